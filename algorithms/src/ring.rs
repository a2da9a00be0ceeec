//! Ring algorithms: reduce-scatter, all-gather, and all-reduce as the two
//! back to back. Each rank sends to `rank+1` and receives from `rank-1`;
//! segments are cut into chunks so step `s+1` of a chunk starts as soon as
//! step `s` of that chunk arrived (pipelining).
//!
//! In the reduce-scatter phase rank `r` sends segment `r-s-1` at step `s`
//! and receives segment `r-s-2`; after `n-1` steps it holds the complete
//! reduction of segment `r`, computed once, in a fixed order, so every rank
//! later receives the same bits.

use crate::schedule::{
    chunks, seg_len, seg_off, sub_mod, Action, Schedule, Span, INPUT, OUTPUT, SCRATCH,
};

/// Reduce-scatter phase over `nseg = n` segments of `count` elements in
/// `src_buf`. `place(seg, is_last_step)` says where the partial of a
/// received segment goes: `(buf, base offset)`; `base + (chunk off - seg
/// off)` is used. Returns, per chunk of the final segment (segment `rank`),
/// the index of the step that completed it.
#[allow(clippy::too_many_arguments)]
fn rs_phase(
    s: &mut Schedule,
    rank: usize,
    n: usize,
    count: usize,
    chunk: usize,
    partials_in_scratch: bool,
    final_dst: Span,
) -> Vec<u32> {
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let seg_max = count.div_ceil(n);
    let mut prev_recv: Vec<u32> = Vec::new(); // steps of the last receive, per chunk
    let mut prev_send: Vec<u32> = Vec::new(); // steps of the last send, per chunk
    for step in 0..n - 1 {
        let send_seg = sub_mod(rank, step + 1, n);
        let recv_seg = sub_mod(rank, step + 2, n);
        // Where this step's partials live: the output's segment itself, or
        // one of two scratch slots alternating by step.
        let where_partial = |seg: usize, st: usize| -> Span {
            if st == n - 2 {
                final_dst
            } else if partials_in_scratch {
                Span::new(SCRATCH, (st % 2) * seg_max, seg_len(count, n, seg))
            } else {
                Span::new(OUTPUT, seg_off(count, n, seg), seg_len(count, n, seg))
            }
        };
        // Send: the input's segment at step 0, then the partial received at step-1.
        let src = if step == 0 {
            Span::new(
                INPUT,
                seg_off(count, n, send_seg),
                seg_len(count, n, send_seg),
            )
        } else {
            where_partial(send_seg, step - 1)
        };
        let mut sends = Vec::new();
        for (j, (off, len)) in chunks(0, src.len, chunk).enumerate() {
            let deps: Vec<u32> = prev_recv.get(j).copied().into_iter().collect();
            sends.push(s.push(
                Action::Send {
                    peer: next,
                    src: Span::new(src.buf, src.off + off, len),
                },
                &deps,
            ));
        }
        let dst = where_partial(recv_seg, step);
        let with_off = seg_off(count, n, recv_seg);
        let mut recvs = Vec::new();
        for (j, (off, len)) in chunks(0, dst.len, chunk).enumerate() {
            // Slot `step % 2` was last read by the previous step's send (it
            // forwarded the partial received two steps back): wait for it.
            let mut deps = Vec::new();
            if partials_in_scratch && step != n - 2 {
                deps.extend(prev_send.get(j).copied());
            }
            recvs.push(s.push(
                Action::RecvReduce {
                    peer: prev,
                    dst: Span::new(dst.buf, dst.off + off, len),
                    with: Span::new(INPUT, with_off + off, len),
                },
                &deps,
            ));
        }
        prev_send = sends;
        prev_recv = recvs;
    }
    prev_recv
}

/// All-gather phase: segment `rank` of `OUTPUT` is complete once the steps
/// in `ready` (per chunk) are done; after `n-1` steps every segment is.
/// `rank` is a position on the ring; `rank_at` maps positions to ranks
/// (the identity, or a ring that starts elsewhere, as a broadcast's root).
pub(crate) fn ag_phase(
    s: &mut Schedule,
    rank: usize,
    n: usize,
    count: usize,
    chunk: usize,
    ready: &[u32],
    rank_at: &dyn Fn(usize) -> usize,
) {
    let next = rank_at((rank + 1) % n);
    let prev = rank_at((rank + n - 1) % n);
    let mut prev_recv: Vec<u32> = ready.to_vec();
    for step in 0..n - 1 {
        let send_seg = sub_mod(rank, step, n);
        let recv_seg = sub_mod(rank, step + 1, n);
        let (so, sl) = (seg_off(count, n, send_seg), seg_len(count, n, send_seg));
        for (j, (off, len)) in chunks(so, sl, chunk).enumerate() {
            let deps: Vec<u32> = prev_recv.get(j).copied().into_iter().collect();
            s.push(
                Action::Send {
                    peer: next,
                    src: Span::new(OUTPUT, off, len),
                },
                &deps,
            );
        }
        let (ro, rl) = (seg_off(count, n, recv_seg), seg_len(count, n, recv_seg));
        prev_recv = chunks(ro, rl, chunk)
            .map(|(off, len)| {
                s.push(
                    Action::Recv {
                        peer: prev,
                        dst: Span::new(OUTPUT, off, len),
                    },
                    &[],
                )
            })
            .collect();
    }
}

/// Ring all-reduce of `count` elements: `INPUT` -> `OUTPUT` (both `count`).
pub fn all_reduce(rank: usize, n: usize, count: usize, chunk: usize, avg: bool) -> Schedule {
    let mut s = Schedule::default();
    if n == 1 {
        return Schedule::copy_all(count);
    }
    let mine = Span::new(OUTPUT, seg_off(count, n, rank), seg_len(count, n, rank));
    let mut done = rs_phase(&mut s, rank, n, count, chunk, false, mine);
    if avg {
        done = chunks(mine.off, mine.len, chunk)
            .zip(done)
            .map(|((off, len), d)| {
                s.push(
                    Action::Divide {
                        dst: Span::new(OUTPUT, off, len),
                    },
                    &[d],
                )
            })
            .collect();
    }
    ag_phase(&mut s, rank, n, count, chunk, &done, &|p| p);
    s
}

/// Ring reduce-scatter: `INPUT` holds `n * count`, `OUTPUT` gets the
/// reduction of segment `rank` (`count` elements). Partials travel through
/// scratch, so no part of the caller's buffers but the result is written.
pub fn reduce_scatter(rank: usize, n: usize, count: usize, chunk: usize, avg: bool) -> Schedule {
    let mut s = Schedule::default();
    let total = n * count;
    if n == 1 {
        return Schedule::copy_all(count);
    }
    s.scratch = if n > 2 { 2 * count } else { 0 };
    let done = rs_phase(
        &mut s,
        rank,
        n,
        total,
        chunk,
        true,
        Span::new(OUTPUT, 0, count),
    );
    if avg {
        for ((off, len), d) in chunks(0, count, chunk).zip(done) {
            s.push(
                Action::Divide {
                    dst: Span::new(OUTPUT, off, len),
                },
                &[d],
            );
        }
    }
    s
}

/// Ring all-gather: `INPUT` holds `count`, `OUTPUT` gets `n * count` with
/// rank `k`'s contribution at `k * count`.
pub fn all_gather(rank: usize, n: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::default();
    let own = Span::new(OUTPUT, rank * count, count);
    let copy = s.push(
        Action::Copy {
            src: Span::new(INPUT, 0, count),
            dst: own,
        },
        &[],
    );
    if n > 1 {
        let ready: Vec<u32> = chunks(0, count, chunk).map(|_| copy).collect();
        ag_phase(&mut s, rank, n, n * count, chunk, &ready, &|p| p);
    }
    s
}

/// The ring: reduce-scatter, all-gather and all-reduce (bandwidth-optimal,
/// latency linear in the rank count).
pub struct Ring;

impl crate::Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        use crate::Kind::*;
        matches!(s.kind, AllReduce | AllGather | ReduceScatter)
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        let (r, n, c, ch) = (s.rank, s.nranks, s.count, s.chunk);
        match s.kind {
            crate::Kind::AllReduce => all_reduce(r, n, c, ch, s.avg),
            crate::Kind::AllGather => all_gather(r, n, c, ch),
            _ => reduce_scatter(r, n, c, ch, s.avg),
        }
    }
}
