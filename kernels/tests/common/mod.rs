//! What the CUDA kernel checks share, on the CPU (`cuda_host.rs`, the
//! kernel source built with g++) and on a GPU (`cuda_device.rs`): element
//! types with their expected results (the host kernels for the host's
//! dtypes; for fp8 and PreMulSum a reference written here, fp8 rounding by
//! searching all 256 codes), and the matrix of cases, run through a
//! [`Runner`] that owns the memory and the launch.
#![allow(dead_code)]

use kernels::{bf16, div_assign, f16, reduce_n_with, Isa, Op, Scalar};

/// Runs one kernel: copies the sources in (each `offset` elements past a
/// 16-byte boundary), launches `kernel` over `count` elements as `grid`
/// blocks of `block` threads, and returns the destination's bytes.
pub trait Runner {
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        kernel: &str,
        elem: usize,
        srcs: &[Vec<u8>],
        count: usize,
        offset: usize,
        divisor: u32,
        scalars: &[u64],
        launch: (u32, u32),
    ) -> Vec<u8>;
}

/// The kernels' argument block (`OxArgs`; `kernels::cuda::ReduceArgs`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Args {
    pub src: [u64; 8],
    pub dst: u64,
    pub count: u64,
    pub nsrc: u32,
    pub divisor: u32,
    pub scalar: [u64; 8],
}

pub fn to_bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    // SAFETY: any initialised value's bytes may be read.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        .to_vec()
}

pub fn from_bytes<T: Copy>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    (0..n)
        // SAFETY: the element types here are plain data, valid for any bits.
        .map(|i| unsafe { (b.as_ptr() as *const T).add(i).read_unaligned() })
        .collect()
}

/// xorshift: reproducible data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// An element type as this test handles it: its bits in a u64.
pub trait Elem: Copy + PartialEq + std::fmt::Debug + 'static {
    const NAME: &'static str;
    fn gen(r: &mut Rng) -> Self;
    fn is_nan(self) -> bool {
        false
    }
    fn same(a: Self, b: Self) -> bool {
        a == b || (a.is_nan() && b.is_nan())
    }
    fn bits(self) -> u64;
    /// The expected result of `op` (Avg: `divisor` > 1) over `xs`, one
    /// element per source, with PreMulSum factors `s`.
    fn expect(op: Option<Op>, xs: &[Self], s: &[Self], divisor: u32) -> Self;
}

/// The host kernels' answer for one element.
fn host<T: Scalar>(op: Op, xs: &[T], divisor: u32) -> T {
    let srcs: Vec<[T; 1]> = xs.iter().map(|x| [*x]).collect();
    let refs: Vec<&[T]> = srcs.iter().map(|s| &s[..]).collect();
    let mut d = [T::default()];
    reduce_n_with(Isa::Baseline, op, &mut d, &refs);
    div_assign(&mut d, divisor as usize);
    d[0]
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = stringify!($t);
            fn gen(r: &mut Rng) -> Self {
                match r.next() % 8 {
                    0 => <$t>::MAX,
                    1 => <$t>::MIN,
                    2 => 0,
                    3 => (r.next() % 7) as $t,
                    _ => r.next() as $t,
                }
            }
            fn bits(self) -> u64 { self as u64 }
            fn expect(op: Option<Op>, xs: &[Self], s: &[Self], divisor: u32) -> Self {
                match op {
                    Some(op) => host(op, xs, divisor),
                    None => {
                        let mut acc = s[0].wrapping_mul(xs[0]);
                        for (x, f) in xs[1..].iter().zip(&s[1..]) {
                            acc = acc.wrapping_add(f.wrapping_mul(*x));
                        }
                        host(Op::Sum, &[acc], divisor)
                    }
                }
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty => $bits:ty),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = stringify!($t);
            fn gen(r: &mut Rng) -> Self {
                match r.next() % 16 {
                    0 => <$t>::NAN,
                    1 => <$t>::INFINITY,
                    2 => <$t>::NEG_INFINITY,
                    3 => 0.0,
                    4 => -0.0,
                    5 => <$t>::MIN_POSITIVE / 4.0, // subnormal
                    6 => <$t>::from_bits(r.next() as $bits), // any bits
                    _ => ((r.next() % 20000) as $t - 10000.0) / 64.0,
                }
            }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            fn same(a: Self, b: Self) -> bool { a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) }
            fn bits(self) -> u64 { self.to_bits() as u64 }
            fn expect(op: Option<Op>, xs: &[Self], s: &[Self], divisor: u32) -> Self {
                match op {
                    Some(op) => host(op, xs, divisor),
                    None => {
                        let mut acc = s[0] * xs[0];
                        for (x, f) in xs[1..].iter().zip(&s[1..]) {
                            acc += f * x;
                        }
                        host(Op::Sum, &[acc], divisor)
                    }
                }
            }
        }
    )*};
}
float_elem!(f32 => u32, f64 => u64);

macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = stringify!($t);
            fn gen(r: &mut Rng) -> Self {
                match r.next() % 8 {
                    0 => <$t>::NAN,
                    1 => <$t>::INFINITY,
                    2 => <$t>::NEG_ZERO,
                    _ => <$t>::from_bits(r.next() as u16),
                }
            }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            fn same(a: Self, b: Self) -> bool { a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) }
            fn bits(self) -> u64 { self.to_bits() as u64 }
            fn expect(op: Option<Op>, xs: &[Self], s: &[Self], divisor: u32) -> Self {
                match op {
                    Some(op) => host(op, xs, divisor),
                    None => {
                        let mut acc = s[0].to_f32() * xs[0].to_f32();
                        for (x, f) in xs[1..].iter().zip(&s[1..]) {
                            acc += f.to_f32() * x.to_f32();
                        }
                        host(Op::Sum, &[<$t>::from_f32(acc)], divisor)
                    }
                }
            }
        }
    )*};
}
half_elem!(f16, bf16);

/// An fp8 format, decoded and encoded from first principles.
pub trait Fp8 {
    const MANT: u32;
    const BIAS: i32;
    /// Whether the format has infinities (e5m2) or not (e4m3).
    const INF: bool;
    const MAX_CODE: u8;

    fn decode(code: u8) -> f64 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code & 0x7f) >> Self::MANT) as i32;
        let m = (code & ((1 << Self::MANT) - 1)) as f64;
        let emax: i32 = 0x7f >> Self::MANT;
        let scale = (1u32 << Self::MANT) as f64;
        if Self::INF && e == emax {
            return if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if !Self::INF && (code & 0x7f) == 0x7f {
            return f64::NAN;
        }
        if e == 0 {
            return sign * m / scale * 2f64.powi(1 - Self::BIAS);
        }
        sign * (1.0 + m / scale) * 2f64.powi(e - Self::BIAS)
    }

    /// Round to nearest, ties to even, saturating to the largest finite
    /// value; NaN to a NaN code. By search over every code.
    fn encode(x: f32) -> u8 {
        if x.is_nan() {
            return 0x7f;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = (x as f64).abs();
        if a > Self::decode(Self::MAX_CODE) {
            return sign | Self::MAX_CODE;
        }
        let values = positive_values::<Self>();
        let mut best = 0u8;
        for c in 0..=Self::MAX_CODE {
            let (d, db) = (
                (values[c as usize] - a).abs(),
                (values[best as usize] - a).abs(),
            );
            if d < db || (d == db && c & 1 == 0 && best & 1 == 1) {
                best = c;
            }
        }
        sign | best
    }
}

/// The values of a format's non-negative finite codes, decoded once.
fn positive_values<F: Fp8 + ?Sized>() -> &'static [f64] {
    static E4M3: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    static E5M2: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    let cell = if F::INF { &E5M2 } else { &E4M3 };
    cell.get_or_init(|| (0..=F::MAX_CODE).map(F::decode).collect())
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub struct E4m3(pub u8);
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct E5m2(pub u8);

impl Fp8 for E4m3 {
    const MANT: u32 = 3;
    const BIAS: i32 = 7;
    const INF: bool = false;
    const MAX_CODE: u8 = 0x7e;
}
impl Fp8 for E5m2 {
    const MANT: u32 = 2;
    const BIAS: i32 = 15;
    const INF: bool = true;
    const MAX_CODE: u8 = 0x7b;
}

fn fp8_fold<F: Fp8>(op: Option<Op>, xs: &[u8], s: &[u8], divisor: u32) -> u8 {
    let w = |c: u8| F::decode(c) as f32;
    let mut acc = match op {
        None => w(s[0]) * w(xs[0]),
        _ => w(xs[0]),
    };
    for (i, x) in xs.iter().enumerate().skip(1) {
        let v = w(*x);
        acc = match op {
            Some(Op::Sum) => acc + v,
            Some(Op::Prod) => acc * v,
            Some(Op::Min) if v.is_nan() => v,
            Some(Op::Min) => {
                if v < acc {
                    v
                } else {
                    acc
                }
            }
            Some(Op::Max) if v.is_nan() => v,
            Some(Op::Max) => {
                if v > acc {
                    v
                } else {
                    acc
                }
            }
            None => acc + w(s[i]) * v,
        };
    }
    let out = F::encode(acc);
    if divisor > 1 {
        F::encode(w(out) / divisor as f32)
    } else {
        out
    }
}

macro_rules! fp8_elem {
    ($($t:ident: $name:literal),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = $name;
            fn gen(r: &mut Rng) -> Self { $t(r.next() as u8) }
            fn is_nan(self) -> bool { <$t as Fp8>::decode(self.0).is_nan() }
            fn bits(self) -> u64 { self.0 as u64 }
            fn expect(op: Option<Op>, xs: &[Self], s: &[Self], divisor: u32) -> Self {
                let xs: Vec<u8> = xs.iter().map(|x| x.0).collect();
                let s: Vec<u8> = s.iter().map(|x| x.0).collect();
                $t(fp8_fold::<$t>(op, &xs, &s, divisor))
            }
        }
    )*};
}
fp8_elem!(E4m3: "f8e4m3", E5m2: "f8e5m2");

pub fn op_name(op: Option<Op>) -> &'static str {
    match op {
        Some(Op::Sum) => "sum",
        Some(Op::Prod) => "prod",
        Some(Op::Min) => "min",
        Some(Op::Max) => "max",
        None => "premulsum",
    }
}

/// One case: `nsrc` random sources of `count` elements, `offset` elements
/// from 16-byte alignment, through kernel `op` with the given launch.
#[allow(clippy::too_many_arguments)]
pub fn case<T: Elem>(
    r: &dyn Runner,
    rng: &mut Rng,
    op: Option<Op>,
    nsrc: usize,
    count: usize,
    offset: usize,
    divisor: u32,
    launch: (u32, u32),
) {
    let data: Vec<Vec<T>> = (0..nsrc)
        .map(|_| (0..count).map(|_| T::gen(rng)).collect())
        .collect();
    let scalars: Vec<T> = (0..nsrc).map(|_| T::gen(rng)).collect();
    check(r, op, &data, &scalars, offset, divisor, launch);
}

/// Runs `op` over `data` (one vector per source) and compares every
/// element with the expected result.
pub fn check<T: Elem>(
    r: &dyn Runner,
    op: Option<Op>,
    data: &[Vec<T>],
    scalars: &[T],
    offset: usize,
    divisor: u32,
    launch: (u32, u32),
) {
    let count = data[0].len();
    let name = format!("ox_reduce_{}_{}", T::NAME, op_name(op));
    let srcs: Vec<Vec<u8>> = data.iter().map(|d| to_bytes(d)).collect();
    let bits: Vec<u64> = scalars.iter().map(|s| s.bits()).collect();
    let out = r.reduce(
        &name,
        std::mem::size_of::<T>(),
        &srcs,
        count,
        offset,
        divisor,
        &bits,
        launch,
    );
    let got: Vec<T> = from_bytes(&out);
    assert_eq!(got.len(), count);
    for j in 0..count {
        let xs: Vec<T> = data.iter().map(|d| d[j]).collect();
        let want = T::expect(op, &xs, scalars, divisor);
        assert!(
            T::same(got[j], want),
            "{name}: element {j} of {count} ({} sources, offset {offset}, divisor {divisor}, launch {launch:?}): \
             got {:?}, want {want:?}, from {xs:?} (factors {scalars:?})",
            data.len(),
            got[j]
        );
    }
}

/// Every op × 1, 2, 3, 8 sources × lengths and alignments that take the
/// vector path, the scalar path or both × launches of several shapes.
pub fn matrix<T: Elem>(r: &dyn Runner) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ T::NAME.len() as u64);
    let ops = [
        Some(Op::Sum),
        Some(Op::Prod),
        Some(Op::Min),
        Some(Op::Max),
        None,
    ];
    let shapes = [
        (0, 0, (1, 1)),
        (1, 0, (1, 1)),
        (37, 0, (2, 3)),
        (37, 1, (2, 3)),
        (1000, 0, (3, 64)),
        (1000, 1, (1, 7)),
        (100_003, 0, (5, 512)),
    ];
    for op in ops {
        for nsrc in [1, 2, 3, 8] {
            for (count, offset, launch) in shapes {
                for divisor in [1, nsrc as u32] {
                    if divisor > 1 && op != Some(Op::Sum) {
                        continue;
                    }
                    case::<T>(r, &mut rng, op, nsrc, count, offset, divisor, launch);
                }
            }
        }
    }
}

/// Every dtype's matrix.
pub fn all_matrices(r: &dyn Runner) {
    matrix::<i8>(r);
    matrix::<u8>(r);
    matrix::<i32>(r);
    matrix::<u32>(r);
    matrix::<i64>(r);
    matrix::<u64>(r);
    matrix::<f32>(r);
    matrix::<f64>(r);
    matrix::<f16>(r);
    matrix::<bf16>(r);
    matrix::<E4m3>(r);
    matrix::<E5m2>(r);
}

/// Every pair of fp8 codes through sum, prod, min and max: both formats'
/// conversions in both directions, exhaustively (256 × 256).
pub fn fp8_pairs(r: &dyn Runner) {
    fn pairs<T: Elem>(r: &dyn Runner, wrap: fn(u8) -> T) {
        let a: Vec<T> = (0..1 << 16).map(|i: u32| wrap((i >> 8) as u8)).collect();
        let b: Vec<T> = (0..1 << 16).map(|i: u32| wrap(i as u8)).collect();
        for op in [Some(Op::Sum), Some(Op::Prod), Some(Op::Min), Some(Op::Max)] {
            check(
                r,
                op,
                &[a.clone(), b.clone()],
                &[wrap(0), wrap(0)],
                0,
                1,
                (4, 128),
            );
        }
    }
    pairs::<E4m3>(r, E4m3);
    pairs::<E5m2>(r, E5m2);
}

/// Every f16 and bf16 value through a one-source reduction (widen, then
/// narrow: the identity but for NaN payloads), and random pairs summed
/// (the rounding of f32 values that need it).
pub fn halves_round_trip(r: &dyn Runner) {
    fn all<T: Elem>(r: &dyn Runner, from_bits: fn(u16) -> T) {
        let every: Vec<T> = (0..=u16::MAX).map(from_bits).collect();
        let name = format!("ox_reduce_{}_sum", T::NAME);
        let out: Vec<T> = from_bytes(&r.reduce(
            &name,
            2,
            &[to_bytes(&every)],
            every.len(),
            0,
            1,
            &[0],
            (8, 256),
        ));
        for (x, got) in every.iter().zip(&out) {
            assert!(T::same(*got, *x), "{name}: {x:?} came back as {got:?}");
        }
        let mut rng = Rng(7);
        for _ in 0..4 {
            case::<T>(r, &mut rng, Some(Op::Sum), 2, 4096, 0, 1, (4, 128));
        }
    }
    all::<f16>(r, f16::from_bits);
    all::<bf16>(r, bf16::from_bits);
}

/// The copy kernel: bytes, aligned and not, any length.
pub fn copies(r: &dyn Runner) {
    for (len, off) in [
        (0, 0),
        (1, 0),
        (15, 0),
        (16, 0),
        (1000, 0),
        (1000, 3),
        (33, 7),
        (1 << 20, 0),
    ] {
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let out = r.reduce(
            "ox_copy",
            1,
            std::slice::from_ref(&src),
            len,
            off,
            1,
            &[0],
            (2, 3),
        );
        assert_eq!(out, src, "{len} bytes at offset {off}");
    }
}
