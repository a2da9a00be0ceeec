//! `ncclMemAlloc` / `ncclMemFree`: NVIDIA's allocate device memory fit for
//! its fastest paths; calls here take host memory, so these allocate host
//! memory, page-aligned (what oxccl's shared-memory and RDMA paths like
//! best), for programs that allocate their buffers through NCCL.

use crate::export;
use crate::result::{run, Failure};
use std::ffi::c_void;

/// Alignment of what `ncclMemAlloc` returns.
const ALIGN: usize = 4096;

export! {
    /// `ncclMemAlloc`: `size` bytes of page-aligned host memory in `*ptr`.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) {
        run("ncclMemAlloc", || {
            if ptr.is_null() {
                return Err(Failure::invalid("ptr is NULL"));
            }
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: posix_memalign writes `p` only on success; ALIGN is a
            // power of two and a multiple of the pointer size.
            let rc = unsafe { libc::posix_memalign(&mut p, ALIGN, size.max(1)) };
            if rc != 0 {
                return Err(Failure::new(
                    crate::result::ncclSystemError,
                    format!("cannot allocate {size} bytes: {}", std::io::Error::from_raw_os_error(rc)),
                ));
            }
            // SAFETY: non-null; the caller gives room for a pointer.
            unsafe { ptr.write(p) };
            Ok(())
        })
    }
}

export! {
    /// `ncclMemFree`: free what `ncclMemAlloc` returned (NULL: nothing).
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) {
        run("ncclMemFree", || {
            // SAFETY: NULL or from ncclMemAlloc (posix_memalign), not freed.
            unsafe { libc::free(ptr) };
            Ok(())
        })
    }
}
