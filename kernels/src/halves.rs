//! `f16` and `bf16`: widened to `f32` a block at a time, combined with the
//! native `f32` loops, rounded back to nearest-even once per element.

use crate::native::{assign, binary};
use crate::{sealed::Sealed, Isa, Op, Scalar};
use half::{bf16, f16};

/// Elements per block: three f32 blocks of this size fit in L1 with room.
const BLOCK: usize = 512;

/// A 16-bit float stored as bits, converted to and from f32 per ISA.
trait Half: Copy {
    fn widen(isa: Isa, src: &[Self], dst: &mut [f32]);
    fn narrow(isa: Isa, src: &[f32], dst: &mut [Self]);
}

// ---- bf16: plain bit arithmetic, which every ISA vectorizes ----

#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// Round to nearest even; NaN stays NaN (quieted), as `half::bf16::from_f32`.
#[inline(always)]
fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) | 0x0040) as u16;
    let is_nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if is_nan { quiet_nan } else { rounded })
}

#[inline(always)]
fn bf16_widen_body(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(*s);
    }
}
#[inline(always)]
fn bf16_narrow_body(src: &[f32], dst: &mut [bf16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16(*s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bf16_widen_avx2(src: &[bf16], dst: &mut [f32]) {
    bf16_widen_body(src, dst)
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bf16_narrow_avx2(src: &[f32], dst: &mut [bf16]) {
    bf16_narrow_body(src, dst)
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn bf16_widen_avx512(src: &[bf16], dst: &mut [f32]) {
    bf16_widen_body(src, dst)
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn bf16_narrow_avx512(src: &[f32], dst: &mut [bf16]) {
    bf16_narrow_body(src, dst)
}

impl Half for bf16 {
    fn widen(isa: Isa, src: &[Self], dst: &mut [f32]) {
        match isa {
            // SAFETY: non-baseline ISAs are only passed after `is_supported`.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { bf16_widen_avx2(src, dst) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { bf16_widen_avx512(src, dst) },
            _ => bf16_widen_body(src, dst),
        }
    }
    fn narrow(isa: Isa, src: &[f32], dst: &mut [Self]) {
        match isa {
            // SAFETY: non-baseline ISAs are only passed after `is_supported`.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { bf16_narrow_avx2(src, dst) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { bf16_narrow_avx512(src, dst) },
            _ => bf16_narrow_body(src, dst),
        }
    }
}

// ---- f16: F16C / AVX-512F conversion instructions, `half` otherwise ----

#[cfg(target_arch = "x86_64")]
mod f16_x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds both 8-element accesses.
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn narrow_f16c(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds both 8-element accesses.
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            i += 8;
        }
        for j in i..n {
            dst[j] = f16::from_f32(src[j]);
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn widen_avx512(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n bounds both 16-element accesses.
            let h = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            i += 16;
        }
        widen_f16c(&src[i..n], &mut dst[i..n]);
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn narrow_avx512(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n bounds both 16-element accesses.
            let v = _mm512_loadu_ps(src.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h);
            i += 16;
        }
        narrow_f16c(&src[i..n], &mut dst[i..n]);
    }
}

impl Half for f16 {
    fn widen(isa: Isa, src: &[Self], dst: &mut [f32]) {
        match isa {
            // SAFETY: Avx2 implies F16C (checked in `Isa::available`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { f16_x86::widen_f16c(src, dst) },
            // SAFETY: Avx512 implies AVX-512F and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { f16_x86::widen_avx512(src, dst) },
            _ => {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s.to_f32();
                }
            }
        }
    }
    fn narrow(isa: Isa, src: &[f32], dst: &mut [Self]) {
        match isa {
            // SAFETY: Avx2 implies F16C (checked in `Isa::available`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { f16_x86::narrow_f16c(src, dst) },
            // SAFETY: Avx512 implies AVX-512F and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { f16_x86::narrow_avx512(src, dst) },
            _ => {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = f16::from_f32(*s);
                }
            }
        }
    }
}

fn half_binary<H: Half>(isa: Isa, op: Op, d: &mut [H], a: &[H], b: &[H]) {
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    for (i, dblk) in d.chunks_mut(BLOCK).enumerate() {
        let (s, n) = (i * BLOCK, dblk.len());
        H::widen(isa, &a[s..s + n], &mut fa[..n]);
        H::widen(isa, &b[s..s + n], &mut fb[..n]);
        assign(isa, op, &mut fa[..n], &fb[..n]);
        H::narrow(isa, &fa[..n], dblk);
    }
}

fn half_assign<H: Half>(isa: Isa, op: Op, d: &mut [H], src: &[H]) {
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    for (i, dblk) in d.chunks_mut(BLOCK).enumerate() {
        let (s, n) = (i * BLOCK, dblk.len());
        H::widen(isa, dblk, &mut fa[..n]);
        H::widen(isa, &src[s..s + n], &mut fb[..n]);
        assign(isa, op, &mut fa[..n], &fb[..n]);
        H::narrow(isa, &fa[..n], dblk);
    }
}

/// n-way: the whole combination happens in f32, one rounding at the end.
fn half_nway<H: Half>(isa: Isa, op: Op, d: &mut [H], srcs: &[&[H]]) {
    let mut acc = [0f32; BLOCK];
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    for (i, dblk) in d.chunks_mut(BLOCK).enumerate() {
        let (s, n) = (i * BLOCK, dblk.len());
        if srcs.len() == 1 {
            dblk.copy_from_slice(&srcs[0][s..s + n]);
            continue;
        }
        H::widen(isa, &srcs[0][s..s + n], &mut fa[..n]);
        H::widen(isa, &srcs[1][s..s + n], &mut fb[..n]);
        binary(isa, op, &mut acc[..n], &fa[..n], &fb[..n]);
        for src in &srcs[2..] {
            H::widen(isa, &src[s..s + n], &mut fa[..n]);
            assign(isa, op, &mut acc[..n], &fa[..n]);
        }
        H::narrow(isa, &acc[..n], dblk);
    }
}

/// Streaming fan-out of halves: each block combined by [`half_nway`] (its
/// bits) into an aligned block, then streamed to every destination.
///
/// # Safety
/// As for `Scalar::k_fanout`.
unsafe fn half_fanout<H: Half>(
    isa: Isa,
    op: Op,
    dsts: &[*mut H],
    streamed: usize,
    srcs: &[*const H],
    from: usize,
    to: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::fanout::{store_fence, with_views, write_block, Block, BLOCK};
        let cnt = BLOCK / std::mem::size_of::<H>();
        let mut blk = Block([0; BLOCK]);
        let mut i = from;
        while i < to {
            // SAFETY: the block holds BLOCK bytes, 64-byte aligned, private.
            let acc = std::slice::from_raw_parts_mut(blk.0.as_mut_ptr() as *mut H, cnt);
            with_views(srcs, i, cnt, |v| half_nway(isa, op, acc, v));
            // SAFETY: AVX2 (the caller's contract); streamed destinations
            // are 64-byte aligned at i.
            write_block(dsts, streamed, i, blk.0.as_ptr());
            i += cnt;
        }
        store_fence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "kernels: streaming fan-out needs AVX2 ({isa:?} {op:?} {} ({streamed} streamed) {} {from} {to})",
        dsts.len(),
        srcs.len()
    );
}

macro_rules! half_scalar {
    ($($t:ty),*) => {$(
        impl Sealed for $t {}
        impl Scalar for $t {
            fn k_binary(isa: Isa, op: Op, dst: &mut [Self], a: &[Self], b: &[Self]) { half_binary(isa, op, dst, a, b) }
            fn k_assign(isa: Isa, op: Op, dst: &mut [Self], src: &[Self]) { half_assign(isa, op, dst, src) }
            fn k_nway(isa: Isa, op: Op, dst: &mut [Self], srcs: &[&[Self]]) { half_nway(isa, op, dst, srcs) }
            unsafe fn k_fanout(isa: Isa, op: Op, dsts: &[*mut Self], streamed: usize, srcs: &[*const Self], from: usize, to: usize) { half_fanout(isa, op, dsts, streamed, srcs, from, to) }
            fn div_count(x: Self, n: usize) -> Self { <$t>::from_f32(x.to_f32() / n as f32) }
        }
    )*};
}
half_scalar!(f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half_crate() {
        // Every 2^16-th f32 pattern plus neighbours of rounding boundaries.
        let mut checked = 0;
        for hi in 0..=u16::MAX as u32 {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let x = f32::from_bits((hi << 16) | lo);
                let ours = f32_to_bf16(x);
                let theirs = bf16::from_f32(x);
                if x.is_nan() {
                    assert!(ours.is_nan());
                } else {
                    assert_eq!(
                        ours.to_bits(),
                        theirs.to_bits(),
                        "x = {x:e} ({:#x})",
                        x.to_bits()
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 300_000);
    }

    #[test]
    fn f16_conversions_match_half_crate_on_every_isa() {
        let src: Vec<f32> = (0..=u16::MAX)
            .map(|b| f16::from_bits(b).to_f32())
            .chain((0..70_000u32).map(|i| f32::from_bits(0x3000_0000u32.wrapping_add(i * 9973))))
            .collect();
        for isa in Isa::available() {
            let mut h = vec![f16::ZERO; src.len()];
            f16::narrow(isa, &src, &mut h);
            let mut back = vec![0f32; src.len()];
            f16::widen(isa, &h, &mut back);
            for (i, x) in src.iter().enumerate() {
                let want = f16::from_f32(*x);
                if x.is_nan() {
                    assert!(h[i].is_nan() && back[i].is_nan(), "{isa:?}");
                } else {
                    assert_eq!(h[i].to_bits(), want.to_bits(), "{isa:?} narrow {x:e}");
                    assert_eq!(back[i].to_bits(), want.to_f32().to_bits(), "{isa:?} widen");
                }
            }
        }
    }
}
