//! One-shot all-reduce for small messages: one exchange instead of the
//! ring's 2(n-1) steps, each rank combining every contribution in rank order.

use crate::schedule::{Action, Schedule, Span, INPUT, OUTPUT, SCRATCH};

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

/// One-shot all-reduce, preferred up to `Tuning::oneshot_bytes`.
pub struct OneShot;

impl crate::Algorithm for OneShot {
    fn name(&self) -> &'static str {
        "oneshot"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::AllReduce
    }
    fn preferred(&self, s: &crate::CollSpec, t: &crate::Tuning) -> bool {
        s.bytes() <= t.oneshot_bytes
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        all_reduce_oneshot(s.rank, s.nranks, s.count, s.avg)
    }
}
