//! The dissemination barrier.

use crate::schedule::{Action, Schedule, Span, INPUT, OUTPUT};

/// Dissemination barrier: in round `k` send an empty message to
/// `rank + 2^k` and wait for one from `rank - 2^k`; after ceil(log2 n)
/// rounds every rank has transitively heard from every other. Round `k`'s
/// send and receive both follow round `k-1`'s receive: were receives left
/// free to complete out of order, a rank could forward round `k` before it
/// heard round `k-1`, and a rank could leave the barrier before another
/// entered it (the checker's knowledge test catches exactly that).
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
            &deps,
        ));
        dist *= 2;
    }
    s
}

/// The dissemination barrier.
pub struct Dissemination;

impl crate::Algorithm for Dissemination {
    fn name(&self) -> &'static str {
        "dissemination"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::Barrier
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        barrier(s.rank, s.nranks)
    }
}
