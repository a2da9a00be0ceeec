//! Copy-in all-reduce (and all-gather, broadcast and all-to-all, at the
//! end): plain buffers at the speed of direct access, for ranks that map
//! each other's executor-owned shared memory ([`SHARED`]: one host).
//!
//! Peers cannot read a plain buffer, so each rank copies its input, one
//! piece at a time, into its shared memory (all but its own segment of the
//! piece); the owner of each segment reduces that segment of every peer's
//! copy and of its own input into its shared memory; then every rank
//! copies the reduced segments into its output. The three stages of
//! consecutive pieces overlap, so that one `Sync` a piece orders them all:
//!
//! ```text
//! phase k:  ReduceFrom own segment of piece k-1 (own part: the input)
//!             into shared[(k-1) % 2] and the own output at once
//!           CopyFrom every other owner's segment of piece k-2 -> output
//!           Copy input of piece k -> shared[k % 2] (but the own segment)
//!           Sync
//! ```
//!
//! Each byte of input is read from memory once and each byte of output
//! written once: the minimum any all-reduce moves. The pieces are sized
//! to stay in cache, so the copies in and the reductions between them
//! cost cache bandwidth only (the ring's traffic is higher: it reads its
//! reduced segment back from memory to pass it on). Two buffers alternate,
//! and what phase k touches in each is disjoint from what any rank may
//! still touch there: piece k goes into the segments of `shared[k % 2]`
//! that owners finished reducing (piece k-2, before Sync k-1), while its
//! own segment, which the reduction of piece k will overwrite, is read by
//! the copies out of piece k-2 only until Sync k. Two last phases reduce
//! and copy out the last pieces; the last `Sync` keeps the next call from
//! overwriting what a peer still reads. (Earlier, two `Sync`s a piece,
//! one after the copies in and one after the reductions: on 4 ranks
//! sharing 2 cores each is a context switch.)
//!
//! The reduction of an element combines every rank's input in rank order
//! at its owner: bitwise identical on every rank, as the ring's is.

use crate::algorithm::Algorithm;
use crate::schedule::{chunks, seg_len, seg_off, Action, Schedule, Span, INPUT, OUTPUT, SHARED};
use crate::spec::{CollSpec, Kind, Tuning};

/// All-reduce through `shared` elements of shared memory (two buffers of
/// half of it, each a slot of `cap` elements per rank; needs `shared >= 2
/// * n`).
pub fn all_reduce(rank: usize, n: usize, count: usize, avg: bool, shared: usize) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let mut s = Schedule::default();
    if count == 0 {
        return s;
    }
    // Segment q of every piece lives in slot q of its buffer, whatever the
    // piece's length (the last one is shorter): so what a phase writes
    // into a buffer never overlaps the slot a peer may still read there.
    let cap = (shared / 2 / n).max(1).min(count.div_ceil(n));
    let piece = cap * n;
    s.shared = 2 * piece;
    let pieces: Vec<(usize, usize)> = chunks(0, count, piece).collect();
    let slot = |j: usize, q: usize| (j % 2) * piece + q * cap;
    // The owner writes its own output segment in the reduction's pass
    // (its peers' copy stays cached for them): one pass less. An average
    // divides the shared copy afterwards, so it copies its own out.
    let fused = !avg;
    // Phase k (after Sync k - 1) reduces piece k - 1, copies piece k - 2
    // out and stages piece k; see the module documentation for why one
    // `Sync` a piece is enough with two buffers.
    let mut sync: Option<u32> = None;
    for k in 0..=pieces.len() + 1 {
        let after: Vec<u32> = sync.into_iter().collect();
        let mut done = Vec::new();
        if let Some(j) = k.checked_sub(1).filter(|j| *j < pieces.len()) {
            let (off, len) = pieces[j];
            let (o, l) = (seg_off(len, n, rank), seg_len(len, n, rank));
            if l > 0 {
                let mine = Span::new(SHARED, slot(j, rank), l);
                let mut last = s.push(
                    Action::ReduceFrom {
                        dst: mine,
                        src: mine,
                        own: Span::new(INPUT, off + o, l),
                        also: fused.then_some(Span::new(OUTPUT, off + o, l)),
                    },
                    &after,
                );
                if avg {
                    last = s.push(Action::Divide { dst: mine }, &[last]);
                }
                done.push(last);
            }
        }
        if let Some(j) = k.checked_sub(2).filter(|j| *j < pieces.len()) {
            let (off, len) = pieces[j];
            for q in 0..n {
                let (o, l) = (seg_off(len, n, q), seg_len(len, n, q));
                if l == 0 {
                    continue;
                }
                let (src, dst) = (
                    Span::new(SHARED, slot(j, q), l),
                    Span::new(OUTPUT, off + o, l),
                );
                let action = match q == rank {
                    true if fused => continue,
                    true => Action::Copy { src, dst },
                    false => Action::CopyFrom { peer: q, src, dst },
                };
                done.push(s.push(action, &after));
            }
        }
        if let Some(&(off, len)) = pieces.get(k) {
            // Every segment but this rank's own goes in (its owner reads
            // it there); the own one is reduced straight from the input.
            for q in (0..n).filter(|q| *q != rank) {
                let (o, l) = (seg_off(len, n, q), seg_len(len, n, q));
                if l > 0 {
                    let copy = Action::Copy {
                        src: Span::new(INPUT, off + o, l),
                        dst: Span::new(SHARED, slot(k, q), l),
                    };
                    done.push(s.push(copy, &after));
                }
            }
        }
        sync = Some(s.push(Action::Sync, &done));
    }
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

/// All-gather through `shared` elements of shared memory: each piece of
/// this rank's input goes once into its shared memory, and the own output
/// segment is written from it while it is cached (a ring reads the input
/// twice out of place: for the own segment and into the ring); one `Sync`,
/// then every rank copies the piece out of each peer's shared memory,
/// while it stages the next piece into the other half (the all-reduce's
/// two buffers, for the same reason: what a phase writes into one half,
/// the peers finished reading before the previous `Sync`).
pub fn all_gather(rank: usize, n: usize, count: usize, in_place: bool, shared: usize) -> Schedule {
    let sources: Vec<usize> = (0..n).collect();
    fan_out(rank, n, count, in_place, shared, &sources, |q| q * count)
}

/// Broadcast through `shared` elements of shared memory: the all-gather's
/// schedule with the root the only rank staging, every rank's output at
/// the start of its buffer. Each output is written once and the input
/// read once, where a chain passes every byte through each rank on the
/// way.
pub fn broadcast(
    rank: usize,
    n: usize,
    count: usize,
    root: usize,
    in_place: bool,
    shared: usize,
) -> Schedule {
    fan_out(rank, n, count, in_place, shared, &[root], |_| 0)
}

/// Every rank of `sources` stages its input a piece at a time (writing its
/// own output, at `at(itself)`, from the staged piece unless in place);
/// after each piece's `Sync` every rank copies the piece out of each other
/// source into its output at `at(source)`.
fn fan_out(
    rank: usize,
    n: usize,
    count: usize,
    in_place: bool,
    shared: usize,
    sources: &[usize],
    at: impl Fn(usize) -> usize,
) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let mut s = Schedule::default();
    if count == 0 {
        return s;
    }
    let piece = (shared / 2).max(1).min(count);
    s.shared = 2 * piece;
    let pieces: Vec<(usize, usize)> = chunks(0, count, piece).collect();
    let slot = |j: usize, len: usize| Span::new(SHARED, (j % 2) * piece, len);
    let stages = sources.contains(&rank);
    let mut sync: Option<u32> = None;
    for k in 0..=pieces.len() {
        let after: Vec<u32> = sync.into_iter().collect();
        let mut done = Vec::new();
        if let Some(&(off, len)) = pieces.get(k).filter(|_| stages) {
            let staged = s.push(
                Action::Copy {
                    src: Span::new(INPUT, off, len),
                    dst: slot(k, len),
                },
                &after,
            );
            done.push(staged);
            // In place the input is the own output segment already.
            if !in_place {
                let own = Action::Copy {
                    src: slot(k, len),
                    dst: Span::new(OUTPUT, at(rank) + off, len),
                };
                done.push(s.push(own, &[staged]));
            }
        }
        if let Some(j) = k.checked_sub(1) {
            let (off, len) = pieces[j];
            for &q in sources.iter().filter(|q| **q != rank) {
                let action = Action::CopyFrom {
                    peer: q,
                    src: slot(j, len),
                    dst: Span::new(OUTPUT, at(q) + off, len),
                };
                done.push(s.push(action, &after));
            }
        }
        sync = Some(s.push(Action::Sync, &done));
    }
    s
}

/// Plain all-reduce, all-gather, broadcast and all-to-all through shared
/// memory (see the module documentation).
pub struct CopyIn;

impl Algorithm for CopyIn {
    fn name(&self) -> &'static str {
        "copyin"
    }

    fn supports(&self, spec: &CollSpec) -> bool {
        spec.direct.is_none()
            && match spec.kind {
                // A slot per rank in each of two buffers.
                Kind::AllReduce | Kind::AllToAll => spec.shared >= 2 * spec.nranks,
                // Two buffers of this rank's own pieces.
                Kind::AllGather | Kind::Broadcast => spec.shared >= 2,
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
        //
        // An all-gather's count is per rank too; the ring's extra read of
        // the input costs once the buffers outgrow the cache. Copy-in
        // against ring (8 MiB cache, new / old time, medians of 3, out of
        // / in place, by output size): 2 ranks 1.59 / 1.22 at 2 MiB, 0.48
        // / 0.60 at 4 MiB, 0.63-0.67 / 0.66-0.74 from 8 to 128 MiB; 4
        // ranks 0.93 / 1.00 at 2 MiB, 0.44-0.55 / 0.42-0.62 from 4 MiB.
        // With a 32 MiB cache 2 ranks' ring leads up to 8 MiB
        // ([`Tuning::copyin_gather_bytes`]).
        //
        // A broadcast's root stages once and every other rank copies out
        // once, where a chain passes each byte through every rank: 4 ranks
        // 0.91 / 0.84 at 1 MiB, 0.44-0.60 from 4 MiB. On 2 ranks the chain
        // is that one hand-off already, pipelined in smaller chunks (copy-in
        // 1.09-1.84 up to 8 MiB, 0.87-1.01 above). With a larger cache the
        // tree leads further ([`Tuning::copyin_broadcast_bytes`]).
        let n = spec.nranks;
        match spec.kind {
            Kind::AllToAll => n > 2 && spec.bytes().saturating_mul(n) >= tuning.copyin_bytes,
            Kind::AllGather => {
                n > 1 && spec.bytes().saturating_mul(n) >= tuning.copyin_gather_bytes(n)
            }
            Kind::Broadcast => n > 2 && spec.bytes() >= tuning.copyin_broadcast_bytes(n),
            _ => n > 1 && spec.bytes() >= tuning.copyin_bytes,
        }
    }

    fn build(&self, spec: &CollSpec) -> Schedule {
        let (r, n, c) = (spec.rank, spec.nranks, spec.count);
        match spec.kind {
            Kind::AllToAll if n == 1 => Schedule::copy_all(c),
            Kind::AllToAll => all_to_all(r, n, c, spec.shared),
            Kind::AllGather => all_gather(r, n, c, spec.in_place, spec.shared),
            Kind::Broadcast => broadcast(r, n, c, spec.root, spec.in_place, spec.shared),
            _ => all_reduce(r, n, c, spec.avg, spec.shared),
        }
    }
}
