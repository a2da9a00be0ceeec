//! The correctness matrix over threads-as-ranks and real TCP sockets:
//! every collective x dtype x op x nranks {1,2,3,4,5,8} x counts
//! {0, 1, 7, n-1, n+1, 1 000 003} x in-place/out-of-place, every element
//! compared with `==` against an exact reference.
//!
//! For the collectives whose count is per rank (all_gather, reduce_scatter,
//! all_to_all) the large case uses 1 000 003 / n per rank, so the total
//! stays near a million elements (still not divisible by n).

mod common;
use common::*;
use oxccl::prelude::*;
use oxccl::{bf16, f16};

fn counts(n: usize) -> Vec<usize> {
    let mut v = vec![0, 1, 7, n - 1, n + 1, 1_000_003];
    v.dedup();
    v
}

fn per_rank(count: usize, n: usize) -> usize {
    if count > 1000 { count / n } else { count }
}

fn check_type<T: TestElem>(comm: &Communicator) -> Result<(), String> {
    let (r, n) = (comm.rank(), comm.nranks());
    let name = T::DTYPE;
    let fail = |what: &str, d: String| {
        let m = format!("rank {r}/{n} {name} {what}: {d}");
        eprintln!("MATRIX FAILURE: {m}");
        Err(m)
    };
    for count in counts(n) {
        for (oi, op) in ReduceOp::ALL.into_iter().enumerate() {
            let root = (oi + count) % n;
            let input: Vec<T> = data(op, r, 0, count);
            // all_reduce
            let mut out = vec![T::default(); count];
            comm.all_reduce(&input, &mut out, op).unwrap();
            if let Some(d) = first_diff(&out, |i| expected(op, n, i)) {
                return fail(&format!("all_reduce {op} count {count}"), d);
            }
            let mut buf = input.clone();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
            if let Some(d) = first_diff(&buf, |i| expected(op, n, i)) {
                return fail(&format!("all_reduce in-place {op} count {count}"), d);
            }
            // reduce
            let mut out = vec![T::default(); if r == root { count } else { 0 }];
            comm.reduce(&input, &mut out, op, root).unwrap();
            if r == root {
                if let Some(d) = first_diff(&out, |i| expected(op, n, i)) {
                    return fail(&format!("reduce {op} root {root} count {count}"), d);
                }
            }
            let mut buf = input.clone();
            comm.reduce_in_place(&mut buf, op, root).unwrap();
            let want_untouched = |i: usize| input[i];
            let d = if r == root { first_diff(&buf, |i| expected(op, n, i)) } else { first_diff(&buf, want_untouched) };
            if let Some(d) = d {
                return fail(&format!("reduce in-place {op} root {root} count {count}"), d);
            }
            // reduce_scatter
            let c = per_rank(count, n);
            let full: Vec<T> = data(op, r, 0, n * c);
            let mut out = vec![T::default(); c];
            comm.reduce_scatter(&full, &mut out, op).unwrap();
            if let Some(d) = first_diff(&out, |i| expected(op, n, r * c + i)) {
                return fail(&format!("reduce_scatter {op} count {c}"), d);
            }
            let mut buf = full.clone();
            comm.reduce_scatter_in_place(&mut buf, op).unwrap();
            if let Some(d) = first_diff(&buf, |i| if i / c.max(1) == r && c > 0 { expected(op, n, i) } else { full[i] }) {
                return fail(&format!("reduce_scatter in-place {op} count {c}"), d);
            }
        }
        let op = ReduceOp::Sum;
        let root = count % n;
        // broadcast
        let input: Vec<T> = data(op, r, 0, count);
        let mut out = vec![T::default(); count];
        comm.broadcast(if r == root { &input[..] } else { &[] }, &mut out, root).unwrap();
        if let Some(d) = first_diff(&out, |i| T::from_i(value(op, root, i))) {
            return fail(&format!("broadcast root {root} count {count}"), d);
        }
        let mut buf = input.clone();
        comm.broadcast_in_place(&mut buf, root).unwrap();
        if let Some(d) = first_diff(&buf, |i| T::from_i(value(op, root, i))) {
            return fail(&format!("broadcast in-place root {root} count {count}"), d);
        }
        // all_gather
        let c = per_rank(count, n);
        let mine: Vec<T> = data(op, r, 0, c);
        let mut out = vec![T::default(); n * c];
        comm.all_gather(&mine, &mut out).unwrap();
        let want = |i: usize| T::from_i(value(op, i / c, i % c));
        if let Some(d) = first_diff(&out, want) {
            return fail(&format!("all_gather count {c}"), d);
        }
        let mut buf = vec![T::default(); n * c];
        buf[r * c..(r + 1) * c].copy_from_slice(&mine);
        comm.all_gather_in_place(&mut buf).unwrap();
        if let Some(d) = first_diff(&buf, want) {
            return fail(&format!("all_gather in-place count {c}"), d);
        }
        // all_to_all: rank r's segment p is element values value(r, p*c+i)
        let send: Vec<T> = data(op, r, 0, n * c);
        let mut out = vec![T::default(); n * c];
        comm.all_to_all(&send, &mut out).unwrap();
        let want = |i: usize| T::from_i(value(op, i / c, r * c + i % c));
        if let Some(d) = first_diff(&out, want) {
            return fail(&format!("all_to_all count {c}"), d);
        }
        let mut buf = send.clone();
        comm.all_to_all_in_place(&mut buf).unwrap();
        if let Some(d) = first_diff(&buf, want) {
            return fail(&format!("all_to_all in-place count {c}"), d);
        }
    }
    Ok(())
}

fn matrix(n: usize) {
    let results = with_ranks(n, test_config(), |comm| -> Result<(), String> {
        check_type::<i8>(&comm)?;
        check_type::<u8>(&comm)?;
        check_type::<i32>(&comm)?;
        check_type::<u32>(&comm)?;
        check_type::<i64>(&comm)?;
        check_type::<u64>(&comm)?;
        check_type::<f16>(&comm)?;
        check_type::<bf16>(&comm)?;
        check_type::<f32>(&comm)?;
        check_type::<f64>(&comm)?;
        comm.barrier().map_err(|e| e.to_string())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn matrix_1_rank() { matrix(1) }
#[test]
fn matrix_2_ranks() { matrix(2) }
#[test]
fn matrix_3_ranks() { matrix(3) }
#[test]
fn matrix_4_ranks() { matrix(4) }
#[test]
fn matrix_5_ranks() { matrix(5) }
#[test]
fn matrix_8_ranks() { matrix(8) }
