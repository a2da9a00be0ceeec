//! Every dtype x op x ISA against an independent scalar reference, with
//! NaN, infinities, signed zeros and integer overflow in the data.

use kernels::{
    bf16, div_assign, f16, reduce_assign_with, reduce_n_with, reduce_with, Isa, Op, Scalar,
};

/// A deterministic generator (xorshift) so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

trait Ref: Scalar {
    fn gen(r: &mut Rng) -> Self;
    fn op(op: Op, a: Self, b: Self) -> Self;
    /// n-way in the reference: halves combine in f32 and round once.
    fn fold(op: Op, xs: &[Self]) -> Self {
        xs[1..].iter().fold(xs[0], |acc, x| Self::op(op, acc, *x))
    }
    fn same(a: Self, b: Self) -> bool;
    fn div(a: Self, n: usize) -> Self;
}

macro_rules! int_ref {
    ($($t:ty),*) => {$(
        impl Ref for $t {
            fn gen(r: &mut Rng) -> Self {
                match r.next() % 8 {
                    0 => <$t>::MAX,
                    1 => <$t>::MIN,
                    2 => 0,
                    _ => r.next() as $t,
                }
            }
            fn op(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                }
            }
            fn same(a: Self, b: Self) -> bool { a == b }
            fn div(a: Self, n: usize) -> Self { (a as i128 / n as i128) as $t }
        }
    )*};
}
int_ref!(i8, u8, i32, u32, i64, u64);

fn float_op(op: Op, a: f64, b: f64) -> f64 {
    if (op == Op::Min || op == Op::Max) && (a.is_nan() || b.is_nan()) {
        return f64::NAN;
    }
    match op {
        Op::Sum => a + b,
        Op::Prod => a * b,
        Op::Min => a.min(b),
        Op::Max => a.max(b),
    }
}

fn special(r: &mut Rng) -> Option<f64> {
    Some(match r.next() % 16 {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => f64::NEG_INFINITY,
        3 => -0.0,
        4 => 0.0,
        5 => 65504.0, // f16 max: sums overflow to inf
        _ => return None,
    })
}

impl Ref for f32 {
    fn gen(r: &mut Rng) -> Self {
        special(r)
            .map(|x| x as f32)
            .unwrap_or_else(|| (r.next() % 20001) as f32 / 7.0 - 1000.0)
    }
    fn op(op: Op, a: Self, b: Self) -> Self {
        float_op(op, a as f64, b as f64) as f32 // exact: f64 holds f32 results then rounds once
    }
    fn same(a: Self, b: Self) -> bool {
        a == b || (a.is_nan() && b.is_nan())
    }
    fn div(a: Self, n: usize) -> Self {
        a / n as f32
    }
}
impl Ref for f64 {
    fn gen(r: &mut Rng) -> Self {
        special(r).unwrap_or_else(|| (r.next() % 2_000_001) as f64 / 3.0 - 300000.0)
    }
    fn op(op: Op, a: Self, b: Self) -> Self {
        float_op(op, a, b)
    }
    fn same(a: Self, b: Self) -> bool {
        a == b || (a.is_nan() && b.is_nan())
    }
    fn div(a: Self, n: usize) -> Self {
        a / n as f64
    }
}
macro_rules! half_ref {
    ($($t:ty),*) => {$(
        impl Ref for $t {
            fn gen(r: &mut Rng) -> Self {
                <$t>::from_f64(special(r).unwrap_or_else(|| (r.next() % 4001) as f64 / 8.0 - 250.0))
            }
            fn op(op: Op, a: Self, b: Self) -> Self {
                <$t>::from_f32(float_op(op, a.to_f64(), b.to_f64()) as f32)
            }
            fn fold(op: Op, xs: &[Self]) -> Self {
                let acc = xs[1..].iter().fold(xs[0].to_f32(), |acc, x| {
                    float_op(op, acc as f64, x.to_f64()) as f32
                });
                <$t>::from_f32(acc)
            }
            fn same(a: Self, b: Self) -> bool { a == b || (a.is_nan() && b.is_nan()) }
            fn div(a: Self, n: usize) -> Self { <$t>::from_f32(a.to_f32() / n as f32) }
        }
    )*};
}
half_ref!(f16, bf16);

fn check_type<T: Ref>(name: &str) {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    // Odd length: exercises every vector width's tail.
    let n = 4099;
    let inputs: Vec<Vec<T>> = (0..5)
        .map(|_| (0..n).map(|_| T::gen(&mut r)).collect())
        .collect();
    for isa in Isa::available() {
        for op in Op::ALL {
            let ctx = format!("{name} {op:?} {isa:?}");
            let mut dst = vec![T::default(); n];
            reduce_with(isa, op, &mut dst, &inputs[0], &inputs[1]);
            for i in 0..n {
                let want = T::op(op, inputs[0][i], inputs[1][i]);
                assert!(
                    T::same(dst[i], want),
                    "{ctx} reduce [{i}]: {:?} op {:?} = {:?}, want {want:?}",
                    inputs[0][i],
                    inputs[1][i],
                    dst[i]
                );
            }
            let mut acc = inputs[2].clone();
            reduce_assign_with(isa, op, &mut acc, &inputs[3]);
            for i in 0..n {
                let want = T::op(op, inputs[2][i], inputs[3][i]);
                assert!(
                    T::same(acc[i], want),
                    "{ctx} assign [{i}]: got {:?} want {want:?}",
                    acc[i]
                );
            }
            for k in 1..=5 {
                let srcs: Vec<&[T]> = inputs[..k].iter().map(|v| v.as_slice()).collect();
                reduce_n_with(isa, op, &mut dst, &srcs);
                for i in 0..n {
                    let col: Vec<T> = inputs[..k].iter().map(|v| v[i]).collect();
                    let want = T::fold(op, &col);
                    assert!(
                        T::same(dst[i], want),
                        "{ctx} nway k={k} [{i}]: got {:?} want {want:?}",
                        dst[i]
                    );
                }
            }
        }
    }
    for ranks in [1, 2, 3, 7] {
        let mut d = inputs[4].clone();
        div_assign(&mut d, ranks);
        for i in 0..n {
            let want = T::div(inputs[4][i], ranks);
            assert!(
                T::same(d[i], want),
                "{name} div by {ranks} [{i}]: got {:?} want {want:?}",
                d[i]
            );
        }
    }
}

#[test]
fn i8_all_ops() {
    check_type::<i8>("i8")
}
#[test]
fn u8_all_ops() {
    check_type::<u8>("u8")
}
#[test]
fn i32_all_ops() {
    check_type::<i32>("i32")
}
#[test]
fn u32_all_ops() {
    check_type::<u32>("u32")
}
#[test]
fn i64_all_ops() {
    check_type::<i64>("i64")
}
#[test]
fn u64_all_ops() {
    check_type::<u64>("u64")
}
#[test]
fn f16_all_ops() {
    check_type::<f16>("f16")
}
#[test]
fn bf16_all_ops() {
    check_type::<bf16>("bf16")
}
#[test]
fn f32_all_ops() {
    check_type::<f32>("f32")
}
#[test]
fn f64_all_ops() {
    check_type::<f64>("f64")
}

#[test]
fn integer_overflow_wraps_and_avg_truncates() {
    let mut d = [i8::MAX, i8::MIN, -7];
    reduce_assign_with(Isa::detect(), Op::Sum, &mut d, &[1, -1, 0]);
    assert_eq!(d, [i8::MIN, i8::MAX, -7]);
    div_assign(&mut d, 2);
    assert_eq!(d, [-64, 63, -3]);
}

#[test]
fn nan_propagates_through_min_and_max_in_either_position() {
    for isa in Isa::available() {
        for op in [Op::Min, Op::Max] {
            let mut d = [0f32; 2];
            reduce_with(isa, op, &mut d, &[f32::NAN, 1.0], &[1.0, f32::NAN]);
            assert!(d[0].is_nan() && d[1].is_nan(), "{isa:?} {op:?}: {d:?}");
        }
    }
}
