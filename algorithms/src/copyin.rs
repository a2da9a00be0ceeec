//! Copy-in all-reduce (and all-to-all, at the end): plain buffers at the
//! speed of direct access, for ranks that map each other's executor-owned
//! shared memory ([`SHARED`]: one host).
//!
//! Peers cannot read a plain buffer, so each rank copies its input, one
//! piece at a time, into its shared memory (all but its own segment of the
//! piece); the owner of each segment reduces that segment of every peer's
//! copy and of its own input into its shared memory; then every rank
//! copies the reduced segments into its output:
//!
//! ```text
//! piece j:  Copy input -> shared[b] (but the own segment)   Sync
//!           ReduceFrom own segment (own part: the input)     Sync
//!           CopyFrom every owner's segment -> output
//! ```
//!
//! Each byte of input is read from memory once and each byte of output
//! written once: the minimum any all-reduce moves. The pieces are sized
//! to stay in cache, so the copies in and the reductions between them
//! cost cache bandwidth only (the ring's traffic is higher: it reads its
//! reduced segment back from memory to pass it on). Two buffers `b`
//! alternate: a rank copies piece `j + 1` in while a slower peer may still
//! copy piece `j` out; piece `j + 2` reuses the buffer only after every
//! rank has passed the first `Sync` of piece `j + 1`, hence finished
//! reading piece `j`. A last `Sync` keeps the next call from overwriting
//! what a peer still reads.
//!
//! The reduction of an element combines every rank's input in rank order
//! at its owner: bitwise identical on every rank, as the ring's is.

use crate::algorithm::Algorithm;
use crate::schedule::{chunks, seg_len, seg_off, Action, Schedule, Span, INPUT, OUTPUT, SHARED};
use crate::spec::{CollSpec, Kind, Tuning};

/// All-reduce through `shared` elements of shared memory (two pieces of
/// half of it).
pub fn all_reduce(rank: usize, n: usize, count: usize, avg: bool, shared: usize) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let mut s = Schedule::default();
    if count == 0 {
        return s;
    }
    let piece = (shared / 2).max(1);
    s.shared = 2 * piece.min(count);
    let mut outs: Vec<u32> = Vec::new();
    for (j, (off, len)) in chunks(0, count, piece).enumerate() {
        let b = (j % 2) * piece;
        // Every segment but this rank's own goes in (its owner reads it
        // there); the own one is reduced straight from the input.
        let (o, l) = (seg_off(len, n, rank), seg_len(len, n, rank));
        let mut staged_in = Vec::new();
        for (from, to) in [(0, o), (o + l, len)] {
            if to > from {
                staged_in.push(s.push(
                    Action::Copy {
                        src: Span::new(INPUT, off + from, to - from),
                        dst: Span::new(SHARED, b + from, to - from),
                    },
                    &outs,
                ));
            }
        }
        let staged = s.push(Action::Sync, &staged_in);
        let mut last = staged;
        if l > 0 {
            let mine = Span::new(SHARED, b + o, l);
            last = s.push(
                Action::ReduceFrom {
                    dst: mine,
                    src: mine,
                    own: Span::new(INPUT, off + o, l),
                },
                &[staged],
            );
            if avg {
                last = s.push(Action::Divide { dst: mine }, &[last]);
            }
        }
        let reduced = s.push(Action::Sync, &[last]);
        outs.clear();
        for k in 0..n {
            let (o, l) = (seg_off(len, n, k), seg_len(len, n, k));
            if l == 0 {
                continue;
            }
            let (src, dst) = (Span::new(SHARED, b + o, l), Span::new(OUTPUT, off + o, l));
            let action = match k == rank {
                true => Action::Copy { src, dst },
                false => Action::CopyFrom { peer: k, src, dst },
            };
            outs.push(s.push(action, &[reduced]));
        }
    }
    s.push(Action::Sync, &outs);
    s
}

/// All-to-all through `shared` elements of shared memory: each piece
/// stages this rank's blocks for its peers (block `k` for rank `k`), one
/// `Sync`, then every rank copies its block out of each peer's staging.
/// Two halves alternate as for the all-reduce; a rank's own block goes
/// straight from its input to its output.
pub fn all_to_all(rank: usize, n: usize, count: usize, shared: usize) -> Schedule {
    let piece = (shared / 2 / n).max(1);
    let mut s = Schedule::default();
    if count == 0 {
        return s;
    }
    s.shared = 2 * n * piece.min(count);
    let mut outs: Vec<u32> = Vec::new();
    for (j, (o, l)) in chunks(0, count, piece).enumerate() {
        let base = (j % 2) * n * piece;
        let mut staged_in = Vec::new();
        for k in 0..n {
            let src = Span::new(INPUT, k * count + o, l);
            let action = match k == rank {
                true => Action::Copy {
                    src,
                    dst: Span::new(OUTPUT, k * count + o, l),
                },
                false => Action::Copy {
                    src,
                    dst: Span::new(SHARED, base + k * l, l),
                },
            };
            staged_in.push(s.push(action, &outs));
        }
        let staged = s.push(Action::Sync, &staged_in);
        outs.clear();
        for k in (0..n).filter(|k| *k != rank) {
            outs.push(s.push(
                Action::CopyFrom {
                    peer: k,
                    src: Span::new(SHARED, base + rank * l, l),
                    dst: Span::new(OUTPUT, k * count + o, l),
                },
                &[staged],
            ));
        }
    }
    s.push(Action::Sync, &outs);
    s
}

/// Plain all-reduce and all-to-all through shared memory (see the module
/// documentation).
pub struct CopyIn;

impl Algorithm for CopyIn {
    fn name(&self) -> &'static str {
        "copyin"
    }

    fn supports(&self, spec: &CollSpec) -> bool {
        spec.direct.is_none()
            && match spec.kind {
                Kind::AllReduce => spec.shared >= 2,
                Kind::AllToAll => spec.shared >= 2 * spec.nranks,
                _ => false,
            }
    }

    fn preferred(&self, spec: &CollSpec, tuning: &Tuning) -> bool {
        // An all-to-all's count is per peer: compare what each rank sends.
        // On 2 ranks the pairwise exchange is one ring copy each way and
        // measured as fast or faster (1 MiB: 10.36 / 11.95 GB/s busbw out
        // of / in place against 9.99 / 8.88); on 4 copy-in wins (1 MiB:
        // 4.28 / 6.04 against 2.51 / 2.52; 256 MiB: 2.77 / 4.12 against
        // 2.78 / 1.98). Medians of 3-5 alternating runs.
        match spec.kind {
            Kind::AllToAll => {
                spec.nranks > 2 && spec.bytes().saturating_mul(spec.nranks) >= tuning.copyin_bytes
            }
            _ => spec.nranks > 1 && spec.bytes() >= tuning.copyin_bytes,
        }
    }

    fn build(&self, spec: &CollSpec) -> Schedule {
        let (r, n, c) = (spec.rank, spec.nranks, spec.count);
        match spec.kind {
            Kind::AllToAll if n == 1 => Schedule::copy_all(c),
            Kind::AllToAll => all_to_all(r, n, c, spec.shared),
            _ => all_reduce(r, n, c, spec.avg, spec.shared),
        }
    }
}
