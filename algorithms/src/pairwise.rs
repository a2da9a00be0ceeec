//! Pairwise all-to-all: every rank exchanges one segment with every other
//! rank directly, partners in a rotating order.

use crate::schedule::{chunks, Action, Schedule, Span, INPUT, OUTPUT, SCRATCH};

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

/// Pairwise all-to-all.
pub struct Pairwise;

impl crate::Algorithm for Pairwise {
    fn name(&self) -> &'static str {
        "pairwise"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::AllToAll
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        all_to_all(s.rank, s.nranks, s.count, s.chunk, s.in_place)
    }
}
