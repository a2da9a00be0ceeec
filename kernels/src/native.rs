//! Reductions on types the CPU computes natively (integers, f32, f64). One
//! generic loop per shape, instantiated under each ISA's target features so
//! the compiler vectorizes it for that ISA.

#[cfg(target_arch = "x86_64")]
use crate::fanout::{store_fence, write_block, Block, BLOCK};
use crate::{sealed::Sealed, Isa, Op, Scalar};

/// Element-wise operators of one native type.
pub(crate) trait Native: Copy {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
}

macro_rules! native_int {
    ($($t:ty => $wide:ty),*) => {$(
        impl Native for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
        }
        impl Sealed for $t {}
        impl Scalar for $t {
            fn k_binary(isa: Isa, op: Op, dst: &mut [Self], a: &[Self], b: &[Self]) { binary(isa, op, dst, a, b) }
            fn k_assign(isa: Isa, op: Op, dst: &mut [Self], src: &[Self]) { assign(isa, op, dst, src) }
            fn k_nway(isa: Isa, op: Op, dst: &mut [Self], srcs: &[&[Self]]) { nway(isa, op, dst, srcs) }
            unsafe fn k_fanout(isa: Isa, op: Op, dsts: &[*mut Self], streamed: usize, srcs: &[*const Self], from: usize, to: usize) { fanout(isa, op, dsts, streamed, srcs, from, to) }
            fn div_count(x: Self, n: usize) -> Self { (x as $wide / n as $wide) as $t }
        }
    )*};
}
native_int!(i8 => i64, u8 => u64, i32 => i64, u32 => u64, i64 => i128, u64 => u64);

macro_rules! native_float {
    ($($t:ty),*) => {$(
        impl Native for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn min(a: Self, b: Self) -> Self {
                let r = if b < a { b } else { a };
                if b.is_nan() { b } else { r }
            }
            #[inline(always)] fn max(a: Self, b: Self) -> Self {
                let r = if b > a { b } else { a };
                if b.is_nan() { b } else { r }
            }
        }
        impl Sealed for $t {}
        impl Scalar for $t {
            fn k_binary(isa: Isa, op: Op, dst: &mut [Self], a: &[Self], b: &[Self]) { binary(isa, op, dst, a, b) }
            fn k_assign(isa: Isa, op: Op, dst: &mut [Self], src: &[Self]) { assign(isa, op, dst, src) }
            fn k_nway(isa: Isa, op: Op, dst: &mut [Self], srcs: &[&[Self]]) { nway(isa, op, dst, srcs) }
            unsafe fn k_fanout(isa: Isa, op: Op, dsts: &[*mut Self], streamed: usize, srcs: &[*const Self], from: usize, to: usize) { fanout(isa, op, dsts, streamed, srcs, from, to) }
            fn div_count(x: Self, n: usize) -> Self { x / n as $t }
        }
    )*};
}
native_float!(f32, f64);

#[inline(always)]
fn assign_body<T: Native>(op: Op, d: &mut [T], s: &[T]) {
    let s = &s[..d.len()];
    macro_rules! each {
        ($f:path) => {
            for (x, y) in d.iter_mut().zip(s) {
                *x = $f(*x, *y)
            }
        };
    }
    match op {
        Op::Sum => each!(T::sum),
        Op::Prod => each!(T::prod),
        Op::Min => each!(T::min),
        Op::Max => each!(T::max),
    }
}

#[inline(always)]
fn binary_body<T: Native>(op: Op, d: &mut [T], a: &[T], b: &[T]) {
    let a = &a[..d.len()];
    let b = &b[..d.len()];
    macro_rules! each {
        ($f:path) => {
            for ((x, y), z) in d.iter_mut().zip(a).zip(b) {
                *x = $f(*y, *z)
            }
        };
    }
    match op {
        Op::Sum => each!(T::sum),
        Op::Prod => each!(T::prod),
        Op::Min => each!(T::min),
        Op::Max => each!(T::max),
    }
}

fn assign_base<T: Native>(op: Op, d: &mut [T], s: &[T]) {
    assign_body(op, d, s)
}
fn binary_base<T: Native>(op: Op, d: &mut [T], a: &[T], b: &[T]) {
    binary_body(op, d, a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn assign_avx2<T: Native>(op: Op, d: &mut [T], s: &[T]) {
    assign_body(op, d, s)
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn binary_avx2<T: Native>(op: Op, d: &mut [T], a: &[T], b: &[T]) {
    binary_body(op, d, a, b)
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn assign_avx512<T: Native>(op: Op, d: &mut [T], s: &[T]) {
    assign_body(op, d, s)
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn binary_avx512<T: Native>(op: Op, d: &mut [T], a: &[T], b: &[T]) {
    binary_body(op, d, a, b)
}

/// `d op= s` on the given ISA (the caller checked that the CPU supports it).
pub(crate) fn assign<T: Native>(isa: Isa, op: Op, d: &mut [T], s: &[T]) {
    match isa {
        Isa::Baseline => assign_base(op, d, s),
        // SAFETY: `Isa` values other than Baseline are only used after
        // `Isa::is_supported` confirmed the CPU has these features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { assign_avx2(op, d, s) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { assign_avx512(op, d, s) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => assign_base(op, d, s),
    }
}

/// `d = a op b` on the given ISA.
pub(crate) fn binary<T: Native>(isa: Isa, op: Op, d: &mut [T], a: &[T], b: &[T]) {
    match isa {
        Isa::Baseline => binary_base(op, d, a, b),
        // SAFETY: see `assign`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { binary_avx2(op, d, a, b) },
        // SAFETY: see `assign`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { binary_avx512(op, d, a, b) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => binary_base(op, d, a, b),
    }
}

/// Elements per block of the n-way reduction: the destination block stays in
/// L1 while every source streams through it once.
const NWAY_BLOCK: usize = 2048;

/// `d = op(srcs..)`, block by block so `d` is written to memory once.
pub(crate) fn nway<T: Native>(isa: Isa, op: Op, d: &mut [T], srcs: &[&[T]]) {
    if srcs.len() == 1 {
        d.copy_from_slice(srcs[0]);
        return;
    }
    let mut start = 0;
    for block in d.chunks_mut(NWAY_BLOCK) {
        let end = start + block.len();
        binary(isa, op, block, &srcs[0][start..end], &srcs[1][start..end]);
        for s in &srcs[2..] {
            assign(isa, op, block, &s[start..end]);
        }
        start = end;
    }
}

/// One block at a time: combine it in registers (the same fold as
/// [`nway`]: `s0 op s1`, then each further source) and write it to every
/// destination, the first `streamed` past the cache (see `fanout.rs`).
///
/// # Safety
/// AVX2 available; as for `Scalar::k_fanout`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fanout_loop<T: Native>(
    f: impl Fn(T, T) -> T + Copy,
    dsts: &[*mut T],
    streamed: usize,
    srcs: &[*const T],
    from: usize,
    to: usize,
) {
    let cnt = BLOCK / std::mem::size_of::<T>();
    let mut blk = Block([0; BLOCK]);
    let acc = blk.0.as_mut_ptr() as *mut T;
    let mut i = from;
    while i < to {
        let (a, b) = (srcs[0].add(i), srcs[1].add(i));
        for j in 0..cnt {
            *acc.add(j) = f(*a.add(j), *b.add(j));
        }
        for s in &srcs[2..] {
            let s = s.add(i);
            for j in 0..cnt {
                *acc.add(j) = f(*acc.add(j), *s.add(j));
            }
        }
        write_block(dsts, streamed, i, acc as *const u8);
        i += cnt;
    }
    store_fence();
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fanout_body<T: Native>(
    op: Op,
    dsts: &[*mut T],
    streamed: usize,
    srcs: &[*const T],
    from: usize,
    to: usize,
) {
    match op {
        Op::Sum => fanout_loop(T::sum, dsts, streamed, srcs, from, to),
        Op::Prod => fanout_loop(T::prod, dsts, streamed, srcs, from, to),
        Op::Min => fanout_loop(T::min, dsts, streamed, srcs, from, to),
        Op::Max => fanout_loop(T::max, dsts, streamed, srcs, from, to),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fanout_avx2<T: Native>(
    op: Op,
    dsts: &[*mut T],
    streamed: usize,
    srcs: &[*const T],
    from: usize,
    to: usize,
) {
    fanout_body(op, dsts, streamed, srcs, from, to)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn fanout_avx512<T: Native>(
    op: Op,
    dsts: &[*mut T],
    streamed: usize,
    srcs: &[*const T],
    from: usize,
    to: usize,
) {
    fanout_body(op, dsts, streamed, srcs, from, to)
}

/// Elements `from..to` of every destination, the first `streamed` streamed
/// (`Scalar::k_fanout`).
///
/// # Safety
/// As for `Scalar::k_fanout`.
pub(crate) unsafe fn fanout<T: Native>(
    isa: Isa,
    op: Op,
    dsts: &[*mut T],
    streamed: usize,
    srcs: &[*const T],
    from: usize,
    to: usize,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => fanout_avx2(op, dsts, streamed, srcs, from, to),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => fanout_avx512(op, dsts, streamed, srcs, from, to),
        _ => unreachable!("kernels: streaming fan-out needs AVX2"),
    }
}
