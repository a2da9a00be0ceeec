//! Direct access over RDMA: a rank's exported memory is registered for
//! remote reads, and its peers read it one-sided (RDMA READ through the
//! link to it, see [`crate::link`]) instead of receiving messages. The
//! handle is (address, rkey, length): 20 bytes, decoded totally.
//!
//! Only memory exported here (`alloc_shared` buffers) is readable by
//! peers; memory registered for zero-copy sends is not.

use crate::regcache::{InsertError, RegCache};
use crate::verbs::{Mr, Pd};
use comm_core::algorithms::Access;
use comm_core::mem::MemfdMemory;
use comm_core::transport::{DirectAccess, Mapped, PeerMemory, RemoteMemory};
use comm_core::{Error, Region, Result};
use std::sync::Arc;

const HANDLE_LEN: usize = 20;

fn encode(addr: u64, rkey: u32, len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HANDLE_LEN);
    h.extend_from_slice(&addr.to_le_bytes());
    h.extend_from_slice(&rkey.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

fn decode(h: &[u8]) -> Option<(u64, u32, u64)> {
    if h.len() != HANDLE_LEN {
        return None;
    }
    let addr = u64::from_le_bytes(h[0..8].try_into().ok()?);
    let rkey = u32::from_le_bytes(h[8..12].try_into().ok()?);
    let len = u64::from_le_bytes(h[12..20].try_into().ok()?);
    // The range must exist in the peer's address space.
    (addr != 0 && addr.checked_add(len).is_some()).then_some((addr, rkey, len))
}

/// Direct access through one RDMA endpoint (its protection domain and
/// registration cache, which the links look local memory up in).
pub struct RdmaDirect {
    pub(crate) pd: Arc<Pd>,
    pub(crate) cache: Arc<RegCache<Mr>>,
    pub(crate) device: String,
}

/// Memory this rank exported: registered for remote reads while it lives.
struct Exported {
    // Field order: unregistered before the memory is unmapped.
    reg: Unregister,
    mem: MemfdMemory,
}

struct Unregister {
    cache: Arc<RegCache<Mr>>,
    addr: usize,
    len: usize,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.cache.remove(self.addr, self.len);
    }
}

impl Mapped for Exported {
    fn region(&self) -> Region {
        let _ = &self.reg;
        self.mem.region()
    }
}

impl DirectAccess for RdmaDirect {
    fn access(&self) -> Access {
        Access::OneSided
    }

    fn export(&self, len: usize) -> Result<(Box<dyn Mapped>, Vec<u8>)> {
        let mem = MemfdMemory::create(len)
            .map_err(|e| Error::System(format!("a {len}-byte registered buffer (mmap): {e}")))?;
        let r = mem.region();
        // SAFETY: `Exported` unregisters the range before unmapping it; a
        // link holding the region for a transfer keeps it registered (the
        // pinned pages stay valid) until that transfer completed.
        let inserted = self.cache.insert(r.addr, r.len, || unsafe {
            Mr::register(&self.pd, r.ptr(), r.len, true)
        });
        inserted.map_err(|e| match e {
            InsertError::Overlap => Error::System(format!(
                "fresh memory at {:#x} overlaps a registered range (internal error)",
                r.addr
            )),
            InsertError::Register(e) => Error::System(format!(
                "registering {} bytes for remote reads with RDMA device {}: {e} (check `ulimit -l`)",
                r.len, self.device
            )),
        })?;
        let reg = Unregister {
            cache: self.cache.clone(),
            addr: r.addr,
            len: r.len,
        };
        let rkey = self
            .cache
            .lookup(r.addr, r.len)
            .map(|mr| mr.rkey())
            .ok_or_else(|| Error::System("a registration vanished (internal error)".into()))?;
        let handle = encode(r.addr as u64, rkey, r.len as u64);
        Ok((Box::new(Exported { reg, mem }), handle))
    }

    fn import(&self, peer: usize, handle: &[u8], len: usize) -> Result<PeerMemory> {
        let Some((addr, key, their_len)) = decode(handle) else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent an RDMA memory handle that does not decode ({} bytes)",
                handle.len()
            )));
        };
        if their_len < len as u64 {
            return Err(Error::Protocol(format!(
                "rank {peer} exported {their_len} bytes where {len} were agreed"
            )));
        }
        Ok(PeerMemory::Remote(RemoteMemory { addr, len, key }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_bad_ones_are_refused() {
        assert_eq!(
            decode(&encode(0x7f00_0000_1000, 42, 8192)),
            Some((0x7f00_0000_1000, 42, 8192))
        );
        for bad in [
            &[][..],
            &[1u8; 19][..],
            &[1u8; 21][..],
            &encode(0, 1, 10)[..],
            &encode(u64::MAX - 4, 1, 10)[..],
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
