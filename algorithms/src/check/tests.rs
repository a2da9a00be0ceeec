//! The checker applied to every registered algorithm, and shown able to
//! fail: deliberately broken schedules must be caught.

use super::*;
use crate::algorithm::{choose, REGISTRY};
use crate::p2p::{p2p, P2pStep};
use crate::spec::{Access, Tuning};

#[test]
fn every_registered_algorithm_is_correct_in_and_out_of_place() {
    let mut checked = 0;
    for alg in REGISTRY {
        for kind in Kind::COLLECTIVES {
            for n in 1..=8 {
                for spec in cases(*alg, kind, n) {
                    if let Err(e) = check_algorithm(*alg, &spec) {
                        panic!("{e}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} cases checked");
}

/// The logarithmic algorithms, whose structure depends on the rank count's
/// bits, on every rank count from 1 to 33.
#[test]
fn logarithmic_algorithms_are_correct_for_1_to_33_ranks() {
    let mut checked = 0;
    // (Fewer shapes than `cases`, which the 1-8 test runs in full: here
    // the rank count is what varies.)
    for name in ["doubling", "bruck", "tree", "dbtree", "halving", "scatter"] {
        let alg = crate::find(name).unwrap();
        for kind in Kind::COLLECTIVES {
            for n in 1..=33 {
                for count in [0, 1, 3] {
                    for chunk in [2, usize::MAX] {
                        for in_place in [false, true] {
                            for root in [0, n / 2, n - 1] {
                                let spec = CollSpec {
                                    chunk,
                                    in_place,
                                    root,
                                    ..CollSpec::new(kind, 0, n, count)
                                };
                                if !alg.supports(&spec) {
                                    continue;
                                }
                                if let Err(e) = check_algorithm(alg, &spec) {
                                    panic!("{e}");
                                }
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} cases checked");
}

/// The hierarchical algorithm on every rank count from 1 to 33 and every
/// even spread of it over hosts, in blocks and round robin.
#[test]
fn hierarchical_algorithms_are_correct_for_every_layout_of_1_to_33_ranks() {
    let alg = crate::find("hier").unwrap();
    let mut checked = 0;
    for kind in [Kind::AllReduce, Kind::AllGather, Kind::ReduceScatter] {
        for n in 1..=33 {
            for layout in layouts(n).into_iter().flatten() {
                // Chunks of 2 cut 5 elements unevenly; averages divide once
                // whether in place or not (checked on the 1-8 test's full set).
                for (count, chunk) in [(0, usize::MAX), (1, usize::MAX), (5, 2)] {
                    for in_place in [false, true] {
                        let spec = CollSpec {
                            chunk,
                            in_place,
                            avg: in_place && kind != Kind::AllGather,
                            layout: Some(layout),
                            ..CollSpec::new(kind, 0, n, count)
                        };
                        if let Err(e) = check_algorithm(alg, &spec) {
                            panic!("{e}");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} cases checked");
}

#[test]
fn every_collective_has_an_algorithm_and_choice_follows_tuning() {
    let t = Tuning::default();
    for kind in Kind::COLLECTIVES {
        for n in [1, 2, 5] {
            for spec in specs(kind, n) {
                assert!(choose(&spec, None, &t).is_some(), "{spec:?}");
            }
        }
    }
    let mut s = CollSpec::new(Kind::AllReduce, 0, 4, 1000);
    assert_eq!(choose(&s, None, &t).unwrap().name(), "oneshot");
    s.count = 1 << 20;
    assert_eq!(choose(&s, None, &t).unwrap().name(), "ring");
    assert_eq!(choose(&s, Some("oneshot"), &t).unwrap().name(), "oneshot");
    s.direct = Some(Access::Mapped);
    assert_eq!(choose(&s, None, &t).unwrap().name(), "direct");
    // Over one-sided links, small calls go as messages.
    s.direct = Some(Access::OneSided);
    s.count = t.oneshot_bytes / s.elem_size;
    assert_ne!(choose(&s, None, &t).unwrap().name(), "direct");
    s.count += 1;
    assert_eq!(choose(&s, None, &t).unwrap().name(), "direct");
    // Across hosts of several ranks, all_reduce past oneshot's sizes goes
    // hierarchical; one rank per host or one host stays on the ring.
    let placed = |per_host| CollSpec {
        layout: Some(crate::Layout {
            per_host,
            cyclic: false,
        }),
        ..CollSpec::new(Kind::AllReduce, 0, 8, 1 << 20)
    };
    assert_eq!(choose(&placed(2), None, &t).unwrap().name(), "hier");
    assert_eq!(choose(&placed(1), None, &t).unwrap().name(), "ring");
    assert_eq!(choose(&placed(8), None, &t).unwrap().name(), "ring");
    let small = CollSpec {
        count: 16,
        ..placed(2)
    };
    assert_eq!(choose(&small, None, &t).unwrap().name(), "oneshot");
    // A 2-rank all_gather copies in from half the host's cache (at least
    // the copy-in's 4 MiB of output); 4 ranks from the 4 MiB alone.
    // (Shared memory for the copy-in; `cache` the least last-level cache.)
    let on_host = |kind: Kind, n: usize, count: usize, cache: Option<usize>| {
        let s = CollSpec {
            shared: 1 << 20,
            ..CollSpec::new(kind, 0, n, count)
        };
        let t = Tuning {
            host_cache: cache,
            ..t
        };
        choose(&s, None, &t).unwrap().name()
    };
    let gather = |n: usize, out: usize, cache| on_host(Kind::AllGather, n, out / n / 4, cache);
    assert_eq!(gather(2, 4 << 20, None), "copyin");
    assert_eq!(gather(2, 4 << 20, Some(8 << 20)), "copyin");
    assert_eq!(gather(2, 2 << 20, Some(8 << 20)), "ring");
    assert_eq!(gather(2, 4 << 20, Some(32 << 20)), "ring");
    assert_eq!(gather(2, 8 << 20, Some(32 << 20)), "ring");
    assert_eq!(gather(2, 16 << 20, Some(32 << 20)), "copyin");
    assert_eq!(gather(4, 4 << 20, Some(32 << 20)), "copyin");
    // A broadcast on 3 or more ranks copies in once every rank's copy
    // fills the host's cache (at least from 1 MiB).
    let bcast = |n: usize, bytes: usize, cache| on_host(Kind::Broadcast, n, bytes / 4, cache);
    assert_eq!(bcast(4, 1 << 20, None), "copyin");
    assert_eq!(bcast(4, 1 << 20, Some(4 << 20)), "copyin");
    assert_ne!(bcast(4, 1 << 20, Some(8 << 20)), "copyin");
    assert_eq!(bcast(4, 2 << 20, Some(8 << 20)), "copyin");
    assert_ne!(bcast(4, 4 << 20, Some(32 << 20)), "copyin");
    assert_eq!(bcast(4, 8 << 20, Some(32 << 20)), "copyin");
    assert_ne!(bcast(2, 64 << 20, Some(32 << 20)), "copyin");
    // Forcing an algorithm that cannot run a call leaves it to the registry.
    let b = CollSpec::new(Kind::Broadcast, 0, 4, 1000);
    assert_eq!(choose(&b, Some("oneshot"), &t).unwrap().name(), "chain");
    assert_eq!(choose(&b, Some("nonsense"), &t).unwrap().name(), "chain");
}

#[test]
fn p2p_groups_posted_send_first_complete() {
    // Ranks 0 and 1 each send to the other and receive, send first.
    let ops = |peer| {
        vec![
            P2pStep::Send {
                peer,
                buf: 2,
                len: 10,
            },
            P2pStep::Recv {
                peer,
                buf: 3,
                len: 10,
            },
        ]
    };
    let sc = vec![p2p(&ops(1), 3), p2p(&ops(0), 3)];
    let setups: Vec<Setup> = (0..2)
        .map(|r| {
            let mut s = Setup::default();
            s.mems.insert(MEM_P2P + 2, leaves_of(r, 10));
            s.mems.insert(MEM_P2P + 3, vec![None; 10]);
            s.layout.insert(2, (MEM_P2P + 2, 0));
            s.layout.insert(3, (MEM_P2P + 3, 0));
            s
        })
        .collect();
    let runs = simulate_all(&sc, &setups).unwrap();
    assert_eq!(runs[0].mem.view(3, 10), leaves_of(1, 10));
    assert_eq!(runs[1].mem.view(3, 10), leaves_of(0, 10));
}

/// The one-shot all-reduce with the dependency of its `Combine` on the
/// sends removed: fine out of place, an in-place hazard (the combined
/// result overwrites the input a slow send still has to read).
#[test]
fn an_in_place_hazard_is_caught() {
    let n = 3;
    let broken = |spec: &CollSpec| -> Vec<Schedule> {
        (0..n)
            .map(|rank| {
                let mut s = crate::oneshot::OneShot.build(&CollSpec { rank, ..*spec });
                for st in s.steps.iter_mut() {
                    if matches!(st.action, Action::Combine { .. }) {
                        st.deps.retain(|d| (*d as usize) >= n - 1); // keep the receives only
                    }
                }
                s
            })
            .collect()
    };
    let mut spec = CollSpec::new(Kind::AllReduce, 0, n, 5);
    assert_eq!(check_schedules(&spec, &broken(&spec)), Ok(()));
    spec.in_place = true;
    let e = check_schedules(&spec, &broken(&spec)).unwrap_err();
    assert!(e.contains("differs") || e.contains("exactly once"), "{e}");
    // The real algorithm passes.
    assert_eq!(check_algorithm(&crate::oneshot::OneShot, &spec), Ok(()));
}

/// The direct all-reduce without its middle `Sync`: peers copy segments
/// their owners are still reducing.
#[test]
fn a_missing_phase_in_a_direct_schedule_is_a_race() {
    let n = 4;
    let mut spec = CollSpec::new(Kind::AllReduce, 0, n, 10);
    spec.direct = Some(Access::Mapped);
    let scheds: Vec<Schedule> = (0..n)
        .map(|rank| {
            let s = crate::direct::all_reduce(rank, n, 10, false);
            let mut out = Schedule {
                output_read: s.output_read,
                ..Schedule::default()
            };
            let mut syncs = 0;
            for st in &s.steps {
                if st.action == Action::Sync {
                    syncs += 1;
                    if syncs == 2 {
                        out.push(
                            Action::Copy {
                                src: Span::new(OUTPUT, 0, 0),
                                dst: Span::new(OUTPUT, 0, 0),
                            },
                            &[],
                        );
                        continue;
                    }
                }
                out.steps.push(st.clone());
            }
            out
        })
        .collect();
    let e = check_schedules(&spec, &scheds).unwrap_err();
    assert!(e.contains("race") || e.contains("undefined"), "{e}");
}

/// The pushing all-reduce (owners write every rank's output) without its
/// last `Sync`: a rank could leave, and reuse its output, while a peer
/// still writes into it; a fused piece that does not wait for the first
/// `Sync` writes a peer's output before that peer entered the call; and
/// (the average's two-pass variant) a piece copied out before it is
/// reduced.
#[test]
fn a_push_that_outlives_the_call_or_its_reduction_is_caught() {
    let n = 3;
    let mut spec = CollSpec::new(Kind::AllReduce, 0, n, 10);
    spec.direct = Some(Access::Mapped);
    spec.chunk = 2;
    let build = |spec: CollSpec, rank| crate::direct::Direct.build(&CollSpec { rank, ..spec });
    let no_done: Vec<Schedule> = (0..n)
        .map(|rank| {
            let mut s = build(spec, rank);
            assert_eq!(s.steps.pop().map(|st| st.action), Some(Action::Sync));
            s
        })
        .collect();
    let e = check_schedules(&spec, &no_done).unwrap_err();
    assert!(e.contains("may still write"), "{e}");
    let unready: Vec<Schedule> = (0..n)
        .map(|rank| {
            // Without the first Sync (every dependency on it dropped).
            let mut s = build(spec, rank);
            assert_eq!(s.steps.remove(0).action, Action::Sync);
            for st in s.steps.iter_mut() {
                st.deps = st.deps.iter().filter(|d| **d > 0).map(|d| d - 1).collect();
            }
            s
        })
        .collect();
    let e = check_schedules(&spec, &unready).unwrap_err();
    assert!(e.contains("without following rank"), "{e}");
    let avg = CollSpec { avg: true, ..spec };
    let early: Vec<Schedule> = (0..n)
        .map(|rank| {
            let mut s = build(avg, rank);
            for st in s.steps.iter_mut() {
                if matches!(st.action, Action::CopyTo { .. }) {
                    st.deps = vec![0];
                }
            }
            s
        })
        .collect();
    let e = check_schedules(&avg, &early).unwrap_err();
    assert!(e.contains("without happening after"), "{e}");
}

/// The one-sided all-reduce (phases as barriers of messages) with the
/// copies of reduced segments no longer waiting for the middle barrier's
/// messages: a rank reads a peer's segment its owner has not reduced yet.
/// The vector clocks catch it although no `Sync` is left to count phases.
#[test]
fn a_one_sided_read_that_skips_a_barrier_is_a_race() {
    let n = 3;
    let mut spec = CollSpec::new(Kind::AllReduce, 0, n, 9);
    spec.direct = Some(Access::OneSided);
    // In place, an early read finds defined (stale) data: only the race
    // detection can tell.
    spec.in_place = true;
    let good: Vec<Schedule> = (0..n)
        .map(|rank| crate::direct::Direct.build(&CollSpec { rank, ..spec }))
        .collect();
    assert!(good[0].steps.iter().all(|s| s.action != Action::Sync));
    assert_eq!(check_schedules(&spec, &good), Ok(()));
    let broken: Vec<Schedule> = good
        .iter()
        .map(|s| {
            let mut s = s.clone();
            let kinds: Vec<Action> = s.steps.iter().map(|st| st.action).collect();
            for st in s.steps.iter_mut() {
                if let Action::CopyFrom { dst, .. } = st.action {
                    if dst.buf == OUTPUT {
                        // Keep the dependencies on this rank's own sends.
                        st.deps
                            .retain(|d| matches!(kinds[*d as usize], Action::Send { .. }));
                    }
                }
            }
            s
        })
        .collect();
    let e = check_schedules(&spec, &broken).unwrap_err();
    assert!(e.contains("(a race)"), "{e}");
}

#[test]
fn writing_the_input_of_an_out_of_place_call_is_caught() {
    let spec = CollSpec::new(Kind::AllReduce, 0, 1, 4);
    let mut s = Schedule::copy_all(4);
    s.push(
        Action::Copy {
            src: Span::new(OUTPUT, 0, 4),
            dst: Span::new(INPUT, 0, 4),
        },
        &[0],
    );
    let e = check_schedules(&spec, &[s]).unwrap_err();
    assert!(e.contains("writes the input"), "{e}");
}

/// The dissemination barrier as it was: each round's receive free of the
/// previous one, so a rank could forward round k before hearing round k-1
/// and leave the barrier before a slow rank entered it. The knowledge test
/// catches it; the fixed barrier passes.
#[test]
fn a_barrier_a_rank_can_leave_early_is_caught() {
    let old = |rank: usize, n: usize| {
        let mut s = Schedule::default();
        let (mut dist, mut last) = (1, None);
        while dist < n {
            let deps: Vec<u32> = last.into_iter().collect();
            let to = (rank + dist) % n;
            s.push(
                Action::Send {
                    peer: to,
                    src: Span::new(INPUT, 0, 0),
                },
                &deps,
            );
            let from = (rank + n - dist) % n;
            last = Some(s.push(
                Action::Recv {
                    peer: from,
                    dst: Span::new(OUTPUT, 0, 0),
                },
                &[],
            ));
            dist *= 2;
        }
        s
    };
    let n = 8;
    let mut spec = CollSpec::new(Kind::Barrier, 0, n, 0);
    spec.in_place = true;
    let scheds: Vec<Schedule> = (0..n).map(|r| old(r, n)).collect();
    let e = check_schedules(&spec, &scheds).unwrap_err();
    assert!(e.contains("before rank"), "{e}");
    let fixed = crate::dissemination::Dissemination;
    assert_eq!(check_algorithm(&fixed, &spec), Ok(()));
}

/// Two local steps writing the same elements with nothing ordering them:
/// the simulation (eager, in schedule order) gets the right result, but an
/// executor may run them the other way round; the order check refuses it,
/// and accepts it once the second depends on the first.
#[test]
fn an_unordered_local_overwrite_is_caught() {
    let spec = CollSpec::new(Kind::AllReduce, 0, 1, 2);
    let both = |deps: &[u32]| {
        let mut s = Schedule::default();
        let whole = || Action::Copy {
            src: Span::new(INPUT, 0, 2),
            dst: Span::new(OUTPUT, 0, 2),
        };
        s.push(whole(), &[]);
        s.push(whole(), deps);
        s
    };
    let e = check_schedules(&spec, &[both(&[])]).unwrap_err();
    assert!(e.contains("without happening after"), "{e}");
    check_schedules(&spec, &[both(&[0])]).unwrap();
}

/// Without direct access a peer's plain buffers are out of reach, but for
/// reads where the kernel copies them (`plain_reads`): the direct
/// all-to-all is correct with them and rejected without; a reduction from
/// a peer's plain input is rejected even with them.
#[test]
fn reaching_a_peers_plain_buffer_is_caught() {
    let n = 4;
    let build = |f: &dyn Fn(usize) -> Schedule| (0..n).map(f).collect::<Vec<_>>();
    let mut spec = CollSpec::new(Kind::AllToAll, 0, n, 5);
    let all_to_all = build(&|r| crate::direct::all_to_all(r, n, 5, false));
    spec.plain_reads = true;
    assert_eq!(check_schedules(&spec, &all_to_all), Ok(()));
    spec.plain_reads = false;
    let e = check_schedules(&spec, &all_to_all).unwrap_err();
    assert!(e.contains("cannot reach"), "{e}");
    let mut spec = CollSpec::new(Kind::AllReduce, 0, n, 8);
    spec.plain_reads = true;
    let e = check_schedules(
        &spec,
        &build(&|r| crate::direct::all_reduce(r, n, 8, false)),
    )
    .unwrap_err();
    assert!(e.contains("cannot reach"), "{e}");
}

/// A rank whose output its peers read during the call must say so (its
/// copies into it then stay cached rather than stream past the cache), and
/// a rank whose output nobody reads must not.
#[test]
fn an_output_peers_read_is_declared() {
    let n = 3;
    let mut spec = CollSpec::new(Kind::Broadcast, 0, n, 6);
    spec.root = 1;
    spec.direct = Some(Access::Mapped);
    let mut bcast: Vec<Schedule> = (0..n)
        .map(|r| crate::direct::broadcast(r, n, 6, 1, false))
        .collect();
    assert_eq!(check_schedules(&spec, &bcast), Ok(()));
    bcast[1].output_read = false;
    let e = check_schedules(&spec, &bcast).unwrap_err();
    assert!(
        e.contains("rank 1's schedule says its peers do not read"),
        "{e}"
    );
    let mut spec = CollSpec::new(Kind::AllToAll, 0, n, 5);
    spec.direct = Some(Access::Mapped);
    let mut a2a: Vec<Schedule> = (0..n)
        .map(|r| crate::direct::all_to_all(r, n, 5, false))
        .collect();
    assert_eq!(check_schedules(&spec, &a2a), Ok(()));
    a2a[2].output_read = true;
    let e = check_schedules(&spec, &a2a).unwrap_err();
    assert!(e.contains("rank 2's schedule says its peers read"), "{e}");
}
