//! The simulator against what it must agree with: itself run on every rank
//! (the symmetry reduction), closed-form α-β costs, and broken schedules.

use algorithms::{find, Action, Kind, Schedule, Span, INPUT, OUTPUT};
use oxccl_sim::engine::{simulate, Ranks};
use oxccl_sim::symmetry::{periodic, Shift};
use oxccl_sim::{predict, Call, How, Model, Topology};

fn call(kind: Kind, bytes: usize) -> Call {
    Call {
        kind,
        bytes,
        elem: 4,
        chunk_bytes: 64 << 10,
        root: 0,
    }
}

/// A network-bound model: no CPU costs, so closed forms hold.
fn wire_only(alpha: f64, nic: f64) -> Model {
    Model {
        msg_overhead: 0.0,
        step_overhead: 0.0,
        shm_alpha: 0.0,
        copy_rate: 1e30,
        reduce_rate: 1e30,
        socket_rate: 1e30,
        alpha,
        nic_rate: nic,
        cores: 0,
        shared_cores: false,
        wake: 0.0,
    }
}

/// Where ranks outnumber cores, a rank that waits for a message sleeps
/// and runs again `wake` after it arrived: a ring all_reduce of 2 ranks
/// sharing 1 core waits for each of its 2 receives, so it takes 2
/// wake-ups longer (less the 32 ns each message's last bytes take at 1
/// GB/s: they arrive while it wakes). With a core each, ranks spin and
/// pay none.
#[test]
fn a_sleeping_rank_pays_a_wake_up_per_message_where_cores_are_oversubscribed() {
    let ring = find("ring").unwrap();
    let time = |wake: f64, cores: usize| {
        let m = Model {
            wake,
            cores,
            shared_cores: true,
            ..wire_only(10e-6, 1e9)
        };
        let topo = Topology::new(2, 1).unwrap();
        let spec = call(Kind::AllReduce, 64).spec(0, 2);
        predict(&m, &topo, ring, &spec, true).unwrap().0.time
    };
    let extra = time(50e-6, 1) - time(0.0, 1);
    assert!(
        (extra - (100e-6 - 64e-9)).abs() < 1e-12,
        "2 ranks, 1 core: {extra}"
    );
    assert_eq!(time(50e-6, 2), time(0.0, 2));
}

#[test]
fn one_host_standing_for_all_gives_the_full_simulation_exactly() {
    let m = Model {
        alpha: 7e-6,
        nic_rate: 3e9,
        ..Model::default()
    };
    let cases = [
        ("ring", Kind::AllReduce, Shift::Rotate),
        ("ring", Kind::AllGather, Shift::Rotate),
        ("ring", Kind::ReduceScatter, Shift::Rotate),
        ("halving", Kind::AllReduce, Shift::Xor),
    ];
    for (name, kind, want) in cases {
        let alg = find(name).unwrap();
        for (hosts, per_host) in [(4, 4), (8, 2), (2, 8)] {
            let topo = Topology::new(hosts, per_host).unwrap();
            for bytes in [4096, 1 << 20, 3 << 20] {
                let c = call(kind, bytes);
                let n = topo.nranks();
                let (shift, _) = periodic(alg, &c.spec(0, n), per_host)
                    .unwrap_or_else(|e| panic!("{name} {kind:?} on {hosts}x{per_host}: {e}"));
                if hosts > 2 {
                    // (On two hosts, rotating by half the ranks is XOR.)
                    assert_eq!(
                        shift, want,
                        "{name} {kind:?} on {hosts}x{per_host}, {bytes} B"
                    );
                }
                let (part, how) = predict(&m, &topo, alg, &c.spec(0, n), false).unwrap();
                assert!(matches!(how, How::Periodic(..)), "{name}: {how:?}");
                let (all, how) = predict(&m, &topo, alg, &c.spec(0, n), true).unwrap();
                assert_eq!(how, How::Full);
                let rel = (part.time - all.time).abs() / all.time;
                assert!(
                    rel < 1e-9,
                    "{name} {kind:?} {hosts}x{per_host} {bytes} B: one host {} us, all ranks {} us",
                    part.time * 1e6,
                    all.time * 1e6
                );
            }
        }
    }
}

#[test]
fn a_tree_is_not_taken_for_periodic() {
    let c = call(Kind::AllReduce, 1 << 20);
    assert!(periodic(find("dbtree").unwrap(), &c.spec(0, 16), 2).is_err());
}

#[test]
fn the_ring_matches_its_closed_form() {
    // One rank per host, no CPU cost, one message per step: the ring's
    // reduce-scatter and all_gather are a chain of 2(n-1) hops, each
    // alpha + (bytes/n)/beta.
    let (alpha, nic) = (10e-6, 1e9);
    let m = wire_only(alpha, nic);
    for n in [2usize, 3, 5, 8] {
        let bytes = 4 * 1024 * n;
        let c = Call {
            chunk_bytes: 1 << 30,
            ..call(Kind::AllReduce, bytes)
        };
        let (out, _) = predict(
            &m,
            &Topology::new(n, 1).unwrap(),
            find("ring").unwrap(),
            &c.spec(0, n),
            true,
        )
        .unwrap();
        let want = 2.0 * (n - 1) as f64 * (alpha + (bytes / n) as f64 / nic);
        assert!(
            (out.time - want).abs() / want < 1e-9,
            "n={n}: {} us, closed form {} us",
            out.time * 1e6,
            want * 1e6
        );
    }
}

#[test]
fn a_shared_nic_serialises_what_leaves_a_host() {
    // Two ranks of host 0 each send 1 MB to a rank of host 1: the second
    // waits for the first on the sender's NIC.
    let (alpha, nic) = (5e-6, 1e9);
    let m = wire_only(alpha, nic);
    let len = 250_000; // elements of 4 bytes
    let send = |peer| {
        let mut s = Schedule::default();
        s.push(
            Action::Send {
                peer,
                src: Span::new(INPUT, 0, len),
            },
            &[],
        );
        s
    };
    let recv = |peer| {
        let mut s = Schedule::default();
        s.push(
            Action::Recv {
                peer,
                dst: Span::new(OUTPUT, 0, len),
            },
            &[],
        );
        s
    };
    let scheds = vec![send(2), send(3), recv(0), recv(1)];
    let out = simulate(&m, &Topology::new(2, 2).unwrap(), 4, scheds, Ranks::All).unwrap();
    let want = 2.0 * 1e6 / nic + alpha;
    assert!(
        (out.time - want).abs() / want < 1e-9,
        "{} us, want {} us",
        out.time * 1e6,
        want * 1e6
    );
}

#[test]
fn a_schedule_that_cannot_finish_is_an_error_naming_the_rank() {
    let mut a = Schedule::default();
    a.push(
        Action::Recv {
            peer: 1,
            dst: Span::new(OUTPUT, 0, 4),
        },
        &[],
    );
    let b = Schedule::default();
    let e = simulate(
        &Model::default(),
        &Topology::new(1, 2).unwrap(),
        4,
        vec![a, b],
        Ranks::All,
    )
    .unwrap_err();
    assert!(
        e.contains("rank 0 never finished") && e.contains("Recv"),
        "{e}"
    );
}

#[test]
fn oversubscribed_cores_slow_the_job_down() {
    let alg = find("ring").unwrap();
    let c = call(Kind::AllReduce, 4 << 20);
    let topo = Topology::new(1, 4).unwrap();
    let free = Model::default();
    let two = Model {
        cores: 2,
        ..Model::default()
    };
    let (a, _) = predict(&free, &topo, alg, &c.spec(0, 4), false).unwrap();
    let (b, _) = predict(&two, &topo, alg, &c.spec(0, 4), false).unwrap();
    assert!(
        b.time > 1.5 * a.time,
        "4 ranks on 2 cores: {} us, on 4: {} us",
        b.time * 1e6,
        a.time * 1e6
    );
}
