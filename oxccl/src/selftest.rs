//! A self-test of every collective with exact-valued data: every dtype x
//! op x count, in place and out of place, each element compared with `==`
//! against an exact reference. Used by the test suite (threads as ranks)
//! and by `oxccl-selftest matrix` (processes under a launcher); useful to
//! check an installation the way nccl-tests' `-c 1` does.

use crate::{bf16, f16, Communicator, Element, ReduceOp};

fn err(e: crate::Error) -> String {
    e.to_string()
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
    fn from_i(v: i64) -> Self {
        v as f32
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f32 / n as f32
    }
}
impl TestElem for f64 {
    fn from_i(v: i64) -> Self {
        v as f64
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f64 / n as f64
    }
}
impl TestElem for f16 {
    fn from_i(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        f16::from_f32(sum as f32 / n as f32)
    }
}
impl TestElem for bf16 {
    fn from_i(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        bf16::from_f32(sum as f32 / n as f32)
    }
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
    (base..base + len)
        .map(|i| T::from_i(value(op, r, i)))
        .collect()
}

/// First mismatch, formatted, or None.
pub fn first_diff<T: TestElem>(got: &[T], want: impl Fn(usize) -> T) -> Option<String> {
    got.iter()
        .enumerate()
        .find(|(i, g)| !T::same(**g, want(*i)))
        .map(|(i, g)| format!("element {i}: got {g:?}, want {:?}", want(i)))
}

/// The counts the matrix uses for `n` ranks: 0, 1, 7, n-1, n+1, 1 000 003.
pub fn standard_counts(n: usize) -> Vec<usize> {
    let mut v = vec![0, 1, 7, n - 1, n + 1, 1_000_003];
    v.sort();
    v.dedup();
    v
}

/// For collectives whose count is per rank (all_gather, reduce_scatter,
/// all_to_all), large counts are divided by `n` so the total stays near
/// the requested size (and still not divisible by `n`).
fn per_rank(count: usize, n: usize) -> usize {
    if count > 1000 {
        count / n
    } else {
        count
    }
}

fn check_type<T: TestElem>(comm: &Communicator, counts: &[usize]) -> Result<(), String> {
    let (r, n) = (comm.rank(), comm.nranks());
    let name = T::DTYPE;
    let fail = |what: &str, d: String| {
        let m = format!("rank {r}/{n} {name} {what}: {d}");
        eprintln!("selftest failure: {m}");
        Err(m)
    };
    for &count in counts {
        for (oi, op) in ReduceOp::ALL.into_iter().enumerate() {
            let root = (oi + count) % n;
            let input: Vec<T> = data(op, r, 0, count);
            // all_reduce
            let mut out = vec![T::default(); count];
            comm.all_reduce(&input, &mut out, op).map_err(err)?;
            if let Some(d) = first_diff(&out, |i| expected(op, n, i)) {
                return fail(&format!("all_reduce {op} count {count}"), d);
            }
            let mut buf = input.clone();
            comm.all_reduce_in_place(&mut buf, op).map_err(err)?;
            if let Some(d) = first_diff(&buf, |i| expected(op, n, i)) {
                return fail(&format!("all_reduce in-place {op} count {count}"), d);
            }
            // reduce
            let mut out = vec![T::default(); if r == root { count } else { 0 }];
            comm.reduce(&input, &mut out, op, root).map_err(err)?;
            if r == root {
                if let Some(d) = first_diff(&out, |i| expected(op, n, i)) {
                    return fail(&format!("reduce {op} root {root} count {count}"), d);
                }
            }
            let mut buf = input.clone();
            comm.reduce_in_place(&mut buf, op, root).map_err(err)?;
            let want_untouched = |i: usize| input[i];
            let d = if r == root {
                first_diff(&buf, |i| expected(op, n, i))
            } else {
                first_diff(&buf, want_untouched)
            };
            if let Some(d) = d {
                return fail(
                    &format!("reduce in-place {op} root {root} count {count}"),
                    d,
                );
            }
            // reduce_scatter
            let c = per_rank(count, n);
            let full: Vec<T> = data(op, r, 0, n * c);
            let mut out = vec![T::default(); c];
            comm.reduce_scatter(&full, &mut out, op).map_err(err)?;
            if let Some(d) = first_diff(&out, |i| expected(op, n, r * c + i)) {
                return fail(&format!("reduce_scatter {op} count {c}"), d);
            }
            let mut buf = full.clone();
            comm.reduce_scatter_in_place(&mut buf, op).map_err(err)?;
            if let Some(d) = first_diff(&buf, |i| {
                if i / c.max(1) == r && c > 0 {
                    expected(op, n, i)
                } else {
                    full[i]
                }
            }) {
                return fail(&format!("reduce_scatter in-place {op} count {c}"), d);
            }
        }
        let op = ReduceOp::Sum;
        let root = count % n;
        // broadcast
        let input: Vec<T> = data(op, r, 0, count);
        let mut out = vec![T::default(); count];
        comm.broadcast(if r == root { &input[..] } else { &[] }, &mut out, root)
            .map_err(err)?;
        if let Some(d) = first_diff(&out, |i| T::from_i(value(op, root, i))) {
            return fail(&format!("broadcast root {root} count {count}"), d);
        }
        let mut buf = input.clone();
        comm.broadcast_in_place(&mut buf, root).map_err(err)?;
        if let Some(d) = first_diff(&buf, |i| T::from_i(value(op, root, i))) {
            return fail(&format!("broadcast in-place root {root} count {count}"), d);
        }
        // all_gather
        let c = per_rank(count, n);
        let mine: Vec<T> = data(op, r, 0, c);
        let mut out = vec![T::default(); n * c];
        comm.all_gather(&mine, &mut out).map_err(err)?;
        let want = |i: usize| T::from_i(value(op, i / c, i % c));
        if let Some(d) = first_diff(&out, want) {
            return fail(&format!("all_gather count {c}"), d);
        }
        let mut buf = vec![T::default(); n * c];
        buf[r * c..(r + 1) * c].copy_from_slice(&mine);
        comm.all_gather_in_place(&mut buf).map_err(err)?;
        if let Some(d) = first_diff(&buf, want) {
            return fail(&format!("all_gather in-place count {c}"), d);
        }
        // all_to_all: rank r's segment p is element values value(r, p*c+i)
        let send: Vec<T> = data(op, r, 0, n * c);
        let mut out = vec![T::default(); n * c];
        comm.all_to_all(&send, &mut out).map_err(err)?;
        let want = |i: usize| T::from_i(value(op, i / c, r * c + i % c));
        if let Some(d) = first_diff(&out, want) {
            return fail(&format!("all_to_all count {c}"), d);
        }
        let mut buf = send.clone();
        comm.all_to_all_in_place(&mut buf).map_err(err)?;
        if let Some(d) = first_diff(&buf, want) {
            return fail(&format!("all_to_all in-place count {c}"), d);
        }
    }
    Ok(())
}

/// Run the whole matrix on `comm` for every dtype; `Err` names the first
/// wrong element (rank, dtype, collective, op, count).
pub fn run_matrix(comm: &Communicator, counts: &[usize]) -> Result<(), String> {
    check_type::<i8>(comm, counts)?;
    check_type::<u8>(comm, counts)?;
    check_type::<i32>(comm, counts)?;
    check_type::<u32>(comm, counts)?;
    check_type::<i64>(comm, counts)?;
    check_type::<u64>(comm, counts)?;
    check_type::<f16>(comm, counts)?;
    check_type::<bf16>(comm, counts)?;
    check_type::<f32>(comm, counts)?;
    check_type::<f64>(comm, counts)?;
    comm.barrier().map_err(err)
}
