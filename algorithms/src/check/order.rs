//! Local ordering: two steps of one rank that touch the same element, one
//! of them writing, must be ordered — the later one must happen after the
//! earlier one. The simulation alone cannot see a missing order between
//! steps of one rank: it runs each rank's ready steps eagerly in schedule
//! order, while the executor may start a ready step before an earlier one
//! (an engine completes work asynchronously; a receive lands whenever its
//! message arrives). So a receive that overwrites a staging slot still
//! being copied out, or a copy that overwrites a block a pending copy
//! still reads, is found here, per rank, with input and output aliased as
//! the call lays them out.
//!
//! "Happens after" is what the executor guarantees, across ranks: a step
//! after its `deps`; a `Sync` after every earlier step of its rank, and
//! after every step that preceded the matching `Sync` on every rank; a
//! local step (not a message) after the last `Sync` before it; a receive's
//! writes after the matching send started (so after the send's
//! dependencies) and its completion after the send's. Messages on one
//! channel are not assumed ordered (they are spread over a link's
//! streams). The graph is walked in the order a simulation completed the
//! steps, which every edge respects.

use super::{RankRun, Setup};
use crate::schedule::{Action, Schedule, Span};
use std::collections::HashMap;

/// Every step's ancestors over all ranks, as bitsets.
struct Ancestors {
    /// Global id of (rank, step): `base[rank] + step`.
    base: Vec<usize>,
    words: usize,
    bits: Vec<u64>,
}

impl Ancestors {
    fn of(scheds: &[Schedule], runs: &[RankRun]) -> Result<Ancestors, String> {
        let n = scheds.len();
        let mut base = Vec::with_capacity(n);
        let mut total = 0;
        for s in scheds {
            base.push(total);
            total += s.steps.len();
        }
        let words = total.div_ceil(64).max(1);
        let mut bits = vec![0u64; total * words];
        // Messages: (from, to, index on that pair) -> the send's step.
        let mut sends = HashMap::new();
        // Per rank, per message step, its index on its (direction, peer).
        let mut msg_no: Vec<Vec<usize>> = Vec::with_capacity(n);
        // Per rank, the step of its k-th Sync, and the last Sync before
        // each step.
        let mut syncs: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut fence: Vec<Vec<Option<usize>>> = Vec::with_capacity(n);
        for (r, s) in scheds.iter().enumerate() {
            let mut c: HashMap<(bool, usize), usize> = HashMap::new();
            let mut nos = Vec::with_capacity(s.steps.len());
            let (mut ks, mut fs, mut last) = (Vec::new(), Vec::new(), None);
            for (i, st) in s.steps.iter().enumerate() {
                let no = match st.action.message_peer() {
                    Some((peer, is_send)) => {
                        let e = c.entry((is_send, peer)).or_insert(0);
                        *e += 1;
                        if is_send {
                            sends.insert((r, peer, *e - 1), i);
                        }
                        *e - 1
                    }
                    None => 0,
                };
                nos.push(no);
                fs.push(last);
                if st.action == Action::Sync {
                    ks.push(i);
                    last = Some(i);
                }
            }
            msg_no.push(nos);
            syncs.push(ks);
            fence.push(fs);
        }
        // Every step in the order the simulation completed it.
        let mut order: Vec<(u64, usize, usize)> = runs
            .iter()
            .enumerate()
            .flat_map(|(r, run)| {
                run.finished
                    .iter()
                    .enumerate()
                    .map(move |(i, t)| (*t, r, i))
            })
            .collect();
        order.sort_unstable();
        let mut a = Ancestors {
            base,
            words,
            bits: Vec::new(),
        };
        for (_, r, i) in order {
            let me = a.base[r] + i;
            let mut preds: Vec<usize> = Vec::new();
            let st = &scheds[r].steps[i];
            preds.extend(st.deps.iter().map(|d| a.base[r] + *d as usize));
            match st.action {
                Action::Sync => {
                    // After every step before the k-th Sync on every rank.
                    let k = syncs[r].iter().position(|s| *s == i).unwrap();
                    for (q, ks) in syncs.iter().enumerate() {
                        if let Some(&sq) = ks.get(k) {
                            preds.extend((0..sq).map(|j| a.base[q] + j));
                        }
                    }
                }
                _ if st.action.message_peer().is_none() => {
                    preds.extend(fence[r][i].map(|s| a.base[r] + s));
                }
                Action::Recv { peer, .. } | Action::RecvReduce { peer, .. } => {
                    let s = sends.get(&(peer, r, msg_no[r][i])).ok_or_else(|| {
                        format!("rank {r} step {i} receives a message rank {peer} never sends")
                    })?;
                    preds.push(a.base[peer] + s);
                }
                _ => {}
            }
            for p in preds {
                if p == me {
                    continue;
                }
                let (lo, hi) = if p < me {
                    let (lo, hi) = bits.split_at_mut(me * words);
                    (&lo[p * words..(p + 1) * words], &mut hi[..words])
                } else {
                    let (lo, hi) = bits.split_at_mut(p * words);
                    (&hi[..words], &mut lo[me * words..(me + 1) * words])
                };
                for (m, x) in hi.iter_mut().zip(lo) {
                    *m |= *x;
                }
                hi[p / 64] |= 1 << (p % 64);
            }
        }
        a.bits = bits;
        Ok(a)
    }

    /// Whether step `x` of rank `r` happens before step `y` of rank `r`.
    fn before(&self, r: usize, x: usize, y: usize) -> bool {
        let (x, y) = (self.base[r] + x, self.base[r] + y);
        self.bits[y * self.words + x / 64] & (1 << (x % 64)) != 0
    }
}

/// What a step reads and writes on its own rank.
fn accesses(action: &Action, nranks: usize) -> (Vec<Span>, Vec<Span>) {
    match *action {
        Action::Send { src, .. } => (vec![src], vec![]),
        Action::Recv { dst, .. } => (vec![], vec![dst]),
        Action::RecvReduce { dst, with, .. } => (vec![with], vec![dst]),
        Action::Copy { src, dst } => (vec![src], vec![dst]),
        Action::Divide { dst } => (vec![dst], vec![dst]),
        Action::Reduce { dst, a, b } => (vec![a, b], vec![dst]),
        Action::Combine {
            dst,
            input,
            slots,
            me,
        } => {
            let mut r = vec![input];
            r.extend(
                (0..nranks)
                    .filter(|k| *k != me)
                    .map(|k| Span::new(slots.buf, slots.off + k * dst.len, dst.len)),
            );
            (r, vec![dst])
        }
        // Peers' memory is the race check's business; the own part of a
        // direct read is read here.
        Action::ReduceFrom { dst, own, also, .. } => {
            (vec![own], [Some(dst), also].into_iter().flatten().collect())
        }
        Action::ReduceToAll { dst, own, .. } => (vec![own], vec![dst]),
        Action::CopyFrom { dst, .. } => (vec![], vec![dst]),
        Action::CopyTo { src, .. } => (vec![src], vec![]),
        Action::Sync => (vec![], vec![]),
    }
}

/// Check every rank's schedule (see the module docs); `runs` is a
/// simulation of the call that completed.
pub(super) fn check(scheds: &[Schedule], setups: &[Setup], runs: &[RankRun]) -> Result<(), String> {
    let anc = Ancestors::of(scheds, runs)?;
    let n = scheds.len();
    for (r, (sched, setup)) in scheds.iter().zip(setups).enumerate() {
        // Per element: the last writer and the readers since.
        let mut last: HashMap<(u32, usize), (Option<usize>, Vec<usize>)> = HashMap::new();
        let say = |i: usize, j: usize, what: &str, m: u32, e: usize| {
            format!(
                "rank {r}: step {j} ({:?}) {what} element {e} of memory {m} that step {i} ({:?}) uses, without happening after it",
                sched.steps[j].action, sched.steps[i].action
            )
        };
        let unordered = |x: usize, y: usize| x != y && !anc.before(r, x, y);
        for (j, st) in sched.steps.iter().enumerate() {
            // A copy onto itself (in place, aliased) touches nothing: the
            // executor skips it.
            if let Action::Copy { src, dst } = st.action {
                if setup.loc(src)? == setup.loc(dst)? {
                    continue;
                }
            }
            let (reads, writes) = accesses(&st.action, n);
            for sp in reads {
                let (m, at) = setup.loc(sp)?;
                for e in at..at + sp.len {
                    let slot = last.entry((m, e)).or_default();
                    if let Some(w) = slot.0.filter(|w| unordered(*w, j)) {
                        return Err(say(w, j, "reads", m, e));
                    }
                    slot.1.push(j);
                }
            }
            for sp in writes {
                let (m, at) = setup.loc(sp)?;
                for e in at..at + sp.len {
                    let slot = last.entry((m, e)).or_default();
                    if let Some(w) = slot.0.filter(|w| unordered(*w, j)) {
                        return Err(say(w, j, "overwrites", m, e));
                    }
                    if let Some(x) = slot.1.iter().find(|x| unordered(**x, j)) {
                        return Err(say(*x, j, "overwrites", m, e));
                    }
                    *slot = (Some(j), Vec::new());
                }
            }
        }
    }
    Ok(())
}
