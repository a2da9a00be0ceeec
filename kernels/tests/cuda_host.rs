//! The CUDA kernels' logic, checked on the CPU: `src/cuda/reduce.cu` is
//! built for the host with g++ and a small shim (`tests/cuda_shim/`: a
//! launch runs every thread of every block in turn, valid for kernels
//! without shared memory or barriers) and compared element by element with
//! the host kernels (`reduce_n` + `div_assign`, the baseline ISA) and, for
//! fp8 and PreMulSum, with an independent reference written here (fp8
//! rounding by searching all 256 codes for the nearest, not by bit
//! tricks). Every dtype × op × 1, 2, 3, 8 sources × aligned and misaligned
//! buffers (vector and scalar paths) × several grid shapes.
//!
//! What only a device can prove is not claimed here: that NVRTC's PTX runs
//! (`cuda_nvrtc.rs` only compiles it), the f16 conversions on a device
//! (there they are the hardware's `cvt` instructions; here the written-out
//! ones), 16-byte vector loads from device memory, and speed.

use kernels::{bf16, div_assign, f16, reduce_n_with, Isa, Op, Scalar};
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The kernels' argument block (`OxArgs`; `kernels::cuda::ReduceArgs`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Args {
    src: [u64; 8],
    dst: u64,
    count: u64,
    nsrc: u32,
    divisor: u32,
    scalar: [u64; 8],
}

type Launch = unsafe extern "C" fn(*const c_void, *const Args, u32, u32);

struct Lib {
    handle: *mut c_void,
    launch: Launch,
}
// SAFETY: the library is loaded once and only read afterwards.
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let out = std::env::temp_dir().join(format!("oxccl-cuda-host-{}.so", std::process::id()));
        let st = std::process::Command::new("g++")
            .args([
                "-O2",
                "-std=c++17",
                "-shared",
                "-fPIC",
                "-Wall",
                "-Werror",
                "-Wno-unknown-pragmas",
            ])
            .arg("-I")
            .arg(dir.join("tests/cuda_shim"))
            .arg("-I")
            .arg(dir.join("src/cuda"))
            .arg(dir.join("tests/cuda_shim/driver.cc"))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("g++ (the host build of the CUDA kernels needs it)");
        assert!(
            st.success(),
            "g++ could not build src/cuda/reduce.cu for the host"
        );
        let path = CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: loading the library just built; its symbols are looked up
        // by name with the types the driver declares.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!handle.is_null(), "dlopen of the host kernels failed");
            let sym = libc::dlsym(handle, c"ox_host_launch".as_ptr());
            assert!(!sym.is_null());
            let _ = std::fs::remove_file(&out);
            Lib {
                handle,
                launch: std::mem::transmute::<*mut c_void, Launch>(sym),
            }
        }
    })
}

/// Runs kernel `name` over host memory as a `grid` × `block` launch.
fn run(name: &str, a: &Args, grid: u32, block: u32) {
    let l = lib();
    let c = CString::new(name).unwrap();
    // SAFETY: the kernel reads `nsrc` sources and writes `dst`, each of
    // `count` elements, all of which the caller allocated.
    unsafe {
        let k = libc::dlsym(l.handle, c.as_ptr());
        assert!(!k.is_null(), "no kernel {name}");
        (l.launch)(k, a, grid, block);
    }
}

/// xorshift: reproducible data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// An element type as this test handles it: its bits in a u64.
trait Elem: Copy + PartialEq + std::fmt::Debug + 'static {
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
trait Fp8 {
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
        let mut best = 0u8;
        for c in 0..=Self::MAX_CODE {
            let (d, db) = ((Self::decode(c) - a).abs(), (Self::decode(best) - a).abs());
            if d < db || (d == db && c & 1 == 0 && best & 1 == 1) {
                best = c;
            }
        }
        sign | best
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
struct E4m3(u8);
#[derive(Clone, Copy, PartialEq, Debug)]
struct E5m2(u8);

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

fn op_name(op: Option<Op>) -> &'static str {
    match op {
        Some(Op::Sum) => "sum",
        Some(Op::Prod) => "prod",
        Some(Op::Min) => "min",
        Some(Op::Max) => "max",
        None => "premulsum",
    }
}

/// 16-byte aligned storage for `n` elements, plus room to misalign.
fn buffer<T: Elem>(n: usize) -> Vec<u128> {
    vec![0u128; (n + 16) * std::mem::size_of::<T>() / 16 + 2]
}

fn at<T: Elem>(b: &mut [u128], offset: usize) -> *mut T {
    // SAFETY: `offset` elements in stays inside the allocation (see buffer).
    unsafe { (b.as_mut_ptr() as *mut T).add(offset) }
}

/// One case: `nsrc` random sources of `count` elements, `offset` elements
/// from 16-byte alignment, through kernel `op` with the given launch.
fn case<T: Elem>(
    rng: &mut Rng,
    op: Option<Op>,
    nsrc: usize,
    count: usize,
    offset: usize,
    divisor: u32,
    launch: (u32, u32),
) {
    let mut srcs: Vec<Vec<u128>> = (0..nsrc).map(|_| buffer::<T>(count)).collect();
    let mut dst = buffer::<T>(count);
    let data: Vec<Vec<T>> = (0..nsrc)
        .map(|_| (0..count).map(|_| T::gen(rng)).collect())
        .collect();
    let scalars: Vec<T> = (0..nsrc).map(|_| T::gen(rng)).collect();
    let mut a = Args {
        count: count as u64,
        nsrc: nsrc as u32,
        divisor,
        ..Args::default()
    };
    for (i, s) in srcs.iter_mut().enumerate() {
        let p = at::<T>(s, offset);
        for (j, x) in data[i].iter().enumerate() {
            // SAFETY: within the buffer.
            unsafe { p.add(j).write(*x) };
        }
        a.src[i] = p as u64;
        a.scalar[i] = scalars[i].bits();
    }
    let out = at::<T>(&mut dst, offset);
    a.dst = out as u64;
    let name = format!("ox_reduce_{}_{}", T::NAME, op_name(op));
    run(&name, &a, launch.0, launch.1);
    for j in 0..count {
        let xs: Vec<T> = data.iter().map(|d| d[j]).collect();
        let want = T::expect(op, &xs, &scalars, divisor);
        // SAFETY: within the buffer.
        let got = unsafe { out.add(j).read() };
        assert!(
            T::same(got, want),
            "{name}: element {j} of {count} ({nsrc} sources, offset {offset}, divisor {divisor}, launch {launch:?}): \
             got {got:?}, want {want:?}, from {xs:?} (factors {scalars:?})"
        );
    }
}

fn matrix<T: Elem>() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ T::NAME.len() as u64);
    let ops = [
        Some(Op::Sum),
        Some(Op::Prod),
        Some(Op::Min),
        Some(Op::Max),
        None,
    ];
    for op in ops {
        for nsrc in [1, 2, 3, 8] {
            for (count, offset, launch) in [
                (0, 0, (1, 1)),
                (1, 0, (1, 1)),
                (37, 0, (2, 3)),
                (37, 1, (2, 3)),
                (1000, 0, (3, 64)),
                (1000, 1, (1, 7)),
            ] {
                for divisor in [1, nsrc as u32] {
                    if divisor > 1 && op != Some(Op::Sum) {
                        continue;
                    }
                    case::<T>(&mut rng, op, nsrc, count, offset, divisor, launch);
                }
            }
        }
    }
}

#[test]
fn integer_kernels_match_the_host_kernels() {
    matrix::<i8>();
    matrix::<u8>();
    matrix::<i32>();
    matrix::<u32>();
    matrix::<i64>();
    matrix::<u64>();
}

#[test]
fn float_kernels_match_the_host_kernels() {
    matrix::<f32>();
    matrix::<f64>();
}

#[test]
fn half_kernels_match_the_host_kernels() {
    matrix::<f16>();
    matrix::<bf16>();
}

#[test]
fn fp8_kernels_match_a_reference_by_search() {
    matrix::<E4m3>();
    matrix::<E5m2>();
}

/// Every pair of codes through sum, prod, min and max: the conversions of
/// both fp8 formats in both directions, exhaustively (256 × 256).
#[test]
fn fp8_every_pair_of_codes() {
    fn pairs<T: Elem + Fp8>(wrap: fn(u8) -> T) {
        let n = 256 * 256;
        let mut a = buffer::<T>(n);
        let mut b = buffer::<T>(n);
        let mut d = buffer::<T>(n);
        let (pa, pb, pd) = (at::<T>(&mut a, 0), at::<T>(&mut b, 0), at::<T>(&mut d, 0));
        for i in 0..n {
            // SAFETY: within the buffers.
            unsafe {
                pa.add(i).write(wrap((i >> 8) as u8));
                pb.add(i).write(wrap(i as u8));
            }
        }
        for op in [Some(Op::Sum), Some(Op::Prod), Some(Op::Min), Some(Op::Max)] {
            let mut args = Args {
                count: n as u64,
                nsrc: 2,
                divisor: 1,
                ..Args::default()
            };
            args.src[0] = pa as u64;
            args.src[1] = pb as u64;
            args.dst = pd as u64;
            let name = format!("ox_reduce_{}_{}", T::NAME, op_name(op));
            run(&name, &args, 4, 128);
            for i in 0..n {
                // SAFETY: within the buffers.
                let (x, y, got) = unsafe { (pa.add(i).read(), pb.add(i).read(), pd.add(i).read()) };
                let want = T::expect(op, &[x, y], &[], 1);
                assert!(
                    T::same(got, want),
                    "{name}: {x:?} {y:?}: got {got:?}, want {want:?}"
                );
            }
        }
    }
    pairs::<E4m3>(E4m3);
    pairs::<E5m2>(E5m2);
}

/// Every f16 and bf16 value through a one-source reduction (widen, then
/// narrow: the identity but for NaN payloads), and random pairs of them
/// summed (the rounding of f32 values that need it).
#[test]
fn halves_every_value_round_trips_and_sums_round_to_nearest_even() {
    fn all<T: Elem>(from_bits: fn(u16) -> T) {
        let n = 1 << 16;
        let mut a = buffer::<T>(n);
        let mut d = buffer::<T>(n);
        let (pa, pd) = (at::<T>(&mut a, 0), at::<T>(&mut d, 0));
        for i in 0..n {
            // SAFETY: within the buffers.
            unsafe { pa.add(i).write(from_bits(i as u16)) };
        }
        let mut args = Args {
            count: n as u64,
            nsrc: 1,
            divisor: 1,
            ..Args::default()
        };
        args.src[0] = pa as u64;
        args.dst = pd as u64;
        let name = format!("ox_reduce_{}_sum", T::NAME);
        run(&name, &args, 8, 256);
        for i in 0..n {
            // SAFETY: within the buffers.
            let (x, got) = unsafe { (pa.add(i).read(), pd.add(i).read()) };
            assert!(T::same(got, x), "{name}: {x:?} came back as {got:?}");
        }
        let mut rng = Rng(7);
        for _ in 0..4 {
            case::<T>(&mut rng, Some(Op::Sum), 2, 4096, 0, 1, (4, 128));
        }
    }
    all::<f16>(f16::from_bits);
    all::<bf16>(bf16::from_bits);
}

/// The copy kernel: bytes, aligned and not, any length.
#[test]
fn the_copy_kernel_copies_bytes() {
    for (len, off) in [
        (0, 0),
        (1, 0),
        (15, 0),
        (16, 0),
        (1000, 0),
        (1000, 3),
        (33, 7),
    ] {
        let src: Vec<u8> = (0..len + 32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; len + 32];
        let base = |p: *const u8| (16 - (p as usize % 16)) % 16;
        let (s, d) = (base(src.as_ptr()) + off, base(dst.as_ptr()) + off);
        let mut a = Args {
            count: len as u64,
            nsrc: 1,
            divisor: 1,
            ..Args::default()
        };
        a.src[0] = src[s..].as_ptr() as u64;
        a.dst = dst[d..].as_mut_ptr() as u64;
        run("ox_copy", &a, 2, 3);
        assert_eq!(
            &dst[d..d + len],
            &src[s..s + len],
            "{len} bytes at offset {off}"
        );
        assert!(dst[..d].iter().all(|x| *x == 0) && dst[d + len..].iter().all(|x| *x == 0));
    }
}
