//! Zero-copy collectives over direct access: every rank reads its peers'
//! registered buffers where they lie instead of exchanging messages.
//! Phases are separated by [`Action::Sync`]: the first ("ready") also
//! checks that every rank called the same thing; the last ("done") keeps
//! any buffer from changing while a peer may still read it.
//!
//! The schedules are written once, for memory mapped into the process
//! ([`Access::Mapped`]: shared memory; CUDA IPC next). Over one-sided links
//! ([`Access::OneSided`]: RDMA) [`over_one_sided`] rewrites them: a read
//! of every peer's span becomes one-sided reads into scratch and a
//! `Combine` (a reduction cannot run on memory that is not mapped), and
//! every `Sync` becomes a barrier of zero-length messages, whose headers
//! carry the call check for free.
//!
//! Direct steps address a peer's buffer with this rank's buffer id and
//! offset: the registered buffers of one call have the same shape on every
//! rank. An in-place all_gather therefore reads peers' *output* segments,
//! never their input span (whose offset differs per rank).

use crate::schedule::{
    chunks, seg_len, seg_off, Action, Schedule, Span, Step, INPUT, OUTPUT, SCRATCH,
};
use crate::spec::{Access, CollSpec, Kind};

/// All-reduce: rank `r` reduces segment `r` of every rank's input into its
/// output; after a `Sync`, every rank copies the other segments from their
/// owners' outputs.
pub fn all_reduce(rank: usize, n: usize, count: usize, avg: bool) -> Schedule {
    let mut s = Schedule {
        output_read: n > 1,
        ..Schedule::default()
    };
    let ready = s.push(Action::Sync, &[]);
    let seg = |k: usize| (seg_off(count, n, k), seg_len(count, n, k));
    let (off, len) = seg(rank);
    let mine = Span::new(OUTPUT, off, len);
    let mut last = s.push(
        Action::ReduceFrom {
            dst: mine,
            src: Span::new(INPUT, off, len),
            own: Span::new(INPUT, off, len),
            also: None,
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

/// All-reduce over mapped memory, writing where the result is needed:
/// rank `r` reduces segment `r` of every rank's input a piece (`piece`
/// elements) at a time and writes each piece into every rank's output
/// (`ReduceToAll`: its own and its peers', one pass). Each rank reads its
/// share of every input once and writes its share of every output once —
/// the least memory traffic an all-reduce can have (the schedule above also
/// writes the segment into its own output and reads it back to hand it
/// on). An average divides between the two, so it reduces each piece into
/// a cache-sized scratch slot, divides there and copies the piece out
/// (`CopyTo`); two slots alternate, so a piece's copies and the next
/// piece's reduction need not wait for each other.
pub fn all_reduce_push(rank: usize, n: usize, count: usize, avg: bool, piece: usize) -> Schedule {
    let piece = piece.max(1);
    let (off, len) = (seg_off(count, n, rank), seg_len(count, n, rank));
    if !avg {
        let mut s = Schedule::default();
        let ready = s.push(Action::Sync, &[]);
        let pieces: Vec<u32> = chunks(off, len, piece)
            .map(|(o, l)| {
                let src = Span::new(INPUT, o, l);
                let dst = Span::new(OUTPUT, o, l);
                s.push(Action::ReduceToAll { dst, src, own: src }, &[ready])
            })
            .collect();
        s.push(Action::Sync, &pieces);
        return s;
    }
    let mut s = Schedule {
        scratch: 2 * piece.min(len),
        ..Schedule::default()
    };
    let ready = s.push(Action::Sync, &[]);
    let mut all: Vec<u32> = Vec::new();
    // The copies out of each slot: its next reduction waits for them.
    let mut slot_readers: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for (j, (o, l)) in chunks(off, len, piece).enumerate() {
        let slot = Span::new(SCRATCH, (j % 2) * piece, l);
        let mut deps = vec![ready];
        deps.append(&mut slot_readers[j % 2]);
        let reduced = s.push(
            Action::ReduceFrom {
                dst: slot,
                src: Span::new(INPUT, o, l),
                own: Span::new(INPUT, o, l),
                also: None,
            },
            &deps,
        );
        let last = s.push(Action::Divide { dst: slot }, &[reduced]);
        let dst = Span::new(OUTPUT, o, l);
        for k in 0..n {
            let action = match k == rank {
                true => Action::Copy { src: slot, dst },
                false => Action::CopyTo {
                    peer: k,
                    src: slot,
                    dst,
                },
            };
            let c = s.push(action, &[last]);
            slot_readers[j % 2].push(c);
            all.push(c);
        }
    }
    s.push(Action::Sync, &all);
    s
}

/// Whether a mapped all_reduce pulls (reduce own segment in place, read the
/// others' back) rather than pushes: in place on 2 ranks with outputs of 4
/// MiB (where outputs stream past the cache) up to 64 MiB, whose working
/// set fits a last-level cache the streamed stores would empty. Measured
/// (2 ranks, in place, busbw medians of 6 alternating runs, GB/s, pull /
/// fused push): 1 MiB 12.3 / 39.7, 4 MiB 26.2 / 12.0, 16 MiB 14.8 / 12.6,
/// 64 MiB 10.1 / 11.8, 256 MiB 9.5 / 11.8. On 4 ranks and out of place
/// push led at every size.
fn pull_in_place(s: &CollSpec) -> bool {
    // Where outputs start to stream (kernels::copy::STREAM_MIN).
    const STREAMED: usize = 4 << 20;
    const CACHED_MAX: usize = 64 << 20;
    s.in_place && s.nranks == 2 && (STREAMED..CACHED_MAX).contains(&s.bytes())
}

/// All-gather: every rank copies each peer's contribution into its output.
pub fn all_gather(rank: usize, n: usize, count: usize, in_place: bool) -> Schedule {
    let mut s = Schedule {
        output_read: in_place && n > 1,
        ..Schedule::default()
    };
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
pub fn broadcast(rank: usize, n: usize, count: usize, root: usize, in_place: bool) -> Schedule {
    let mut s = Schedule {
        output_read: rank == root && n > 1,
        ..Schedule::default()
    };
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
            own: Span::new(INPUT, rank * count, count),
            also: None,
        },
        &[ready],
    );
    if avg {
        last = s.push(Action::Divide { dst }, &[last]);
    }
    s.push(Action::Sync, &[last]);
    s
}

/// Reduce: the root reduces every rank's input into its output; the other
/// ranks only keep their inputs unchanged until it has (the last `Sync`).
pub fn reduce(rank: usize, count: usize, root: usize, avg: bool) -> Schedule {
    let mut s = Schedule::default();
    let mut at = s.push(Action::Sync, &[]);
    if rank == root {
        // In place the output is the root's input: only the root reads it.
        let dst = Span::new(OUTPUT, 0, count);
        at = s.push(
            Action::ReduceFrom {
                dst,
                src: Span::new(INPUT, 0, count),
                own: Span::new(INPUT, 0, count),
                also: None,
            },
            &[at],
        );
        if avg {
            at = s.push(Action::Divide { dst }, &[at]);
        }
    }
    s.push(Action::Sync, &[at]);
    s
}

/// All-to-all: every rank copies its segment of each peer's input (peer
/// `k`'s input segment `rank`) into its output segment `k`, once. In place
/// a rank's buffer is read by its peers while it would overwrite it, so
/// the copies land in scratch and move into the buffer after a `Sync`
/// (when no peer reads it any more).
pub fn all_to_all(rank: usize, n: usize, count: usize, in_place: bool) -> Schedule {
    let mut s = Schedule::default();
    let ready = s.push(Action::Sync, &[]);
    let to = if in_place { SCRATCH } else { OUTPUT };
    if in_place {
        s.scratch = n * count;
    }
    let mut deps = Vec::new();
    if !in_place {
        deps.push(s.push(
            Action::Copy {
                src: Span::new(INPUT, rank * count, count),
                dst: Span::new(OUTPUT, rank * count, count),
            },
            &[ready],
        ));
    }
    // Each rank starts with the next one's block: no two read the same
    // peer at once (the kernel's copy pins the pages it reads).
    for k in (1..n).map(|d| (rank + d) % n) {
        deps.push(s.push(
            Action::CopyFrom {
                peer: k,
                src: Span::new(INPUT, rank * count, count),
                dst: Span::new(to, k * count, count),
            },
            &[ready],
        ));
    }
    let done = s.push(Action::Sync, &deps);
    if in_place {
        for k in (0..n).filter(|k| *k != rank) {
            s.push(
                Action::Copy {
                    src: Span::new(SCRATCH, k * count, count),
                    dst: Span::new(OUTPUT, k * count, count),
                },
                &[done],
            );
        }
    }
    s
}

/// `sched` (rank `rank` of `n`, written for mapped memory) for one-sided
/// links: `ReduceFrom` becomes a `CopyFrom` of each peer's span into its
/// own scratch slot plus a `Combine`, and each `Sync` a barrier: a
/// zero-length message to and from every peer. A barrier's sends wait for
/// every earlier step of the rank; every later step waits for the whole
/// barrier (the fence a `Sync` is).
pub fn over_one_sided(sched: &Schedule, rank: usize, n: usize) -> Schedule {
    let mut out = Schedule {
        steps: Vec::with_capacity(sched.steps.len() * 2),
        scratch: sched.scratch,
        stage: sched.stage,
        shared: sched.shared,
        output_read: sched.output_read,
    };
    // Old step -> the new step that completes it (Syncs have none: the
    // fence below stands for them).
    let mut new_of: Vec<Option<u32>> = Vec::with_capacity(sched.steps.len());
    // The last barrier's steps, and every step since it.
    let mut fence: Vec<u32> = Vec::new();
    let mut since: Vec<u32> = Vec::new();
    let token = Span::new(SCRATCH, 0, 0);
    for st in &sched.steps {
        let mut deps: Vec<u32> = st
            .deps
            .iter()
            .filter_map(|d| new_of[*d as usize])
            .chain(fence.iter().copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        let mut push = |out: &mut Schedule, action: Action, deps: &[u32]| {
            let i = out.push(action, deps);
            since.push(i);
            i
        };
        let done = match st.action {
            Action::Sync => {
                let before: Vec<u32> = since.drain(..).chain(fence.drain(..)).collect();
                for k in (0..n).filter(|k| *k != rank) {
                    fence.push(out.push(
                        Action::Send {
                            peer: k,
                            src: token,
                        },
                        &before,
                    ));
                }
                for k in (0..n).filter(|k| *k != rank) {
                    fence.push(out.push(
                        Action::Recv {
                            peer: k,
                            dst: token,
                        },
                        &[],
                    ));
                }
                None
            }
            Action::ReduceFrom {
                dst,
                src,
                own,
                also,
            } => {
                let base = out.scratch;
                out.scratch += n * src.len;
                let mut got = deps.clone();
                for k in (0..n).filter(|k| *k != rank) {
                    let slot = Span::new(SCRATCH, base + k * src.len, src.len);
                    got.push(push(
                        &mut out,
                        Action::CopyFrom {
                            peer: k,
                            src,
                            dst: slot,
                        },
                        &deps,
                    ));
                }
                let slots = Span::new(SCRATCH, base, n * src.len);
                let combined = push(
                    &mut out,
                    Action::Combine {
                        dst,
                        input: own,
                        slots,
                        me: rank,
                    },
                    &got,
                );
                Some(match also {
                    Some(a) => push(&mut out, Action::Copy { src: dst, dst: a }, &[combined]),
                    None => combined,
                })
            }
            action => Some(push(&mut out, action, &deps)),
        };
        new_of.push(done);
    }
    debug_assert!(out.steps.iter().all(|s: &Step| s.action != Action::Sync));
    out
}

/// Direct access: needs `CollSpec::direct` (all of the call's buffers
/// registered on a communicator whose every link reaches peers' memory).
pub struct Direct;

impl crate::Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }
    fn supports(&self, s: &CollSpec) -> bool {
        s.direct.is_some()
            && s.nranks > 1
            && matches!(
                s.kind,
                Kind::AllReduce
                    | Kind::AllGather
                    | Kind::Broadcast
                    | Kind::ReduceScatter
                    | Kind::Reduce
                    | Kind::AllToAll
            )
    }
    /// Always on mapped memory (no messages, no copies). Over one-sided
    /// links only above `oneshot_bytes`: each phase costs a round trip of
    /// messages (three per call) plus one of reads, where the message
    /// algorithms need one for small calls (Soft-RoCE: 8 KiB all_reduce on
    /// 2 ranks 166 µs with messages, about 260 µs direct; even at 32 KiB).
    fn preferred(&self, s: &CollSpec, t: &crate::Tuning) -> bool {
        s.direct == Some(Access::Mapped) || s.bytes() > t.oneshot_bytes
    }
    fn build(&self, s: &CollSpec) -> Schedule {
        let (r, n, c) = (s.rank, s.nranks, s.count);
        let mapped = match s.kind {
            Kind::AllReduce if s.direct == Some(Access::Mapped) && !pull_in_place(s) => {
                all_reduce_push(r, n, c, s.avg, s.chunk)
            }
            Kind::AllReduce => all_reduce(r, n, c, s.avg),
            Kind::AllGather => all_gather(r, n, c, s.in_place),
            Kind::Broadcast => broadcast(r, n, c, s.root, s.in_place),
            Kind::Reduce => reduce(r, c, s.root, s.avg),
            Kind::AllToAll => all_to_all(r, n, c, s.in_place),
            _ => reduce_scatter(r, c, s.avg, s.in_place),
        };
        match s.direct {
            Some(Access::OneSided) => over_one_sided(&mapped, r, n),
            _ => mapped,
        }
    }
}
