//! Recursive doubling all_gather for any rank count (the Bruck variant):
//! at step `k` every rank sends the `m = min(2^k, n - 2^k)` blocks it holds
//! starting at its own, `[r, r + m)` (mod n), to rank `r - 2^k` and gets
//! `[r + 2^k, r + 2^k + m)` from rank `r + 2^k`. After `ceil(log2 n)`
//! steps every rank holds every block. Blocks land straight at their place
//! in the output (no final rotation); a run of blocks that wraps past the
//! last rank is sent as two messages, split the same way on both sides.
//!
//! `ceil(log2 n)` rounds instead of the ring's `n - 1`: for small messages,
//! where each round costs a latency, not bandwidth.

use crate::schedule::{chunks, Action, Schedule, Span, INPUT, OUTPUT};

/// The contiguous runs of blocks `[first, first + m)` mod `n`, in order:
/// one run, or two when it wraps.
fn runs(first: usize, m: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    let head = m.min(n - first);
    [(first, head), (0, m - head)]
        .into_iter()
        .filter(|(_, len)| *len > 0)
}

/// Recursive doubling all_gather of `count` elements per rank into
/// `OUTPUT` (`n * count`); in place, this rank's block is already there.
pub fn all_gather(rank: usize, n: usize, count: usize, chunk: usize, in_place: bool) -> Schedule {
    let mut s = Schedule::default();
    // Per block, the steps that wrote it here (what a send of it waits for).
    let mut writers: Vec<Vec<u32>> = vec![Vec::new(); n];
    if !in_place {
        writers[rank].push(s.push(
            Action::Copy {
                src: Span::new(INPUT, 0, count),
                dst: Span::new(OUTPUT, rank * count, count),
            },
            &[],
        ));
    }
    let mut dist = 1;
    while dist < n {
        let m = dist.min(n - dist);
        let to = (rank + n - dist) % n;
        let from = (rank + dist) % n;
        for (b, nb) in runs(rank, m, n) {
            let deps: Vec<u32> = writers[b..b + nb].iter().flatten().copied().collect();
            for (off, len) in chunks(b * count, nb * count, chunk) {
                s.push(
                    Action::Send {
                        peer: to,
                        src: Span::new(OUTPUT, off, len),
                    },
                    &deps,
                );
            }
        }
        for (b, nb) in runs(from, m, n) {
            for (off, len) in chunks(b * count, nb * count, chunk) {
                let i = s.push(
                    Action::Recv {
                        peer: from,
                        dst: Span::new(OUTPUT, off, len),
                    },
                    &[],
                );
                let (first, last) = (off / count.max(1), (off + len).div_ceil(count.max(1)));
                for w in &mut writers[first..last.min(n)] {
                    w.push(i);
                }
            }
        }
        dist *= 2;
    }
    s
}

/// Recursive doubling all_gather: `ceil(log2 n)` rounds, for small
/// messages (never chosen automatically yet: `OXCCL_ALGO=doubling`).
pub struct Doubling;

impl crate::Algorithm for Doubling {
    fn name(&self) -> &'static str {
        "doubling"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::AllGather && s.direct.is_none()
    }
    fn preferred(&self, _: &crate::CollSpec, _: &crate::Tuning) -> bool {
        false
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        all_gather(s.rank, s.nranks, s.count, s.chunk, s.in_place)
    }
}
