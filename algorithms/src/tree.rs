//! Pipelined binary trees rooted at the call's root: broadcast flows down,
//! reduce flows up, chunk by chunk, so a chunk moves on while the next one
//! arrives. Ranks are placed in heap order relative to the root
//! (position `p = rank - root`, parent `(p - 1) / 2`, children `2p + 1`
//! and `2p + 2`): depth `floor(log2 n)` instead of the chain's `n - 1`, so
//! small messages take logarithmic time, large ones about twice the
//! chain's per-link traffic at the inner nodes.
//!
//! Reduce combines in a fixed order per node — its first child, then its
//! second, then its own contribution last in the expression `(c2+(c1+in))`
//! — and only the root's output is written (inner nodes combine in
//! scratch, one slot per chunk).

use crate::schedule::{chunks, sub_mod, Action, Schedule, Span, INPUT, OUTPUT, SCRATCH};

/// Position `p`'s children among `n`.
fn children(p: usize, n: usize) -> impl Iterator<Item = usize> {
    [2 * p + 1, 2 * p + 2].into_iter().filter(move |c| *c < n)
}

/// The rank at position `p` of a tree rooted at `root`.
fn rank_at(p: usize, root: usize, n: usize) -> usize {
    (p + root) % n
}

/// Broadcast `count` elements from `root`'s `INPUT` into every `OUTPUT`.
pub fn broadcast(rank: usize, n: usize, count: usize, chunk: usize, root: usize) -> Schedule {
    let p = sub_mod(rank, root, n);
    let kids: Vec<usize> = children(p, n).map(|c| rank_at(c, root, n)).collect();
    if p == 0 {
        let mut s = Schedule::copy_all(count);
        for (off, len) in chunks(0, count, chunk) {
            for &k in &kids {
                s.push(
                    Action::Send {
                        peer: k,
                        src: Span::new(INPUT, off, len),
                    },
                    &[],
                );
            }
        }
        return s;
    }
    let mut s = Schedule::default();
    let parent = rank_at((p - 1) / 2, root, n);
    for (off, len) in chunks(0, count, chunk) {
        let got = s.push(
            Action::Recv {
                peer: parent,
                dst: Span::new(OUTPUT, off, len),
            },
            &[],
        );
        for &k in &kids {
            s.push(
                Action::Send {
                    peer: k,
                    src: Span::new(OUTPUT, off, len),
                },
                &[got],
            );
        }
    }
    s
}

/// Reduce `count` elements of every `INPUT` into `root`'s `OUTPUT`.
pub fn reduce(
    rank: usize,
    n: usize,
    count: usize,
    chunk: usize,
    root: usize,
    avg: bool,
) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let p = sub_mod(rank, root, n);
    let kids: Vec<usize> = children(p, n).map(|c| rank_at(c, root, n)).collect();
    let mut s = Schedule::default();
    // Where this node's partial of a chunk lives: the root's output, else
    // scratch at the chunk's offset.
    let partial = |off: usize, len: usize| match p {
        0 => Span::new(OUTPUT, off, len),
        _ => Span::new(SCRATCH, off, len),
    };
    if p != 0 && !kids.is_empty() {
        s.scratch = count;
    }
    for (off, len) in chunks(0, count, chunk) {
        let mine = Span::new(INPUT, off, len);
        let mut last: Option<u32> = None;
        for &k in &kids {
            let with = last.map_or(mine, |_| partial(off, len));
            let deps: Vec<u32> = last.into_iter().collect();
            last = Some(s.push(
                Action::RecvReduce {
                    peer: k,
                    dst: partial(off, len),
                    with,
                },
                &deps,
            ));
        }
        if p == 0 {
            if avg {
                s.push(
                    Action::Divide {
                        dst: partial(off, len),
                    },
                    &[last.expect("the root of two or more ranks has a child")],
                );
            }
            continue;
        }
        let src = last.map_or(mine, |_| partial(off, len));
        let deps: Vec<u32> = last.into_iter().collect();
        s.push(
            Action::Send {
                peer: rank_at((p - 1) / 2, root, n),
                src,
            },
            &deps,
        );
    }
    s
}

/// Binary trees for broadcast and reduce (never chosen automatically yet:
/// `OXCCL_ALGO=tree`).
pub struct Tree;

impl crate::Algorithm for Tree {
    fn name(&self) -> &'static str {
        "tree"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        matches!(s.kind, crate::Kind::Broadcast | crate::Kind::Reduce) && s.direct.is_none()
    }
    fn preferred(&self, _: &crate::CollSpec, _: &crate::Tuning) -> bool {
        false
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        let (r, n, c, ch) = (s.rank, s.nranks, s.count, s.chunk);
        match s.kind {
            crate::Kind::Broadcast => broadcast(r, n, c, ch, s.root),
            _ => reduce(r, n, c, ch, s.root, s.avg),
        }
    }
}
