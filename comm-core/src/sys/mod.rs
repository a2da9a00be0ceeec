//! Every Linux call of oxccl's runtime that is not a socket read or write,
//! in one place (as mio keeps its syscalls under `sys/`): shared memory
//! (memfd, mappings), wake-ups (eventfd, futex), fd passing and peer
//! credentials over Unix sockets, other processes through `/proc`, the
//! monotonic clock as an integer, this thread's CPU affinity and the size
//! of its last-level cache.
//! Each wrapper is small and safe to call; `unsafe` stays in here.

mod clock;
mod cpu;
mod event;
mod fdpass;
mod proc;
mod shm;

pub use clock::{CallClock, Stamp};
pub use cpu::{
    affinity, allowed_cpus, bind_to_cpu, last_level_cache, prefetch_for_read, prefetch_for_write,
    prefetches_for_write,
};
pub use event::{drain, eventfd, futex_wait, futex_wake, poll, poll_one, signal, wait_readable};
pub use fdpass::{peer_process, recv_fds, send_fds};
pub use proc::{open_process_fd, process_gone, read_found_exited, read_process};
pub use shm::{memfd, Mapping};

fn cvt(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}
