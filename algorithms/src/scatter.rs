//! Van de Geijn's broadcast for large messages: the root scatters the data
//! in `n` segments down a binomial tree (`ceil(log2 n)` rounds, the root
//! sending each byte once), then a ring all_gather brings every segment to
//! every rank. About `2 (n-1)/n` of the data crosses each link, against
//! the chain's one copy per link but `n - 1` hops of latency; the tree
//! broadcast's inner nodes send everything twice.
//!
//! Positions are relative to the root (`p = rank - root`); segment `p` is
//! the one position `p` owns for the all_gather. A position owns the
//! segments of its binomial subtree `[p, hi)`: its parent sends them in one
//! message, it keeps segment `p` and sends the upper part of the rest to
//! each of its children, largest first.

use crate::schedule::{chunks, seg_off, sub_mod, Action, Schedule, Span, INPUT, OUTPUT};

/// Position `p`'s parent, the end of its subtree, and its children with
/// the ends of theirs, in the order it sends to them.
fn subtree(p: usize, n: usize) -> (Option<usize>, usize, Vec<(usize, usize)>) {
    let (mut lo, mut hi, mut parent) = (0, n, None);
    while lo != p {
        let m = lo + (hi - lo).div_ceil(2);
        if p >= m {
            (parent, lo) = (Some(lo), m);
        } else {
            hi = m;
        }
    }
    let mut kids = Vec::new();
    let mut h = hi;
    while h - p > 1 {
        let m = p + (h - p).div_ceil(2);
        kids.push((m, h));
        h = m;
    }
    (parent, hi, kids)
}

/// Broadcast `count` elements from `root`'s `INPUT` into every `OUTPUT`.
pub fn broadcast(rank: usize, n: usize, count: usize, chunk: usize, root: usize) -> Schedule {
    let p = sub_mod(rank, root, n);
    let rank_at = move |q: usize| (q + root) % n;
    let elems = |a: usize, b: usize| {
        (
            seg_off(count, n, a),
            seg_off(count, n, b) - seg_off(count, n, a),
        )
    };
    let (parent, hi, kids) = subtree(p, n);
    let mut s = Schedule::default();
    // Where this position's segments come from, and the steps that put
    // them there (by element range).
    let mut got: Vec<(usize, usize, u32)> = Vec::new();
    let src = match parent {
        None => {
            let c = s.push(
                Action::Copy {
                    src: Span::new(INPUT, 0, count),
                    dst: Span::new(OUTPUT, 0, count),
                },
                &[],
            );
            got.push((0, count, c));
            INPUT
        }
        Some(up) => {
            let (off, len) = elems(p, hi);
            for (o, l) in chunks(off, len, chunk) {
                let i = s.push(
                    Action::Recv {
                        peer: rank_at(up),
                        dst: Span::new(OUTPUT, o, l),
                    },
                    &[],
                );
                got.push((o, l, i));
            }
            OUTPUT
        }
    };
    let after = |o: usize, l: usize| -> Vec<u32> {
        match src {
            // The root sends from its input once its output holds it too
            // (the all_gather writes the same data there again later).
            INPUT => vec![got[0].2],
            _ => got
                .iter()
                .filter(|(go, gl, _)| *go < o + l && o < go + gl)
                .map(|g| g.2)
                .collect(),
        }
    };
    for &(k, end) in &kids {
        let (off, len) = elems(k, end);
        for (o, l) in chunks(off, len, chunk) {
            let deps = after(o, l);
            s.push(
                Action::Send {
                    peer: rank_at(k),
                    src: Span::new(src, o, l),
                },
                &deps,
            );
        }
    }
    // Segment p is in place: the ring all_gather over positions.
    let (so, sl) = elems(p, p + 1);
    let ready: Vec<u32> = chunks(so, sl, chunk)
        .map(|(o, l)| {
            // The receive (or the root's copy) that brought this chunk:
            // ranges are chunked from segment p's start, like the segment.
            got.iter()
                .find(|(go, gl, _)| *go < o + l && o < go + gl)
                .map(|g| g.2)
                .expect("segment p lies in the range this position received")
        })
        .collect();
    if n > 1 {
        crate::ring::ag_phase(&mut s, p, n, count, chunk, &ready, &rank_at);
    }
    s
}

/// Van de Geijn broadcast: binomial scatter + ring all_gather (never
/// chosen automatically yet: `OXCCL_ALGO=scatter`).
pub struct ScatterGather;

impl crate::Algorithm for ScatterGather {
    fn name(&self) -> &'static str {
        "scatter"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::Broadcast && s.direct.is_none()
    }
    fn preferred(&self, _: &crate::CollSpec, _: &crate::Tuning) -> bool {
        false
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        broadcast(s.rank, s.nranks, s.count, s.chunk, s.root)
    }
}
