//! Symbolic execution of every rank's schedule together, without I/O.
//! Each element holds an expression (`(r0i3+r1i3)`) instead of a number, so
//! the tests check that every contribution arrives exactly once, that the
//! reduction is complete, and that all ranks end with the *same expression*
//! (hence bitwise-identical floats).

use super::*;
use std::collections::HashMap;

type Val = Option<String>;

struct Rank {
    bufs: HashMap<BufId, Vec<Val>>,
    done: Vec<bool>,
    msg_index: Vec<usize>,
}

fn leaf(r: usize, i: usize) -> String {
    format!("r{r}i{i}")
}

/// Run all schedules; panics on a stuck or malformed run. `bufs(rank)`
/// gives each rank's initial buffers (scratch is added from the schedule).
/// Run once in plain order, then with a few different slow ranks (see
/// `simulate`); every run must end with the same buffers.
fn simulate_all(
    scheds: &[Schedule],
    mut bufs: impl FnMut(usize) -> HashMap<BufId, Vec<Val>>,
) -> Vec<Rank> {
    let n = scheds.len();
    let base = simulate(scheds, &mut bufs, usize::MAX);
    let mut victims = vec![0, n / 2, n - 1];
    victims.dedup();
    for v in victims {
        let other = simulate(scheds, &mut bufs, v);
        for (r, (a, b)) in base.iter().zip(&other).enumerate() {
            for (id, buf) in &a.bufs {
                if *id != SCRATCH {
                    assert_eq!(buf, &b.bufs[id], "rank {r} buffer {id} differs when rank {v} sends late (a missing dependency)");
                }
            }
        }
    }
    base
}

fn simulate(
    scheds: &[Schedule],
    bufs: &mut impl FnMut(usize) -> HashMap<BufId, Vec<Val>>,
    victim: usize,
) -> Vec<Rank> {
    let n = scheds.len();
    let mut ranks: Vec<Rank> = (0..n)
        .map(|r| {
            let mut b = bufs(r);
            b.insert(SCRATCH, vec![None; scheds[r].scratch]);
            // Number messages per directed pair in schedule order.
            let mut counters: HashMap<(bool, usize), usize> = HashMap::new();
            let msg_index = scheds[r]
                .steps
                .iter()
                .map(|st| match st.action {
                    Action::Send { peer, .. } => post(&mut counters, (true, peer)),
                    Action::Recv { peer, .. } | Action::RecvReduce { peer, .. } => {
                        post(&mut counters, (false, peer))
                    }
                    _ => 0,
                })
                .collect();
            Rank {
                bufs: b,
                done: vec![false; scheds[r].steps.len()],
                msg_index,
            }
        })
        .collect();
    fn post(c: &mut HashMap<(bool, usize), usize>, k: (bool, usize)) -> usize {
        let e = c.entry(k).or_insert(0);
        *e += 1;
        *e - 1
    }
    let mut msgs: HashMap<(usize, usize, usize), Vec<Val>> = HashMap::new();
    // Adversarial order: the victim's sends are delayed until nothing else
    // can run anywhere, then one goes. A receive or copy that overwrites
    // data a pending send still has to read then shows up as wrong data,
    // as it could on a real network where that socket is full.
    let mut allow_send = false;
    loop {
        let mut progressed = false;
        for r in 0..n {
            for i in 0..scheds[r].steps.len() {
                let st = &scheds[r].steps[i];
                if ranks[r].done[i] || !st.deps.iter().all(|d| ranks[r].done[*d as usize]) {
                    continue;
                }
                if r == victim && matches!(st.action, Action::Send { .. }) {
                    if !allow_send {
                        continue;
                    }
                    allow_send = false;
                }
                let read = |rk: &Rank, sp: Span| -> Vec<Val> {
                    rk.bufs[&sp.buf][sp.off..sp.off + sp.len].to_vec()
                };
                let ok = match st.action {
                    Action::Send { peer, src } => {
                        let v = read(&ranks[r], src);
                        assert!(
                            v.iter().all(|x| x.is_some()),
                            "rank {r} step {i} sends undefined data"
                        );
                        msgs.insert((r, peer, ranks[r].msg_index[i]), v);
                        true
                    }
                    Action::Recv { peer, dst } => {
                        match msgs.remove(&(peer, r, ranks[r].msg_index[i])) {
                            Some(v) => {
                                assert_eq!(v.len(), dst.len, "rank {r} step {i}: message length");
                                ranks[r].bufs.get_mut(&dst.buf).unwrap()
                                    [dst.off..dst.off + dst.len]
                                    .clone_from_slice(&v);
                                true
                            }
                            None => false,
                        }
                    }
                    Action::RecvReduce { peer, dst, with } => {
                        match msgs.remove(&(peer, r, ranks[r].msg_index[i])) {
                            Some(v) => {
                                assert_eq!(v.len(), dst.len, "rank {r} step {i}: message length");
                                let w = read(&ranks[r], with);
                                let out: Vec<Val> = v
                                    .iter()
                                    .zip(&w)
                                    .map(|(a, b)| {
                                        Some(format!(
                                            "({}+{})",
                                            a.as_ref().unwrap(),
                                            b.as_ref().unwrap()
                                        ))
                                    })
                                    .collect();
                                ranks[r].bufs.get_mut(&dst.buf).unwrap()
                                    [dst.off..dst.off + dst.len]
                                    .clone_from_slice(&out);
                                true
                            }
                            None => false,
                        }
                    }
                    Action::Copy { src, dst } => {
                        let v = read(&ranks[r], src);
                        ranks[r].bufs.get_mut(&dst.buf).unwrap()[dst.off..dst.off + dst.len]
                            .clone_from_slice(&v);
                        true
                    }
                    Action::Combine {
                        dst,
                        input,
                        slots,
                        me,
                    } => {
                        let srcs: Vec<Vec<Val>> = (0..n)
                            .map(|k| {
                                if k == me {
                                    read(&ranks[r], input)
                                } else {
                                    read(
                                        &ranks[r],
                                        Span::new(slots.buf, slots.off + k * dst.len, dst.len),
                                    )
                                }
                            })
                            .collect();
                        let out: Vec<Val> = (0..dst.len)
                            .map(|i| {
                                let parts: Vec<String> =
                                    srcs.iter().map(|v| v[i].clone().unwrap()).collect();
                                Some(format!("({})", parts.join("+")))
                            })
                            .collect();
                        ranks[r].bufs.get_mut(&dst.buf).unwrap()[dst.off..dst.off + dst.len]
                            .clone_from_slice(&out);
                        true
                    }
                    Action::Divide { dst } => {
                        let b = ranks[r].bufs.get_mut(&dst.buf).unwrap();
                        for x in &mut b[dst.off..dst.off + dst.len] {
                            *x = Some(format!("avg{}", x.as_ref().unwrap()));
                        }
                        true
                    }
                };
                if ok {
                    ranks[r].done[i] = true;
                    progressed = true;
                }
            }
        }
        if !progressed {
            if allow_send {
                break;
            }
            allow_send = true;
        }
    }
    for (r, rk) in ranks.iter().enumerate() {
        assert!(
            rk.done.iter().all(|d| *d),
            "rank {r} is stuck: schedules deadlock"
        );
    }
    assert!(
        msgs.is_empty(),
        "messages never received: {:?}",
        msgs.keys().collect::<Vec<_>>()
    );
    ranks
}

/// Sorted leaves of an expression: the contributions it combines.
fn leaves(e: &str) -> Vec<String> {
    let mut v: Vec<String> = e
        .split(['(', ')', '+'])
        .map(|s| s.trim_start_matches("avg").to_string())
        .filter(|s| !s.is_empty())
        .collect();
    v.sort();
    v
}

fn vals(r: usize, len: usize, base: usize) -> Vec<Val> {
    (0..len).map(|i| Some(leaf(r, base + i))).collect()
}

const NS: [usize; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn counts(n: usize) -> Vec<usize> {
    vec![0, 1, 7, n.saturating_sub(1), n + 1, 23]
}

#[test]
fn all_reduce_is_complete_and_identical_everywhere() {
    for n in NS {
        for count in counts(n) {
            for chunk in [1, 3, 1000] {
                for avg in [false, true] {
                    for in_place in [false, true] {
                        let sc: Vec<Schedule> = (0..n)
                            .map(|r| all_reduce(r, n, count, chunk, avg))
                            .collect();
                        let ranks = simulate_all(&sc, |r| {
                            let mut m = HashMap::new();
                            m.insert(
                                OUTPUT,
                                if in_place {
                                    vals(r, count, 0)
                                } else {
                                    vec![None; count]
                                },
                            );
                            m.insert(INPUT, vals(r, count, 0));
                            m
                        });
                        // In-place runs share one buffer: emulate by checking
                        // OUTPUT, which received every write.
                        for i in 0..count {
                            let e0 = ranks[0].bufs[&OUTPUT][i].clone().unwrap();
                            let want: Vec<String> = {
                                let mut w: Vec<String> = (0..n).map(|r| leaf(r, i)).collect();
                                w.sort();
                                w
                            };
                            assert_eq!(leaves(&e0), want, "n={n} count={count} elem {i}: {e0}");
                            assert_eq!(e0.starts_with("avg"), avg && n > 1, "{e0}");
                            for rk in &ranks {
                                assert_eq!(
                                    rk.bufs[&OUTPUT][i].as_ref(),
                                    Some(&e0),
                                    "ranks differ at {i}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_segment() {
    for n in NS {
        for count in counts(n) {
            for chunk in [2, 1000] {
                let sc: Vec<Schedule> = (0..n)
                    .map(|r| reduce_scatter(r, n, count, chunk, false))
                    .collect();
                let ranks = simulate_all(&sc, |r| {
                    let mut m = HashMap::new();
                    m.insert(INPUT, vals(r, n * count, 0));
                    m.insert(OUTPUT, vec![None; count]);
                    m
                });
                for (r, rk) in ranks.iter().enumerate() {
                    for i in 0..count {
                        let mut want: Vec<String> =
                            (0..n).map(|p| leaf(p, r * count + i)).collect();
                        want.sort();
                        assert_eq!(
                            leaves(rk.bufs[&OUTPUT][i].as_ref().unwrap()),
                            want,
                            "n={n} c={count} r={r}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn all_gather_places_every_contribution() {
    for n in NS {
        for count in counts(n) {
            let sc: Vec<Schedule> = (0..n).map(|r| all_gather(r, n, count, 4)).collect();
            let ranks = simulate_all(&sc, |r| {
                let mut m = HashMap::new();
                m.insert(INPUT, vals(r, count, 0));
                m.insert(OUTPUT, vec![None; n * count]);
                m
            });
            for rk in &ranks {
                for p in 0..n {
                    for i in 0..count {
                        assert_eq!(rk.bufs[&OUTPUT][p * count + i], Some(leaf(p, i)));
                    }
                }
            }
        }
    }
}

#[test]
fn broadcast_and_reduce_from_every_root() {
    for n in NS {
        for count in counts(n) {
            for root in 0..n {
                let sc: Vec<Schedule> = (0..n).map(|r| broadcast(r, n, count, 3, root)).collect();
                let ranks = simulate_all(&sc, |r| {
                    let mut m = HashMap::new();
                    m.insert(INPUT, vals(r, count, 0));
                    m.insert(OUTPUT, vec![None; count]);
                    m
                });
                for rk in &ranks {
                    assert_eq!(rk.bufs[&OUTPUT], vals(root, count, 0));
                }
                let sc: Vec<Schedule> = (0..n)
                    .map(|r| reduce(r, n, count, 3, root, false))
                    .collect();
                let ranks = simulate_all(&sc, |r| {
                    let mut m = HashMap::new();
                    m.insert(INPUT, vals(r, count, 0));
                    m.insert(OUTPUT, vec![None; count]);
                    m
                });
                for i in 0..count {
                    let mut want: Vec<String> = (0..n).map(|p| leaf(p, i)).collect();
                    want.sort();
                    assert_eq!(leaves(ranks[root].bufs[&OUTPUT][i].as_ref().unwrap()), want);
                }
                for (r, rk) in ranks.iter().enumerate() {
                    if r != root {
                        assert!(
                            rk.bufs[&OUTPUT].iter().all(|v| v.is_none()),
                            "non-root output written"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_transposes() {
    for n in NS {
        for count in [0, 1, 5] {
            for in_place in [false, true] {
                let sc: Vec<Schedule> = (0..n)
                    .map(|r| all_to_all(r, n, count, 2, in_place))
                    .collect();
                let ranks = simulate_all(&sc, |r| {
                    let mut m = HashMap::new();
                    m.insert(INPUT, vals(r, n * count, 0));
                    m.insert(
                        OUTPUT,
                        if in_place {
                            vals(r, n * count, 0)
                        } else {
                            vec![None; n * count]
                        },
                    );
                    m
                });
                for (r, rk) in ranks.iter().enumerate() {
                    for p in 0..n {
                        for i in 0..count {
                            assert_eq!(
                                rk.bufs[&OUTPUT][p * count + i],
                                Some(leaf(p, r * count + i)),
                                "n={n} r={r} p={p}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn barrier_and_p2p_complete() {
    for n in NS {
        let sc: Vec<Schedule> = (0..n).map(|r| barrier(r, n)).collect();
        simulate_all(&sc, |_| {
            let mut m = HashMap::new();
            m.insert(INPUT, vec![]);
            m.insert(OUTPUT, vec![]);
            m
        });
    }
    // Ranks 0 and 1 each send to the other and receive, posted send-first
    // on both sides: must complete.
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
    let ranks = simulate_all(&sc, |r| {
        let mut m = HashMap::new();
        m.insert(2, vals(r, 10, 0));
        m.insert(3, vec![None; 10]);
        m
    });
    assert_eq!(ranks[0].bufs[&3], vals(1, 10, 0));
    assert_eq!(ranks[1].bufs[&3], vals(0, 10, 0));
}

#[test]
fn oneshot_all_reduce_is_complete_and_identical_everywhere() {
    for n in NS {
        for count in counts(n) {
            for avg in [false, true] {
                let sc: Vec<Schedule> = (0..n)
                    .map(|r| all_reduce_oneshot(r, n, count, avg))
                    .collect();
                let ranks = simulate_all(&sc, |r| {
                    let mut m = HashMap::new();
                    m.insert(INPUT, vals(r, count, 0));
                    m.insert(OUTPUT, vec![None; count]);
                    m
                });
                for i in 0..count {
                    let e0 = ranks[0].bufs[&OUTPUT][i].clone().unwrap();
                    let mut want: Vec<String> = (0..n).map(|r| leaf(r, i)).collect();
                    want.sort();
                    assert_eq!(leaves(&e0), want, "n={n} count={count} elem {i}: {e0}");
                    assert_eq!(e0.starts_with("avg"), avg && n > 1);
                    for rk in &ranks {
                        assert_eq!(rk.bufs[&OUTPUT][i].as_ref(), Some(&e0));
                    }
                }
            }
        }
    }
}
