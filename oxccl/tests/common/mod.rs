//! In-process harness: threads as ranks over real TCP sockets on loopback,
//! plus exact-valued test data and the references to check it.
#![allow(dead_code)]

use oxccl::prelude::*;
use oxccl::{bf16, f16};
use std::time::Duration;

/// Configuration for tests: loopback only, a deadline that turns a hang
/// into a failure.
pub fn test_config() -> Config {
    Config { socket_ifname: Some("lo".into()), timeout: Duration::from_secs(120), ..Config::default() }
}

/// Run `f` on `n` ranks (one thread each) of a fresh communicator.
pub fn with_ranks<R: Send>(n: usize, cfg: Config, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    let id = UniqueId::with_config(&cfg).expect("root");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, cfg, f) = (&id, cfg.clone(), &f);
                s.spawn(move || f(Communicator::init_with_config(id, r, n, cfg).expect("init")))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

/// Test element: small integers convert exactly into every type.
pub trait TestElem: Element {
    fn from_i(v: i64) -> Self;
    /// `sum / n` the way the library's Avg finishes (trunc for ints).
    fn avg(sum: i64, n: usize) -> Self;
    fn same(a: Self, b: Self) -> bool {
        a == b
    }
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(impl TestElem for $t {
        fn from_i(v: i64) -> Self { v as $t }
        fn avg(sum: i64, n: usize) -> Self { (sum as $t as i128 / n as i128) as $t }
    })*};
}
int_elem!(i8, u8, i32, u32, i64, u64);
impl TestElem for f32 {
    fn from_i(v: i64) -> Self { v as f32 }
    fn avg(sum: i64, n: usize) -> Self { sum as f32 / n as f32 }
}
impl TestElem for f64 {
    fn from_i(v: i64) -> Self { v as f64 }
    fn avg(sum: i64, n: usize) -> Self { sum as f64 / n as f64 }
}
impl TestElem for f16 {
    fn from_i(v: i64) -> Self { f16::from_f32(v as f32) }
    fn avg(sum: i64, n: usize) -> Self { f16::from_f32(sum as f32 / n as f32) }
}
impl TestElem for bf16 {
    fn from_i(v: i64) -> Self { bf16::from_f32(v as f32) }
    fn avg(sum: i64, n: usize) -> Self { bf16::from_f32(sum as f32 / n as f32) }
}

/// Rank `r`'s value at element `i` for operator `op`: chosen so every
/// reduction is exact in every type (sums <= 3*8, products of 1s and 2s).
pub fn value(op: ReduceOp, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => ((r + i) % 4) as i64,
        ReduceOp::Prod => 1 + ((r + i) % 2) as i64,
        ReduceOp::Min | ReduceOp::Max => ((r * 7 + i * 3) % 11) as i64,
    }
}

/// The exact reduction over `n` ranks of element `i` (in i64, wrapping
/// happens in the conversion to the element type like in the library).
pub fn expected<T: TestElem>(op: ReduceOp, n: usize, i: usize) -> T {
    let vals = (0..n).map(|r| value(op, r, i));
    match op {
        ReduceOp::Sum => T::from_i(vals.sum()),
        ReduceOp::Avg => T::avg(vals.sum(), n),
        ReduceOp::Prod => T::from_i(vals.product()),
        ReduceOp::Min => T::from_i(vals.min().unwrap()),
        ReduceOp::Max => T::from_i(vals.max().unwrap()),
    }
}

/// Data of rank `r`, `len` elements starting at global index `base`.
pub fn data<T: TestElem>(op: ReduceOp, r: usize, base: usize, len: usize) -> Vec<T> {
    (base..base + len).map(|i| T::from_i(value(op, r, i))).collect()
}

/// First mismatch, formatted, or None.
pub fn first_diff<T: TestElem>(got: &[T], want: impl Fn(usize) -> T) -> Option<String> {
    got.iter().enumerate().find(|(i, g)| !T::same(**g, want(*i))).map(|(i, g)| format!("element {i}: got {g:?}, want {:?}", want(i)))
}
