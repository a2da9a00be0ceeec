//! `kernels` owns the arithmetic of oxccl: element-wise reductions over host
//! slices for every supported element type and reduction operator.
//!
//! Three shapes exist, all element-wise:
//! - [`reduce`]: `dst = a op b` (ring algorithms: a received chunk with a local one),
//! - [`reduce_assign`]: `dst op= src` (in-place variants),
//! - [`reduce_n`]: `dst = op(src_0, .., src_k)` (shared-memory algorithms that
//!   read every rank's contribution at once),
//! - [`reduce_n_fanout`]: the same result written into several destinations
//!   in one pass (a direct all_reduce's owner writing every rank's output).
//!
//! plus [`div_assign`], the final step of `Avg` (sum, then divide by the rank
//! count; integers truncate toward zero like NCCL), and [`copy`], byte copies
//! whose speed does not depend on the buffers' placement.
//!
//! The loops are written once and compiled several times under
//! `#[target_feature]` (AVX2, AVX-512); [`Isa::detect`] picks the best one the
//! running CPU supports, so the default build needs no `target-cpu=native`.
//! `f16` and `bf16` are widened to `f32` block by block, combined in `f32` and
//! rounded to nearest-even once per output element.
//!
//! Semantics (identical on every ISA; the tests compare each ISA to a scalar
//! reference): integers wrap on overflow; `Min`/`Max` on floats propagate NaN
//! (if either input is NaN the result is NaN).

pub mod copy;
#[cfg(feature = "cuda")]
pub mod cuda;
mod fanout;
mod halves;
mod native;

pub use fanout::{reduce_n_fanout, reduce_n_fanout_with};
pub use half::{bf16, f16};
use std::fmt::Debug;
use std::sync::OnceLock;

/// An element-wise reduction operator as the kernels see it. `Avg` is not
/// here: it is `Sum` followed by [`div_assign`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
}

impl Op {
    /// All operators, for tests and benchmarks.
    pub const ALL: [Op; 4] = [Op::Sum, Op::Prod, Op::Min, Op::Max];
}

/// Instruction-set level a kernel runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86-64), no runtime features.
    Baseline,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ.
    Avx512,
}

impl Isa {
    /// Every level the running CPU supports, lowest first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                v.push(Isa::Avx2);
                if std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512dq")
                {
                    v.push(Isa::Avx512);
                }
            }
        }
        v
    }

    /// The best supported level, capped by `OXCCL_KERNEL_ISA`
    /// (`baseline`, `avx2`, `avx512`) when set. Detected once per process.
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = *Isa::available().last().unwrap_or(&Isa::Baseline);
            let cap = match std::env::var("OXCCL_KERNEL_ISA").as_deref() {
                Ok("baseline") | Ok("scalar") => Isa::Baseline,
                Ok("avx2") => Isa::Avx2,
                _ => Isa::Avx512,
            };
            best.min(cap)
        })
    }

    /// Whether the running CPU can execute kernels of this level. Checked
    /// on every kernel call, so it reads a value detected once (no
    /// allocation, no CPUID).
    pub fn is_supported(self) -> bool {
        static BEST: OnceLock<Isa> = OnceLock::new();
        self <= *BEST.get_or_init(|| *Isa::available().last().unwrap_or(&Isa::Baseline))
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type the kernels can reduce. Implemented for `i8 u8 i32 u32 i64
/// u64 f16 bf16 f32 f64`; sealed.
pub trait Scalar:
    Copy + Send + Sync + PartialEq + Debug + Default + 'static + sealed::Sealed
{
    /// `dst = a op b` with the given ISA. Lengths are checked by the caller.
    #[doc(hidden)]
    fn k_binary(isa: Isa, op: Op, dst: &mut [Self], a: &[Self], b: &[Self]);
    /// `dst op= src` with the given ISA.
    #[doc(hidden)]
    fn k_assign(isa: Isa, op: Op, dst: &mut [Self], src: &[Self]);
    /// `dst = op(srcs..)` with the given ISA; `srcs` is non-empty.
    #[doc(hidden)]
    fn k_nway(isa: Isa, op: Op, dst: &mut [Self], srcs: &[&[Self]]);
    /// Elements `from..to` of every destination = op(srcs..), the first
    /// `streamed` destinations streamed past the cache.
    ///
    /// # Safety
    /// `isa` is AVX2 or AVX-512 and supported; `srcs` has at least two
    /// sources; `to - from` is a whole number of 256-byte blocks; every
    /// streamed destination is 64-byte aligned at `from`; the ranges as
    /// for [`reduce_n_fanout`].
    #[doc(hidden)]
    unsafe fn k_fanout(
        isa: Isa,
        op: Op,
        dsts: &[*mut Self],
        streamed: usize,
        srcs: &[*const Self],
        from: usize,
        to: usize,
    );
    /// `x / n` (truncating for integers; computed in f32 and rounded once for halves).
    fn div_count(x: Self, n: usize) -> Self;
}

fn check_len(what: &str, dst: usize, other: usize) {
    assert!(
        dst == other,
        "kernels: {what} has {other} elements but the destination has {dst}"
    );
}

/// Below this many bytes a vector kernel's setup costs more than it saves
/// (an 8-byte all_reduce spent 15 % of its time in the AVX-512 kernel's):
/// the production entry points take the baseline kernel. Every ISA gives
/// the same bits, so ranks need not agree on it.
const TINY: usize = 64;

/// The ISA for `len` elements of `T`: the detected one, baseline when tiny.
fn isa_for<T>(len: usize) -> Isa {
    match len * std::mem::size_of::<T>() < TINY {
        true => Isa::Baseline,
        false => Isa::detect(),
    }
}

/// `dst[i] = a[i] op b[i]`. Panics if the lengths differ.
pub fn reduce<T: Scalar>(op: Op, dst: &mut [T], a: &[T], b: &[T]) {
    reduce_with(isa_for::<T>(dst.len()), op, dst, a, b)
}

/// [`reduce`] with an explicit ISA (tests and benchmarks).
pub fn reduce_with<T: Scalar>(isa: Isa, op: Op, dst: &mut [T], a: &[T], b: &[T]) {
    check_len("operand a", dst.len(), a.len());
    check_len("operand b", dst.len(), b.len());
    assert!(
        isa.is_supported(),
        "kernels: {isa:?} not supported by this CPU"
    );
    T::k_binary(isa, op, dst, a, b)
}

/// `dst[i] = dst[i] op src[i]`. Panics if the lengths differ.
pub fn reduce_assign<T: Scalar>(op: Op, dst: &mut [T], src: &[T]) {
    reduce_assign_with(isa_for::<T>(dst.len()), op, dst, src)
}

/// [`reduce_assign`] with an explicit ISA.
pub fn reduce_assign_with<T: Scalar>(isa: Isa, op: Op, dst: &mut [T], src: &[T]) {
    check_len("source", dst.len(), src.len());
    assert!(
        isa.is_supported(),
        "kernels: {isa:?} not supported by this CPU"
    );
    T::k_assign(isa, op, dst, src)
}

/// `dst[i] = op(srcs[0][i], srcs[1][i], ..)`, combined left to right (so
/// every caller with the same sources in the same order gets the same bits).
/// One source is a copy. Panics if `srcs` is empty or a length differs.
pub fn reduce_n<T: Scalar>(op: Op, dst: &mut [T], srcs: &[&[T]]) {
    reduce_n_with(isa_for::<T>(dst.len()), op, dst, srcs)
}

/// [`reduce_n`] with an explicit ISA.
pub fn reduce_n_with<T: Scalar>(isa: Isa, op: Op, dst: &mut [T], srcs: &[&[T]]) {
    assert!(
        !srcs.is_empty(),
        "kernels: reduce_n needs at least one source"
    );
    for s in srcs {
        check_len("a source", dst.len(), s.len());
    }
    assert!(
        isa.is_supported(),
        "kernels: {isa:?} not supported by this CPU"
    );
    T::k_nway(isa, op, dst, srcs)
}

/// `dst[i] = dst[i] / n`: the last step of an average over `n` ranks.
pub fn div_assign<T: Scalar>(dst: &mut [T], n: usize) {
    assert!(n > 0, "kernels: division by zero ranks");
    if n == 1 {
        return;
    }
    for x in dst.iter_mut() {
        *x = T::div_count(*x, n);
    }
}

/// The scalar definition of one element of `a op b`: the semantics every
/// SIMD path must reproduce bit for bit.
pub fn apply<T: Scalar>(op: Op, a: T, b: T) -> T {
    let mut d = [T::default()];
    T::k_binary(Isa::Baseline, op, &mut d, &[a], &[b]);
    d[0]
}
