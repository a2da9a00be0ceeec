//! The host engine: the SIMD kernels of `kernels/`, run on the calling
//! thread, so every piece of work is complete when it is returned.

use super::{Compute, Pending};
use crate::error::{Error, Result};
use crate::mem::{MemorySpace, Region};
use crate::types::DataType;
use crate::with_dtype;

/// Elements per block when a reduction writes one of its own sources.
const BLOCK_BYTES: usize = 256 << 10;
/// Sources that live on the stack (more take one allocation per call).
const MAX_STACK_SRCS: usize = 32;

/// The CPU engine (host and registered host memory).
#[derive(Default, Debug)]
pub struct HostCompute {
    /// Temporary block for reductions that write one of their sources;
    /// kept between calls (a warm communicator allocates nothing).
    tmp: Vec<u64>,
}

impl HostCompute {
    pub fn new() -> HostCompute {
        HostCompute::default()
    }

    /// `dst = src` with `kernel` (one of `kernels::copy`'s: cached,
    /// streamed or by size) where the regions do not overlap; overlapping
    /// ones with `ptr::copy`.
    fn copy_by(
        &mut self,
        dst: Region,
        src: Region,
        kernel: unsafe fn(*mut u8, *const u8, usize),
    ) -> Result<Pending> {
        self.check("write", &dst)?;
        self.check("read", &src)?;
        let n = dst.len.min(src.len);
        let disjoint = dst.addr + n <= src.addr || src.addr + n <= dst.addr;
        if n > 0 && disjoint {
            // SAFETY: both regions hold n bytes the caller lends for this
            // call, and they do not overlap (the kernel's contract).
            unsafe { kernel(dst.ptr(), src.ptr() as *const u8, n) };
        } else if n > 0 && dst.addr != src.addr {
            // SAFETY: as above; `ptr::copy` tolerates the overlap.
            unsafe { std::ptr::copy(src.ptr() as *const u8, dst.ptr(), n) };
        }
        Ok(Pending::DONE)
    }

    fn check(&self, what: &str, r: &Region) -> Result<()> {
        if self.reaches(r.space) {
            Ok(())
        } else {
            Err(Error::Unsupported(format!(
                "the host engine cannot {what} {} (a device engine is needed)",
                r.space
            )))
        }
    }
}

/// `len` elements of `T` at `r` (offset `at` elements).
///
/// # Safety
/// `r` must hold `at + len` initialised, aligned elements of `T` that
/// nothing writes while the slice lives.
unsafe fn view<'a, T>(r: &Region, at: usize, len: usize) -> &'a [T] {
    std::slice::from_raw_parts((r.addr as *const T).add(at), len)
}

impl Compute for HostCompute {
    fn name(&self) -> &'static str {
        "host"
    }

    fn reaches(&self, space: MemorySpace) -> bool {
        space.is_host()
    }

    fn copy(&mut self, dst: Region, src: Region) -> Result<Pending> {
        self.copy_by(dst, src, kernels::copy::copy)
    }

    fn copy_kept(&mut self, dst: Region, src: Region) -> Result<Pending> {
        self.copy_by(dst, src, kernels::copy::copy_cached)
    }

    fn copy_final(&mut self, dst: Region, src: Region) -> Result<Pending> {
        self.copy_by(dst, src, kernels::copy::copy_streaming)
    }

    fn reduce(
        &mut self,
        dtype: DataType,
        op: kernels::Op,
        dst: Region,
        srcs: &[Region],
    ) -> Result<Pending> {
        self.check("write", &dst)?;
        for s in srcs {
            self.check("read", s)?;
        }
        let es = dtype.size();
        let len = dst.len / es;
        if len == 0 {
            return Ok(Pending::DONE);
        }
        let aliased = srcs.iter().position(|s| s.addr == dst.addr);
        with_dtype!(dtype, T => {
            match (srcs.len(), aliased) {
                // dst op= other: the common receive-reduce, in place.
                (2, Some(a)) => {
                    let other = &srcs[1 - a];
                    // SAFETY: dst holds len writable elements only this call
                    // touches; `other` does not overlap it.
                    unsafe {
                        let d = std::slice::from_raw_parts_mut(dst.ptr() as *mut T, len);
                        kernels::reduce_assign(op, d, view::<T>(other, 0, len));
                    }
                }
                // No aliasing: straight into dst.
                (_, None) => {
                    // SAFETY: every region is host memory (checked above)
                    // the caller lends for this call; no source overlaps dst.
                    unsafe { reduce_into::<T>(op, dst, srcs, len) };
                }
                // dst is one of several sources: reduce block by block into
                // the temporary, then copy each block over.
                (_, Some(_)) => {
                    let block = (BLOCK_BYTES / es).max(1);
                    if self.tmp.len() * 8 < block * es {
                        self.tmp.resize((block * es).div_ceil(8), 0);
                    }
                    let mut at = 0;
                    while at < len {
                        let m = block.min(len - at);
                        // SAFETY: the temporary holds `block` elements of T
                        // (u64-aligned) and is private.
                        let t = unsafe {
                            std::slice::from_raw_parts_mut(self.tmp.as_mut_ptr() as *mut T, m)
                        };
                        reduce_blocks::<T>(op, t, srcs, at, m);
                        // SAFETY: dst holds len elements; nobody reads this
                        // block of it until the copy is done.
                        unsafe {
                            std::ptr::copy_nonoverlapping(t.as_ptr(), (dst.ptr() as *mut T).add(at), m)
                        };
                        at += m;
                    }
                }
            }
        });
        Ok(Pending::DONE)
    }

    fn reduce_fanout(
        &mut self,
        dtype: DataType,
        op: kernels::Op,
        dsts: &[Region],
        srcs: &[Region],
        streamed: usize,
    ) -> Result<Pending> {
        let es = dtype.size();
        let len = dsts.first().map_or(0, |d| d.len / es);
        for d in dsts {
            self.check("write", d)?;
            debug_assert_eq!(d.len / es, len);
        }
        for s in srcs {
            self.check("read", s)?;
            debug_assert!(s.len / es >= len);
        }
        if len == 0 {
            return Ok(Pending::DONE);
        }
        if dsts.len() > MAX_STACK_SRCS || srcs.len() > MAX_STACK_SRCS {
            // More than 32 ranks on one host: one reduction, then copies.
            return super::reduce_then_copy(self, dtype, op, dsts, srcs);
        }
        with_dtype!(dtype, T => {
            let mut d = [std::ptr::null_mut::<T>(); MAX_STACK_SRCS];
            let mut s = [std::ptr::null::<T>(); MAX_STACK_SRCS];
            for (p, r) in d.iter_mut().zip(dsts) {
                *p = r.ptr() as *mut T;
            }
            for (p, r) in s.iter_mut().zip(srcs) {
                *p = r.ptr() as *const T;
            }
            // SAFETY: the regions are lent for this call (len elements
            // each, aligned for T); by the schedule's contract a
            // destination is a source exactly or overlaps none, and no
            // destination overlaps another.
            unsafe {
                kernels::reduce_n_fanout(op, &d[..dsts.len()], &s[..srcs.len()], len, streamed)
            };
        });
        Ok(Pending::DONE)
    }

    fn divide(&mut self, dtype: DataType, dst: Region, divisor: usize) -> Result<Pending> {
        self.check("write", &dst)?;
        with_dtype!(dtype, T => {
            // SAFETY: dst holds whole elements of T, aligned, lent to this call.
            let d = unsafe {
                std::slice::from_raw_parts_mut(dst.ptr() as *mut T, dst.len / dtype.size())
            };
            kernels::div_assign(d, divisor);
        });
        Ok(Pending::DONE)
    }

    fn poll(&mut self, _work: Pending) -> Result<bool> {
        Ok(true)
    }
}

/// `dst = srcs[0] op srcs[1] op ..` over `len` elements, combined left to
/// right, for a `dst` that no source overlaps.
///
/// # Safety
/// `dst` must hold `len` writable elements of `T` and every source `len`
/// readable ones, all host memory, none of which anything else touches
/// during the call; no source may overlap `dst`.
unsafe fn reduce_into<T: kernels::Scalar>(
    op: kernels::Op,
    dst: Region,
    srcs: &[Region],
    len: usize,
) {
    let d = std::slice::from_raw_parts_mut(dst.ptr() as *mut T, len);
    match srcs {
        [a, b] => kernels::reduce(op, d, view::<T>(a, 0, len), view::<T>(b, 0, len)),
        _ => reduce_blocks::<T>(op, d, srcs, 0, len),
    }
}

/// [`reduce_into`] for `dtype`, sized by `dst`: the host reduction
/// without an engine, for callers whose every region is host memory by
/// construction (the small-message path).
///
/// # Safety
/// As for [`reduce_into`], with `len = dst.len / dtype.size()`.
pub(crate) unsafe fn reduce_host(dtype: DataType, op: kernels::Op, dst: Region, srcs: &[Region]) {
    let len = dst.len / dtype.size();
    if len > 0 {
        with_dtype!(dtype, T => reduce_into::<T>(op, dst, srcs, len));
    }
}

/// `out = op over srcs` of elements `at..at + out.len()`, sources on the
/// stack up to [`MAX_STACK_SRCS`].
fn reduce_blocks<T: kernels::Scalar>(
    op: kernels::Op,
    out: &mut [T],
    srcs: &[Region],
    at: usize,
    m: usize,
) {
    // SAFETY (each view): every source holds at least `at + m` elements of T
    // that nobody writes during the call (the caller's contract).
    if srcs.len() <= MAX_STACK_SRCS {
        let mut views: [&[T]; MAX_STACK_SRCS] = [&[]; MAX_STACK_SRCS];
        for (v, s) in views.iter_mut().zip(srcs) {
            *v = unsafe { view::<T>(s, at, m) };
        }
        kernels::reduce_n(op, out, &views[..srcs.len()]);
    } else {
        let views: Vec<&[T]> = srcs
            .iter()
            .map(|s| unsafe { view::<T>(s, at, m) })
            .collect();
        kernels::reduce_n(op, out, &views);
    }
}
