//! The tuner in a running job: with a cost model every rank picks the
//! algorithm the simulator predicts fastest for the call's shape, all ranks
//! the same one, results stay exact; a forced algorithm still wins.

mod common;
use common::{host_config, with_rank_configs};
use oxccl::prelude::*;
use oxccl::sim::Model;

/// 4 pretend hosts x 2 ranks; links between hosts modelled slow.
fn run(algo: Option<&str>, count: usize) -> Vec<(Option<&'static str>, bool)> {
    let model = Model {
        alpha: 200e-6,
        nic_rate: 1.25e9,
        ..Model::default()
    };
    with_rank_configs(
        8,
        |r| Config {
            tuner: Some(model.clone()),
            algo: algo.map(String::from),
            ..host_config(r / 2)
        },
        |comm| {
            let n = comm.nranks() as f32;
            let mine = vec![comm.rank() as f32 + 1.0; count];
            let mut out = vec![0f32; count];
            comm.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
            let exact = out.iter().all(|&x| x == n * (n + 1.0) / 2.0);
            (comm.last_algorithm(), exact)
        },
    )
}

#[test]
fn every_rank_runs_the_predicted_fastest_algorithm() {
    // 64 KiB: past OXCCL_ONESHOT_BYTES, so the registry's rules say ring,
    // whose 14 hops (7 between hosts) cost far more over 200 µs links than
    // a logarithmic or one-round algorithm.
    let got = run(None, 16 << 10);
    let first = got[0].0;
    assert!(got.iter().all(|g| g.0 == first && g.1), "64 KiB: {got:?}");
    assert!(
        matches!(first, Some(n) if n != "ring"),
        "64 KiB over 200 µs links: {first:?}"
    );
    // 8 MiB over 10 Gbit/s NICs: bandwidth decides, the ring wins.
    let got = run(None, 2 << 20);
    assert!(
        got.iter().all(|g| g.0 == Some("ring") && g.1),
        "8 MiB: {got:?}"
    );
    // A forced algorithm still wins.
    let forced = run(Some("dbtree"), 16);
    assert!(
        forced.iter().all(|g| g.0 == Some("dbtree") && g.1),
        "{forced:?}"
    );
}
