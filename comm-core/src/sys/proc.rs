//! Other processes of this host: opening their fds through `/proc`,
//! reading their memory (cross-memory attach) and checking that they still
//! exist.

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

/// Copy `len` bytes at address `addr` in process `pid` into `dst`
/// (`process_vm_readv`, one copy by the kernel: cross-memory attach). Needs
/// ptrace rights over the process (the same user, and Yama's
/// `ptrace_scope` allowing it); a process that has exited is `ESRCH`, an
/// address it has not mapped `EFAULT`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes, and nothing else may
/// touch them during the call.
pub unsafe fn read_process(pid: u32, addr: u64, dst: *mut u8, len: usize) -> Result<()> {
    let mut done = 0;
    while done < len {
        let local = libc::iovec {
            // SAFETY (of the add): within the caller's `len` bytes.
            iov_base: unsafe { dst.add(done) } as *mut libc::c_void,
            iov_len: len - done,
        };
        let remote = libc::iovec {
            // (Wrapping: an address a misbehaving peer published is the
            // kernel's to refuse, not a panic here.)
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one local and one remote iovec; the local one is the
        // caller's writable memory, the remote one is checked by the kernel.
        let got = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        match got {
            g if g > 0 => done += g as usize,
            // A partial read stops at a page the process has not mapped:
            // nothing read at all means the same.
            0 => return Err(Error::from_raw_os_error(libc::EFAULT)),
            _ => {
                let e = Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Whether [`read_process`] failed because the process has exited: the
/// kernel says `ESRCH` from the moment an exiting process has released its
/// memory, while `kill(pid, 0)` still finds it and `/proc` does not call it
/// a zombie yet ([`process_gone`] is false for a while).
pub fn read_found_exited(e: &Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH)
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
    fn a_process_reads_its_own_memory_and_fails_on_unmapped_or_gone() {
        let src: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let me = std::process::id();
        // SAFETY: `dst` is a live buffer of `src.len()` bytes.
        unsafe { super::read_process(me, src.as_ptr() as u64, dst.as_mut_ptr(), src.len()) }
            .unwrap();
        assert_eq!(src, dst);
        // Page 0 is never mapped.
        // SAFETY: as above.
        let e = unsafe { super::read_process(me, 8, dst.as_mut_ptr(), 8) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
        assert!(!super::read_found_exited(&e));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        // SAFETY: as above.
        let e = unsafe { super::read_process(pid, src.as_ptr() as u64, dst.as_mut_ptr(), 8) }
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH));
        assert!(super::read_found_exited(&e));
    }

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
