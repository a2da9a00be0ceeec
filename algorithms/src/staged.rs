//! Staging: the same algorithm for memory that links cannot touch.
//!
//! Links move host bytes. When a call's buffers live where a link cannot
//! read or write them (device memory; its scratch then lives on the device
//! too), every message goes through host staging slots ([`STAGE`], memory
//! the executor owns and the compute engine fills and drains):
//!
//! - `Send{src}` becomes `Copy{src -> slot}` then `Send{slot}`;
//! - `Recv{dst}` becomes `Recv{slot}` then `Copy{slot -> dst}`;
//! - `RecvReduce{dst, with}` becomes `Recv{slot}`, `Copy{slot -> land}` (a
//!   landing slot in scratch, beside the data the kernels reduce) and
//!   `Reduce{dst = land op with}`.
//!
//! Each (peer, direction) has [`SLOTS`] slots used round robin, so copies
//! and transfers of consecutive messages overlap (the pipeline NCCL runs
//! between its device FIFOs and the network). A slot's next writer depends
//! on its last reader, so no message overwrites one still being read; a
//! step that depended on an original message step now depends on the step
//! that finishes its job (the staged send, the copy out of the slot, the
//! reduction). Message order per peer is unchanged, so the result is the
//! original schedule's, expression for expression (the checker proves it
//! for every algorithm).

use crate::schedule::{Action, Schedule, Span, SCRATCH, STAGE};
use std::collections::HashMap;

/// Staging slots per (peer, direction).
pub const SLOTS: usize = 4;

/// One (peer, direction)'s slots: where they start, how long each is,
/// their readers so far, and how many messages used them.
struct Lane {
    base: usize,
    len: usize,
    last_reader: [Option<u32>; SLOTS],
    used: usize,
}

impl Lane {
    /// The next slot: its span for a message of `len` elements and the
    /// step its writer must wait for.
    fn next(&mut self, buf: u16, len: usize) -> (usize, Span, Option<u32>) {
        let k = self.used % SLOTS;
        self.used += 1;
        let span = Span::new(buf, self.base + k * self.len, len);
        (k, span, self.last_reader[k])
    }
}

/// `sched` with every message staged through host slots (see the module
/// documentation). Landing slots extend its scratch.
pub fn staged(sched: &Schedule) -> Schedule {
    // Longest message per (peer, is_send), and whether a peer's receives
    // reduce (they need landing slots).
    let mut longest: HashMap<(usize, bool), usize> = HashMap::new();
    let mut reduces: HashMap<usize, usize> = HashMap::new();
    for st in &sched.steps {
        let (peer, len) = match st.action {
            Action::Send { peer, src } => ((peer, true), src.len),
            Action::Recv { peer, dst } => ((peer, false), dst.len),
            Action::RecvReduce { peer, dst, .. } => {
                let l = reduces.entry(peer).or_default();
                *l = (*l).max(dst.len);
                ((peer, false), dst.len)
            }
            _ => continue,
        };
        let l = longest.entry(peer).or_default();
        *l = (*l).max(len);
    }
    // Lay the slots out in a fixed order (peer, direction), so every rank
    // of a call computes the same layout from the same schedule.
    let mut keys: Vec<_> = longest.keys().copied().collect();
    keys.sort_unstable();
    let mut out = Schedule {
        scratch: sched.scratch,
        shared: sched.shared,
        output_read: sched.output_read,
        ..Schedule::default()
    };
    let mut lanes = HashMap::new();
    for k in keys {
        let len = longest[&k];
        let lane = Lane {
            base: out.stage,
            len,
            last_reader: [None; SLOTS],
            used: 0,
        };
        out.stage += SLOTS * len;
        lanes.insert(k, lane);
    }
    let mut peers: Vec<_> = reduces.keys().copied().collect();
    peers.sort_unstable();
    let mut landing = HashMap::new();
    for p in peers {
        let len = reduces[&p];
        let lane = Lane {
            base: out.scratch,
            len,
            last_reader: [None; SLOTS],
            used: 0,
        };
        out.scratch += SLOTS * len;
        landing.insert(p, lane);
    }

    // Original step -> the staged step that finishes its job.
    let mut finish: Vec<u32> = Vec::with_capacity(sched.steps.len());
    let mut deps: Vec<u32> = Vec::new();
    for st in &sched.steps {
        deps.clear();
        deps.extend(st.deps.iter().map(|d| finish[*d as usize]));
        let done = match st.action {
            Action::Send { peer, src } => {
                let lane = lanes.get_mut(&(peer, true)).expect("laid out above");
                let (k, slot, busy) = lane.next(STAGE, src.len);
                deps.extend(busy);
                let fill = out.push(Action::Copy { src, dst: slot }, &deps);
                let send = out.push(Action::Send { peer, src: slot }, &[fill]);
                lane.last_reader[k] = Some(send);
                send
            }
            Action::Recv { peer, dst } => {
                let lane = lanes.get_mut(&(peer, false)).expect("laid out above");
                let (k, slot, busy) = lane.next(STAGE, dst.len);
                deps.extend(busy);
                let recv = out.push(Action::Recv { peer, dst: slot }, &deps);
                let drain = out.push(Action::Copy { src: slot, dst }, &[recv]);
                lane.last_reader[k] = Some(drain);
                drain
            }
            Action::RecvReduce { peer, dst, with } => {
                let lane = lanes.get_mut(&(peer, false)).expect("laid out above");
                let (k, slot, busy) = lane.next(STAGE, dst.len);
                deps.extend(busy);
                let recv = out.push(Action::Recv { peer, dst: slot }, &deps);
                let land = landing.get_mut(&peer).expect("laid out above");
                let (j, landed, land_busy) = land.next(SCRATCH, dst.len);
                let mut d = vec![recv];
                d.extend(land_busy);
                let drain = out.push(
                    Action::Copy {
                        src: slot,
                        dst: landed,
                    },
                    &d,
                );
                lane.last_reader[k] = Some(drain);
                // The reduction also keeps the original dependencies (they
                // guard `with` and `dst`).
                deps.push(drain);
                let reduce = out.push(
                    Action::Reduce {
                        dst,
                        a: landed,
                        b: with,
                    },
                    &deps,
                );
                land.last_reader[j] = Some(reduce);
                reduce
            }
            other => out.push(other, &deps),
        };
        finish.push(done);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{cases, check_schedules};
    use crate::spec::Kind;
    use crate::{Algorithm, REGISTRY};

    /// Every message-based algorithm, staged, still computes exactly what
    /// it did, for every kind it runs and many rank counts.
    #[test]
    fn staged_schedules_pass_the_checker() {
        let mut checked = 0;
        for kind in Kind::COLLECTIVES {
            for n in (1..=6).chain([9]) {
                for alg in REGISTRY {
                    for spec in cases(*alg, kind, n) {
                        if spec.direct.is_some() {
                            continue;
                        }
                        let scheds: Vec<Schedule> = (0..n)
                            .map(|r| staged(&alg.build(&crate::CollSpec { rank: r, ..spec })))
                            .collect();
                        check_schedules(&spec, &scheds)
                            .unwrap_or_else(|e| panic!("{} staged, {spec:?}: {e}", alg.name()));
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100, "only {checked} cases");
    }

    /// Every message goes through a slot, and a slot is written again only
    /// after its last reader completed.
    #[test]
    fn a_slot_is_rewritten_only_after_its_reader() {
        let spec = crate::CollSpec {
            kind: Kind::AllReduce,
            rank: 1,
            nranks: 3,
            count: 3 * 40,
            root: 0,
            avg: false,
            in_place: false,
            chunk: 4,
            elem_size: 4,
            direct: None,
            layout: None,
            shared: 0,
            plain_reads: false,
        };
        let plain = crate::ring::Ring.build(&spec);
        let s = staged(&plain);
        // Slots: all of STAGE, and the landing slots after the original scratch.
        let slot = |sp: Span| sp.buf == STAGE || (sp.buf == SCRATCH && sp.off >= plain.scratch);
        let mut last_reader: HashMap<(u16, usize), u32> = HashMap::new();
        let depends = |from: u32, on: u32| {
            let mut todo = vec![from];
            let mut seen = vec![false; s.steps.len()];
            while let Some(i) = todo.pop() {
                if i == on {
                    return true;
                }
                if !std::mem::replace(&mut seen[i as usize], true) {
                    todo.extend(&s.steps[i as usize].deps);
                }
            }
            false
        };
        let mut reused = 0;
        for (i, st) in s.steps.iter().enumerate() {
            let i = i as u32;
            let (read, written) = match st.action {
                Action::Send { src, .. } => (Some(src), None),
                Action::Recv { dst, .. } => (None, Some(dst)),
                Action::RecvReduce { .. } => panic!("a receive-reduce was not staged"),
                Action::Copy { src, dst } => (Some(src), Some(dst)),
                Action::Reduce { dst, a, b } => {
                    assert!(!slot(b), "step {i}: `with` is a slot");
                    (Some(a), Some(dst))
                }
                _ => (None, None),
            };
            if let Some(w) = written.filter(|w| slot(*w)) {
                if let Some(r) = last_reader.get(&(w.buf, w.off)) {
                    assert!(
                        depends(i, *r),
                        "step {i} rewrites slot {w:?} before step {r} read it"
                    );
                    reused += 1;
                }
            }
            if let Some(r) = read.filter(|r| slot(*r)) {
                last_reader.insert((r.buf, r.off), i);
            }
            if let Action::Send { src, .. } | Action::Recv { dst: src, .. } = st.action {
                assert_eq!(src.buf, STAGE, "step {i} moves non-staged memory");
            }
        }
        assert!(reused > 0, "no slot was reused: the test checks nothing");
    }
}
