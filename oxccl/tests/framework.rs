//! What a framework needs from the API (issue 12): errors in the job's
//! numbering, culprits as data, wait cycles, monitored barriers, per-call
//! deadlines, `Work` as a future, groups of anything.

mod common;

use common::*;
use oxccl::prelude::*;
use oxccl::{bf16, CoreCommunicator};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

fn short(timeout_ms: u64) -> Config {
    Config {
        timeout: Duration::from_millis(timeout_ms),
        ..test_config()
    }
}

#[test]
fn errors_on_a_sub_communicator_name_world_ranks() {
    // A 2x2 grid: data-parallel groups {0, 2} and {1, 3}. World rank 3
    // leaves its group; world rank 1 must hear "world rank 3", not "rank 1".
    with_ranks(4, test_config(), |c| {
        let r = c.rank();
        let dp = c.split((r % 2) as u32, r as i64).unwrap();
        assert_eq!(dp.world_ranks(), [r % 2, r % 2 + 2]);
        assert_eq!(dp.world_rank(), r);
        c.barrier().unwrap();
        match r {
            3 => drop(dp),
            1 => {
                let e = dp
                    .all_reduce_in_place(&mut [1f32; 1 << 16], ReduceOp::Sum)
                    .unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::PeerLost {
                            rank: 1,
                            world_rank: 3,
                            ..
                        }
                    ),
                    "{e:?}"
                );
                assert_eq!(e.blamed_rank(), Some(1));
                assert_eq!(e.blamed_world_rank(), Some(3));
                let text = e.to_string();
                assert!(text.contains("rank 1 (world rank 3, host"), "{text}");
                assert!(text.contains("all_reduce #0"), "{text}");
                assert!(
                    text.contains(&format!("pid {}", std::process::id())),
                    "{text}"
                );
            }
            _ => {
                let mut v = [r as f32];
                dp.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert_eq!(v[0], 2.0); // world ranks 0 + 2
            }
        }
    });
}

#[test]
fn a_timeout_blames_the_late_rank_and_tells_it_so() {
    let out = with_ranks(3, short(800), |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(2500));
        }
        c.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum)
            .unwrap_err()
    });
    for (r, e) in out.iter().enumerate() {
        let Error::Timeout { rank, after, .. } = e else {
            panic!("rank {r}: {e:?}");
        };
        assert_eq!(*rank, Some(2), "rank {r}: {e}");
        assert_eq!(e.blamed_world_rank(), Some(2), "rank {r}: {e}");
        assert!(*after >= Duration::from_millis(800), "rank {r}: {e}");
        assert!(e.to_string().contains("all_reduce #0"), "rank {r}: {e}");
    }
    let late = out[2].to_string();
    assert!(late.contains("waited for this rank (rank 2)"), "{late}");
}

#[test]
fn a_wait_cycle_is_reported_as_a_cycle() {
    // Both ranks receive before they send: a deadlock of the program,
    // which must be named as such, not blamed on one rank.
    let out = with_ranks(2, short(800), |c| {
        let peer = 1 - c.rank();
        let mut buf = [0u32; 8];
        c.recv(&mut buf, peer).unwrap_err()
    });
    for (r, e) in out.iter().enumerate() {
        let Error::WaitCycle { ranks, .. } = e else {
            panic!("rank {r}: {e:?}");
        };
        let mut sorted = ranks.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1], "rank {r}: {e}");
        assert_eq!(e.blamed_rank(), None);
        let text = e.to_string();
        assert!(
            text.contains("wait cycle") && text.contains("recv #0 from rank"),
            "{text}"
        );
    }
}

#[test]
fn monitored_barrier_names_every_rank_that_did_not_arrive() {
    let out = with_ranks(4, test_config(), |c| {
        // Everyone arrives: it passes.
        c.monitored_barrier(Duration::from_secs(10)).unwrap();
        if c.rank() >= 2 {
            std::thread::sleep(Duration::from_millis(2000));
        }
        let t = Instant::now();
        let e = c.monitored_barrier(Duration::from_millis(500)).unwrap_err();
        (e, t.elapsed())
    });
    for (r, (e, took)) in out.iter().enumerate() {
        let Error::Absent { ranks, during, .. } = e else {
            panic!("rank {r}: {e:?}");
        };
        assert_eq!(ranks, &[2, 3], "rank {r}: {e}");
        assert_eq!(during, "monitored_barrier #1", "rank {r}: {e}");
        assert_eq!(e.blamed_rank(), Some(2));
        if r < 2 {
            assert!(*took < Duration::from_secs(2), "rank {r} waited {took:?}");
        }
    }
}

#[test]
fn a_per_call_deadline_overrides_the_communicator_timeout() {
    // The configured timeout is two minutes; one call asks for 300 ms.
    let out = with_ranks(2, test_config(), |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(2500));
            return None;
        }
        let quick = c.with_timeout(Duration::from_millis(300));
        assert_eq!(quick.timeout(), Duration::from_millis(300));
        assert_eq!(c.timeout(), Duration::from_secs(120));
        let t = Instant::now();
        let e = quick
            .all_reduce_in_place(&mut [1f64; 16], ReduceOp::Sum)
            .unwrap_err();
        Some((e, t.elapsed()))
    });
    let (e, took) = out[0].as_ref().unwrap();
    assert!(matches!(e, Error::Timeout { rank: Some(1), .. }), "{e:?}");
    // A zero deadline or wait is a bad argument, not a failed job.
    with_ranks(1, test_config(), |c| {
        let none = c.with_timeout(Duration::ZERO);
        assert!(matches!(none.barrier(), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            none.send(&[1u8], 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            none.all_reduce_async(vec![1f32], ReduceOp::Sum).wait(),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            c.monitored_barrier(Duration::ZERO),
            Err(Error::InvalidArgument(_))
        ));
        c.barrier().unwrap();
    });
    assert!(*took < Duration::from_secs(2), "took {took:?}");
}

/// Poll a future to completion on this thread (no async runtime).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn work_has_wait_timeout_debug_and_is_a_future() {
    with_ranks(2, test_config(), |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(400));
        }
        let w = c.all_reduce_async(vec![1f32; 1000], ReduceOp::Sum);
        if c.rank() == 0 {
            // Rank 1 is late: not done within 50 ms.
            assert!(!w.wait_timeout(Duration::from_millis(50)));
            assert!(!w.is_done());
            let d = format!("{w:?}");
            assert!(d.contains("all_reduce") && d.contains("running"), "{d}");
        }
        assert!(w.wait_timeout(Duration::from_secs(60)));
        assert!(format!("{w:?}").contains("done"));
        assert_eq!(block_on(w).unwrap(), vec![2f32; 1000]);
        // A future woken by the worker, not found done at the first poll.
        let w = c.all_gather_async(vec![c.rank() as u32; 3], vec![0u32; 6]);
        let (_, got) = block_on(w).unwrap();
        assert_eq!(got, [0, 0, 0, 1, 1, 1]);
        // Bad arguments come back from the future too, and leave the
        // communicator usable.
        let e = block_on(c.all_gather_async(vec![1u8; 3], vec![0u8; 5])).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        c.barrier().unwrap();
    });
}

#[test]
fn a_group_mixes_types_sends_receives_and_collectives() {
    with_ranks(2, test_config(), |c| {
        let (me, peer) = (c.rank(), 1 - c.rank());
        // Pipeline-style: a shape header and a bf16 payload each way, both
        // ranks posting their sends first, plus a collective.
        let header = [me as u32, 1024];
        let payload: Vec<bf16> = (0..1024).map(|i| bf16::from_f32((i + me) as f32)).collect();
        let mut got_header = [0u32; 2];
        let mut got_payload = vec![bf16::ZERO; 1024];
        let mut grads = vec![me as f32 + 1.0; 4096];
        c.group(|g| {
            g.send(&header, peer)?;
            g.send(&payload, peer)?;
            g.recv(&mut got_header, peer)?;
            g.recv(&mut got_payload, peer)?;
            g.all_reduce_in_place(&mut grads, ReduceOp::Sum)
        })
        .unwrap();
        assert_eq!(got_header, [peer as u32, 1024]);
        assert_eq!(got_payload[5].to_f32(), (5 + peer) as f32);
        assert!(grads.iter().all(|g| *g == 3.0));

        // The async form: owned buffers go in and come back.
        let bufs = (vec![me as u64; 8], vec![0u64; 8], vec![1i32; 4]);
        let w = c.group_async(bufs, move |g, (s, r, sum)| {
            g.send(s, peer)?;
            g.recv(r, peer)?;
            g.all_reduce_in_place(sum, ReduceOp::Sum)
        });
        let (_, r, sum) = w.wait().unwrap();
        assert_eq!(r, vec![peer as u64; 8]);
        assert_eq!(sum, vec![2; 4]);

        // A bad operation fails the group before anything runs, naming it.
        let mut small = [0u32; 1];
        let e = c
            .group(|g| {
                g.send(&header, peer)?;
                g.recv(&mut small, 7)
            })
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("peer 7")),
            "{e:?}"
        );
        // Nothing was sent: the next call pairs up as if it never happened.
        let mut v = [1u8];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [2]);
    });
}

#[test]
fn ergonomics_debug_and_nccl_codes() {
    // Constructors are inherent: `Communicator::init` needs no trait import
    // (this file imports none), and every public type prints.
    with_ranks(2, test_config(), |c| {
        let d = format!("{c:?}");
        assert!(d.contains(&format!("rank: {}", c.rank())), "{d}");
        assert_eq!(c.world_size(), 2);
        let core: &CoreCommunicator = &c;
        assert!(format!("{core:?}").contains("nranks: 2"));
    });
    // ncclDataType_t and ncclRedOp_t values, as nccl.h defines them.
    assert_eq!(DataType::I8 as u8, 0);
    assert_eq!(DataType::F16 as u8, 6);
    assert_eq!(DataType::F32 as u8, 7);
    assert_eq!(DataType::F64 as u8, 8);
    assert_eq!(DataType::Bf16 as u8, 9);
    assert_eq!(ReduceOp::Sum as u8, 0);
    assert_eq!(ReduceOp::Prod as u8, 1);
    assert_eq!(ReduceOp::Max as u8, 2);
    assert_eq!(ReduceOp::Min as u8, 3);
    assert_eq!(ReduceOp::Avg as u8, 4);
    for d in DataType::ALL {
        assert_eq!(DataType::from_code(d.code()), Some(d));
    }
}

#[test]
fn shrink_leaves_out_a_lost_rank_and_the_survivors_compute_exactly() {
    with_ranks(4, test_config(), |c| {
        let r = c.rank();
        c.barrier().unwrap();
        if r == 2 {
            return; // leaves (its communicator is dropped)
        }
        let e = c
            .all_reduce_in_place(&mut [1f32; 1 << 16], ReduceOp::Sum)
            .unwrap_err();
        assert_eq!(e.blamed_rank(), Some(2), "{e:?}");
        // Bad lists are argument errors.
        assert!(matches!(c.shrink(&[r]), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.shrink(&[9]), Err(Error::InvalidArgument(_))));
        let small = c.shrink(&[2, 2]).unwrap();
        assert_eq!(small.nranks(), 3);
        assert_eq!(small.rank(), if r < 2 { r } else { r - 1 });
        assert_eq!(small.world_ranks(), [0, 1, 3]);
        let mut v = vec![r as f64 + 1.0; 1000];
        small.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert!(v.iter().all(|x| *x == 1.0 + 2.0 + 4.0));
        // And it shrinks again: world rank 3 leaves the three.
        if r == 3 {
            return;
        }
        let e = small
            .all_reduce_in_place(&mut [1f32; 1 << 16], ReduceOp::Sum)
            .unwrap_err();
        assert_eq!(e.blamed_world_rank(), Some(3), "{e:?}");
        let two = small.shrink(&[e.blamed_rank().unwrap()]).unwrap();
        assert_eq!(two.world_ranks(), [0, 1]);
        let mut v = [r as i64];
        two.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [1]);
    });
}

#[test]
fn survivors_that_disagree_on_whom_to_shrink_get_an_error() {
    let cfg = short(1500);
    with_ranks(3, cfg, |c| {
        c.barrier().unwrap();
        // Ranks 0 and 1 leave out different ranks: no common communicator.
        let out = match c.rank() {
            0 => c.shrink(&[2]).map(|_| ()),
            1 => c.shrink(&[0]).map(|_| ()),
            _ => return,
        };
        let e = out.unwrap_err();
        assert!(
            matches!(
                e,
                Error::Bootstrap(_) | Error::Handshake(_) | Error::Timeout { .. }
            ),
            "rank {}: {e:?}",
            c.rank()
        );
    });
}

#[test]
fn a_posted_receive_then_a_send_completes_on_both_sides() {
    // torch's irecv-then-send: each rank posts its receive, then sends
    // (blocking), then waits for the receive.
    with_ranks(2, test_config(), |c| {
        let peer = 1 - c.rank();
        for len in [0usize, 10, 1 << 20] {
            let w = c.recv_async(vec![0u32; len], peer);
            c.send(&vec![c.rank() as u32 + 7; len], peer).unwrap();
            assert_eq!(w.wait().unwrap(), vec![peer as u32 + 7; len]);
        }
    });
}

#[test]
fn a_posted_receive_does_not_hold_up_later_collectives() {
    // Rank 0 posts a receive that rank 1 satisfies only after a collective
    // that needs rank 0: the collective must not wait for the receive.
    with_ranks(2, short(5000), |c| {
        if c.rank() == 0 {
            let w = c.recv_async(vec![0f64; 1 << 16], 1);
            let mut v = [1f32; 8];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            c.barrier().unwrap();
            assert_eq!(v, [2.0; 8]);
            assert_eq!(w.wait().unwrap(), vec![3.5; 1 << 16]);
        } else {
            let mut v = [1f32; 8];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            c.barrier().unwrap();
            c.send(&vec![3.5f64; 1 << 16], 0).unwrap();
        }
        // And sends posted before a collective, received after it.
        let peer = 1 - c.rank();
        let s = c.send_async(vec![c.rank() as u8; 1 << 20], peer);
        let mut x = [c.rank() as i64];
        c.all_reduce_in_place(&mut x, ReduceOp::Max).unwrap();
        let got = c.recv_async(vec![0u8; 1 << 20], peer).wait().unwrap();
        s.wait().unwrap();
        assert_eq!(x, [1]);
        assert!(got.iter().all(|b| *b == peer as u8));
    });
}

#[test]
fn a_receive_that_does_not_match_its_send_is_a_mismatch_naming_both() {
    // Same bytes, different operation: 4 f32 sent, 8 bf16 expected.
    with_ranks(2, test_config(), |c| {
        if c.rank() == 0 {
            c.send(&[1f32; 4], 1).unwrap();
            // The receiver's verdict reaches the sender at its next call.
            let e = c.barrier().unwrap_err();
            assert!(
                matches!(e, Error::Mismatch { peer: 1, .. }),
                "rank 0: {e:?}"
            );
        } else {
            let mut got = [bf16::ZERO; 8];
            let e = c.recv(&mut got, 0).unwrap_err();
            let Error::Mismatch {
                local,
                remote,
                peer,
                ..
            } = &e
            else {
                panic!("rank 1: {e:?}");
            };
            assert_eq!(*peer, 0);
            assert!(local.contains("bf16") && remote.contains("f32"), "{e}");
        }
    });
}
