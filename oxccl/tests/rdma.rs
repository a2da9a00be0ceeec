//! RDMA selection on a host without an RDMA device (this machine, CI):
//! automatic selection falls back to TCP between hosts, and forcing RDMA is
//! a clear error. With the `rdma` feature the device probe really runs
//! (`ibv_get_device_list`); without it the error says the build lacks RDMA.
//! On a host that has a device these tests print why they skip.

mod common;
use common::*;
use oxccl::prelude::*;

fn device_present() -> bool {
    match oxccl::rdma_device() {
        Ok(Some(name)) => {
            println!("skipped: this host has an RDMA device ({name})");
            true
        }
        _ => false,
    }
}

#[test]
fn forcing_rdma_without_a_device_is_a_clear_error() {
    if device_present() {
        return;
    }
    let cfg = Config {
        transport: Some("rdma".into()),
        ..test_config()
    };
    let err = match oxccl::transports(&cfg) {
        Err(e) => e,
        Ok(_) => panic!("forced rdma accepted without a device"),
    };
    let msg = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    if cfg!(feature = "rdma") {
        assert!(msg.contains("no RDMA device was found"), "{msg}");
        assert!(msg.contains("OXCCL_IB_HCA"), "names the variable: {msg}");
    } else {
        assert!(
            msg.contains("no RDMA support") && msg.contains("--features rdma"),
            "{msg}"
        );
    }
    // The same error reaches a user at init, before anything is connected.
    let id = UniqueId::with_config(&cfg).unwrap();
    match Communicator::init_with_config(&id, 0, 1, cfg) {
        Err(e) => assert_eq!(e.to_string(), msg),
        Ok(_) => panic!("init succeeded with forced rdma and no device"),
    }
}

#[test]
fn peers_on_other_hosts_fall_back_to_tcp() {
    if device_present() {
        return;
    }
    let t = oxccl::transports(&test_config()).unwrap();
    assert!(
        t.list.iter().all(|t| t.name() != "rdma"),
        "no rdma transport without a device"
    );
    // Three ranks on three pretend hosts: every link is TCP, and it works.
    let sums = with_rank_configs(3, host_config, |c| {
        let peers = c.peers().to_vec();
        for p in peers.iter().filter(|p| p.rank != c.rank()) {
            let i = (t.choose)(&test_config(), &peers[c.rank()], p).unwrap();
            assert_eq!(t.list[i].name(), "tcp", "peer {} on another host", p.rank);
        }
        let mut v = vec![c.rank() as f32 + 1.0; 1001];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        v
    });
    for v in sums {
        assert!(v.iter().all(|x| *x == 6.0));
    }
}

#[test]
fn registering_memory_without_rdma_is_a_harmless_no_op() {
    if device_present() {
        return;
    }
    let ok = with_ranks(2, test_config(), |c| {
        let mut v = vec![c.rank() as i32; 10_000];
        // SAFETY: `v` outlives the registration (dropped at the end of the
        // closure, after `reg`).
        let reg = unsafe { c.register_memory(&v) }.unwrap();
        assert!(
            !reg.is_active(),
            "no transport here sends from registered memory"
        );
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        drop(reg);
        v.iter().all(|x| *x == 1)
    });
    assert!(ok.iter().all(|b| *b));
}
