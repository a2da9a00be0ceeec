//! Anonymous shared memory as a [`Mapped`] region: a memfd (never named,
//! so nothing is left in `/dev/shm`) and a shared mapping of it. Registered
//! buffers use it for their own memory; the shared-memory transport's
//! direct access exports it and maps peers' through `/proc/<pid>/fd`.

use super::{MemorySpace, Region};
use crate::sys::{self, Mapping};
use crate::transport::Mapped;
use std::io::Result;
use std::os::fd::{AsRawFd, OwnedFd};

/// A mapped memfd; unmapped and closed on drop.
#[derive(Debug)]
pub struct MemfdMemory {
    map: Mapping,
    fd: OwnedFd,
    len: usize,
}

impl MemfdMemory {
    /// `len` zeroed bytes of fresh memory, tagged `memfd:oxccl-registered`.
    pub fn create(len: usize) -> Result<MemfdMemory> {
        let fd = sys::memfd(c"oxccl-registered", len.max(1))?;
        Self::map(fd, len)
    }

    /// Map `len` bytes of fd `fd` of process `pid` (same user).
    pub fn open(pid: u32, fd: i32, len: usize) -> Result<MemfdMemory> {
        Self::map(sys::open_process_fd(pid, fd)?, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<MemfdMemory> {
        let map = Mapping::new(&fd, len.max(1))?;
        Ok(MemfdMemory { map, fd, len })
    }

    /// The fd number (what a peer opens through `/proc/<pid>/fd`).
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl Mapped for MemfdMemory {
    fn region(&self) -> Region {
        Region {
            space: MemorySpace::Host,
            addr: self.map.ptr() as usize,
            len: self.len,
        }
    }
}
