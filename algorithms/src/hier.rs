//! Hierarchical collectives for several ranks per host: intra-host, then
//! across hosts by rail, then intra-host again. A *rail* is the ranks with
//! the same local index on every host; each rail crosses hosts with a
//! `1/per_host` share of the data, so every rank (and every NIC a rank
//! drives) works at once, and a message crosses hosts `O(hosts)` (or
//! `O(log hosts)`) times rather than the flat ring's `O(ranks)`.
//!
//! - all_reduce: a ring reduce-scatter inside each host leaves local rank
//!   `l` with its host's partial of segment `l`; rail `l` all-reduces that
//!   segment (recursive halving/doubling for small segments, a ring for
//!   large ones: [`RAIL_RING_BYTES_PER_HOST`]); a ring all-gather inside each host
//!   spreads the segments. Each element is reduced once per level in a
//!   fixed order, so every rank gets the same bits.
//! - all_gather: rail `l` all-gathers the blocks of its ranks (a ring across
//!   hosts), then a ring inside each host exchanges the rails' *columns*
//!   (column `l`: the blocks of rail `l`'s ranks).
//! - reduce_scatter: the reverse: a ring reduce-scatter of columns inside
//!   each host (local rank `l` ends with its host's partial of column `l`
//!   in scratch), then rail `l` reduce-scatters that column across hosts.
//!
//! The rank placement comes from [`CollSpec::layout`] (blocks or round
//! robin); without one the algorithm does not run. Phases follow each other
//! per rank: a phase's first steps wait for the last steps of the one
//! before ([`phase`]); inside a phase, chunks pipeline as in [`crate::ring`].

use crate::schedule::{
    chunks, seg_len, seg_off, sub_mod, Action, BufId, Schedule, Span, Step, INPUT, OUTPUT, SCRATCH,
};
use crate::spec::{CollSpec, Kind, Layout};

/// Rail segments of at least this many bytes per host are all-reduced by
/// a ring (pipelined, neighbour to neighbour); smaller ones by recursive
/// halving/doubling (`2 log2 hosts` rounds against the ring's
/// `2 (hosts - 1)`, the same bytes). The ring's extra rounds grow with the
/// host count, so the size it takes over at does too; on 4 emulated hosts
/// the two cross between 32 KiB and 512 KiB (docs/PERFORMANCE.md).
pub const RAIL_RING_BYTES_PER_HOST: usize = 32 << 10;

/// Where this rank sits: host `h` of `hosts`, local index `l` of `per`.
struct Place {
    n: usize,
    layout: Layout,
    hosts: usize,
    per: usize,
    h: usize,
    l: usize,
}

impl Place {
    fn of(spec: &CollSpec, layout: Layout) -> Place {
        let n = spec.nranks;
        let (h, l) = layout.place(spec.rank, n);
        Place {
            n,
            layout,
            hosts: layout.hosts(n),
            per: layout.per_host,
            h,
            l,
        }
    }
    /// The rank of local index `j` on this host.
    fn local(&self, j: usize) -> usize {
        self.layout.rank(self.h, j, self.n)
    }
    /// The rank of host `k` on this rail.
    fn rail(&self, k: usize) -> usize {
        self.layout.rank(k, self.l, self.n)
    }
    /// The ring of this host's ranks, by local index.
    fn host_ring(&self) -> RingOf {
        RingOf {
            pos: self.l,
            ranks: (0..self.per).map(|j| self.local(j)).collect(),
        }
    }
    /// The ring of this rail's ranks, by host.
    fn rail_ring(&self) -> RingOf {
        RingOf {
            pos: self.h,
            ranks: (0..self.hosts).map(|k| self.rail(k)).collect(),
        }
    }
    /// The blocks (of `count`) of rail `j`'s ranks, by host, merged where
    /// adjacent (round robin placement: one span).
    fn column(&self, buf: BufId, j: usize, count: usize) -> Vec<Span> {
        merge(
            (0..self.hosts)
                .map(|k| Span::new(buf, self.layout.rank(k, j, self.n) * count, count))
                .collect(),
        )
    }
}

/// Join spans that follow each other in the same buffer.
fn merge(spans: Vec<Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for sp in spans {
        match out.last_mut() {
            Some(last) if last.buf == sp.buf && last.off + last.len == sp.off => last.len += sp.len,
            _ => out.push(sp),
        }
    }
    out
}

/// The messages of a segment: each span cut into chunks.
fn pieces(spans: &[Span], chunk: usize) -> Vec<Span> {
    spans
        .iter()
        .flat_map(|sp| {
            chunks(sp.off, sp.len, chunk).map(move |(off, len)| Span::new(sp.buf, off, len))
        })
        .collect()
}

/// The same pieces laid out contiguously from `(buf, base)`.
fn packed(pieces: &[Span], (buf, base): (BufId, usize)) -> Vec<Span> {
    let mut off = base;
    pieces
        .iter()
        .map(|p| {
            let sp = Span::new(buf, off, p.len);
            off += p.len;
            sp
        })
        .collect()
}

/// Run `build` as a phase that starts after the steps `after`: its steps
/// that wait for nothing wait for those (every other step waits for them
/// through its dependencies). Returns the steps that end the phase (those
/// no later step of it waits for), or `after` when it added none.
fn phase(s: &mut Schedule, after: &[u32], build: impl FnOnce(&mut Schedule)) -> Vec<u32> {
    let start = s.steps.len();
    build(s);
    if s.steps.len() == start {
        return after.to_vec();
    }
    let mut waited = vec![false; s.steps.len() - start];
    for st in &mut s.steps[start..] {
        if st.deps.is_empty() {
            st.deps = after.to_vec();
        }
        for &d in &st.deps {
            if d as usize >= start {
                waited[d as usize - start] = true;
            }
        }
    }
    (start..s.steps.len())
        .filter(|&i| !waited[i - start])
        .map(|i| i as u32)
        .collect()
}

/// A ring of some ranks: this rank's position and the rank at each.
struct RingOf {
    pos: usize,
    ranks: Vec<usize>,
}

impl RingOf {
    /// (positions, the rank after this one, the rank before it)
    fn around(&self) -> (usize, usize, usize) {
        let n = self.ranks.len();
        (
            n,
            self.ranks[(self.pos + 1) % n],
            self.ranks[(self.pos + n - 1) % n],
        )
    }
}

/// A ring all-gather: segment `seg(k)` is complete on position `k` at the
/// start, on every position at the end.
fn ring_ag(s: &mut Schedule, ring: &RingOf, seg: &dyn Fn(usize) -> Vec<Span>, chunk: usize) {
    let ((n, next, prev), pos) = (ring.around(), ring.pos);
    let mut prev_recv: Vec<u32> = Vec::new();
    for step in 0..n.saturating_sub(1) {
        for (j, src) in pieces(&seg(sub_mod(pos, step, n)), chunk)
            .into_iter()
            .enumerate()
        {
            let deps: Vec<u32> = prev_recv.get(j).copied().into_iter().collect();
            s.push(Action::Send { peer: next, src }, &deps);
        }
        prev_recv = pieces(&seg(sub_mod(pos, step + 1, n)), chunk)
            .into_iter()
            .map(|dst| s.push(Action::Recv { peer: prev, dst }, &[]))
            .collect();
    }
}

/// A ring reduce-scatter over `n` positions: position `k` ends with the
/// reduction of every position's `input(k)` at `slot(k, n - 2)` (packed
/// from that `(buffer, offset)`); the partial received at step `t` lies
/// at `slot(segment, t)`. Slots that two steps reuse are ordered by the
/// memory they share.
fn ring_rs(
    s: &mut Schedule,
    ring: &RingOf,
    input: &dyn Fn(usize) -> Vec<Span>,
    slot: &dyn Fn(usize, usize) -> (BufId, usize),
    chunk: usize,
) {
    let ((n, next, prev), pos) = (ring.around(), ring.pos);
    // The last step's receives and sends: (step index, span written/read).
    let mut prev_recv: Vec<(u32, Span)> = Vec::new();
    let mut prev_send: Vec<(u32, Span)> = Vec::new();
    for step in 0..n.saturating_sub(1) {
        let (send_seg, recv_seg) = (sub_mod(pos, step + 1, n), sub_mod(pos, step + 2, n));
        let send_in = pieces(&input(send_seg), chunk);
        let src = if step == 0 {
            send_in
        } else {
            packed(&send_in, slot(send_seg, step - 1))
        };
        let sends: Vec<(u32, Span)> = src
            .into_iter()
            .enumerate()
            .map(|(j, src)| {
                let deps: Vec<u32> = prev_recv.get(j).map(|r| r.0).into_iter().collect();
                (s.push(Action::Send { peer: next, src }, &deps), src)
            })
            .collect();
        let with = pieces(&input(recv_seg), chunk);
        let dst = packed(&with, slot(recv_seg, step));
        let recvs = dst
            .into_iter()
            .zip(with)
            .map(|(dst, with)| {
                // A slot reused from step - 1 waits for the sends that read
                // what it held (the last sends go up one buffer in order).
                let first = prev_send.partition_point(|(_, r)| r.off + r.len <= dst.off);
                let deps: Vec<u32> = prev_send[first..]
                    .iter()
                    .take_while(|(_, r)| r.off < dst.off + dst.len)
                    .filter(|(_, r)| r.buf == dst.buf)
                    .map(|r| r.0)
                    .collect();
                let st = s.push(
                    Action::RecvReduce {
                        peer: prev,
                        dst,
                        with,
                    },
                    &deps,
                );
                (st, dst)
            })
            .collect();
        prev_send = sends;
        prev_recv = recvs;
    }
}

/// Copy `src` over `dst` in place of a message phase (one rank per host or
/// one host: a level with nothing to exchange).
fn copy(s: &mut Schedule, src: Span, dst: Span) {
    s.push(Action::Copy { src, dst }, &[]);
}

/// Divide `dst` (the end of an average).
fn divide(s: &mut Schedule, dst: Span, chunk: usize) {
    for (off, len) in chunks(dst.off, dst.len, chunk) {
        s.push(
            Action::Divide {
                dst: Span::new(dst.buf, off, len),
            },
            &[],
        );
    }
}

/// Append `sub` (a schedule built for a group of ranks) with its peers
/// mapped by `peer` and its buffers by `place` (buffer -> where its
/// element 0 lies here).
fn embed(
    s: &mut Schedule,
    sub: &Schedule,
    peer: &dyn Fn(usize) -> usize,
    place: &dyn Fn(BufId) -> (BufId, usize),
) {
    let base = s.steps.len() as u32;
    let at = |sp: Span| {
        let (buf, off) = place(sp.buf);
        Span::new(buf, off + sp.off, sp.len)
    };
    for st in &sub.steps {
        let action = match st.action {
            Action::Send { peer: p, src } => Action::Send {
                peer: peer(p),
                src: at(src),
            },
            Action::Recv { peer: p, dst } => Action::Recv {
                peer: peer(p),
                dst: at(dst),
            },
            Action::RecvReduce { peer: p, dst, with } => Action::RecvReduce {
                peer: peer(p),
                dst: at(dst),
                with: at(with),
            },
            Action::Copy { src, dst } => Action::Copy {
                src: at(src),
                dst: at(dst),
            },
            Action::Divide { dst } => Action::Divide { dst: at(dst) },
            Action::Reduce { dst, a, b } => Action::Reduce {
                dst: at(dst),
                a: at(a),
                b: at(b),
            },
            // Combine, ReduceFrom, CopyFrom and Sync name every rank of the
            // call (by rank order or by memory all of them map): the rail
            // schedules embedded here are message schedules without them.
            other => panic!("hier: a rail schedule has a step it cannot embed: {other:?}"),
        };
        s.steps.push(Step {
            action,
            deps: st.deps.iter().map(|d| d + base).collect(),
        });
    }
}

fn all_reduce(spec: &CollSpec, p: &Place) -> Schedule {
    let (count, chunk) = (spec.count, spec.chunk);
    let mut s = Schedule::default();
    let seg = |j: usize| Span::new(OUTPUT, seg_off(count, p.per, j), seg_len(count, p.per, j));
    let mine = seg(p.l);
    // 1. Inside the host: local rank l gets the host's partial of segment l.
    let done = phase(&mut s, &[], |s| {
        if p.per == 1 {
            copy(s, Span::new(INPUT, 0, count), mine);
        } else {
            let input = |j: usize| {
                vec![Span {
                    buf: INPUT,
                    ..seg(j)
                }]
            };
            let slot = |j: usize, _| (OUTPUT, seg(j).off);
            ring_rs(s, &p.host_ring(), &input, &slot, chunk);
        }
    });
    // 2. Across hosts, rail l all-reduces segment l in place.
    let done = phase(&mut s, &done, |s| {
        if p.hosts > 1 {
            let sub_spec = CollSpec {
                kind: Kind::AllReduce,
                rank: p.h,
                nranks: p.hosts,
                count: mine.len,
                in_place: true,
                avg: false,
                direct: None,
                layout: None,
                ..*spec
            };
            let sub = if mine.len * spec.elem_size < RAIL_RING_BYTES_PER_HOST * p.hosts {
                crate::Algorithm::build(&crate::halving::Halving, &sub_spec)
            } else {
                crate::ring::all_reduce(p.h, p.hosts, mine.len, chunk, false)
            };
            s.scratch = s.scratch.max(sub.scratch);
            embed(s, &sub, &|k| p.rail(k), &|b| {
                if b == SCRATCH {
                    (SCRATCH, 0)
                } else {
                    (OUTPUT, mine.off)
                }
            });
        }
    });
    let done = phase(&mut s, &done, |s| {
        if spec.avg {
            divide(s, mine, chunk);
        }
    });
    // 3. Inside the host: every segment to every local rank.
    phase(&mut s, &done, |s| {
        ring_ag(s, &p.host_ring(), &|j| vec![seg(j)], chunk);
    });
    s
}

fn all_gather(spec: &CollSpec, p: &Place) -> Schedule {
    let (count, chunk) = (spec.count, spec.chunk);
    let mut s = Schedule::default();
    // 1. Across hosts: rail l gathers its ranks' blocks.
    let done = phase(&mut s, &[], |s| {
        copy(
            s,
            Span::new(INPUT, 0, count),
            Span::new(OUTPUT, spec.rank * count, count),
        );
    });
    let done = phase(&mut s, &done, |s| {
        let block = |k: usize| vec![Span::new(OUTPUT, p.rail(k) * count, count)];
        ring_ag(s, &p.rail_ring(), &block, chunk);
    });
    // 2. Inside the host: the rails' columns.
    phase(&mut s, &done, |s| {
        ring_ag(s, &p.host_ring(), &|j| p.column(OUTPUT, j, count), chunk);
    });
    s
}

fn reduce_scatter(spec: &CollSpec, p: &Place) -> Schedule {
    let (count, chunk) = (spec.count, spec.chunk);
    let column = p.hosts * count;
    let mut s = Schedule::default();
    // Scratch: two slots for the partials of the host ring (more than two
    // local ranks), then the host's partial of this rank's column; the
    // rail ring's two slots reuse the first ones.
    let fin = if p.per > 2 { 2 * column } else { 2 * count };
    // 1. Inside the host: local rank l gets the host's partial of column l.
    let done = phase(&mut s, &[], |s| {
        if p.per > 1 {
            let input = |j: usize| p.column(INPUT, j, count);
            let slot = |_: usize, t: usize| {
                if t + 2 == p.per {
                    if p.hosts == 1 {
                        (OUTPUT, 0)
                    } else {
                        (SCRATCH, fin)
                    }
                } else {
                    (SCRATCH, (t % 2) * column)
                }
            };
            ring_rs(s, &p.host_ring(), &input, &slot, chunk);
        } else if p.hosts == 1 {
            copy(s, Span::new(INPUT, 0, count), Span::new(OUTPUT, 0, count));
        }
    });
    // 2. Across hosts: rail l reduce-scatters the column.
    let done = phase(&mut s, &done, |s| {
        if p.hosts > 1 {
            let input = |k: usize| {
                if p.per > 1 {
                    vec![Span::new(SCRATCH, fin + k * count, count)]
                } else {
                    vec![Span::new(INPUT, p.rail(k) * count, count)]
                }
            };
            let slot = |_: usize, t: usize| {
                if t + 2 == p.hosts {
                    (OUTPUT, 0)
                } else {
                    (SCRATCH, (t % 2) * count)
                }
            };
            ring_rs(s, &p.rail_ring(), &input, &slot, chunk);
        }
    });
    if spec.avg {
        phase(&mut s, &done, |s| {
            divide(s, Span::new(OUTPUT, 0, count), chunk)
        });
    }
    s.scratch = if p.per > 1 && p.hosts > 1 {
        fin + column
    } else if p.per > 2 {
        2 * column
    } else if p.hosts > 2 {
        2 * count
    } else {
        0
    };
    s
}

/// Hierarchical all_reduce, all_gather and reduce_scatter (see the module
/// documentation). Chosen automatically for all_reduce across hosts of
/// several ranks, by the tuner, or by `OXCCL_ALGO=hier`.
pub struct Hier;

impl crate::Algorithm for Hier {
    fn name(&self) -> &'static str {
        "hier"
    }
    fn supports(&self, s: &CollSpec) -> bool {
        matches!(
            s.kind,
            Kind::AllReduce | Kind::AllGather | Kind::ReduceScatter
        ) && s.direct.is_none()
            && s.layout
                .is_some_and(|l| l.per_host > 0 && s.nranks.is_multiple_of(l.per_host))
    }
    /// Taken automatically for all_reduce on several hosts of several
    /// ranks (after `oneshot`'s small sizes): on 4 emulated hosts of 2 it
    /// was as fast as the ring or up to 2x faster at every size from 32
    /// KiB to 16 MiB (docs/PERFORMANCE.md). all_gather and reduce_scatter
    /// keep the ring until measured.
    fn preferred(&self, s: &CollSpec, _: &crate::Tuning) -> bool {
        s.kind == Kind::AllReduce
            && s.layout
                .is_some_and(|l| l.per_host > 1 && l.hosts(s.nranks) > 1)
    }
    fn build(&self, spec: &CollSpec) -> Schedule {
        let layout = spec.layout.expect("hier runs only calls with a layout");
        if spec.nranks == 1 {
            return Schedule::copy_all(spec.count);
        }
        let p = Place::of(spec, layout);
        match spec.kind {
            Kind::AllReduce => all_reduce(spec, &p),
            Kind::AllGather => all_gather(spec, &p),
            _ => reduce_scatter(spec, &p),
        }
    }
}
