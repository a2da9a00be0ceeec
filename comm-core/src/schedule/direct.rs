//! Algorithms where every rank talks to its partners directly: the
//! one-shot all-reduce for small messages, all-to-all, point-to-point
//! groups, and the dissemination barrier.

use super::{chunks, Action, BufId, Schedule, Span, INPUT, OUTPUT, SCRATCH};

/// All-to-all: `INPUT` segment `p` (of `count`) goes to rank `p`, which
/// stores it as its `OUTPUT` segment `rank`. When `in_place`, receives land
/// in scratch and are copied over each segment after it has been sent.
pub fn all_to_all(rank: usize, n: usize, count: usize, chunk: usize, in_place: bool) -> Schedule {
    let mut s = Schedule::default();
    if in_place {
        s.scratch = n * count;
    }
    // Self segment.
    if !in_place {
        s.push(
            Action::Copy {
                src: Span::new(INPUT, rank * count, count),
                dst: Span::new(OUTPUT, rank * count, count),
            },
            &[],
        );
    }
    // Partners in a rotating order so no rank is everyone's first target.
    for i in 1..n {
        let to = (rank + i) % n;
        let from = (rank + n - i) % n;
        for (off, len) in chunks(to * count, count, chunk) {
            s.push(
                Action::Send {
                    peer: to,
                    src: Span::new(INPUT, off, len),
                },
                &[],
            );
        }
        let dst_buf = if in_place { SCRATCH } else { OUTPUT };
        for (off, len) in chunks(from * count, count, chunk) {
            s.push(
                Action::Recv {
                    peer: from,
                    dst: Span::new(dst_buf, off, len),
                },
                &[],
            );
        }
    }
    if in_place {
        // Copy each received segment over the buffer after the send that read
        // that segment completed and the receive finished.
        let steps = s.steps.clone();
        for p in (0..n).filter(|p| *p != rank) {
            let deps: Vec<u32> = steps
                .iter()
                .enumerate()
                .filter(|(_, st)| match st.action {
                    Action::Send { peer, .. } | Action::Recv { peer, .. } => peer == p,
                    _ => false,
                })
                .map(|(i, _)| i as u32)
                .collect();
            s.push(
                Action::Copy {
                    src: Span::new(SCRATCH, p * count, count),
                    dst: Span::new(OUTPUT, p * count, count),
                },
                &deps,
            );
        }
    }
    s
}

/// One-shot all-reduce: every rank sends its whole input to every other
/// rank and combines all contributions itself, in rank order. One message
/// step instead of the ring's 2(n-1), at n-1 times the traffic: the choice
/// for small messages, where latency is everything.
pub fn all_reduce_oneshot(rank: usize, n: usize, count: usize, avg: bool) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let mut s = Schedule {
        scratch: n * count,
        ..Schedule::default()
    };
    let mut deps = Vec::new();
    for i in 1..n {
        let to = (rank + i) % n;
        deps.push(s.push(
            Action::Send {
                peer: to,
                src: Span::new(INPUT, 0, count),
            },
            &[],
        ));
    }
    for i in 1..n {
        let from = (rank + n - i) % n;
        deps.push(s.push(
            Action::Recv {
                peer: from,
                dst: Span::new(SCRATCH, from * count, count),
            },
            &[],
        ));
    }
    // After every send too: in place, the output is the input they read.
    let dst = Span::new(OUTPUT, 0, count);
    let c = s.push(
        Action::Combine {
            dst,
            input: Span::new(INPUT, 0, count),
            slots: Span::new(SCRATCH, 0, count),
            me: rank,
        },
        &deps,
    );
    if avg {
        s.push(Action::Divide { dst }, &[c]);
    }
    s
}

/// One operation of a point-to-point group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pStep {
    /// Send buffer `buf` (of `len` elements) to `peer`.
    Send { peer: usize, buf: BufId, len: usize },
    /// Receive `len` elements from `peer` into buffer `buf`.
    Recv { peer: usize, buf: BufId, len: usize },
}

/// A group of sends and receives that progress together (so a send and a
/// receive posted by both sides never deadlock). A zero-length operation
/// still sends one (empty) message so the pair stays matched.
pub fn p2p(ops: &[P2pStep], chunk: usize) -> Schedule {
    let mut s = Schedule::default();
    for op in ops {
        match *op {
            P2pStep::Send { peer, buf, len } => {
                if len == 0 {
                    s.push(
                        Action::Send {
                            peer,
                            src: Span::new(buf, 0, 0),
                        },
                        &[],
                    );
                }
                for (off, l) in chunks(0, len, chunk) {
                    s.push(
                        Action::Send {
                            peer,
                            src: Span::new(buf, off, l),
                        },
                        &[],
                    );
                }
            }
            P2pStep::Recv { peer, buf, len } => {
                if len == 0 {
                    s.push(
                        Action::Recv {
                            peer,
                            dst: Span::new(buf, 0, 0),
                        },
                        &[],
                    );
                }
                for (off, l) in chunks(0, len, chunk) {
                    s.push(
                        Action::Recv {
                            peer,
                            dst: Span::new(buf, off, l),
                        },
                        &[],
                    );
                }
            }
        }
    }
    s
}

/// Dissemination barrier: in round `k` send an empty message to
/// `rank + 2^k` and wait for one from `rank - 2^k`; after ceil(log2 n)
/// rounds every rank has transitively heard from every other.
pub fn barrier(rank: usize, n: usize) -> Schedule {
    let mut s = Schedule::default();
    let mut dist = 1;
    let mut last: Option<u32> = None;
    while dist < n {
        let deps: Vec<u32> = last.into_iter().collect();
        s.push(
            Action::Send {
                peer: (rank + dist) % n,
                src: Span::new(INPUT, 0, 0),
            },
            &deps,
        );
        last = Some(s.push(
            Action::Recv {
                peer: (rank + n - dist) % n,
                dst: Span::new(OUTPUT, 0, 0),
            },
            &[],
        ));
        dist *= 2;
    }
    s
}
