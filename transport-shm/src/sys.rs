//! The Linux calls this transport needs live in `comm_core::sys`; this
//! names its segments.

pub use comm_core::sys::{drain, eventfd, peer_process, recv_fds, send_fds, signal, Mapping};

/// An anonymous, never-named shared memory segment (memfd) of the ring.
pub fn memfd(len: usize) -> std::io::Result<std::os::fd::OwnedFd> {
    comm_core::sys::memfd(c"oxccl-shm", len)
}
