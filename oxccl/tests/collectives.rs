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
use oxccl::selftest::{run_matrix, standard_counts};

fn matrix(n: usize) {
    let results = with_ranks(n, test_config(), |comm| {
        run_matrix(&comm, &standard_counts(n))
    });
    for r in results {
        r.unwrap();
    }
}
#[test]
fn matrix_1_rank() {
    matrix(1)
}
#[test]
fn matrix_2_ranks() {
    matrix(2)
}
#[test]
fn matrix_3_ranks() {
    matrix(3)
}
#[test]
fn matrix_4_ranks() {
    matrix(4)
}
#[test]
fn matrix_5_ranks() {
    matrix(5)
}
#[test]
fn matrix_8_ranks() {
    matrix(8)
}
