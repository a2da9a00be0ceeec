//! The correctness matrix over threads-as-ranks and real transports (TCP,
//! shared memory, and a communicator mixing both: ranks alternate between
//! two pretend hosts):
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

fn check(results: Vec<Result<(), String>>) {
    for r in results {
        r.unwrap();
    }
}

fn tcp(n: usize) {
    check(with_ranks(n, tcp_config(), |comm| {
        run_matrix(&comm, &standard_counts(n))
    }));
}

fn shm(n: usize) {
    check(with_ranks(n, test_config(), |comm| {
        run_matrix(&comm, &standard_counts(n))
    }));
}

fn mixed(n: usize) {
    check(with_rank_configs(
        n,
        |r| host_config(r % 2),
        |comm| run_matrix(&comm, &standard_counts(n)),
    ));
}

#[test]
fn tcp_1_rank() {
    tcp(1)
}
#[test]
fn tcp_2_ranks() {
    tcp(2)
}
#[test]
fn tcp_3_ranks() {
    tcp(3)
}
#[test]
fn tcp_4_ranks() {
    tcp(4)
}
#[test]
fn tcp_5_ranks() {
    tcp(5)
}
#[test]
fn tcp_8_ranks() {
    tcp(8)
}
#[test]
fn shm_2_ranks() {
    shm(2)
}
#[test]
fn shm_3_ranks() {
    shm(3)
}
#[test]
fn shm_4_ranks() {
    shm(4)
}
#[test]
fn shm_5_ranks() {
    shm(5)
}
#[test]
fn shm_8_ranks() {
    shm(8)
}
#[test]
fn mixed_3_ranks() {
    mixed(3)
}
#[test]
fn mixed_4_ranks() {
    mixed(4)
}
#[test]
fn mixed_5_ranks() {
    mixed(5)
}
#[test]
fn mixed_8_ranks() {
    mixed(8)
}

/// The matrix again with every message staged through host slots, the path
/// calls on device memory take (here the host engine fills and drains the
/// slots; on a GPU the device engine does).
fn staged(n: usize, mixed: bool) {
    let cfg = |r: usize| oxccl::Config {
        stage_always: true,
        ..match mixed {
            true => host_config(r % 2),
            false => test_config(),
        }
    };
    check(with_rank_configs(n, cfg, |comm| {
        run_matrix(&comm, &standard_counts(n))
    }));
}

#[test]
fn staged_shm_3_ranks() {
    staged(3, false)
}

#[test]
fn staged_mixed_4_ranks() {
    staged(4, true)
}

/// The matrix with an algorithm forced (`OXCCL_ALGO`; the collectives it
/// does not run keep the automatic choice), on a rank count that is not a
/// power of two.
fn forced(algo: &str, n: usize, mixed: bool) {
    forced_on(algo, n, |r| match mixed {
        true => host_config(r % 2),
        false => test_config(),
    })
}

/// [`forced`] with rank `r` configured by `cfg(r)` (its host).
fn forced_on(algo: &str, n: usize, cfg: impl Fn(usize) -> oxccl::Config + Sync) {
    let cfg = |r: usize| oxccl::Config {
        algo: Some(algo.into()),
        ..cfg(r)
    };
    check(with_rank_configs(n, cfg, |comm| {
        run_matrix(&comm, &standard_counts(n))?;
        // The forced algorithm did run (a spec it cannot run would quietly
        // fall back to the automatic choice).
        let mut used = Vec::new();
        let x = vec![1f32; 64 * n];
        let mut y = vec![0f32; 64 * n * n];
        let op = oxccl::ReduceOp::Sum;
        let calls: [&Call; 5] = [
            &|y| comm.all_reduce(&x, &mut y[..64 * n], op),
            &|y| comm.all_gather(&x, &mut y[..64 * n * n]),
            &|y| comm.reduce_scatter(&x, &mut y[..64], op),
            &|y| comm.broadcast(&x, &mut y[..64 * n], 0),
            &|y| comm.all_to_all(&x[..64 * n], &mut y[..64 * n]),
        ];
        for call in calls {
            call(&mut y).map_err(|e| e.to_string())?;
            used.extend(comm.last_algorithm());
        }
        if n > 1 && !used.contains(&algo) {
            return Err(format!("{algo} forced, but the calls ran {used:?}"));
        }
        Ok(())
    }));
}

/// One call on scratch buffers.
type Call<'a> = dyn Fn(&mut Vec<f32>) -> oxccl::Result<()> + 'a;

/// One test per forced algorithm: 5 ranks over shared memory, 6 mixed.
macro_rules! forced_tests {
    ($($name:ident: $algo:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            forced($algo, 5, false);
            forced($algo, 6, true);
        }
    )*};
}

forced_tests! {
    forced_doubling: "doubling",
    forced_bruck: "bruck",
    forced_tree: "tree",
    forced_dbtree: "dbtree",
    forced_halving: "halving",
    forced_scatter: "scatter",
}

/// The hierarchical algorithm on one host (5 ranks: the intra-host rings
/// alone), on 2 hosts of 3 ranks placed round robin (the mixed runs of the
/// macro above) and on 3 hosts of 2 ranks in blocks.
#[test]
fn forced_hier() {
    forced("hier", 5, false);
    forced("hier", 6, true);
    forced_on("hier", 6, |r| host_config(r / 2));
}
