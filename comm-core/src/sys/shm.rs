//! Anonymous shared memory: memfd files (never named, so nothing can be
//! left in `/dev/shm`) and shared mappings of them. Used by registered
//! buffers and by the shared-memory transport.

use std::io::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An anonymous shared memory file of `len` bytes, tagged `name` in
/// `/proc/<pid>/maps` (`memfd:<name>`).
pub fn memfd(name: &std::ffi::CStr, len: usize) -> Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the fd is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing our own file.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::last_os_error());
    }
    Ok(fd)
}

/// A read-write shared mapping of a whole file; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain shared memory; users coordinate access through atomics or
// through protocols that hand out disjoint ranges.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd`, shared.
    pub fn new(fd: &OwnedFd, len: usize) -> Result<Mapping> {
        // SAFETY: mapping a file we hold open; the kernel checks `len`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os_error());
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
        })
    }

    /// Start of the mapping (page aligned).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}
