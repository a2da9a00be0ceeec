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
/// launcher or test harness is until it waits). Allocates nothing: the
/// executor asks while it sleeps on a peer.
pub fn process_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 {
        return Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    zombie(pid)
}

/// Whether `/proc/<pid>/stat` says the process is a zombie (or dead).
fn zombie(pid: u32) -> bool {
    // "/proc/<pid>/stat\0" in a stack buffer.
    let mut path = [0u8; 32];
    let mut digits = [0u8; 10];
    let (mut n, mut v) = (0, pid);
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let name = b"/proc/"
        .iter()
        .chain(digits[..n].iter().rev())
        .chain(b"/stat");
    for (slot, b) in path.iter_mut().zip(name) {
        *slot = *b;
    }
    // SAFETY: `path` is NUL-terminated (at most 21 bytes written of 32 zeroed).
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 512];
    // SAFETY: reading at most `buf.len()` bytes into the live stack buffer.
    let got = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    // SAFETY: closing the fd opened above, once.
    unsafe { libc::close(fd) };
    if got <= 0 {
        return false;
    }
    // "pid (comm) state ...": comm may hold spaces and parentheses, so the
    // state is the first field after the last ')'.
    let stat = &buf[..got as usize];
    let Some(close) = stat.iter().rposition(|b| *b == b')') else {
        return false;
    };
    stat[close + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|s| *s == b'Z' || *s == b'X')
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_killed_unreaped_child_is_gone_and_a_living_one_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!super::process_gone(pid));
        assert!(!super::process_gone(std::process::id()));
        child.kill().unwrap();
        // Not reaped yet: a zombie.
        let t = std::time::Instant::now();
        while !super::process_gone(pid) {
            assert!(t.elapsed().as_secs() < 5, "pid {pid} never looked gone");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(super::process_gone(pid));
    }
}
