//! Double binary tree all_reduce (as NCCL 2.4 introduced): two binary
//! trees over all ranks, each carrying half of the data — reduced up to its
//! root and broadcast back down, chunk by chunk, both halves at once. The
//! second tree is the first with positions shifted by `ceil(n/2)`, so the
//! inner nodes of one are leaves of the other: every rank forwards for at
//! most one tree, and the load is even. Latency grows with `log2 n`
//! instead of the ring's `n`.
//!
//! Each tree's root computes its half once and the bits travel down
//! unchanged, so every rank ends with the same result. Inner nodes combine
//! in their output (their first child, then the second, their own
//! contribution last: `(c2+(c1+in))`); a node receives the final value of
//! a chunk there only after it has sent its partial up.

use crate::schedule::{chunks, seg_len, seg_off, Action, Schedule, Span, INPUT, OUTPUT};

/// The two trees' position of `rank` (tree `t` shifts positions by
/// `t * ceil(n/2)`; the rank at position 0 is the tree's root).
fn position(rank: usize, n: usize, t: usize) -> usize {
    (rank + t * n.div_ceil(2)) % n
}

fn rank_at(p: usize, n: usize, t: usize) -> usize {
    (p + n - (t * n.div_ceil(2)) % n) % n
}

/// All-reduce `count` elements `INPUT` -> `OUTPUT`.
pub fn all_reduce(rank: usize, n: usize, count: usize, chunk: usize, avg: bool) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let mut s = Schedule::default();
    for t in 0..2 {
        let (base, len) = (seg_off(count, 2, t), seg_len(count, 2, t));
        let p = position(rank, n, t);
        let kids: Vec<usize> = [2 * p + 1, 2 * p + 2]
            .into_iter()
            .filter(|c| *c < n)
            .map(|c| rank_at(c, n, t))
            .collect();
        let parent = (p > 0).then(|| rank_at((p - 1) / 2, n, t));
        for (off, l) in chunks(base, len, chunk) {
            let (mine, out) = (Span::new(INPUT, off, l), Span::new(OUTPUT, off, l));
            // Up: combine the children's partials with this rank's own.
            let mut last: Option<u32> = None;
            for &k in &kids {
                let deps: Vec<u32> = last.into_iter().collect();
                last = Some(s.push(
                    Action::RecvReduce {
                        peer: k,
                        dst: out,
                        with: if last.is_some() { out } else { mine },
                    },
                    &deps,
                ));
            }
            let partial = if last.is_some() { out } else { mine };
            let ready = match parent {
                Some(up) => {
                    // Send the partial up; the final value comes back into
                    // the output once it has left.
                    let deps: Vec<u32> = last.into_iter().collect();
                    let sent = s.push(
                        Action::Send {
                            peer: up,
                            src: partial,
                        },
                        &deps,
                    );
                    s.push(Action::Recv { peer: up, dst: out }, &[sent])
                }
                None => {
                    let done = last.expect("a root of two or more ranks has a child");
                    match avg {
                        true => s.push(Action::Divide { dst: out }, &[done]),
                        false => done,
                    }
                }
            };
            // Down: the final value to the children.
            for &k in &kids {
                s.push(Action::Send { peer: k, src: out }, &[ready]);
            }
        }
    }
    s
}

/// Double binary tree all_reduce (never chosen automatically yet:
/// `OXCCL_ALGO=dbtree`).
pub struct DoubleTree;

impl crate::Algorithm for DoubleTree {
    fn name(&self) -> &'static str {
        "dbtree"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::AllReduce && s.direct.is_none()
    }
    fn preferred(&self, _: &crate::CollSpec, _: &crate::Tuning) -> bool {
        false
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        all_reduce(s.rank, s.nranks, s.count, s.chunk, s.avg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The point of two trees: no rank forwards (has children) in both, and
    /// each tree has every rank exactly once.
    #[test]
    fn every_rank_is_an_inner_node_of_one_tree_at_most() {
        for n in 2..=65 {
            for r in 0..n {
                let inner = (0..2).filter(|t| 2 * position(r, n, *t) + 1 < n).count();
                assert!(inner <= 1, "rank {r} of {n} is inner in both trees");
            }
            for t in 0..2 {
                let mut seen: Vec<usize> = (0..n).map(|p| rank_at(p, n, t)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
                assert!((0..n).all(|r| rank_at(position(r, n, t), n, t) == r));
            }
        }
    }
}
