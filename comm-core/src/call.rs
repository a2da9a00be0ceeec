//! What a rank is asked to do: the kind of collective and its arguments,
//! summarised as a [`Fingerprint`] that travels in every message header so a
//! rank that called something else is caught, not silently mixed in.

use crate::types::{DataType, ReduceOp};
use std::fmt;

pub use algorithms::Kind;

/// The arguments every rank must agree on. `count` is the per-rank count as
/// NCCL defines it for that collective (all_gather: elements each rank
/// contributes; reduce_scatter: elements each rank receives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    pub kind: Kind,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: u32,
    pub count: u64,
}

impl Fingerprint {
    /// A fingerprint for a call without an operator or root.
    pub fn new(kind: Kind, dtype: DataType, count: usize) -> Fingerprint {
        Fingerprint {
            kind,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            count: count as u64,
        }
    }

    /// Set the reduction operator.
    pub fn with_op(mut self, op: ReduceOp) -> Fingerprint {
        self.op = op;
        self
    }

    /// Set the root (or the peer for point-to-point).
    pub fn with_root(mut self, root: usize) -> Fingerprint {
        self.root = root as u32;
        self
    }

    /// Whether the operator is part of the call's meaning.
    fn has_op(&self) -> bool {
        matches!(
            self.kind,
            Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce
        )
    }

    /// Whether `root` is part of the call's meaning.
    fn has_root(&self) -> bool {
        matches!(self.kind, Kind::Broadcast | Kind::Reduce)
    }

    /// 16-byte wire form.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = self.kind as u8;
        b[1] = self.dtype as u8;
        b[2] = self.op as u8;
        b[4..8].copy_from_slice(&self.root.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    /// Decode the wire form; `None` for unknown codes.
    pub fn decode(b: &[u8; 16]) -> Option<Fingerprint> {
        Some(Fingerprint {
            kind: Kind::from_code(b[0])?,
            dtype: DataType::from_code(b[1])?,
            op: ReduceOp::from_code(b[2])?,
            root: u32::from_le_bytes(b[4..8].try_into().ok()?),
            count: u64::from_le_bytes(b[8..16].try_into().ok()?),
        })
    }

    /// The 16 encoded bytes as two words, for shared-memory pages where
    /// ranks publish their call with atomic stores.
    /// (Built in registers: going through `encode`'s bytes stalled a
    /// store-to-load forward, several nanoseconds on every call.)
    #[inline]
    pub fn to_words(&self) -> [u64; 2] {
        [
            self.kind as u64
                | (self.dtype as u64) << 8
                | (self.op as u64) << 16
                | (self.root as u64) << 32,
            self.count,
        ]
    }

    /// [`Fingerprint::to_words`] back (`None` when they do not decode).
    pub fn from_words(w: [u64; 2]) -> Option<Fingerprint> {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&w[0].to_le_bytes());
        b[8..].copy_from_slice(&w[1].to_le_bytes());
        Fingerprint::decode(&b)
    }

    /// Whether two ranks' calls are the same call. Fields that do not apply
    /// to the kind (op of a broadcast, root of an all_reduce) are ignored.
    pub fn agrees_with(&self, other: &Fingerprint) -> bool {
        self.kind == other.kind
            && self.dtype == other.dtype
            && self.count == other.count
            && (!self.has_op() || self.op == other.op)
            && (!self.has_root() || self.root == other.root)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(count={}, {}",
            self.kind.name(),
            self.count,
            self.dtype
        )?;
        if self.has_op() {
            write!(f, ", {}", self.op)?;
        }
        if self.has_root() {
            write!(f, ", root={}", self.root)?;
        }
        if self.kind == Kind::P2p {
            write!(f, ", peer={}", self.root)?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_the_wire_bytes_and_decode_back() {
        let kinds: Vec<Kind> = (0..=255u8).filter_map(Kind::from_code).collect();
        assert!(kinds.len() > 5, "{kinds:?}");
        for (i, &kind) in kinds.iter().enumerate() {
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL {
                    let fp = Fingerprint {
                        kind,
                        dtype,
                        op,
                        root: 0x8765_4321u32.rotate_left(i as u32),
                        count: 0xfedc_ba98_7654_3210u64.rotate_left(i as u32),
                    };
                    let b = fp.encode();
                    let by_bytes = [
                        u64::from_le_bytes(b[..8].try_into().unwrap()),
                        u64::from_le_bytes(b[8..].try_into().unwrap()),
                    ];
                    assert_eq!(fp.to_words(), by_bytes, "{fp:?}");
                    assert_eq!(Fingerprint::from_words(fp.to_words()), Some(fp));
                }
            }
        }
    }
}
