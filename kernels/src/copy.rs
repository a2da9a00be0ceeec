//! Byte copies whose speed does not depend on where the buffers lie.
//!
//! glibc's `memcpy` copies 2 KiB–some MiB with `rep movsb` on CPUs that
//! advertise fast strings. On AMD Zen 4 (this project's machines) that path
//! is two to three times slower when the destination is not 64-byte aligned
//! — exactly the common case of two heap buffers allocated one after the
//! other (16 bytes of malloc header between them): a 4 KiB copy took
//! 117–131 ns there against 49 ns aligned, 8 KiB 221–261 against 93. A
//! broadcast root copies its input to its output on every call, so the
//! benchmark's speed at 4–16 KiB depended on the allocator's placement
//! (measurements and the sweep in `docs/PERFORMANCE.md`, "The 4–16 KiB
//! broadcast: found").
//!
//! [`copy`] therefore copies mid-sized blocks with AVX2: unaligned loads,
//! stores aligned to the destination's cache lines (the first and last 64
//! bytes go unaligned, loaded before anything is stored), 256 bytes per
//! iteration. Measured over every destination offset (16-byte steps) at
//! 2–32 KiB it is faster than `memcpy` on average and in the worst case
//! (4 KiB: mean 43.5 / worst 57 ns against 57 / 131). Past 64 KiB the data
//! no longer stays in cache between copies, and there `memcpy` keeps a
//! small edge while the destination is cache-line aligned (cold copies of
//! 128–512 KiB: 10.9–12.3 GB/s against 10.2–11.9) but drops to 6.8 GB/s
//! when it is not (AVX2: 10.5–11.9); so from 64 KiB to 1 MiB the AVX2 path
//! takes only misaligned destinations. Below 512 bytes, from 1 MiB to
//! [`STREAM_MIN`], without AVX2 or with `OXCCL_KERNEL_ISA=baseline`,
//! `memcpy` runs. From [`STREAM_MIN`] the copy streams (non-temporal
//! stores): a final output that large would not stay cached, and not
//! reading it for ownership saves a third of the traffic (2-rank
//! all_reduce on registered 256 MiB buffers, medians of 7 alternating
//! runs: 5.49 / 6.77 GB/s busbw out of / in place before, 6.43 / 9.92
//! after). Staging a reader takes next ([`copy_cached`]: the
//! shared-memory rings) never streams by size: streamed, the reader
//! fetched it from memory and plain 256 MiB all_reduces got slower (4.04
//! -> 3.33) while the cores shared a cache. (The copy-in's staging
//! streams, through [`copy_streaming`], only while its executor finds
//! the pieces crossing between caches: `comm-core/src/exec/handoff.rs`.)

use crate::Isa;

/// Smallest copy the AVX2 path takes (below it `memcpy`'s small-size paths
/// are as fast).
pub const VECTOR_MIN: usize = 512;
/// Largest copy the AVX2 path takes whatever the destination's alignment.
pub const VECTOR_HOT_MAX: usize = 64 << 10;
/// Largest copy the AVX2 path takes for a destination that is not 64-byte
/// aligned (above it `memcpy` is as fast in every placement).
pub const VECTOR_MAX: usize = 1 << 20;

/// Smallest copy that streams: non-temporal stores, which write the
/// destination to memory without reading it into the cache first. A copy
/// this large evicts its own start before it ends, so caching the
/// destination buys nothing and the read for ownership costs a third of
/// the traffic. (glibc 2.36 streams only from 240 MiB here.)
pub const STREAM_MIN: usize = 4 << 20;

/// Copy `n` bytes from `src` to `dst`.
///
/// # Safety
/// `src` must be valid for `n` bytes of reads, `dst` for `n` bytes of
/// writes, and the two ranges must not overlap.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    copy_with(Isa::detect(), dst, src, n)
}

/// [`copy`] that never streams: for staging that a reader takes next
/// (a shared-memory ring), which should stay in the cache whatever its
/// size.
///
/// # Safety
/// As for [`copy`].
#[inline]
pub unsafe fn copy_cached(dst: *mut u8, src: *const u8, n: usize) {
    cached_with(Isa::detect(), dst, src, n)
}

/// [`copy`] that streams whatever its size (from 4 KiB, with AVX2): for a
/// piece of a large final output that nobody reads soon (the copy-in
/// all-reduce writes its output a piece at a time, each piece smaller
/// than [`STREAM_MIN`] though the output is not).
///
/// # Safety
/// As for [`copy`].
#[inline]
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= 4096 && Isa::detect() >= Isa::Avx2 && Isa::Avx2.is_supported() {
        // SAFETY: AVX2 is supported (checked above); the caller's contract
        // covers the ranges; n >= 4096 > 64.
        return avx2::stream(dst, src, n);
    }
    copy(dst, src, n)
}

/// [`copy`] with an explicit ISA (tests and benchmarks); an ISA the CPU
/// lacks falls back to `memcpy`.
///
/// # Safety
/// As for [`copy`].
#[inline]
pub unsafe fn copy_with(isa: Isa, dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= STREAM_MIN && isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
        // SAFETY: AVX2 is supported (checked above); the caller's contract
        // covers the ranges; n >= STREAM_MIN > 64.
        return avx2::stream(dst, src, n);
    }
    cached_with(isa, dst, src, n)
}

/// [`copy_with`] without streaming.
///
/// # Safety
/// As for [`copy`].
#[inline]
unsafe fn cached_with(isa: Isa, dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    let misaligned = dst as usize & 63 != 0;
    let wanted = (VECTOR_MIN..=VECTOR_HOT_MAX).contains(&n) || (misaligned && n <= VECTOR_MAX);
    if wanted && n >= VECTOR_MIN && isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
        // SAFETY: AVX2 is supported (checked above); the caller's contract
        // covers the ranges; n >= VECTOR_MIN >= 128 as the loop requires.
        return avx2::copy(dst, src, n);
    }
    let _ = isa;
    std::ptr::copy_nonoverlapping(src, dst, n)
}

/// [`copy`] between slices of equal length.
///
/// # Panics
/// If the lengths differ.
pub fn copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "kernels::copy_slice: lengths differ");
    // SAFETY: two slices of `dst.len()` bytes; `&mut` excludes overlap.
    unsafe { copy(dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_storeu_si256, _mm256_stream_si256,
        _mm_sfence,
    };

    /// 256 bytes from `at` (unaligned loads).
    ///
    /// # Safety
    /// AVX2 must be available; `at` must be valid for 256 bytes of reads.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(at: *const u8) -> [__m256i; 8] {
        let ld = |k: usize| _mm256_loadu_si256(at.add(32 * k) as *const __m256i);
        [ld(0), ld(1), ld(2), ld(3), ld(4), ld(5), ld(6), ld(7)]
    }

    /// Copy with non-temporal stores: the bytes up to the destination's
    /// next cache line and after its last whole one go through `memcpy`,
    /// the lines between stream, 256 bytes per iteration; a store fence
    /// orders them before anything the caller stores next (a flag that
    /// tells a peer the data is there).
    ///
    /// # Safety
    /// AVX2 must be available; `n >= 64`; the ranges as for `super::copy`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn stream(dst: *mut u8, src: *const u8, n: usize) {
        let head = (64 - (dst as usize & 63)) & 63;
        std::ptr::copy_nonoverlapping(src, dst, head);
        let body = (n - head) & !63;
        let (d, s) = (dst.add(head), src.add(head));
        let ld = |at: usize| _mm256_loadu_si256(s.add(at) as *const __m256i);
        let mut i = 0;
        while i + 256 <= body {
            let v = load8(s.add(i));
            for (k, v) in v.into_iter().enumerate() {
                // SAFETY: d + i is 64-byte aligned, so each store is 32-byte aligned.
                _mm256_stream_si256(d.add(i + 32 * k) as *mut __m256i, v);
            }
            i += 256;
        }
        while i < body {
            _mm256_stream_si256(d.add(i) as *mut __m256i, ld(i));
            i += 32;
        }
        _mm_sfence();
        std::ptr::copy_nonoverlapping(s.add(body), d.add(body), n - head - body);
    }

    /// # Safety
    /// AVX2 must be available; `n >= 128`; the ranges as for `super::copy`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
        let ld = |at: usize| _mm256_loadu_si256(src.add(at) as *const __m256i);
        // The unaligned ends, loaded first (the ranges do not overlap, so
        // any order is correct; this one keeps the loop's stores aligned).
        let (h0, h1, t0, t1) = (ld(0), ld(32), ld(n - 64), ld(n - 32));
        let end = n - 64;
        // First offset whose destination is 64-byte aligned (1..=64: the
        // head's two stores cover [0, 64)).
        let mut i = 64 - (dst as usize & 63);
        while i + 256 <= end {
            let v = load8(src.add(i));
            for (k, v) in v.into_iter().enumerate() {
                // SAFETY: dst + i is 64-byte aligned, so each store is 32-byte aligned.
                _mm256_store_si256(dst.add(i + 32 * k) as *mut __m256i, v);
            }
            i += 256;
        }
        while i + 32 <= end {
            _mm256_store_si256(dst.add(i) as *mut __m256i, ld(i));
            i += 32;
        }
        if i < end {
            // Fewer than 32 bytes before the tail: one unaligned block
            // ending at `end` covers them (end - 32 >= 0 since n >= 128).
            _mm256_storeu_si256(dst.add(end - 32) as *mut __m256i, ld(end - 32));
        }
        _mm256_storeu_si256(dst as *mut __m256i, h0);
        _mm256_storeu_si256(dst.add(32) as *mut __m256i, h1);
        _mm256_storeu_si256(dst.add(n - 64) as *mut __m256i, t0);
        _mm256_storeu_si256(dst.add(n - 32) as *mut __m256i, t1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the path's edges, every destination and source
    /// alignment within a cache line: the bytes arrive, nothing outside the
    /// destination is written.
    #[test]
    fn copies_every_byte_and_nothing_else_at_every_alignment() {
        const GUARD: usize = 80;
        let lens: Vec<usize> = (0..140)
            .chain(VECTOR_MIN - 3..VECTOR_MIN + 300)
            .chain([4093, 4096, 4099, 8192 + 17, 65536 + 31, 300_001])
            .chain([VECTOR_MAX - 1, VECTOR_MAX, VECTOR_MAX + 1])
            .chain([STREAM_MIN - 1, STREAM_MIN, STREAM_MIN + 33])
            .collect();
        let max = *lens.iter().max().unwrap();
        let src_mem: Vec<u8> = (0..max + 128).map(|i| (i * 131 + 7) as u8).collect();
        let mut dst_mem = vec![0u8; max + 2 * GUARD + 64];
        for isa in Isa::available() {
            for &n in &lens {
                let shifts: &[usize] = if n > 70_000 {
                    &[0, 16, 33]
                } else {
                    &[0, 1, 16, 31, 32, 48, 63]
                };
                let window = &mut dst_mem[..n + 2 * GUARD + 64];
                for &d in shifts {
                    for s in [0usize, 5, 16, 32] {
                        window.fill(0xA5);
                        let at = GUARD + d;
                        // SAFETY: in-bounds, disjoint vectors.
                        unsafe {
                            copy_with(isa, window.as_mut_ptr().add(at), src_mem.as_ptr().add(s), n)
                        };
                        assert!(
                            window[at..at + n] == src_mem[s..s + n],
                            "{isa:?}: {n} bytes to offset {d} from offset {s} differ"
                        );
                        let outside = window[..at].iter().chain(&window[at + n..]);
                        assert!(
                            outside.into_iter().all(|&b| b == 0xA5),
                            "{isa:?}: {n} bytes to offset {d} wrote outside the destination"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn copy_slice_refuses_different_lengths() {
        let r = std::panic::catch_unwind(|| copy_slice(&mut [0u8; 3], &[1u8; 4]));
        assert!(r.is_err());
    }
}
