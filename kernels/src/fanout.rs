//! One reduction, many destinations: `dst_k = op(srcs..)` for every `k`,
//! each source read once and each destination written once, in one pass.
//!
//! A direct-access all_reduce's owner combines its segment from every
//! rank's input and writes the result into every rank's output. Reducing
//! into a scratch block first and copying it out takes two passes; on this
//! project's 2-core machine that ran at 60–65 % of a plain copy of the same
//! bytes, against 90–95 % fused (one process, 4 × 256 MiB, f32 sum,
//! alternating runs). The gain comes from interleaving: each 256-byte block
//! is combined in registers and streamed out at once, so loads and
//! non-temporal stores stay in flight together; staging through an L1
//! block of 1–4 KiB measured as slow as the scratch (the long runs of
//! stores stall the write-combining buffers while no load is in flight).
//!
//! Results are bitwise those of [`crate::reduce_n`] with the same sources
//! in the same order.

use crate::{isa_for, Isa, Op, Scalar};

/// Bytes combined per step: four cache lines.
pub(crate) const BLOCK: usize = 256;

/// A block of elements, aligned for vector loads of it.
#[repr(C, align(64))]
pub(crate) struct Block(pub(crate) [u8; BLOCK]);

/// Staging for the unaligned ends and the cached path (bytes).
const STAGE: usize = 4096;

#[repr(C, align(64))]
struct Stage([u8; STAGE]);

/// `dsts[k][i] = srcs[0][i] op srcs[1][i] op ..` for every `k` and every
/// `i < len`. The first `streamed` destinations are written past the cache
/// (non-temporal stores) where the CPU has them (AVX2) and they share
/// their alignment modulo 64 bytes; otherwise, and the others always,
/// through it (a copy-in all_reduce's owner streams its own output and
/// keeps the copy its peers read next cached). One source is a copy to
/// every destination.
///
/// # Safety
/// Every source holds `len` readable elements and every destination `len`
/// writable ones that nothing else accesses during the call. A destination
/// may be a source exactly (the same address: an in-place reduction) but
/// must not otherwise overlap a source or another destination.
pub unsafe fn reduce_n_fanout<T: Scalar>(
    op: Op,
    dsts: &[*mut T],
    srcs: &[*const T],
    len: usize,
    streamed: usize,
) {
    reduce_n_fanout_with(isa_for::<T>(len), op, dsts, srcs, len, streamed)
}

/// [`reduce_n_fanout`] with an explicit ISA (tests and benchmarks).
///
/// # Safety
/// As for [`reduce_n_fanout`].
pub unsafe fn reduce_n_fanout_with<T: Scalar>(
    isa: Isa,
    op: Op,
    dsts: &[*mut T],
    srcs: &[*const T],
    len: usize,
    streamed: usize,
) {
    assert!(
        !srcs.is_empty() && !dsts.is_empty(),
        "kernels: reduce_n_fanout needs a source and a destination"
    );
    assert!(
        isa.is_supported(),
        "kernels: {isa:?} not supported by this CPU"
    );
    let es = std::mem::size_of::<T>();
    let streamed = streamed.min(dsts.len());
    let mis = dsts[0] as usize % 64;
    let aligned_alike = dsts[..streamed].iter().all(|d| *d as usize % 64 == mis);
    let stream = cfg!(target_arch = "x86_64")
        && streamed > 0
        && aligned_alike
        && isa >= Isa::Avx2
        && srcs.len() > 1;
    // Elements before the destinations' next cache line (element sizes
    // divide 64, and destinations are element-aligned).
    let head = match stream {
        true => ((64 - mis) % 64 / es).min(len),
        false => 0,
    };
    let body = match stream {
        true => (len - head) / (BLOCK / es) * (BLOCK / es),
        false => 0,
    };
    through_cache(isa, op, dsts, srcs, 0, head);
    if body > 0 {
        // SAFETY: isa >= Avx2 and supported (checked above); the
        // streamed destinations are 64-byte aligned at `head`; `body` is a
        // whole number of blocks; the ranges are the caller's.
        T::k_fanout(isa, op, dsts, streamed, srcs, head, head + body);
    }
    through_cache(isa, op, dsts, srcs, head + body, len);
}

/// Most sources whose views live on the stack (more take one allocation
/// per block: more than 32 ranks on one host).
const MAX_SRCS: usize = 32;

/// `f` with views of elements `at..at + m` of every source.
///
/// # Safety
/// Every source holds `at + m` elements that nothing writes while `f` runs.
#[inline(always)]
pub(crate) unsafe fn with_views<T, R>(
    srcs: &[*const T],
    at: usize,
    m: usize,
    f: impl FnOnce(&[&[T]]) -> R,
) -> R {
    if srcs.len() <= MAX_SRCS {
        let mut views: [&[T]; MAX_SRCS] = [&[]; MAX_SRCS];
        for (v, s) in views.iter_mut().zip(srcs) {
            *v = std::slice::from_raw_parts(s.add(at), m);
        }
        f(&views[..srcs.len()])
    } else {
        let views: Vec<&[T]> = srcs
            .iter()
            .map(|s| std::slice::from_raw_parts(s.add(at), m))
            .collect();
        f(&views)
    }
}

/// Elements `from..to` through a staging block on the stack, copied to
/// every destination with ordinary stores.
///
/// # Safety
/// As for [`reduce_n_fanout`].
unsafe fn through_cache<T: Scalar>(
    isa: Isa,
    op: Op,
    dsts: &[*mut T],
    srcs: &[*const T],
    from: usize,
    to: usize,
) {
    if from >= to {
        // Most calls: no unaligned end (and no 4 KiB stage to clear).
        return;
    }
    let mut stage = Stage([0; STAGE]);
    let step = STAGE / std::mem::size_of::<T>();
    let mut at = from;
    while at < to {
        let m = step.min(to - at);
        // SAFETY: the stage holds STAGE bytes, 64-byte aligned, private.
        let t = std::slice::from_raw_parts_mut(stage.0.as_mut_ptr() as *mut T, m);
        // A destination aliasing a source is only written below, after
        // the views are gone.
        with_views(srcs, at, m, |v| T::k_nway(isa, op, t, v));
        for d in dsts {
            // SAFETY: each destination holds `to` elements; none overlaps
            // the private stage.
            std::ptr::copy_nonoverlapping(t.as_ptr(), d.add(at), m);
        }
        at += m;
    }
}

/// Write one combined block (`BLOCK` bytes at `src`, 64-byte aligned) to
/// every destination at element `i`: the first `streamed` with
/// non-temporal stores (64-byte aligned there), the rest through the
/// cache; the caller fences.
///
/// # Safety
/// AVX2 must be available; every destination holds `BLOCK` bytes at `i`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn write_block<T>(dsts: &[*mut T], streamed: usize, i: usize, src: *const u8) {
    for (k, d) in dsts.iter().enumerate() {
        let d = d.add(i) as *mut u8;
        match k < streamed {
            true => stream_block(d, src),
            false => std::ptr::copy_nonoverlapping(src, d, BLOCK),
        }
    }
}

/// Stream one block (`BLOCK` bytes at `src`, 64-byte aligned) to `dst`
/// (64-byte aligned) with non-temporal stores; the caller fences.
///
/// # Safety
/// AVX2 must be available; both ranges hold `BLOCK` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn stream_block(dst: *mut u8, src: *const u8) {
    use std::arch::x86_64::{__m256i, _mm256_load_si256, _mm256_stream_si256};
    let (d, s) = (dst as *mut __m256i, src as *const __m256i);
    for k in 0..BLOCK / 32 {
        _mm256_stream_si256(d.add(k), _mm256_load_si256(s.add(k)));
    }
}

/// Order the streamed stores before whatever the caller stores next (a
/// flag telling a peer the data is there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn store_fence() {
    // SAFETY: SSE2 is part of the x86-64 baseline.
    unsafe { std::arch::x86_64::_mm_sfence() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bf16, f16, reduce_n_with};

    /// One case: how many sources, how long, how far off alignment.
    struct Case {
        isa: Isa,
        op: Op,
        nsrc: usize,
        len: usize,
        shift: usize,
        streamed: usize,
        in_place: bool,
    }

    /// Every ISA and operator, both modes, odd alignments and lengths, in
    /// place or not: the bits of `reduce_n` in every destination.
    fn check<T: Scalar>(make: impl Fn(usize) -> T) {
        for isa in Isa::available() {
            for op in Op::ALL {
                for nsrc in [1usize, 2, 3, 5] {
                    for len in [0usize, 1, 7, 63, 64, 200, 1000, 4099] {
                        for shift in [0usize, 1, 3] {
                            for (streamed, in_place) in [
                                (0, false),
                                (0, true),
                                (3, false),
                                (3, true),
                                (1, false),
                                (1, true),
                            ] {
                                let c = Case {
                                    isa,
                                    op,
                                    nsrc,
                                    len,
                                    shift,
                                    streamed,
                                    in_place,
                                };
                                run::<T>(&make, &c);
                            }
                        }
                    }
                }
            }
        }
    }

    fn run<T: Scalar>(make: &impl Fn(usize) -> T, c: &Case) {
        let (len, shift) = (c.len, c.shift);
        let mut srcs: Vec<Vec<T>> = (0..c.nsrc)
            .map(|k| (0..len + shift).map(|i| make(i * 7 + k * 13)).collect())
            .collect();
        let views: Vec<&[T]> = srcs.iter().map(|s| &s[shift..]).collect();
        let mut want = vec![T::default(); len];
        if len > 0 {
            reduce_n_with(c.isa, c.op, &mut want, &views);
        }
        let mut outs: Vec<Vec<T>> = (0..3).map(|_| vec![T::default(); len + shift]).collect();
        let mut dsts: Vec<*mut T> = outs.iter_mut().map(|o| o[shift..].as_mut_ptr()).collect();
        let sp: Vec<*mut T> = srcs.iter_mut().map(|s| s[shift..].as_mut_ptr()).collect();
        if c.in_place {
            // The last source is also the first destination.
            dsts[0] = sp[c.nsrc - 1];
        }
        let sp: Vec<*const T> = sp.into_iter().map(|p| p as *const T).collect();
        // SAFETY: the vectors hold len + shift elements; the only overlap
        // is the exact alias of the in-place case.
        unsafe { reduce_n_fanout_with(c.isa, c.op, &dsts, &sp, len, c.streamed) };
        for (k, d) in dsts.iter().enumerate() {
            // SAFETY: as above.
            let got = unsafe { std::slice::from_raw_parts(*d, len) };
            let bad = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                bad.is_none(),
                "destination {k}, element {bad:?} differs: {:?} {:?}, {} sources, {len} elements, shift {shift}, streamed {}, in place {}",
                c.isa, c.op, c.nsrc, c.streamed, c.in_place
            );
        }
    }

    #[test]
    fn every_destination_gets_the_bits_of_reduce_n() {
        check::<f32>(|i| (i % 97) as f32 * 0.37 - 11.0);
        check::<f64>(|i| (i % 89) as f64 * 1e-3 + 0.1);
        check::<i8>(|i| (i % 251) as i8);
        check::<u64>(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        check::<f16>(|i| f16::from_f32((i % 61) as f32 * 0.125));
        check::<bf16>(|i| bf16::from_f32((i % 61) as f32 * 0.3));
    }
}
