//! In-process harness: threads as ranks over real TCP sockets on loopback,
//! plus exact-valued test data and the references to check it.
#![allow(dead_code)]

use oxccl::prelude::*;
use std::time::Duration;

/// Configuration for tests: loopback only, a deadline that turns a hang
/// into a failure.
pub fn test_config() -> Config {
    Config {
        socket_ifname: Some("lo".into()),
        timeout: Duration::from_secs(120),
        ..Config::default()
    }
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
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}
