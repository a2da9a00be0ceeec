//! Zero-copy collectives over direct access: every rank reads its peers'
//! registered buffers where they lie (shared memory today; CUDA IPC and
//! RDMA next) instead of exchanging messages. Phases are separated by
//! [`Action::Sync`]: the first ("ready") also checks that every rank called
//! the same thing; the last ("done") keeps any buffer from changing while a
//! peer may still read it.
//!
//! Direct steps address a peer's buffer with this rank's buffer id and
//! offset: the registered buffers of one call have the same shape on every
//! rank. An in-place all_gather therefore reads peers' *output* segments,
//! never their input span (whose offset differs per rank).

use crate::schedule::{seg_len, seg_off, Action, Schedule, Span, INPUT, OUTPUT};
use crate::spec::{CollSpec, Kind};

/// All-reduce: rank `r` reduces segment `r` of every rank's input into its
/// output; after a `Sync`, every rank copies the other segments from their
/// owners' outputs.
pub fn all_reduce(rank: usize, n: usize, count: usize, avg: bool) -> Schedule {
    let mut s = Schedule::default();
    let ready = s.push(Action::Sync, &[]);
    let seg = |k: usize| (seg_off(count, n, k), seg_len(count, n, k));
    let (off, len) = seg(rank);
    let mine = Span::new(OUTPUT, off, len);
    let mut last = s.push(
        Action::ReduceFrom {
            dst: mine,
            src: Span::new(INPUT, off, len),
        },
        &[ready],
    );
    if avg {
        last = s.push(Action::Divide { dst: mine }, &[last]);
    }
    let reduced = s.push(Action::Sync, &[last]);
    let copies: Vec<u32> = (0..n)
        .filter(|k| *k != rank)
        .map(|k| {
            let (o, l) = seg(k);
            s.push(
                Action::CopyFrom {
                    peer: k,
                    src: Span::new(OUTPUT, o, l),
                    dst: Span::new(OUTPUT, o, l),
                },
                &[reduced],
            )
        })
        .collect();
    s.push(Action::Sync, &copies);
    s
}

/// All-gather: every rank copies each peer's contribution into its output.
pub fn all_gather(rank: usize, n: usize, count: usize, in_place: bool) -> Schedule {
    let mut s = Schedule::default();
    let ready = s.push(Action::Sync, &[]);
    let mut deps = Vec::new();
    if !in_place {
        deps.push(s.push(
            Action::Copy {
                src: Span::new(INPUT, 0, count),
                dst: Span::new(OUTPUT, rank * count, count),
            },
            &[ready],
        ));
    }
    for k in (0..n).filter(|k| *k != rank) {
        // In place, a peer's contribution is its output segment `k`.
        let src = if in_place {
            Span::new(OUTPUT, k * count, count)
        } else {
            Span::new(INPUT, 0, count)
        };
        deps.push(s.push(
            Action::CopyFrom {
                peer: k,
                src,
                dst: Span::new(OUTPUT, k * count, count),
            },
            &[ready],
        ));
    }
    s.push(Action::Sync, &deps);
    s
}

/// Broadcast: the root's output holds the data (out of place the root
/// copies its input there first: before "ready", as nobody reads a rank's
/// buffers outside a call); after "ready" every other rank copies it.
pub fn broadcast(rank: usize, count: usize, root: usize, in_place: bool) -> Schedule {
    let mut s = Schedule::default();
    let out = Span::new(OUTPUT, 0, count);
    let mut deps = Vec::new();
    if !in_place && rank == root {
        deps.push(s.push(
            Action::Copy {
                src: Span::new(INPUT, 0, count),
                dst: out,
            },
            &[],
        ));
    }
    let mut at = s.push(Action::Sync, &deps);
    if rank != root {
        at = s.push(
            Action::CopyFrom {
                peer: root,
                src: out,
                dst: out,
            },
            &[at],
        );
    }
    s.push(Action::Sync, &[at]);
    s
}

/// Reduce-scatter: rank `r` reduces segment `r` of every rank's input.
pub fn reduce_scatter(rank: usize, count: usize, avg: bool, in_place: bool) -> Schedule {
    let mut s = Schedule::default();
    let ready = s.push(Action::Sync, &[]);
    // In place, the output is the input's segment `rank`.
    let dst = if in_place {
        Span::new(INPUT, rank * count, count)
    } else {
        Span::new(OUTPUT, 0, count)
    };
    let mut last = s.push(
        Action::ReduceFrom {
            dst,
            src: Span::new(INPUT, rank * count, count),
        },
        &[ready],
    );
    if avg {
        last = s.push(Action::Divide { dst }, &[last]);
    }
    s.push(Action::Sync, &[last]);
    s
}

/// Direct access: needs `CollSpec::direct` (all of the call's buffers
/// registered on a communicator whose every link can map peers' memory).
pub struct Direct;

impl crate::Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }
    fn supports(&self, s: &CollSpec) -> bool {
        s.direct
            && s.nranks > 1
            && matches!(
                s.kind,
                Kind::AllReduce | Kind::AllGather | Kind::Broadcast | Kind::ReduceScatter
            )
    }
    fn build(&self, s: &CollSpec) -> Schedule {
        let (r, n, c) = (s.rank, s.nranks, s.count);
        match s.kind {
            Kind::AllReduce => all_reduce(r, n, c, s.avg),
            Kind::AllGather => all_gather(r, n, c, s.in_place),
            Kind::Broadcast => broadcast(r, c, s.root, s.in_place),
            _ => reduce_scatter(r, c, s.avg, s.in_place),
        }
    }
}
