//! What two ranks tell each other to connect one queue pair: the QP's
//! address (QPN, PSN, LID, GID) and the receive ring the peer may write
//! into (address, rkey, slot count and size). Sent once per direction over
//! the authenticated setup connection; the decoder is total (bad bytes are
//! an error, never a panic) and rejects values no correct peer sends.

use comm_core::wire::{Put, Reader};
use comm_core::{Error, Result};

const MAGIC: &[u8; 4] = b"OXRD";
const VERSION: u8 = 1;
/// Encoded size.
pub const LEN: usize = 4 + 1 + 4 + 4 + 2 + 16 + 8 + 4 + 4 + 4;

/// Most slots a ring may have / bytes a slot may hold.
pub const MAX_SLOTS: u32 = 1024;
pub const MAX_SLOT_BYTES: u32 = 64 << 20;
/// Largest ring (the peer allocates as many bounce bytes).
pub const MAX_RING_BYTES: u64 = 1 << 30;

/// Where a remote QP is and how to address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathInfo {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
}

/// One side's queue pair and receive ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub path: PathInfo,
    /// Address of the receive ring in the owner's memory and its rkey.
    pub ring_addr: u64,
    pub rkey: u32,
    pub slots: u32,
    pub slot_bytes: u32,
}

impl QpEndpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.extend_from_slice(MAGIC);
        v.put_u8(VERSION);
        v.put_u32(self.path.qpn);
        v.put_u32(self.path.psn);
        v.put_u16(self.path.lid);
        v.extend_from_slice(&self.path.gid);
        v.put_u64(self.ring_addr);
        v.put_u32(self.rkey);
        v.put_u32(self.slots);
        v.put_u32(self.slot_bytes);
        v
    }

    pub fn decode(b: &[u8]) -> Result<QpEndpoint> {
        let mut r = Reader::new(b, "RDMA endpoint");
        if r.array::<4>()? != *MAGIC {
            return Err(Error::Protocol("RDMA endpoint: bad magic".into()));
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(Error::Protocol(format!(
                "RDMA endpoint version {version}, this build speaks {VERSION}"
            )));
        }
        let qpn = r.u32()?;
        let psn = r.u32()?;
        let lid = r.u16()?;
        let gid = r.array::<16>()?;
        let ring_addr = r.u64()?;
        let rkey = r.u32()?;
        let slots = r.u32()?;
        let slot_bytes = r.u32()?;
        r.finish()?;
        let bad = |what: String| Err(Error::Protocol(format!("RDMA endpoint: {what}")));
        if qpn == 0 || qpn >= 1 << 24 {
            return bad(format!("queue pair number {qpn} out of range"));
        }
        if psn >= 1 << 24 {
            return bad(format!("packet sequence number {psn} out of range"));
        }
        if ring_addr == 0 {
            return bad("null ring address".into());
        }
        if !(1..=MAX_SLOTS).contains(&slots) || !(1..=MAX_SLOT_BYTES).contains(&slot_bytes) {
            return bad(format!("{slots} slots of {slot_bytes} bytes"));
        }
        let ring_bytes = slots as u64 * slot_bytes as u64;
        if ring_bytes > MAX_RING_BYTES {
            return bad(format!(
                "a ring of {ring_bytes} bytes (at most {MAX_RING_BYTES})"
            ));
        }
        if ring_addr.checked_add(ring_bytes).is_none() {
            return bad("ring wraps the address space".into());
        }
        Ok(QpEndpoint {
            path: PathInfo { qpn, psn, lid, gid },
            ring_addr,
            rkey,
            slots,
            slot_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QpEndpoint {
        QpEndpoint {
            path: PathInfo {
                qpn: 0x11,
                psn: 0xabcdef,
                lid: 3,
                gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
            },
            ring_addr: 0x7f00_0000_1000,
            rkey: 0x1234,
            slots: 16,
            slot_bytes: 128 << 10,
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let b = e.encode();
        assert_eq!(b.len(), LEN);
        assert_eq!(QpEndpoint::decode(&b).unwrap(), e);
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(QpEndpoint::decode(&b[..n]).is_err(), "{n} bytes accepted");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(QpEndpoint::decode(&long).is_err());
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        type Edit = Box<dyn Fn(&mut QpEndpoint)>;
        let cases: Vec<Edit> = vec![
            Box::new(|e| e.path.qpn = 0),
            Box::new(|e| e.path.qpn = 1 << 24),
            Box::new(|e| e.path.psn = 1 << 24),
            Box::new(|e| e.ring_addr = 0),
            Box::new(|e| e.ring_addr = u64::MAX - 10),
            Box::new(|e| e.slots = 0),
            Box::new(|e| e.slots = MAX_SLOTS + 1),
            Box::new(|e| e.slot_bytes = 0),
            Box::new(|e| e.slot_bytes = MAX_SLOT_BYTES + 1),
            Box::new(|e| {
                e.slots = MAX_SLOTS;
                e.slot_bytes = MAX_SLOT_BYTES;
            }),
        ];
        for (i, f) in cases.iter().enumerate() {
            let mut e = sample();
            f(&mut e);
            assert!(
                QpEndpoint::decode(&e.encode()).is_err(),
                "case {i} accepted"
            );
        }
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(QpEndpoint::decode(&b).is_err(), "bad magic");
        let mut b = sample().encode();
        b[4] = 9;
        assert!(QpEndpoint::decode(&b).is_err(), "unknown version");
    }

    #[test]
    fn random_and_mutated_bytes_never_panic() {
        let good = sample().encode();
        let mut x = 0x2545f4914f6cdd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..100_000 {
            let mut b = if i % 2 == 0 {
                good.clone()
            } else {
                (0..(next() % 80) as usize).map(|_| next() as u8).collect()
            };
            for _ in 0..(next() % 4) {
                if !b.is_empty() {
                    let k = (next() as usize) % b.len();
                    b[k] = next() as u8;
                }
            }
            if let Ok(e) = QpEndpoint::decode(&b) {
                // Anything accepted re-encodes to the same bytes.
                assert_eq!(e.encode(), b);
            }
        }
    }
}
