//! Direct access between processes of one host: memory is an anonymous
//! memfd mapped by its owner; a peer maps the same file by opening
//! `/proc/<pid>/fd/<fd>` (same user; nothing is ever named in `/dev/shm`).
//! The handle is (pid, fd, length): 16 bytes, decoded totally.

use comm_core::algorithms::Access;
use comm_core::mem::MemfdMemory;
use comm_core::transport::{DirectAccess, Mapped, PeerMemory};
use comm_core::{Error, Result};

/// Direct access through shared memory (what the shm endpoint offers).
pub struct ShmDirect;

const HANDLE_LEN: usize = 16;

fn encode(pid: u32, fd: i32, len: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(HANDLE_LEN);
    h.extend_from_slice(&pid.to_le_bytes());
    h.extend_from_slice(&fd.to_le_bytes());
    h.extend_from_slice(&(len as u64).to_le_bytes());
    h
}

fn decode(h: &[u8]) -> Option<(u32, i32, u64)> {
    if h.len() != HANDLE_LEN {
        return None;
    }
    let pid = u32::from_le_bytes(h[0..4].try_into().ok()?);
    let fd = i32::from_le_bytes(h[4..8].try_into().ok()?);
    let len = u64::from_le_bytes(h[8..16].try_into().ok()?);
    (pid != 0 && fd >= 0).then_some((pid, fd, len))
}

impl DirectAccess for ShmDirect {
    fn access(&self) -> Access {
        Access::Mapped
    }

    fn export(&self, len: usize) -> Result<(Box<dyn Mapped>, Vec<u8>)> {
        let m = MemfdMemory::create(len)
            .map_err(|e| Error::System(format!("a {len}-byte shared buffer (memfd, mmap): {e}")))?;
        let handle = encode(std::process::id(), m.fd(), len.max(1));
        Ok((Box::new(m), handle))
    }

    fn import(&self, peer: usize, handle: &[u8], len: usize) -> Result<PeerMemory> {
        let Some((pid, fd, their_len)) = decode(handle) else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent a shared-memory handle that does not decode ({} bytes)",
                handle.len()
            )));
        };
        if their_len < len.max(1) as u64 {
            return Err(Error::Protocol(format!(
                "rank {peer} exported {their_len} bytes where {len} were agreed"
            )));
        }
        let m = MemfdMemory::open(pid, fd, len).map_err(|e| Error::Transport {
            peer,
            world_peer: peer,
            detail: format!(
                "cannot map rank {peer}'s shared buffer (/proc/{pid}/fd/{fd}): {e}; registered buffers need all ranks of a host to run as one user"
            ),
        })?;
        Ok(PeerMemory::Mapped(Box::new(m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_bad_ones_are_refused() {
        assert_eq!(decode(&encode(7, 3, 4096)), Some((7, 3, 4096)));
        for bad in [&[][..], &[0u8; 15][..], &[0u8; 17][..], &[0u8; 16][..]] {
            assert_eq!(decode(bad), None);
        }
        let e = ShmDirect.import(2, &[1, 2, 3], 10).err().unwrap();
        assert!(matches!(e, Error::Protocol(_)), "{e:?}");
    }

    #[test]
    fn an_exported_buffer_is_the_same_memory_when_imported() {
        let (mine, h) = ShmDirect.export(8192).unwrap();
        let Ok(PeerMemory::Mapped(theirs)) = ShmDirect.import(1, &h, 8192) else {
            panic!("shared memory is imported mapped")
        };
        let (a, b) = (mine.region(), theirs.region());
        assert_ne!(a.addr, b.addr);
        // SAFETY: both map 8192 bytes of one file, alive here.
        unsafe {
            *a.ptr().add(100) = 42;
            assert_eq!(*b.ptr().add(100), 42);
        }
        let e = ShmDirect.import(1, &h, 1 << 20).err().unwrap();
        assert!(matches!(e, Error::Protocol(_)), "{e:?}");
    }
}
