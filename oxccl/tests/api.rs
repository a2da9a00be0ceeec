//! Point-to-point, async, split, argument errors, abort, timeout, mismatch
//! and poisoning, over threads-as-ranks.

mod common;
use common::*;
use oxccl::prelude::*;
use oxccl::CrossMemory;
use std::time::{Duration, Instant};

#[test]
fn send_recv_exchange_larger_than_socket_buffers_does_not_deadlock() {
    // Both ranks post a send and a receive of 24 MiB to each other at once.
    let n = 2;
    with_ranks(n, test_config(), |c| {
        let peer = 1 - c.rank();
        let send: Vec<f32> = (0..6 << 20)
            .map(|i| (i % 1000) as f32 + c.rank() as f32)
            .collect();
        let mut recv = vec![0f32; send.len()];
        c.send_recv(&send, peer, &mut recv, peer).unwrap();
        assert!(recv
            .iter()
            .enumerate()
            .all(|(i, v)| *v == (i % 1000) as f32 + peer as f32));
    });
}

#[test]
fn blocking_send_and_recv_in_any_pair_and_order() {
    with_ranks(3, test_config(), |c| {
        // 0 -> 2, then 2 -> 1, then 1 -> 0 (each pair in its own order)
        let mut buf = [0u64; 5];
        match c.rank() {
            0 => {
                c.send(&[1u64, 2, 3, 4, 5], 2).unwrap();
                c.recv(&mut buf, 1).unwrap();
                assert_eq!(buf, [7; 5]);
            }
            1 => {
                c.recv(&mut buf, 2).unwrap();
                assert_eq!(buf, [6; 5]);
                c.send(&[7u64; 5], 0).unwrap();
            }
            _ => {
                c.recv(&mut buf, 0).unwrap();
                assert_eq!(buf, [1, 2, 3, 4, 5]);
                c.send(&[6u64; 5], 1).unwrap();
            }
        }
        // Zero-length messages and a self send/recv in a group.
        let mut empty: [u8; 0] = [];
        let mut me = [0i32; 3];
        let next = (c.rank() + 1) % 3;
        let prev = (c.rank() + 2) % 3;
        let mut got = [0i32; 3];
        let mine = [c.rank() as i32; 3];
        c.group(|g| {
            g.send(&mine, next)?;
            g.recv(&mut got, prev)?;
            g.send(&[9, 9, 9], c.rank())?;
            g.recv(&mut me, c.rank())
        })
        .unwrap();
        assert_eq!(got, [prev as i32; 3]);
        assert_eq!(me, [9; 3]);
        c.group(|g| {
            g.send::<u8, _>(&[], next)?;
            g.recv(&mut empty, prev)
        })
        .unwrap();
    });
}

#[test]
fn async_calls_run_in_issue_order_and_mix_with_blocking_ones() {
    with_ranks(3, test_config(), |c| {
        let r = c.rank() as f64;
        let w1 = c.all_reduce_async(vec![r; 1000], ReduceOp::Sum);
        let w2 = c.all_gather_async(vec![r; 2], vec![0.0; 6]);
        let w3 = c.reduce_scatter_async(vec![1.0f64; 6], vec![0.0; 2], ReduceOp::Sum);
        let mut b = [r; 4];
        c.all_reduce_in_place(&mut b, ReduceOp::Max).unwrap(); // waits for w1..w3
        assert_eq!(b, [2.0; 4]);
        assert!(w1.is_done());
        assert_eq!(w1.wait().unwrap(), vec![3.0; 1000]);
        assert_eq!(w2.wait().unwrap().1, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
        assert_eq!(w3.wait().unwrap().1, vec![3.0; 2]);
        let w = c.broadcast_async(vec![r; 3], 1);
        assert_eq!(w.wait().unwrap(), vec![1.0; 3]);
        c.barrier_async().wait().unwrap();
        let next = (c.rank() + 1) % 3;
        let prev = (c.rank() + 2) % 3;
        let s = c.send_async(vec![r as u32; 10], next);
        let got = c.recv_async(vec![0u32; 10], prev).wait().unwrap();
        s.wait().unwrap();
        assert_eq!(got, vec![prev as u32; 10]);
    });
}

#[test]
fn split_makes_working_subgroups() {
    with_ranks(5, test_config(), |c| {
        let r = c.rank();
        let color = if r == 4 { None } else { Some((r % 2) as u32) };
        let sub = c.split_maybe(color, -(r as i64)).unwrap();
        match sub {
            None => assert_eq!(r, 4),
            Some(s) => {
                assert_eq!(s.nranks(), 2);
                // key = -rank: higher parent rank comes first.
                assert_eq!(s.rank(), if r >= 2 { 0 } else { 1 });
                assert_eq!(s.world_rank(), r);
                assert_eq!(s.world_ranks()[s.rank()], r);
                let mut v = [r as i32];
                s.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert_eq!(v[0], if r % 2 == 0 { 2 } else { 4 });
            }
        }
        c.barrier().unwrap();
    });
}

#[test]
fn bad_arguments_are_typed_errors_and_leave_the_communicator_usable() {
    with_ranks(2, test_config(), |c| {
        let mut out = [0f32; 3];
        let e = c
            .all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(matches!(
            c.broadcast_in_place(&mut out, 2),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            c.all_gather(&[1f32; 2], &mut out),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            c.reduce_scatter(&[1f32; 5], &mut out, ReduceOp::Sum),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            c.all_to_all_in_place(&mut out),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(c.send(&out, 7), Err(Error::InvalidArgument(_))));
        let bytes = [0u8; 7];
        let mut rb = [0u8; 7];
        assert!(matches!(
            c.collective_bytes(
                oxccl::Kind::AllReduce,
                Some(&bytes),
                &mut rb,
                DataType::F32,
                ReduceOp::Sum,
                0
            ),
            Err(Error::InvalidArgument(_))
        ));
        // Still works.
        let mut v = [c.rank() as u8 + 1];
        c.all_reduce_in_place(&mut v, ReduceOp::Prod).unwrap();
        assert_eq!(v, [2]);
        assert!(c.error().is_none());
    });
}

#[test]
fn abort_wakes_every_waiter_and_poisons() {
    let cfg = test_config();
    with_ranks(2, cfg, |c| {
        if c.rank() == 0 {
            // Rank 1 never joins: one call blocks in the executor, an async
            // one waits behind it for its turn, a third thread waits for its
            // turn with a blocking call. Abort from a fourth thread.
            let queued = c.all_reduce_async(vec![1f32; 10], ReduceOp::Sum);
            std::thread::scope(|s| {
                let blocked = s.spawn(|| {
                    let r = c.all_reduce_in_place(&mut [1f32; 10], ReduceOp::Sum);
                    (r, Instant::now())
                });
                std::thread::sleep(Duration::from_millis(100));
                let waiting = s.spawn(|| {
                    let r = c.barrier();
                    (r, Instant::now())
                });
                std::thread::sleep(Duration::from_millis(200));
                let t = Instant::now();
                c.abort();
                let queued_r = queued.wait();
                let queued_at = Instant::now();
                for (what, (r, at)) in [
                    ("blocked", blocked.join().unwrap()),
                    ("waiting", waiting.join().unwrap()),
                    ("queued", (queued_r.map(|_| ()), queued_at)),
                ] {
                    let e = r.unwrap_err();
                    assert_eq!(
                        e,
                        Error::Aborted {
                            by: None,
                            world_by: None
                        },
                        "{what}"
                    );
                    let took = at.saturating_duration_since(t);
                    // Generous bound (2 cores, 3 threads): the design target is 100 ms.
                    assert!(took < Duration::from_secs(1), "{what} woke after {took:?}");
                    eprintln!(
                        "abort: {what} call returned after {:.2} ms",
                        took.as_secs_f64() * 1e3
                    );
                }
            });
            // Later calls fail at once with the original cause.
            assert_eq!(
                c.barrier().unwrap_err(),
                Error::Aborted {
                    by: None,
                    world_by: None
                }
            );
        } else {
            // Told by the root that rank 0 aborted, before sending anything.
            std::thread::sleep(Duration::from_millis(800));
            let e = c.barrier().unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Aborted { by: Some(0), .. } | Error::PeerLost { rank: 0, .. }
                ),
                "{e:?}"
            );
        }
    });
}

#[test]
fn a_peer_closing_its_links_is_peer_lost_and_drop_is_bounded() {
    // Rank 1 leaves at once; rank 0's call fails, then dropping its
    // communicator (goodbye to the root, closing links) must not block.
    with_ranks(2, test_config(), |c| {
        if c.rank() == 0 {
            // A peer that closed its links is a lost peer, named.
            let e = c
                .all_reduce_in_place(&mut [1f32; 1 << 16], ReduceOp::Sum)
                .unwrap_err();
            assert!(matches!(e, Error::PeerLost { rank: 1, .. }), "{e:?}");
            let t = Instant::now();
            drop(c);
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "drop took {:?}",
                t.elapsed()
            );
        }
    });
}

#[test]
fn a_rank_that_never_calls_is_a_timeout_not_a_hang() {
    let cfg = Config {
        timeout: Duration::from_secs(1),
        ..test_config()
    };
    with_ranks(2, cfg, |c| {
        if c.rank() == 0 {
            let t = Instant::now();
            let e = c
                .all_reduce_in_place(&mut [1f32; 10], ReduceOp::Sum)
                .unwrap_err();
            assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
            assert!(t.elapsed() < Duration::from_secs(5));
            assert!(
                e.to_string().contains("rank 1 stopped making progress"),
                "{e}"
            );
        } else {
            std::thread::sleep(Duration::from_millis(1500));
            // The root's verdict on rank 0's timeout names rank 1, the one that never called.
            let e = c.barrier().unwrap_err();
            match &e {
                Error::Timeout { waiting_for, .. } => {
                    assert!(
                        waiting_for.contains("rank 1 stopped making progress")
                            && waiting_for.contains("ranks [0] timed out"),
                        "{e}"
                    )
                }
                other => panic!("expected the relayed timeout, got {other:?}"),
            }
        }
    });
}

#[test]
fn different_collectives_are_a_mismatch_on_every_rank() {
    with_ranks(3, test_config(), |c| {
        let mut buf = [1f32; 12];
        let r = if c.rank() == 1 {
            c.all_gather_in_place(&mut buf)
        } else {
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        };
        match r.unwrap_err() {
            Error::Mismatch {
                local,
                peer,
                remote,
                ..
            } => {
                assert!(
                    local.contains("collective #0") && remote.contains("collective #0"),
                    "{local} / {remote}"
                );
                assert_ne!(local, remote);
                if c.rank() == 1 {
                    assert!(
                        local.starts_with("all_gather")
                            && remote.starts_with("all_reduce(count=12, f32, sum)"),
                        "{local} / {remote}"
                    );
                    assert_ne!(peer, 1);
                } else {
                    assert!(
                        local.starts_with("all_reduce")
                            && remote.starts_with("all_gather(count=4, f32)"),
                        "{local} / {remote}"
                    );
                    assert_eq!(peer, 1, "rank {} blames {peer}", c.rank());
                }
            }
            other => panic!("rank {}: expected a mismatch, got {other:?}", c.rank()),
        }
    });
}

#[test]
fn one_rank_communicator_just_copies() {
    with_ranks(1, test_config(), |c| {
        let mut out = [0i64; 3];
        c.all_reduce(&[1, 2, 3], &mut out, ReduceOp::Avg).unwrap();
        assert_eq!(out, [1, 2, 3]);
        c.all_to_all(&[4, 5, 6], &mut out).unwrap();
        assert_eq!(out, [4, 5, 6]);
        c.barrier().unwrap();
    });
}

#[test]
fn float_results_are_bitwise_identical_on_every_rank() {
    // Inexact data (random-looking floats): the sum depends on the order,
    // yet every rank must end with the very same bits.
    let n = 5;
    let results = with_ranks(n, test_config(), |c| {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ ((c.rank() as u64 + 1) * 0x1234_5678);
        let mut v: Vec<f32> = (0..300_007)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 1_000_000) as f32 / 7.3 - 50_000.0
            })
            .collect();
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        // Also compare through the library itself: gather every rank's hash.
        let mut all = vec![0u64; n];
        c.all_gather(&[fnv_hash(&v)], &mut all).unwrap();
        (v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(), all)
    });
    for (bits, _) in &results[1..] {
        assert!(bits == &results[0].0, "ranks disagree bitwise");
    }
    let hashes = &results[0].1;
    assert!(hashes.iter().all(|h| *h == hashes[0]));
}

fn fnv_hash(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    })
}

mod registered {
    use super::common::*;
    use oxccl::prelude::*;
    use oxccl::selftest::{run_registered, DirectFrom};

    #[test]
    fn zero_copy_all_reduce_matrix() {
        for n in [1, 2, 3, 4, 5, 8] {
            with_ranks(n, test_config(), |c| {
                let want = if n > 1 {
                    DirectFrom::Bytes(0)
                } else {
                    DirectFrom::Never
                };
                run_registered(&c, want, 200_003).unwrap();
            });
        }
    }

    /// Registered all_reduces in many pieces (4 KiB chunks: each owner
    /// reduces and pushes its segment piece by piece, through two
    /// alternating scratch slots), in and out of place, back to back.
    #[test]
    fn registered_all_reduce_in_many_pieces_is_exact() {
        // 100 003 floats stay in the cache; 1 048 581 (4 MiB and 20 bytes,
        // an odd tail) stream their outputs past it; the average takes
        // the two-pass variant (reduce, divide, copy out).
        for n in [2, 3, 4] {
            let cfg = Config {
                chunk_bytes: Some(4096),
                ..test_config()
            };
            with_ranks(n, cfg, |c| {
                let r = c.rank();
                for count in [100_003, 1_048_581] {
                    let fill = |b: &mut [f32]| {
                        for (i, x) in b.iter_mut().enumerate() {
                            *x = ((i % 11) + 3 * r) as f32;
                        }
                    };
                    let mut a = c.alloc_shared::<f32>(count).unwrap();
                    let mut out = c.alloc_shared::<f32>(count).unwrap();
                    let nf = n as f32;
                    let sum = |i: usize| nf * (i % 11) as f32 + 3.0 * (nf * (nf - 1.0) / 2.0);
                    for round in 0..4 {
                        fill(&mut a);
                        let op = if round == 3 {
                            ReduceOp::Avg
                        } else {
                            ReduceOp::Sum
                        };
                        if round % 2 == 0 {
                            c.all_reduce(&a, &mut out, op).unwrap();
                        } else {
                            c.all_reduce_in_place(&mut a, op).unwrap();
                            out.copy_from_slice(&a);
                        }
                        assert_eq!(c.last_algorithm(), Some("direct"));
                        for (i, x) in out.iter().enumerate() {
                            let want = if round == 3 { sum(i) / nf } else { sum(i) };
                            assert_eq!(*x, want, "n {n} count {count} round {round} element {i}");
                        }
                    }
                }
            });
        }
    }

    #[test]
    fn registered_buffers_across_hosts_fall_back_and_stay_correct() {
        with_rank_configs(
            4,
            |r| host_config(r % 2),
            |c| {
                run_registered(&c, DirectFrom::Never, 200_003).unwrap();
            },
        );
    }

    #[test]
    fn a_different_op_on_registered_buffers_is_a_mismatch() {
        with_ranks(3, test_config(), |c| {
            let mut b = c.alloc_shared::<f32>(100).unwrap();
            let op = if c.rank() == 1 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let e = c.all_reduce_in_place(&mut b, op).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Mismatch { .. } | Error::Remote { .. } | Error::PeerLost { .. }
                ),
                "{e:?}"
            );
            if c.rank() == 1 {
                assert!(
                    matches!(e, Error::Mismatch { .. }),
                    "rank 1 sees the others' sum: {e:?}"
                );
            }
        });
    }

    /// A direct access whose memory one rank cannot map (GPUs without
    /// peer access, say): this stands in for the core's agreement only —
    /// it labels host memory as device memory nothing here touches.
    struct Unmappable {
        refuses: bool,
    }

    struct Block(Vec<u64>);

    impl comm_core::transport::Mapped for Block {
        fn region(&self) -> oxccl::Region {
            oxccl::Region {
                space: oxccl::MemorySpace::Device {
                    kind: oxccl::DeviceKind::Cuda,
                    ordinal: 0,
                },
                addr: self.0.as_ptr() as usize,
                len: self.0.len() * 8,
            }
        }
    }

    impl comm_core::transport::DirectAccess for Unmappable {
        fn access(&self) -> comm_core::algorithms::Access {
            comm_core::algorithms::Access::Mapped
        }
        fn export(
            &self,
            len: usize,
        ) -> oxccl::Result<(Box<dyn comm_core::transport::Mapped>, Vec<u8>)> {
            Ok((Box::new(Block(vec![0; len.div_ceil(8)])), vec![1]))
        }
        fn import(
            &self,
            peer: usize,
            _: &[u8],
            len: usize,
        ) -> oxccl::Result<comm_core::transport::PeerMemory> {
            match self.refuses {
                true => Err(Error::Transport {
                    peer,
                    world_peer: peer,
                    detail: format!("no peer access to rank {peer}'s device"),
                }),
                false => Ok(comm_core::transport::PeerMemory::Mapped(Box::new(Block(
                    vec![0; len.div_ceil(8)],
                )))),
            }
        }
    }

    #[test]
    fn memory_one_rank_cannot_map_leaves_every_rank_to_messages() {
        for refusing in [None, Some(2)] {
            with_ranks(3, test_config(), |c| {
                let access = std::sync::Arc::new(Unmappable {
                    refuses: refusing == Some(c.rank()),
                });
                let b = c.alloc_shared_device::<f32>(1000, access).unwrap();
                assert_eq!(b.is_zero_copy(), refusing.is_none(), "rank {}", c.rank());
                // The communicator goes on.
                let mut x = [1.0f32; 5];
                c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                assert_eq!(x, [3.0; 5]);
            });
        }
    }

    #[test]
    fn mismatched_allocation_sizes_are_an_argument_error() {
        with_ranks(2, test_config(), |c| {
            let e = c.alloc_shared::<f32>(10 + c.rank()).err().unwrap();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        });
    }
}

/// The queued entry on regions (what device streams wait on): `after` runs
/// exactly once, with the outcome, when the call succeeds, when its
/// arguments are bad, and when it never runs because the communicator had
/// failed.
#[test]
fn queued_region_calls_always_report_their_end_exactly_once() {
    use oxccl::{DataType, Kind, Region};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    with_ranks(2, test_config(), |c| {
        let ends = Arc::new(AtomicUsize::new(0));
        let oks = Arc::new(AtomicUsize::new(0));
        let after = || {
            let (e, o) = (ends.clone(), oks.clone());
            Box::new(move |r: &oxccl::Result<()>| {
                e.fetch_add(1, Ordering::SeqCst);
                if r.is_ok() {
                    o.fetch_add(1, Ordering::SeqCst);
                }
            }) as Box<dyn FnOnce(&oxccl::Result<()>) + Send>
        };
        let ran_before = Arc::new(AtomicUsize::new(0));
        let b = ran_before.clone();
        let before = Box::new(move || {
            b.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        // Success: the data is reduced, `before` ran, `after` saw Ok.
        let mut buf = vec![c.rank() as f32 + 1.0; 1000];
        let r = Region::host_mut(oxccl::as_bytes_mut(&mut buf[..]));
        // SAFETY: `buf` lives until the work is waited for.
        let w = unsafe {
            c.collective_regions_async(
                Kind::AllReduce,
                None,
                r,
                DataType::F32,
                ReduceOp::Sum,
                0,
                before,
                after(),
            )
        };
        w.wait().unwrap();
        assert!(buf.iter().all(|x| *x == 3.0));
        assert_eq!(ran_before.load(Ordering::SeqCst), 1);
        assert_eq!(
            (ends.load(Ordering::SeqCst), oks.load(Ordering::SeqCst)),
            (1, 1)
        );
        // Bad arguments: a length that is not whole elements.
        let r = Region::host_mut(&mut oxccl::as_bytes_mut(&mut buf[..])[..7]);
        // SAFETY: rejected before anything runs.
        let w = unsafe {
            c.collective_regions_async(
                Kind::AllReduce,
                None,
                r,
                DataType::F32,
                ReduceOp::Sum,
                0,
                Box::new(|| Ok(())),
                after(),
            )
        };
        assert!(w.wait().is_err());
        assert_eq!(
            (ends.load(Ordering::SeqCst), oks.load(Ordering::SeqCst)),
            (2, 1)
        );
        // A failed communicator: the call never runs, `after` still does.
        c.barrier().unwrap();
        c.abort();
        let r = Region::host_mut(oxccl::as_bytes_mut(&mut buf[..]));
        // SAFETY: `buf` outlives the wait.
        let w = unsafe {
            c.collective_regions_async(
                Kind::AllReduce,
                None,
                r,
                DataType::F32,
                ReduceOp::Sum,
                0,
                Box::new(|| panic!("an aborted communicator ran a call")),
                after(),
            )
        };
        assert!(w.wait().is_err());
        assert_eq!(
            (ends.load(Ordering::SeqCst), oks.load(Ordering::SeqCst)),
            (3, 1)
        );
    });
}

/// The small-message path takes small all_reduces among the ranks of one
/// host (shared memory) and nothing else: not larger ones, not other
/// collectives, not over TCP, not when an algorithm is forced; results
/// exact in every case (every rank combines in rank order), in place too.
#[test]
fn small_all_reduces_on_one_host_take_the_small_path() {
    let ran = |cfg: Config, count: usize, in_place: bool| -> Vec<Option<&'static str>> {
        with_ranks(3, cfg, |c| {
            let mine: Vec<f32> = (0..count).map(|i| (c.rank() * 1000 + i) as f32).collect();
            let mut out = vec![0f32; count];
            if in_place {
                out.copy_from_slice(&mine);
                c.all_reduce_in_place(&mut out, ReduceOp::Sum).unwrap();
            } else {
                c.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
            }
            for (i, v) in out.iter().enumerate() {
                assert_eq!(*v, (3000 + 3 * i) as f32, "element {i} of {count}");
            }
            c.last_algorithm()
        })
    };
    for (count, in_place) in [(1, false), (2, true), (1024, false), (1024, true)] {
        assert!(
            ran(test_config(), count, in_place)
                .iter()
                .all(|a| *a == Some("small")),
            "{count} floats"
        );
    }
    // 4 KiB + 4 bytes per rank: the general path.
    assert!(ran(test_config(), 1025, false)
        .iter()
        .all(|a| *a != Some("small")));
    assert!(ran(tcp_config(), 2, false)
        .iter()
        .all(|a| *a != Some("small")));
    let forced = Config {
        algo: Some("ring".into()),
        ..test_config()
    };
    assert!(ran(forced, 2, false).iter().all(|a| *a == Some("ring")));
}

/// Rank `k`'s element `i` in call `call` of the mixed sequence below.
fn small_value(k: usize, i: usize, call: usize) -> f32 {
    (k * 1000 + i + call) as f32
}

/// One call of a mixed sequence on 3 ranks: every collective, in and out
/// of place, roots and sizes drawn alike on every rank (the same seed),
/// some just over the small path's 4 KiB slot. Checks the output exactly
/// and returns whether it took the small path.
fn small_call(c: &Communicator, call: usize, draw: u64) -> bool {
    let (n, me) = (c.nranks(), c.rank());
    let kind = draw % 7;
    let in_place = (draw >> 3) % 2 == 1;
    let root = (draw >> 4) as usize % n;
    // Elements per rank: at most the slot, or just over it.
    let over = (draw >> 6).is_multiple_of(4);
    let per_slot = if matches!(kind, 2 | 5) {
        1024 / n
    } else {
        1024
    };
    let count = if over {
        per_slot + 1
    } else {
        1 + (draw >> 8) as usize % per_slot
    };
    let v = |k: usize, i: usize| small_value(k, i, call);
    let mine = |len: usize| (0..len).map(|i| v(me, i)).collect::<Vec<f32>>();
    let sum = |i: usize| (0..n).map(|k| v(k, i)).sum::<f32>();
    let (out, want): (Vec<f32>, Vec<f32>) = match kind {
        0 => {
            let mut out = mine(count);
            if in_place {
                c.all_reduce_in_place(&mut out, ReduceOp::Sum).unwrap();
            } else {
                c.all_reduce(&mine(count), &mut out, ReduceOp::Sum).unwrap();
            }
            (out, (0..count).map(sum).collect())
        }
        1 => {
            let mut out = vec![0f32; n * count];
            if in_place {
                out[me * count..][..count].copy_from_slice(&mine(count));
                c.all_gather_in_place(&mut out).unwrap();
            } else {
                c.all_gather(&mine(count), &mut out).unwrap();
            }
            let want = (0..n * count).map(|j| v(j / count, j % count)).collect();
            (out, want)
        }
        2 => {
            let want = (0..count).map(|i| sum(me * count + i)).collect();
            if in_place {
                let mut buf = mine(n * count);
                c.reduce_scatter_in_place(&mut buf, ReduceOp::Sum).unwrap();
                (buf[me * count..][..count].to_vec(), want)
            } else {
                let mut out = vec![0f32; count];
                c.reduce_scatter(&mine(n * count), &mut out, ReduceOp::Sum)
                    .unwrap();
                (out, want)
            }
        }
        3 => {
            let mut out = if me == root {
                mine(count)
            } else {
                vec![0f32; count]
            };
            if in_place {
                c.broadcast_in_place(&mut out, root).unwrap();
            } else {
                c.broadcast(&mine(count), &mut out, root).unwrap();
            }
            (out, (0..count).map(|i| v(root, i)).collect())
        }
        4 => {
            let mut out = mine(count);
            if in_place {
                c.reduce_in_place(&mut out, ReduceOp::Sum, root).unwrap();
            } else {
                c.reduce(&mine(count), &mut out, ReduceOp::Sum, root)
                    .unwrap();
            }
            match me == root {
                true => (out, (0..count).map(sum).collect()),
                // A non-root's buffer is its own.
                false => (out, mine(count)),
            }
        }
        5 => {
            let mut out = mine(n * count);
            if in_place {
                c.all_to_all_in_place(&mut out).unwrap();
            } else {
                c.all_to_all(&mine(n * count), &mut out).unwrap();
            }
            let want = (0..n * count)
                .map(|j| v(j / count, me * count + j % count))
                .collect();
            (out, want)
        }
        _ => {
            c.barrier().unwrap();
            (vec![], vec![])
        }
    };
    assert!(
        out == want,
        "call {call} (kind {kind}, {count} elements, in place {in_place}, root {root}) on rank {me}"
    );
    c.last_algorithm() == Some("small")
}

#[test]
fn small_calls_of_every_collective_on_one_host_take_the_small_path() {
    // The same draws on every rank: a mixed sequence exercises the reuse
    // of slots across collectives that write and read them differently
    // (a broadcast's receivers write nothing, a reduce's non-roots read
    // nothing).
    let draws: Vec<u64> = {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..400)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect()
    };
    let took = with_ranks(3, test_config(), |c| {
        draws
            .iter()
            .enumerate()
            .map(|(call, d)| small_call(&c, call, *d))
            .collect::<Vec<bool>>()
    });
    for (call, d) in draws.iter().enumerate() {
        let over = (d >> 6).is_multiple_of(4) && d % 7 != 6;
        for (rank, t) in took.iter().enumerate() {
            assert_eq!(
                t[call],
                !over,
                "call {call} (kind {}) on rank {rank}",
                d % 7
            );
        }
    }
    // Over TCP, never.
    let took = with_ranks(3, tcp_config(), |c| small_call(&c, 0, 3));
    assert!(took.iter().all(|t| !t));
}

/// Small calls far apart in the sequence, with general calls between
/// them, land in the same slot (slots go by sequence number, 64 a page): a
/// rank reuses its slot only once every peer says it finished the call
/// that last wrote it, and ranks hold that word back for a few calls. A
/// word held back across the general calls (or across a wait) would
/// leave both ranks waiting for each other until the deadline.
#[test]
fn small_calls_between_general_calls_reuse_their_slot() {
    let cfg = Config {
        timeout: Duration::from_secs(10),
        ..test_config()
    };
    for n in [2, 3] {
        with_ranks(n, cfg.clone(), |c| {
            let me = c.rank();
            let big: Vec<f32> = vec![1.0; 2048];
            let mut big_out = vec![0f32; 2048];
            for round in 0..4 {
                let mut v = [(me + round) as f32; 2];
                let root = round % n;
                match round % 2 {
                    0 => c.broadcast_in_place(&mut v, root).unwrap(),
                    _ => c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap(),
                }
                let want = match round % 2 {
                    0 => (root + round) as f32,
                    _ => (0..n).map(|k| (k + round) as f32).sum(),
                };
                assert_eq!(v, [want; 2], "round {round} on rank {me} of {n}");
                assert_eq!(c.last_algorithm(), Some("small"));
                // 8 KiB per rank: the general path, 63 calls to the next
                // small one, in the same slot.
                for _ in 0..63 {
                    c.all_reduce(&big, &mut big_out, ReduceOp::Sum).unwrap();
                    assert_ne!(c.last_algorithm(), Some("small"));
                }
            }
        });
    }
}

#[test]
fn large_plain_all_reduces_on_one_host_copy_in_through_shared_memory() {
    // From 1 MiB per rank (f32: 262144 elements); counts that are no
    // multiple of the ranks or of a piece (349 524 f32 with 8 MiB of
    // shared memory, whatever this host's cache), in and out of place,
    // back to back so each call reuses the shared memory the last one's
    // readers left.
    let cases: [(usize, bool, ReduceOp); 6] = [
        (262_144, false, ReduceOp::Sum),
        (1_300_001, false, ReduceOp::Sum),
        (1_300_001, true, ReduceOp::Max),
        (524_289, true, ReduceOp::Avg),
        (262_143, false, ReduceOp::Sum),
        (2_000_000, false, ReduceOp::Min),
    ];
    let n = 3;
    let cfg = Config {
        copyin_memory: Some(8 << 20),
        ..test_config()
    };
    let results = with_ranks(n, cfg, |c| {
        let r = c.rank();
        let mut took = Vec::new();
        for &(count, in_place, op) in &cases {
            let input: Vec<f32> = (0..count).map(|i| ((i % 13) + 4 * r) as f32).collect();
            let out = if in_place {
                let mut b = input.clone();
                c.all_reduce_in_place(&mut b, op).unwrap();
                b
            } else {
                let mut b = vec![f32::NAN; count];
                c.all_reduce(&input, &mut b, op).unwrap();
                b
            };
            for (i, v) in out.iter().enumerate() {
                let base = (i % 13) as f32;
                let want = match op {
                    ReduceOp::Sum => 3.0 * base + 12.0,
                    ReduceOp::Avg => (3.0 * base + 12.0) / 3.0,
                    ReduceOp::Max => base + 8.0,
                    ReduceOp::Min => base,
                    _ => unreachable!(),
                };
                assert_eq!(*v, want, "count {count} {op:?} element {i} on rank {r}");
            }
            took.push(c.last_algorithm());
        }
        took
    });
    for t in results {
        let want: Vec<Option<&str>> = cases
            .iter()
            .map(|(count, ..)| Some(if *count >= 262_144 { "copyin" } else { "ring" }))
            .collect();
        assert_eq!(t, want);
    }
}

#[test]
fn ranks_asking_for_different_copy_in_memory_stage_through_the_least() {
    // Rank 1 would stage through 64 KiB over all ranks (pieces of 2 730
    // f32 on 3 ranks), the others through 8 MiB (pieces of 349 524): the
    // schedule follows the size, so unless every rank takes the same one
    // the owners reduce segments their peers never staged (or wait for
    // `Sync`s that never come).
    let n = 3;
    let cfg = |r: usize| Config {
        copyin_memory: Some(if r == 1 { 64 << 10 } else { 8 << 20 }),
        timeout: Duration::from_secs(20),
        ..test_config()
    };
    let took = with_rank_configs(n, cfg, |c| {
        let r = c.rank();
        let count = 1_000_003;
        let input: Vec<f32> = (0..count).map(|i| ((i % 13) + 4 * r) as f32).collect();
        let mut out = vec![f32::NAN; count];
        c.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, 3.0 * (i % 13) as f32 + 12.0, "element {i} on rank {r}");
        }
        c.last_algorithm()
    });
    assert!(took.iter().all(|a| *a == Some("copyin")), "{took:?}");
}

#[test]
fn large_plain_all_to_alls_on_one_host_copy_once_by_the_kernel_or_in_through_shared_memory() {
    // 3 and 4 ranks, in and out of place, blocks of several pieces (4
    // ranks: 2 MiB of shared memory per rank, 65536 f32 per block per
    // piece) and one not a multiple of a piece. Out of place from 1 MiB a
    // rank the kernel copies each block once from its owner's input
    // (cross-memory attach), unless `OXCCL_CMA=off`; in place, and with it
    // off, the blocks go through shared memory. 2 ranks keep the pairwise
    // exchange but for the single copy out of place from 1 MiB.
    // (`OXCCL_CMA=on`: chosen by size alone, whatever this host's kernel
    // copy timed at creation.)
    for (n, cross_memory) in [(2, true), (2, false), (3, true), (4, true), (4, false)] {
        let cfg = Config {
            copyin_memory: Some(8 << 20),
            cross_memory: match cross_memory {
                true => CrossMemory::On,
                false => CrossMemory::Off,
            },
            ..test_config()
        };
        let took = with_ranks(n, cfg.clone(), move |c| {
            let r = c.rank();
            let mut took = Vec::new();
            for (count, in_place) in [(150_001usize, false), (200_000, true), (90_001, false)] {
                let input: Vec<f32> = (0..n * count).map(|i| (r * 1_000_000 + i) as f32).collect();
                let out = if in_place {
                    let mut b = input.clone();
                    c.all_to_all_in_place(&mut b).unwrap();
                    b
                } else {
                    let mut b = vec![f32::NAN; n * count];
                    c.all_to_all(&input, &mut b).unwrap();
                    b
                };
                for k in 0..n {
                    for i in 0..count {
                        // Block r of rank k's input.
                        let want = (k * 1_000_000 + r * count + i) as f32;
                        assert_eq!(
                            out[k * count + i],
                            want,
                            "n {n} count {count} block {k} element {i}"
                        );
                    }
                }
                took.push(c.last_algorithm());
            }
            took
        });
        let want = match (n > 2, cross_memory) {
            (true, true) => ["singlecopy", "copyin", "singlecopy"],
            (true, false) => ["copyin"; 3],
            (false, true) => ["singlecopy", "pairwise", "pairwise"],
            (false, false) => ["pairwise"; 3],
        };
        for t in took {
            assert_eq!(t, want.map(Some), "n {n}, cross-memory {cross_memory}");
        }
    }
}

#[test]
fn staging_written_streamed_or_cached_holds_the_same_bytes() {
    // Every copy-in collective on 3 ranks (pieces of 21 845 f32 per rank
    // in 256 KiB of shared memory: several pieces and a ragged last one),
    // and the ring's all_reduce and all_gather over shared-memory links
    // (their ring buffers are staging too), with staging writes forced
    // streamed (non-temporal stores) on every rank, forced cached, and one
    // rank each way under the gauge (`auto`): exact results every time.
    // The gauge streams only where pieces cross between caches, which a
    // test cannot arrange; forcing reaches the same writes.
    let n = 3;
    for (algo, modes) in ["copyin", "ring"].into_iter().flat_map(|a| {
        [
            [Some(true); 3],
            [Some(false); 3],
            [Some(true), None, Some(false)],
        ]
        .map(|m| (a, m))
    }) {
        let cfg = move |r: usize| Config {
            copyin_memory: Some(256 << 10),
            algo: Some(algo.into()),
            cross_memory: CrossMemory::Off,
            stage_writes: modes[r],
            ..test_config()
        };
        let took = with_rank_configs(n, cfg, |c| {
            let r = c.rank();
            let count = 100_003;
            let input: Vec<f32> = (0..count).map(|i| ((i % 13) + 4 * r) as f32).collect();
            let mut took = Vec::new();
            // 20 all_reduces: the gauge's probes (every eighth call) too.
            for _ in 0..20 {
                let mut out = vec![f32::NAN; count];
                c.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
                for (i, v) in out.iter().enumerate() {
                    assert_eq!(
                        *v,
                        3.0 * (i % 13) as f32 + 12.0,
                        "all_reduce {i} rank {r} {algo} {modes:?}"
                    );
                }
            }
            took.push(c.last_algorithm());
            let mut all = vec![f32::NAN; n * count];
            c.all_gather(&input, &mut all).unwrap();
            for (i, v) in all.iter().enumerate() {
                let (k, j) = (i / count, i % count);
                assert_eq!(
                    *v,
                    ((j % 13) + 4 * k) as f32,
                    "all_gather {i} rank {r} {algo} {modes:?}"
                );
            }
            took.push(c.last_algorithm());
            let mut b = input.clone();
            c.broadcast_in_place(&mut b, 1).unwrap();
            for (i, v) in b.iter().enumerate() {
                assert_eq!(
                    *v,
                    ((i % 13) + 4) as f32,
                    "broadcast {i} rank {r} {modes:?}"
                );
            }
            took.push(c.last_algorithm());
            let blocks: Vec<f32> = (0..n * count).map(|i| (r * 1_000_000 + i) as f32).collect();
            let mut got = vec![f32::NAN; n * count];
            c.all_to_all(&blocks, &mut got).unwrap();
            for (i, v) in got.iter().enumerate() {
                let (k, j) = (i / count, i % count);
                assert_eq!(
                    *v,
                    (k * 1_000_000 + r * count + j) as f32,
                    "all_to_all {i} rank {r} {modes:?}"
                );
            }
            took.push(c.last_algorithm());
            took
        });
        for t in took {
            match algo {
                "copyin" => assert_eq!(t, vec![Some("copyin"); 4], "{modes:?}"),
                _ => assert_eq!(t[..2], [Some("ring"); 2], "{modes:?}"),
            }
        }
    }
}

#[test]
fn large_plain_all_gathers_and_broadcasts_on_one_host_copy_in_through_shared_memory() {
    // 3 ranks, 8 MiB of shared memory (pieces of 349 525 f32 per rank):
    // counts of several pieces, of one piece and a little, and not a
    // multiple of one; in and out of place; broadcasts from every root
    // (non-roots pass no input), back to back so each call reuses the
    // shared memory the last one's readers left. The smallest calls keep
    // the rings (an all_gather below 4 MiB of output, a broadcast below 1
    // MiB or below a third of the host's cache), and 2-rank broadcasts
    // keep the chain.
    let cfg = Config {
        copyin_memory: Some(8 << 20),
        ..test_config()
    };
    let value = |r: usize, i: usize| (r * 10_000_000 + i % 1_000_003) as f32;
    let n = 3;
    let took = with_ranks(n, cfg.clone(), move |c| {
        let r = c.rank();
        let mut took = Vec::new();
        for (count, in_place) in [
            (1_000_003usize, false),
            (700_001, true),
            (349_526, false),
            (300_000, true),
            (100_000, false),
        ] {
            let mine: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
            let mut out = vec![f32::NAN; n * count];
            match in_place {
                true => {
                    out[r * count..(r + 1) * count].copy_from_slice(&mine);
                    c.all_gather_in_place(&mut out).unwrap();
                }
                false => c.all_gather(&mine, &mut out).unwrap(),
            }
            for (i, v) in out.iter().enumerate() {
                let want = value(i / count, i % count);
                assert_eq!(*v, want, "all_gather count {count} element {i} on rank {r}");
            }
            took.push(("all_gather", count, c.last_algorithm()));
        }
        for (count, in_place, root) in [
            (3_000_001usize, false, 2),
            (1_000_003, false, 0),
            (700_001, true, 2),
            (349_526, false, 1),
            (200_000, true, 1),
        ] {
            let theirs: Vec<f32> = (0..count).map(|i| value(root, i)).collect();
            let out = match in_place {
                true => {
                    let mut b = match r == root {
                        true => theirs.clone(),
                        false => vec![f32::NAN; count],
                    };
                    c.broadcast_in_place(&mut b, root).unwrap();
                    b
                }
                false => {
                    let mut b = vec![f32::NAN; count];
                    let send: &[f32] = if r == root { &theirs } else { &[] };
                    c.broadcast(send, &mut b, root).unwrap();
                    b
                }
            };
            assert!(
                out == theirs,
                "broadcast count {count} from {root} on rank {r}"
            );
            took.push(("broadcast", count, c.last_algorithm()));
        }
        let cache = c.peers().iter().filter_map(|p| p.llc).min();
        (took, cache)
    });
    for (t, cache) in took {
        for (kind, count, alg) in t {
            // A broadcast copies in from 1 MiB, and from where every
            // rank's copy fills the least cache if that is more.
            let big = match kind {
                "all_gather" => n * count * 4 >= 4 << 20,
                _ => count * 4 >= cache.map_or(0, |c| c / n).max(1 << 20),
            };
            assert_eq!(alg == Some("copyin"), big, "{kind} of {count}: {alg:?}");
        }
    }
    let took = with_ranks(2, cfg, |c| {
        let mut b = vec![c.rank() as f32; 1 << 20];
        c.broadcast_in_place(&mut b, 1).unwrap();
        assert!(b.iter().all(|v| *v == 1.0));
        c.last_algorithm()
    });
    assert!(took.iter().all(|a| *a != Some("copyin")), "{took:?}");
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(r, 0, "sched_getaffinity");
    // SAFETY: reads a bit of a valid set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
        .collect()
}

/// Bind the calling thread to CPU `cpu`.
fn bind_to(cpu: usize) {
    // SAFETY: as above; the set is passed with its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(r, 0, "sched_setaffinity");
}

/// Ranks that a launcher binds to a core each (Open MPI's default) spin
/// as ranks with the whole host do; ranks bound to one core yield.
#[test]
fn ranks_share_cores_as_their_bindings_say() {
    let cpus = allowed_cpus();
    let shares = |binding: [usize; 2]| {
        let id = UniqueId::with_config(&test_config()).expect("root");
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || {
                        bind_to(binding[r]);
                        let c = Communicator::init_with_config(id, r, 2, test_config()).unwrap();
                        c.shares_cores()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(shares([cpus[0], cpus[0]]), [true, true]);
    if cpus.len() >= 2 {
        assert_eq!(shares([cpus[0], cpus[1]]), [false, false]);
    }
}

#[test]
fn the_chunk_is_agreed_at_init_from_the_cache_unless_configured() {
    use comm_core::config::{automatic_chunk, DEFAULT_CHUNK_BYTES};
    let chunks = |n: usize, cfg: &dyn Fn(usize) -> Config| {
        with_rank_configs(n, cfg, |c| {
            // The agreed chunk runs the collectives: a ring all_gather of
            // several chunks a rank, exact.
            let r = c.rank();
            let count = 300_001;
            let input: Vec<f32> = (0..count).map(|i| (r * count + i) as f32).collect();
            let mut out = vec![f32::NAN; n * count];
            c.all_gather(&input, &mut out).unwrap();
            assert!(out.iter().enumerate().all(|(i, v)| *v == i as f32));
            c.config().chunk_bytes
        })
    };
    let llc = comm_core::sys::last_level_cache();
    for n in [2, 4] {
        // One host, shared memory: sized to the cache. (Where that comes
        // to 1 MiB, a 32 MiB cache on 2 ranks or none known, this case
        // cannot tell it from the default; 4 ranks on any cache up to
        // 32 MiB can, as an 8 MiB one does for both.)
        let want = automatic_chunk(&vec![llc; n]);
        assert_eq!(
            chunks(n, &|_| test_config()),
            vec![Some(want); n],
            "{n} ranks"
        );
        // Configured: kept as given.
        let cfg = |_| Config {
            chunk_bytes: Some(96 << 10),
            ..test_config()
        };
        assert_eq!(chunks(n, &cfg), vec![Some(96 << 10); n]);
    }
    // TCP paces its links by the chunk too: the default, which TCP prefers.
    assert_eq!(
        chunks(2, &|_| tcp_config()),
        vec![Some(DEFAULT_CHUNK_BYTES); 2]
    );
    // Two hosts (shared memory within each, TCP between): the default.
    let cfg = |r: usize| Config {
        host_id: Some(format!("host-{}", r / 2)),
        ..test_config()
    };
    assert_eq!(chunks(4, &cfg), vec![Some(DEFAULT_CHUNK_BYTES); 4]);
}

/// The algorithms of one 3-rank out-of-place all_to_all of 1.2 MB per
/// rank (exact results checked), rank `r` set to `modes[r]`.
fn all_to_all_under(modes: [CrossMemory; 3]) -> Vec<Option<&'static str>> {
    with_rank_configs(
        3,
        |r| Config {
            cross_memory: modes[r],
            ..test_config()
        },
        |c| {
            let count = 100_000;
            let input: Vec<f32> = (0..3 * count)
                .map(|i| (c.rank() * 1_000_000 + i) as f32)
                .collect();
            let mut out = vec![f32::NAN; 3 * count];
            c.all_to_all(&input, &mut out).unwrap();
            for k in 0..3 {
                assert_eq!(
                    out[k * count + 7],
                    (k * 1_000_000 + c.rank() * count + 7) as f32
                );
            }
            c.last_algorithm()
        },
    )
}

#[test]
fn the_single_copy_needs_every_rank_to_agree() {
    use CrossMemory::{Auto, Off, On};
    // One rank opting out (`OXCCL_CMA=off`) keeps all of them on the
    // copies through shared memory: the schedules must match.
    for modes in [[Off, On, On], [On, On, Off]] {
        let took = all_to_all_under(modes);
        assert_eq!(took, vec![Some("copyin"); 3], "{modes:?}");
    }
    // Ranks that time the kernel's copy (`auto`) beside ones that force it
    // (`on`) still decide alike, whichever way this host's timings fall:
    // every rank reads the same list of shares.
    for modes in [[Auto, On, Auto], [On, Auto, On], [Auto; 3]] {
        let took = all_to_all_under(modes);
        assert!(
            took.iter().all(|t| *t == took[0]) && took[0].is_some(),
            "{modes:?}: {took:?}"
        );
        if modes.iter().filter(|m| **m == On).count() >= 2 {
            assert_eq!(
                took[0],
                Some("singlecopy"),
                "{modes:?}: the median is forced"
            );
        }
    }
}
