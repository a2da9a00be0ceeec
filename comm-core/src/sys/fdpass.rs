//! Unix-socket helpers: the peer's credentials and passing fds
//! (SCM_RIGHTS), how the shared-memory transport hands its segments over.

use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// "pid P (uid U)" of the process at the other end of `s` (SO_PEERCRED).
pub fn peer_process(s: &UnixStream) -> String {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r == 0 {
        format!("pid {} (uid {})", cred.pid, cred.uid)
    } else {
        "an unknown process".into()
    }
}

const MAX_FDS: usize = 8;

/// Send `data` with `fds` attached (SCM_RIGHTS).
pub fn send_fds(s: &UnixStream, data: &[u8], fds: &[RawFd]) -> Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let msg = msghdr(&mut iov, &mut cbuf, space);
    // SAFETY: the control buffer has room for one header with `fds`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut RawFd, fds.len());
    }
    // SAFETY: msg is fully initialised.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(Error::new(ErrorKind::WriteZero, "short fd message"));
    }
    Ok(())
}

/// A message header over one `iov` and the control buffer `cbuf` (of
/// `space` bytes); both must outlive the call that uses it.
fn msghdr(iov: &mut libc::iovec, cbuf: &mut [u64], space: usize) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    msg
}

/// Receive up to `buf.len()` bytes and exactly `nfds` fds.
pub fn recv_fds(s: &UnixStream, buf: &mut [u8], nfds: usize) -> Result<(usize, Vec<OwnedFd>)> {
    assert!(nfds <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: pure size computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut msg = msghdr(&mut iov, &mut cbuf, space);
    // SAFETY: msg is fully initialised; CMSG_CLOEXEC keeps fds from leaking to children.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c) as *const RawFd;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if fds.len() != nfds || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("expected {nfds} fds, got {}", fds.len()),
        ));
    }
    Ok((n as usize, fds))
}
