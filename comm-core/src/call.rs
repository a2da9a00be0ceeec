//! What a rank is asked to do: the kind of collective and its arguments,
//! summarised as a [`Fingerprint`] that travels in every message header so a
//! rank that called something else is caught, not silently mixed in.

use crate::types::{DataType, ReduceOp};
use std::fmt;

/// The kind of a communication call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    AllReduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Broadcast = 4,
    Reduce = 5,
    AllToAll = 6,
    Barrier = 7,
    /// Point-to-point send or receive (numbered per peer pair, not in the
    /// collective sequence).
    P2p = 8,
}

impl Kind {
    /// Decode the wire code.
    pub fn from_code(c: u8) -> Option<Kind> {
        use Kind::*;
        [
            AllReduce,
            AllGather,
            ReduceScatter,
            Broadcast,
            Reduce,
            AllToAll,
            Barrier,
            P2p,
        ]
        .into_iter()
        .find(|k| *k as u8 == c)
    }

    /// The snake_case name users know from NCCL (`all_reduce`).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
            Kind::P2p => "send/recv",
        }
    }
}

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
