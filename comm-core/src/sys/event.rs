//! Wake-ups: eventfds (pollable counters) and futexes (sleeping on a word
//! of shared memory).

use super::cvt;
use std::io::Result;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A non-blocking eventfd.
pub fn eventfd() -> Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned below.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Add one to an eventfd (wakes a poller).
pub fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: 8-byte write from a live u64 to an eventfd.
    unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
}

/// Reset an eventfd's counter (non-blocking; nothing to do if zero).
pub fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: 8-byte read into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// `poll(2)` on `fds` for at most `timeout` (at least 1 ms); the number of
/// ready fds (an interrupted wait returns early, -1).
pub fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> i32 {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: a valid array of initialised pollfd, alive for the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) }
}

/// `poll(2)` on one fd for `events`, at most `timeout` (at least 1 ms);
/// whether it is ready.
pub fn poll_one(fd: RawFd, events: i16, timeout: Duration) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    poll(&mut p, timeout) > 0
}

/// Wait until one of `fds` is readable, at most `timeout` (negative fds
/// are ignored, as by `poll(2)`; an interrupted wait returns early).
pub fn wait_readable(fds: &[RawFd], timeout: Duration) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    poll(&mut p, timeout);
}

/// Sleep while `*word == expected`, at most `timeout` (spurious and early
/// returns are normal: callers re-check their condition).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live, 4-byte aligned word (possibly in a
    // shared mapping, hence no FUTEX_PRIVATE_FLAG) with a timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAIT,
            expected,
            &ts,
            0usize,
            0u32,
        )
    };
}

/// Wake every sleeper of [`futex_wait`] on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        )
    };
}
