//! Other processes of this host: opening their fds through `/proc` and
//! checking that they still exist.

use std::io::{Error, Result};
use std::os::fd::{FromRawFd, OwnedFd};

/// Open fd `fd` of process `pid` through `/proc/<pid>/fd/<fd>` (read-write;
/// needs the same user, or ptrace rights over it).
pub fn open_process_fd(pid: u32, fd: i32) -> Result<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).unwrap();
    // SAFETY: NUL-terminated path; the fd is owned below.
    let f = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if f < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(f) })
}

/// Whether process `pid` is gone: `kill(pid, 0)` says ESRCH, or it is a
/// zombie (dead, not yet reaped by its parent, as a killed child of a
/// launcher or test harness is until it waits).
pub fn process_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 {
        return Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // `/proc/<pid>/stat` is "pid (comm) state ...", comm may hold spaces
    // and parentheses: the state follows the last ')'.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace()
                .next()
                .map(|st| st == "Z" || st == "X")
        })
        .unwrap_or(false)
}
