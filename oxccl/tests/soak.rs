//! Soak: thousands of random calls (kind, dtype, op, count from 0 to
//! several MiB, root, in place or not) over 3 and 5 ranks on each transport,
//! every result checked exactly. The short version runs in CI; the long one
//! is `cargo test --release -p oxccl --test soak -- --ignored`.

mod common;
use common::*;
use oxccl::selftest::soak;

fn run(n: usize, cfg: oxccl::Config, seed: u64, calls: usize) {
    let t = std::time::Instant::now();
    for r in with_ranks(n, cfg, |c| soak(&c, seed, calls, 1 << 20)) {
        assert_eq!(r.unwrap(), calls);
    }
    eprintln!(
        "soak: {calls} calls on {n} ranks in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn soak_short_tcp_3_ranks() {
    run(3, tcp_config(), 11, 300);
}

#[test]
fn soak_short_shm_5_ranks() {
    run(5, test_config(), 12, 300);
}

#[test]
fn soak_short_mixed_4_ranks() {
    with_rank_configs(4, |r| host_config(r / 2), |c| soak(&c, 13, 300, 1 << 20))
        .into_iter()
        .for_each(|r| assert_eq!(r.unwrap(), 300));
}

#[test]
#[ignore]
fn soak_long_every_transport() {
    for (n, seed) in [(3, 21), (5, 22)] {
        run(n, tcp_config(), seed, 20_000);
        run(n, test_config(), seed + 100, 20_000);
    }
}
