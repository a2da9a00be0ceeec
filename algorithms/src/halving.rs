//! Rabenseifner's all_reduce: a reduce-scatter by recursive halving, then
//! an all_gather by recursive doubling — `2 log2 p` rounds moving about
//! twice the data once, against the ring's `2 (n - 1)` rounds.
//!
//! For a rank count `n` that is not a power of two, the usual fold: with
//! `p` the largest power of two below `n` and `rem = n - p`, each even rank
//! below `2 rem` first sends its whole input to the odd rank above it and
//! waits; the `p` remaining ranks (numbered `0..p` in order) run the
//! power-of-two algorithm; each odd rank below `2 rem` finally sends the
//! whole result back to its even neighbour.
//!
//! The data is cut into `p` blocks. Halving: at mask `d = p/2, .., 1` a rank
//! keeps the half of its window of blocks on its side of bit `d`, sends the
//! other half to the rank across that bit and reduces what comes back into
//! its half; it ends owning block `new rank`, reduced once (the owner also
//! divides it for `Avg`), so every rank later gets the same bits. Doubling
//! exchanges windows of growing size until every block is everywhere.
//! Which steps wait for which is derived from the memory each step reads
//! and writes ([`Deps`]), block by block.

use crate::schedule::{chunks, seg_off, Action, Schedule, Span, INPUT, OUTPUT};

/// Dependencies from memory use: per run of blocks of the output (and of
/// the input when it is the same memory), the steps of its last write (one
/// per chunk) and the steps that read it since. Runs, not single blocks:
/// every step touches an aligned range of blocks, so a handful of runs
/// describe all `p` blocks and a rank's schedule builds in `O(log² p)`
/// rather than `O(p log p)` (16 384 ranks: the simulator builds every
/// rank's).
struct Deps {
    /// Runs covering `0..p` in order: (first block, end, writers, readers).
    runs: Vec<Run>,
    in_place: bool,
}

struct Run {
    lo: usize,
    hi: usize,
    writer: Vec<u32>,
    readers: Vec<u32>,
}

impl Deps {
    fn new(p: usize, in_place: bool) -> Deps {
        Deps {
            runs: vec![Run {
                lo: 0,
                hi: p,
                writer: Vec::new(),
                readers: Vec::new(),
            }],
            in_place,
        }
    }
    /// Make `x` a run boundary (when it lies inside a run).
    fn split(&mut self, x: usize) {
        if let Some(i) = self.runs.iter().position(|r| r.lo < x && x < r.hi) {
            let r = &mut self.runs[i];
            let right = Run {
                lo: x,
                hi: r.hi,
                writer: r.writer.clone(),
                readers: r.readers.clone(),
            };
            r.hi = x;
            self.runs.insert(i + 1, right);
        }
    }
    /// The runs inside `b` (after splitting at its ends).
    fn within(&mut self, b: &std::ops::Range<usize>) -> impl Iterator<Item = &mut Run> {
        self.split(b.start);
        self.split(b.end);
        let b = b.clone();
        self.runs
            .iter_mut()
            .filter(move |r| b.start <= r.lo && r.hi <= b.end)
    }
    fn overlapping(&self, b: std::ops::Range<usize>) -> impl Iterator<Item = &Run> {
        self.runs
            .iter()
            .filter(move |r| r.lo < b.end && b.start < r.hi)
    }
    /// Steps a read of blocks `b` of `buf` must follow.
    fn read(&self, buf: u16, b: std::ops::Range<usize>) -> Vec<u32> {
        if buf == INPUT && !self.in_place {
            return Vec::new();
        }
        set(self.overlapping(b).flat_map(|r| r.writer.iter().copied()))
    }
    /// Steps a write of blocks `b` must follow.
    fn write(&self, b: std::ops::Range<usize>) -> Vec<u32> {
        set(self
            .overlapping(b)
            .flat_map(|r| r.writer.iter().chain(&r.readers).copied()))
    }
    fn did_read(&mut self, buf: u16, b: std::ops::Range<usize>, step: u32) {
        if buf == OUTPUT || self.in_place {
            for r in self.within(&b) {
                r.readers.push(step);
            }
        }
    }
    fn did_write(&mut self, b: std::ops::Range<usize>, steps: &[u32]) {
        for r in self.within(&b) {
            r.writer = steps.to_vec();
            r.readers.clear();
        }
    }
}

/// Step indices as a sorted set (a dependency list names each step once).
fn set(steps: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = steps.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The element span of blocks `b` of `buf`.
fn span(buf: u16, count: usize, p: usize, b: &std::ops::Range<usize>) -> Span {
    let (lo, hi) = (seg_off(count, p, b.start), seg_off(count, p, b.end));
    Span::new(buf, lo, hi - lo)
}

/// Rabenseifner all_reduce of `count` elements `INPUT` -> `OUTPUT`.
pub fn all_reduce(
    rank: usize,
    n: usize,
    count: usize,
    chunk: usize,
    avg: bool,
    in_place: bool,
) -> Schedule {
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let p = 1 << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let mut s = Schedule::default();
    let mut deps = Deps::new(p, in_place);
    let all = 0..p;
    // The ranks in the power-of-two group, and this rank's place in it.
    let member = |r: usize| match r < 2 * rem {
        true => (r % 2 == 1).then_some(r / 2),
        false => Some(r - rem),
    };
    let rank_of = |nr: usize| match nr < rem {
        true => 2 * nr + 1,
        false => nr + rem,
    };
    // Send blocks `b` of `buf` to `peer`, chunked.
    let send = |s: &mut Schedule, deps: &mut Deps, peer, buf, b: std::ops::Range<usize>| {
        let sp = span(buf, count, p, &b);
        let d = deps.read(buf, b.clone());
        for (off, len) in chunks(sp.off, sp.len, chunk) {
            let i = s.push(
                Action::Send {
                    peer,
                    src: Span::new(buf, off, len),
                },
                &d,
            );
            deps.did_read(buf, b.clone(), i);
        }
    };
    // Receive blocks `b` from `peer` into the output, reducing with `with`
    // (a buffer: the same blocks of it) or not.
    let recv =
        |s: &mut Schedule, deps: &mut Deps, peer, with: Option<u16>, b: std::ops::Range<usize>| {
            let sp = span(OUTPUT, count, p, &b);
            let mut d = deps.write(b.clone());
            if let Some(w) = with {
                d.extend(deps.read(w, b.clone()));
                d = set(d.into_iter());
            }
            let mut done = Vec::new();
            for (off, len) in chunks(sp.off, sp.len, chunk) {
                let dst = Span::new(OUTPUT, off, len);
                let action = match with {
                    Some(w) => Action::RecvReduce {
                        peer,
                        dst,
                        with: Span::new(w, off, len),
                    },
                    None => Action::Recv { peer, dst },
                };
                done.push(s.push(action, &d));
            }
            if let Some(w) = with {
                for &i in &done {
                    deps.did_read(w, b.clone(), i);
                }
            }
            deps.did_write(b, &done);
        };

    let Some(nr) = member(rank) else {
        // Folded away: give the input to the odd neighbour, get the result.
        send(&mut s, &mut deps, rank + 1, INPUT, all.clone());
        recv(&mut s, &mut deps, rank + 1, None, all);
        return s;
    };
    // The current partial of every block: the input, or after the fold
    // (or any reduction into it) the output.
    let mut cur = INPUT;
    if rank < 2 * rem {
        recv(&mut s, &mut deps, rank - 1, Some(INPUT), all.clone());
        cur = OUTPUT;
    }
    // Reduce-scatter by recursive halving.
    let (mut lo, mut hi) = (0, p);
    let mut d = p / 2;
    while d >= 1 {
        let peer = rank_of(nr ^ d);
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = match nr & d {
            0 => (lo..mid, mid..hi),
            _ => (mid..hi, lo..mid),
        };
        send(&mut s, &mut deps, peer, cur, give);
        recv(&mut s, &mut deps, peer, Some(cur), keep.clone());
        (lo, hi) = (keep.start, keep.end);
        cur = OUTPUT;
        d /= 2;
    }
    if avg {
        let own = nr..nr + 1;
        let i = s.push(
            Action::Divide {
                dst: span(OUTPUT, count, p, &own),
            },
            &deps.write(own.clone()),
        );
        deps.did_write(own, &[i]);
    }
    // All-gather by recursive doubling.
    let mut d = 1;
    while d < p {
        let peer = rank_of(nr ^ d);
        let mine = nr & !(d - 1);
        let theirs = (nr ^ d) & !(d - 1);
        send(&mut s, &mut deps, peer, OUTPUT, mine..mine + d);
        recv(&mut s, &mut deps, peer, None, theirs..theirs + d);
        d *= 2;
    }
    // Unfold: the result to the even neighbour that folded into this rank.
    if rank < 2 * rem {
        send(&mut s, &mut deps, rank - 1, OUTPUT, all);
    }
    s
}

/// Rabenseifner all_reduce (never chosen automatically yet:
/// `OXCCL_ALGO=halving`).
pub struct Halving;

impl crate::Algorithm for Halving {
    fn name(&self) -> &'static str {
        "halving"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::AllReduce && s.direct.is_none()
    }
    fn preferred(&self, _: &crate::CollSpec, _: &crate::Tuning) -> bool {
        false
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        all_reduce(s.rank, s.nranks, s.count, s.chunk, s.avg, s.in_place)
    }
}
