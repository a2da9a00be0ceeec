//! Chain (pipelined ring without the wrap-around) algorithms rooted at one
//! rank: broadcast flows root -> root+1 -> ... -> root-1, reduce flows
//! root+1 -> ... -> root. Chunks stream through the chain, so for large
//! messages every link is busy at once and the time approaches
//! `bytes / bandwidth`, independent of the rank count.

use crate::schedule::{chunks, sub_mod, Action, Schedule, Span, INPUT, OUTPUT, SCRATCH};

/// Broadcast `count` elements from `root`'s `INPUT` into every `OUTPUT`.
pub fn broadcast(rank: usize, n: usize, count: usize, chunk: usize, root: usize) -> Schedule {
    let mut s = Schedule::default();
    let pos = sub_mod(rank, root, n);
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    if pos == 0 {
        s = Schedule::copy_all(count);
        if n > 1 {
            for (off, len) in chunks(0, count, chunk) {
                s.push(
                    Action::Send {
                        peer: next,
                        src: Span::new(INPUT, off, len),
                    },
                    &[],
                );
            }
        }
        return s;
    }
    for (off, len) in chunks(0, count, chunk) {
        let r = s.push(
            Action::Recv {
                peer: prev,
                dst: Span::new(OUTPUT, off, len),
            },
            &[],
        );
        if pos != n - 1 {
            s.push(
                Action::Send {
                    peer: next,
                    src: Span::new(OUTPUT, off, len),
                },
                &[r],
            );
        }
    }
    s
}

/// Scratch slots a middle rank of the reduce chain cycles through.
const REDUCE_SLOTS: usize = 4;

/// Reduce `count` elements of every `INPUT` into `root`'s `OUTPUT`. Only the
/// root writes its output; middle ranks combine in scratch slots.
pub fn reduce(
    rank: usize,
    n: usize,
    count: usize,
    chunk: usize,
    root: usize,
    avg: bool,
) -> Schedule {
    let mut s = Schedule::default();
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let pos = sub_mod(rank, root + 1, n);
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    if pos == 0 {
        for (off, len) in chunks(0, count, chunk) {
            s.push(
                Action::Send {
                    peer: next,
                    src: Span::new(INPUT, off, len),
                },
                &[],
            );
        }
    } else if pos == n - 1 {
        for (off, len) in chunks(0, count, chunk) {
            let dst = Span::new(OUTPUT, off, len);
            let r = s.push(
                Action::RecvReduce {
                    peer: prev,
                    dst,
                    with: Span::new(INPUT, off, len),
                },
                &[],
            );
            if avg {
                s.push(Action::Divide { dst }, &[r]);
            }
        }
    } else {
        let slot = chunk.min(count);
        s.scratch = REDUCE_SLOTS * slot;
        let mut sends: Vec<u32> = Vec::new();
        for (j, (off, len)) in chunks(0, count, chunk).enumerate() {
            let tmp = Span::new(SCRATCH, (j % REDUCE_SLOTS) * slot, len);
            // A slot is reused only after the send that read it finished.
            let deps: Vec<u32> = j
                .checked_sub(REDUCE_SLOTS)
                .map(|k| sends[k])
                .into_iter()
                .collect();
            let r = s.push(
                Action::RecvReduce {
                    peer: prev,
                    dst: tmp,
                    with: Span::new(INPUT, off, len),
                },
                &deps,
            );
            sends.push(s.push(
                Action::Send {
                    peer: next,
                    src: tmp,
                },
                &[r],
            ));
        }
    }
    s
}

/// The chain: rooted broadcast and reduce, pipelined along the ranks.
pub struct Chain;

impl crate::Algorithm for Chain {
    fn name(&self) -> &'static str {
        "chain"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        matches!(s.kind, crate::Kind::Broadcast | crate::Kind::Reduce)
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        let (r, n, c, ch) = (s.rank, s.nranks, s.count, s.chunk);
        match s.kind {
            crate::Kind::Broadcast => broadcast(r, n, c, ch, s.root),
            _ => reduce(r, n, c, ch, s.root, s.avg),
        }
    }
}
