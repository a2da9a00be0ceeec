//! The symbolic checker: runs every rank's schedule of one call together,
//! without I/O. Each element holds an expression (`(r0i3+r1i3)`) instead of
//! a number, so a check can see that every contribution arrives exactly
//! once, that a reduction is complete, and that all ranks end with the *same
//! expression* (hence bitwise-identical floats).
//!
//! Memory is modelled as the runtime lays it out: out of place, input and
//! output are separate memories and the input is read-only (a write to it
//! is an error); in place they are one memory (all_gather's input is the
//! output's segment `rank`, reduce_scatter's output the input's segment
//! `rank`), so a step that overwrites data a pending send or a peer still
//! needs changes what arrives. Direct-access steps read peers' memory as it
//! is at that moment. Each step carries a vector clock of what it causally
//! follows (its dependencies, the messages it received, the `Sync`s before
//! it), so a peer's read of a location and its owner's write of it must be
//! ordered one way or the other: otherwise it is reported as a race, however
//! the ranks synchronise (phase flags, or barriers of messages).
//!
//! Every call is run in plain order and again with one rank's sends (and
//! direct reads) delayed as long as possible; all runs must end alike, so
//! a missing dependency shows up as a difference.

use crate::algorithm::Algorithm;
use crate::schedule::{Action, BufId, Schedule, Span, INPUT, OUTPUT, SCRATCH, SHARED, STAGE};
use crate::spec::{Access, CollSpec, Kind, Layout};
use std::collections::{HashMap, HashSet};

/// A symbolic element: `None` is "never written".
pub type Val = Option<String>;

/// Memory ids of [`Setup`]: input, output, scratch; point-to-point buffers
/// use their buffer id plus [`MEM_P2P`].
pub const MEM_IN: u32 = 0;
pub const MEM_OUT: u32 = 1;
pub const MEM_SCRATCH: u32 = 2;
pub const MEM_P2P: u32 = 3;
/// The host staging memory of staged schedules.
pub const MEM_STAGE: u32 = u32::MAX - 1;
/// The shared memory of copy-in schedules (peers read it).
pub const MEM_SHARED: u32 = u32::MAX - 2;

/// One rank's memories and where each buffer id lies in them.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub mems: HashMap<u32, Vec<Val>>,
    /// Buffer id -> (memory, offset of the buffer's element 0).
    pub layout: HashMap<BufId, (u32, usize)>,
    /// Memories no step may write (the input of an out-of-place call).
    pub read_only: HashSet<u32>,
}

/// The element `i` of rank `r`'s input: `r{r}i{i}`.
pub fn leaf(r: usize, i: usize) -> String {
    format!("r{r}i{i}")
}

fn leaves_of(r: usize, len: usize) -> Vec<Val> {
    (0..len).map(|i| Some(leaf(r, i))).collect()
}

impl Setup {
    /// Rank `spec.rank`'s memory for a collective, in or out of place.
    pub fn for_spec(spec: &CollSpec, sched: &Schedule) -> Setup {
        let r = spec.rank;
        let (ilen, olen) = (spec.input_len(), spec.output_len());
        let mut s = Setup::default();
        s.mems.insert(MEM_SCRATCH, vec![None; sched.scratch]);
        s.layout.insert(SCRATCH, (MEM_SCRATCH, 0));
        s.mems.insert(MEM_STAGE, vec![None; sched.stage]);
        s.layout.insert(STAGE, (MEM_STAGE, 0));
        s.mems.insert(MEM_SHARED, vec![None; sched.shared]);
        s.layout.insert(SHARED, (MEM_SHARED, 0));
        if !spec.in_place {
            s.mems.insert(MEM_IN, leaves_of(r, ilen));
            s.mems.insert(MEM_OUT, vec![None; olen]);
            s.layout.insert(INPUT, (MEM_IN, 0));
            s.layout.insert(OUTPUT, (MEM_OUT, 0));
            s.read_only.insert(MEM_IN);
            return s;
        }
        match spec.in_place_offset() {
            Ok(off) => {
                let mut m = vec![None; olen];
                if spec.kind == Kind::AllGather {
                    m[off..off + ilen].clone_from_slice(&leaves_of(r, ilen));
                } else {
                    m = leaves_of(r, olen);
                }
                s.mems.insert(MEM_OUT, m);
                s.layout.insert(INPUT, (MEM_OUT, off));
                s.layout.insert(OUTPUT, (MEM_OUT, 0));
            }
            Err(off) => {
                s.mems.insert(MEM_IN, leaves_of(r, ilen));
                s.layout.insert(INPUT, (MEM_IN, 0));
                s.layout.insert(OUTPUT, (MEM_IN, off));
            }
        }
        s
    }

    fn loc(&self, sp: Span) -> Result<(u32, usize), String> {
        let (m, base) = *self
            .layout
            .get(&sp.buf)
            .ok_or_else(|| format!("buffer {} does not exist", sp.buf))?;
        let len = self.mems[&m].len();
        if base + sp.off + sp.len > len {
            return Err(format!("span {sp:?} exceeds its buffer ({len} elements)"));
        }
        Ok((m, base + sp.off))
    }

    fn read(&self, sp: Span) -> Result<Vec<Val>, String> {
        let (m, at) = self.loc(sp)?;
        Ok(self.mems[&m][at..at + sp.len].to_vec())
    }

    /// A buffer's elements as the caller sees them.
    pub fn view(&self, buf: BufId, len: usize) -> Vec<Val> {
        self.read(Span::new(buf, 0, len)).unwrap_or_default()
    }
}

/// One rank's state after a run.
pub struct RankRun {
    pub mem: Setup,
    done: Vec<bool>,
    /// When each step completed, on one clock for all ranks (an order in
    /// which the whole call could have run).
    finished: Vec<u64>,
    /// The ranks whose entry into the call this rank's steps causally
    /// follow (itself, what its receives carried, everyone after a `Sync`).
    pub heard: Vec<bool>,
}

/// A vector clock: per rank, the last of its events a step follows.
type Clock = Vec<u64>;

/// A message in flight: its payload, what its sender had heard when
/// sending it, and the send's clock.
type Message = (Vec<Val>, Vec<bool>, Clock);

fn join(into: &mut Clock, other: &Clock) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = (*a).max(*b);
    }
}

/// Direct-access traffic per location, for race detection.
#[derive(Default)]
struct Races {
    /// (owner, memory, index) -> (writer, its event) of the last write
    /// there: the owner's, or a peer's (`CopyTo`).
    written: HashMap<(usize, u32, usize), (usize, u64)>,
    /// (owner, memory, index) -> (reader, its event) of reads since: the
    /// peers', and the owner's own when peers may write its memory.
    read: HashMap<(usize, u32, usize), Vec<(usize, u64)>>,
    /// Whether any schedule writes a peer's memory (then the owner's own
    /// reads are recorded too).
    pushes: bool,
}

/// Run all schedules once; `victim`'s sends and direct reads wait until
/// nothing else can run (`usize::MAX`: plain order).
pub fn simulate(
    scheds: &[Schedule],
    setups: &[Setup],
    victim: usize,
) -> Result<Vec<RankRun>, String> {
    let n = scheds.len();
    let mut ranks: Vec<RankRun> = setups
        .iter()
        .zip(scheds)
        .enumerate()
        .map(|(r, (s, sc))| RankRun {
            mem: s.clone(),
            done: vec![false; sc.steps.len()],
            finished: vec![0; sc.steps.len()],
            heard: (0..n).map(|k| k == r).collect(),
        })
        .collect();
    // Message numbering per directed pair, in schedule order.
    let msg_index: Vec<Vec<usize>> = scheds
        .iter()
        .map(|sc| {
            let mut c: HashMap<(bool, usize), usize> = HashMap::new();
            sc.steps
                .iter()
                .map(|st| match st.action.message_peer() {
                    Some((peer, is_send)) => {
                        let e = c.entry((is_send, peer)).or_insert(0);
                        *e += 1;
                        *e - 1
                    }
                    None => 0,
                })
                .collect()
        })
        .collect();
    // Sync k of each rank, and the last Sync before each step (a fence).
    let sync_no: Vec<Vec<usize>> = scheds
        .iter()
        .map(|sc| {
            let mut k = 0;
            sc.steps
                .iter()
                .map(|st| {
                    let me = k;
                    k += usize::from(st.action == Action::Sync);
                    me
                })
                .collect()
        })
        .collect();
    // The last Sync before each step (it follows that Sync's completion).
    let sync_before: Vec<Vec<Option<usize>>> = scheds
        .iter()
        .map(|sc| {
            let mut last = None;
            sc.steps
                .iter()
                .enumerate()
                .map(|(i, st)| {
                    let me = last;
                    if st.action == Action::Sync {
                        last = Some(i);
                    }
                    me
                })
                .collect()
        })
        .collect();
    let mut arrived = vec![0usize; n];
    let mut epoch = vec![0usize; n];
    let mut races = Races {
        pushes: scheds.iter().any(|s| {
            s.steps.iter().any(|st| {
                matches!(
                    st.action,
                    Action::CopyTo { .. } | Action::ReduceToAll { .. }
                )
            })
        }),
        ..Races::default()
    };
    // What each rank's caller wrote before the call: a peer that touches
    // a rank's memory without following its entry (event 1) races with it
    // (the caller may still be filling its input, or reading the output of
    // its previous call).
    for (r, run) in ranks.iter().enumerate() {
        for (m, v) in &run.mem.mems {
            for j in 0..v.len() {
                races.written.insert((r, *m, j), (r, 1));
            }
        }
    }
    // Events: each rank's entry into the call is its event 1.
    let mut events = vec![1u64; n];
    let entry: Vec<Clock> = (0..n)
        .map(|r| (0..n).map(|k| u64::from(k == r)).collect())
        .collect();
    let mut clocks: Vec<Vec<Option<Clock>>> =
        scheds.iter().map(|sc| vec![None; sc.steps.len()]).collect();
    // (rank, Sync number) -> the rank's clock when it arrived there.
    let mut sync_arrival: HashMap<(usize, usize), Clock> = HashMap::new();
    let mut msgs: HashMap<(usize, usize, usize), Message> = HashMap::new();
    let mut allow_victim = false;
    let mut tick = 0u64;
    loop {
        let mut progressed = false;
        for r in 0..n {
            for i in 0..scheds[r].steps.len() {
                let st = &scheds[r].steps[i];
                if ranks[r].done[i] || !st.deps.iter().all(|d| ranks[r].done[*d as usize]) {
                    continue;
                }
                // A Sync is a fence: nothing passes it either way.
                let fence_ok = if st.action == Action::Sync {
                    ranks[r].done[..i].iter().all(|d| *d)
                } else {
                    sync_no[r][i] == epoch[r]
                };
                if !fence_ok {
                    continue;
                }
                let delayed = matches!(
                    st.action,
                    Action::Send { .. }
                        | Action::ReduceFrom { .. }
                        | Action::ReduceToAll { .. }
                        | Action::CopyFrom { .. }
                        | Action::CopyTo { .. }
                );
                if r == victim && delayed {
                    if !allow_victim {
                        continue;
                    }
                    allow_victim = false;
                }
                let ctx = |m: &str| format!("rank {r} step {i} ({:?}): {m}", st.action);
                // What this step follows; its own event is the rank's next.
                let mut now = entry[r].clone();
                for d in &st.deps {
                    join(&mut now, clocks[r][*d as usize].as_ref().unwrap());
                }
                if let Some(s) = sync_before[r][i] {
                    join(&mut now, clocks[r][s].as_ref().unwrap());
                }
                now[r] = events[r] + 1;
                let ok = match st.action {
                    Action::Send { peer, src } => {
                        let v = remote_read(&ranks, r, r, src, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        if v.iter().any(|x| x.is_none()) {
                            return Err(ctx("sends undefined data"));
                        }
                        let heard = ranks[r].heard.clone();
                        msgs.insert((r, peer, msg_index[r][i]), (v, heard, now.clone()));
                        true
                    }
                    Action::Recv { peer, dst } => match msgs.remove(&(peer, r, msg_index[r][i])) {
                        Some((v, heard, sent)) => {
                            learn(&mut ranks[r].heard, &heard);
                            join(&mut now, &sent);
                            if v.len() != dst.len {
                                return Err(ctx(&format!("message of {} elements", v.len())));
                            }
                            write(&mut ranks[r].mem, dst, v, (r, r), &now, &mut races)
                                .map_err(|e| ctx(&e))?;
                            true
                        }
                        None => false,
                    },
                    Action::RecvReduce { peer, dst, with } => {
                        match msgs.remove(&(peer, r, msg_index[r][i])) {
                            Some((v, heard, sent)) => {
                                learn(&mut ranks[r].heard, &heard);
                                join(&mut now, &sent);
                                if v.len() != dst.len {
                                    return Err(ctx(&format!("message of {} elements", v.len())));
                                }
                                let w = remote_read(&ranks, r, r, with, &now, &mut races)
                                    .map_err(|e| ctx(&e))?;
                                let out = combine(&[v, w]).map_err(|e| ctx(&e))?;
                                write(&mut ranks[r].mem, dst, out, (r, r), &now, &mut races)
                                    .map_err(|e| ctx(&e))?;
                                true
                            }
                            None => false,
                        }
                    }
                    Action::Copy { src, dst } => {
                        let v = remote_read(&ranks, r, r, src, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        write(&mut ranks[r].mem, dst, v, (r, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::Combine {
                        dst,
                        input,
                        slots,
                        me,
                    } => {
                        let mut srcs = Vec::new();
                        for k in 0..n {
                            let sp = if k == me {
                                input
                            } else {
                                Span::new(slots.buf, slots.off + k * dst.len, dst.len)
                            };
                            srcs.push(
                                remote_read(&ranks, r, r, sp, &now, &mut races)
                                    .map_err(|e| ctx(&e))?,
                            );
                        }
                        let out = combine(&srcs).map_err(|e| ctx(&e))?;
                        write(&mut ranks[r].mem, dst, out, (r, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::Reduce { dst, a, b } => {
                        let va =
                            remote_read(&ranks, r, r, a, &now, &mut races).map_err(|e| ctx(&e))?;
                        let vb =
                            remote_read(&ranks, r, r, b, &now, &mut races).map_err(|e| ctx(&e))?;
                        if va.len() != dst.len || vb.len() != dst.len {
                            return Err(ctx("operands differ in length"));
                        }
                        let out = combine(&[va, vb]).map_err(|e| ctx(&e))?;
                        write(&mut ranks[r].mem, dst, out, (r, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::Divide { dst } => {
                        let v = remote_read(&ranks, r, r, dst, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        let out = v
                            .into_iter()
                            .map(|x| match x {
                                Some(e) => Ok(Some(format!("avg{e}"))),
                                None => Err(ctx("divides undefined data")),
                            })
                            .collect::<Result<Vec<Val>, String>>()?;
                        write(&mut ranks[r].mem, dst, out, (r, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::ReduceToAll { dst, src, own } => {
                        if dst.len != src.len {
                            return Err(ctx("its spans differ in length"));
                        }
                        let out = reduce_from(&ranks, r, src, own, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        // Addressed with this rank's layout, in every rank's memory.
                        let (m, at) = ranks[r].mem.loc(dst).map_err(|e| ctx(&e))?;
                        for (k, run) in ranks.iter_mut().enumerate() {
                            write_at(&mut run.mem, m, at, out.clone(), (k, r), &now, &mut races)
                                .map_err(|e| ctx(&e))?;
                        }
                        true
                    }
                    Action::ReduceFrom {
                        dst,
                        src,
                        own,
                        also,
                    } => {
                        let out = reduce_from(&ranks, r, src, own, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        if let Some(a) = also {
                            write(&mut ranks[r].mem, a, out.clone(), (r, r), &now, &mut races)
                                .map_err(|e| ctx(&e))?;
                        }
                        write(&mut ranks[r].mem, dst, out, (r, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::CopyTo { peer, src, dst } => {
                        if peer >= n {
                            return Err(ctx("no such peer"));
                        }
                        let v = remote_read(&ranks, r, r, src, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        // Addressed with this rank's layout, in the peer's memory.
                        let (m, at) = ranks[r].mem.loc(dst).map_err(|e| ctx(&e))?;
                        write_at(&mut ranks[peer].mem, m, at, v, (peer, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::CopyFrom { peer, src, dst } => {
                        if peer >= n {
                            return Err(ctx("no such peer"));
                        }
                        let v = remote_read(&ranks, r, peer, src, &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        write(&mut ranks[r].mem, dst, v, (r, r), &now, &mut races)
                            .map_err(|e| ctx(&e))?;
                        true
                    }
                    Action::Sync => {
                        let k = sync_no[r][i];
                        arrived[r] = arrived[r].max(k + 1);
                        sync_arrival.entry((r, k)).or_insert_with(|| {
                            // Every earlier step is done (the fence).
                            let mut c = entry[r].clone();
                            for cl in clocks[r][..i].iter().flatten() {
                                join(&mut c, cl);
                            }
                            c
                        });
                        if arrived.iter().all(|a| *a > k) {
                            for q in 0..n {
                                join(&mut now, &sync_arrival[&(q, k)]);
                            }
                            epoch[r] += 1;
                            ranks[r].heard.iter_mut().for_each(|h| *h = true);
                            true
                        } else {
                            false
                        }
                    }
                };
                if ok {
                    events[r] = now[r];
                    clocks[r][i] = Some(now);
                    ranks[r].done[i] = true;
                    tick += 1;
                    ranks[r].finished[i] = tick;
                    progressed = true;
                }
            }
        }
        if !progressed {
            if allow_victim || victim >= n {
                break;
            }
            allow_victim = true;
        }
    }
    for (r, rk) in ranks.iter().enumerate() {
        if let Some(i) = rk.done.iter().position(|d| !d) {
            return Err(format!(
                "rank {r} is stuck at step {i} ({:?}): the schedules deadlock",
                scheds[r].steps[i].action
            ));
        }
    }
    if !msgs.is_empty() {
        return Err(format!(
            "messages never received (from, to, index): {:?}",
            msgs.keys().collect::<Vec<_>>()
        ));
    }
    // A rank leaves the call when its last step completes; its next call
    // may then overwrite its memory, so every peer's read of it, and write
    // into it, must come before (ordered by a `Sync` or a message), not
    // merely within the call.
    let exit: Vec<Clock> = (0..n)
        .map(|r| {
            let mut c = entry[r].clone();
            for cl in clocks[r].iter().flatten() {
                join(&mut c, cl);
            }
            c
        })
        .collect();
    for ((owner, m, j), (w, e)) in &races.written {
        if w != owner && exit[*owner][*w] < *e {
            return Err(format!(
                "rank {owner} can leave the call while rank {w} may still write element {j} of its memory {m}"
            ));
        }
    }
    for ((owner, m, j), reads) in &races.read {
        if let Some((q, _)) = reads
            .iter()
            .find(|(q, e)| q != owner && exit[*owner][*q] < *e)
        {
            return Err(format!(
                "rank {owner} can leave the call while rank {q} may still read element {j} of its memory {m} (its next call may overwrite it)"
            ));
        }
    }
    Ok(ranks)
}

fn learn(mine: &mut [bool], theirs: &[bool]) {
    for (m, t) in mine.iter_mut().zip(theirs) {
        *m |= *t;
    }
}

/// `(a+b+..)` element-wise; every operand must be defined.
fn combine(srcs: &[Vec<Val>]) -> Result<Vec<Val>, String> {
    let len = srcs.first().map_or(0, |s| s.len());
    (0..len)
        .map(|i| {
            let parts = srcs
                .iter()
                .map(|s| s[i].clone().ok_or("reduces undefined data"))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(format!("({})", parts.join("+"))))
        })
        .collect()
}

/// `writer` stores `v` at `dst` of `owner`'s memory `mem`: `(owner,
/// writer)` (the same rank, or a peer writing directly).
fn write(
    mem: &mut Setup,
    dst: Span,
    v: Vec<Val>,
    who: (usize, usize),
    now: &Clock,
    races: &mut Races,
) -> Result<(), String> {
    let (m, at) = mem.loc(dst)?;
    if v.len() != dst.len {
        return Err(format!("writes {} elements into {dst:?}", v.len()));
    }
    write_at(mem, m, at, v, who, now, races)
}

fn write_at(
    mem: &mut Setup,
    m: u32,
    at: usize,
    v: Vec<Val>,
    (owner, writer): (usize, usize),
    now: &Clock,
    races: &mut Races,
) -> Result<(), String> {
    if mem.read_only.contains(&m) {
        return Err(format!(
            "writes the input of an out-of-place call (memory {m} at {at})"
        ));
    }
    let len = v.len();
    let theirs = mem
        .mems
        .get_mut(&m)
        .ok_or_else(|| format!("rank {owner} has no memory {m}"))?;
    if at + len > theirs.len() {
        return Err(format!("writes past rank {owner}'s memory {m}"));
    }
    for j in at..at + len {
        let key = (owner, m, j);
        if let Some(reads) = races.read.remove(&key) {
            if let Some((q, _)) = reads.iter().find(|(q, e)| *q != writer && now[*q] < *e) {
                return Err(format!(
                    "writes element {j} of rank {owner}'s memory {m} while rank {q} may still read it (a race)"
                ));
            }
        }
        if let Some((w, e)) = races.written.get(&key) {
            if *w != writer && now[*w] < *e {
                return Err(format!(
                    "writes element {j} of rank {owner}'s memory {m} unordered with rank {w}'s write there (a race)"
                ));
            }
        }
        races.written.insert(key, (writer, now[writer]));
    }
    theirs[at..at + len].clone_from_slice(&v);
    Ok(())
}

/// Rank `me`'s direct reduction: `src` of every peer and `own` of its
/// own, combined in rank order.
fn reduce_from(
    ranks: &[RankRun],
    me: usize,
    src: Span,
    own: Span,
    now: &Clock,
    races: &mut Races,
) -> Result<Vec<Val>, String> {
    if own.len != src.len {
        return Err("its own part differs in length".into());
    }
    let srcs = (0..ranks.len())
        .map(|k| remote_read(ranks, me, k, if k == me { own } else { src }, now, races))
        .collect::<Result<Vec<_>, String>>()?;
    combine(&srcs)
}

/// Rank `me` reads `src` of rank `owner` (addressed with `me`'s layout, as
/// the runtime does: registered buffers have one shape on every rank).
fn remote_read(
    ranks: &[RankRun],
    me: usize,
    owner: usize,
    src: Span,
    now: &Clock,
    races: &mut Races,
) -> Result<Vec<Val>, String> {
    let (m, at) = ranks[me].mem.loc(src)?;
    let theirs = ranks[owner]
        .mem
        .mems
        .get(&m)
        .ok_or_else(|| format!("rank {owner} has no memory {m}"))?;
    if at + src.len > theirs.len() {
        return Err(format!("reads past rank {owner}'s buffer ({src:?})"));
    }
    for j in at..at + src.len {
        let key = (owner, m, j);
        if let Some((w, e)) = races.written.get(&key) {
            if *w != me && now[*w] < *e {
                return Err(format!(
                    "reads element {j} of rank {owner}'s memory {m} without following rank {w}'s write there (a race)"
                ));
            }
        }
        if owner != me || races.pushes {
            races.read.entry(key).or_default().push((me, now[me]));
        }
    }
    let v = theirs[at..at + src.len].to_vec();
    if v.iter().any(|x| x.is_none()) {
        return Err(format!("reads undefined data of rank {owner} ({src:?})"));
    }
    Ok(v)
}

/// Every rank must have heard (causally) from every other by the end:
/// what a barrier means.
fn check_heard(runs: &[RankRun], what: &str) -> Result<(), String> {
    for (r, run) in runs.iter().enumerate() {
        if let Some(k) = run.heard.iter().position(|h| !h) {
            return Err(format!(
                "rank {r} can leave the {what} before rank {k} entered it"
            ));
        }
    }
    Ok(())
}

/// Run in plain order and with a few slow ranks; all runs must agree.
/// With `barrier`, every run must also leave every rank having heard from
/// every other.
pub fn simulate_all(scheds: &[Schedule], setups: &[Setup]) -> Result<Vec<RankRun>, String> {
    simulate_runs(scheds, setups, false)
}

fn simulate_runs(
    scheds: &[Schedule],
    setups: &[Setup],
    barrier: bool,
) -> Result<Vec<RankRun>, String> {
    let n = scheds.len();
    let base = simulate(scheds, setups, usize::MAX)?;
    // Every rank as the slow one (a barrier's flaw may show for one only).
    let mut victims: Vec<usize> = if barrier {
        (0..n).collect()
    } else {
        vec![0, n / 2, n.saturating_sub(1)]
    };
    victims.dedup();
    for v in victims {
        let other = simulate(scheds, setups, v)?;
        if barrier {
            check_heard(&other, "barrier").map_err(|e| format!("{e} (rank {v} slow)"))?;
        }
        for (r, (a, b)) in base.iter().zip(&other).enumerate() {
            for (m, mem) in &a.mem.mems {
                if *m != MEM_SCRATCH && mem != &b.mem.mems[m] {
                    return Err(format!(
                        "rank {r} memory {m} differs when rank {v} runs late (a missing dependency)"
                    ));
                }
            }
        }
    }
    Ok(base)
}

/// Sorted leaves of an expression: the contributions it combines.
pub fn leaves(e: &str) -> Vec<String> {
    let mut v: Vec<String> = e
        .split(['(', ')', '+'])
        .map(|s| s.trim_start_matches("avg").to_string())
        .filter(|s| !s.is_empty())
        .collect();
    v.sort();
    v
}

/// Check `alg` on the call `spec` describes (its `rank` is ignored: every
/// rank's schedule is built): it completes, agrees under slow ranks, and
/// leaves every rank with what the collective defines.
pub fn check_algorithm(alg: &dyn Algorithm, spec: &CollSpec) -> Result<(), String> {
    let specs: Vec<CollSpec> = (0..spec.nranks)
        .map(|rank| CollSpec { rank, ..*spec })
        .collect();
    let scheds: Vec<Schedule> = specs.iter().map(|s| alg.build(s)).collect();
    check_schedules(spec, &scheds).map_err(|e| format!("{} on {spec:?}: {e}", alg.name()))
}

/// What a rank may touch of its peers' memory: anything with direct access
/// (registered buffers); without it, only their shared memory, and their
/// plain input and output to read where `plain_reads` allows (the kernel
/// copies from them: no reduction from them, nothing written into them).
fn reach(spec: &CollSpec, scheds: &[Schedule]) -> Result<(), String> {
    if spec.direct.is_some() {
        return Ok(());
    }
    let readable = |b: BufId| b == SHARED || (spec.plain_reads && (b == INPUT || b == OUTPUT));
    for (r, sched) in scheds.iter().enumerate() {
        for (i, st) in sched.steps.iter().enumerate() {
            let ok = match st.action {
                Action::CopyFrom { src, .. } => readable(src.buf),
                Action::ReduceFrom { src, .. } => src.buf == SHARED,
                Action::ReduceToAll { dst, .. } | Action::CopyTo { dst, .. } => dst.buf == SHARED,
                _ => true,
            };
            if !ok {
                return Err(format!(
                    "rank {r} step {i} ({:?}) reaches a peer's memory it cannot reach (direct access: none, plain reads: {})",
                    st.action, spec.plain_reads
                ));
            }
        }
    }
    Ok(())
}

/// Every rank whose output its peers read during the call says so
/// ([`Schedule::output_read`]: its copies into it then stay cached), and
/// no other rank does.
fn outputs_read(scheds: &[Schedule]) -> Result<(), String> {
    let n = scheds.len();
    let mut read = vec![false; n];
    for (r, sched) in scheds.iter().enumerate() {
        for st in &sched.steps {
            match st.action {
                Action::CopyFrom { peer, src, .. } if src.buf == OUTPUT => read[peer] = true,
                Action::ReduceFrom { src, .. } | Action::ReduceToAll { src, .. }
                    if src.buf == OUTPUT =>
                {
                    (0..n).filter(|k| *k != r).for_each(|k| read[k] = true)
                }
                _ => {}
            }
        }
    }
    for (r, sched) in scheds.iter().enumerate() {
        if sched.output_read != read[r] {
            return Err(format!(
                "rank {r}'s schedule says its peers {} its output during the call, but they {}",
                if sched.output_read {
                    "read"
                } else {
                    "do not read"
                },
                if read[r] { "do" } else { "do not" },
            ));
        }
    }
    Ok(())
}

/// Check the schedules of every rank for the call `spec` describes.
pub fn check_schedules(spec: &CollSpec, scheds: &[Schedule]) -> Result<(), String> {
    let n = spec.nranks;
    let setups: Vec<Setup> = (0..n)
        .map(|rank| Setup::for_spec(&CollSpec { rank, ..*spec }, &scheds[rank]))
        .collect();
    reach(spec, scheds)?;
    outputs_read(scheds)?;
    let runs = simulate_runs(scheds, &setups, spec.kind == Kind::Barrier)?;
    order::check(scheds, &setups, &runs)?;
    let count = spec.count;
    let olen = spec.output_len();
    let out = |r: usize| runs[r].mem.view(OUTPUT, olen);
    let want_sum = |e: &Val, idx: &dyn Fn(usize) -> usize, what: &str| -> Result<(), String> {
        let e = e.as_ref().ok_or(format!("{what}: never written"))?;
        let mut want: Vec<String> = (0..n).map(|k| leaf(k, idx(k))).collect();
        want.sort();
        if leaves(e) != want {
            return Err(format!(
                "{what}: {e} does not combine {want:?} exactly once"
            ));
        }
        if e.starts_with("avg") != (spec.avg && n > 1) {
            return Err(format!("{what}: {e} (average: {})", spec.avg));
        }
        Ok(())
    };
    match spec.kind {
        Kind::AllReduce => {
            for i in 0..count {
                let e0 = &out(0)[i];
                want_sum(e0, &|_| i, &format!("element {i}"))?;
                for r in 1..n {
                    if &out(r)[i] != e0 {
                        return Err(format!(
                            "element {i}: rank {r} has {:?}, rank 0 {e0:?} (not bitwise identical)",
                            out(r)[i]
                        ));
                    }
                }
            }
        }
        Kind::ReduceScatter => {
            for (r, run) in runs.iter().enumerate() {
                let o = out(r);
                for (i, e) in o.iter().enumerate() {
                    want_sum(e, &|_| r * count + i, &format!("rank {r} element {i}"))?;
                }
                if spec.in_place {
                    // The rest of the buffer is left as it was.
                    let all = run.mem.view(INPUT, n * count);
                    for (j, v) in all.iter().enumerate() {
                        if j / count.max(1) != r && v.as_deref() != Some(leaf(r, j).as_str()) {
                            return Err(format!(
                                "rank {r} element {j} outside its segment changed"
                            ));
                        }
                    }
                }
            }
        }
        Kind::AllGather => {
            for r in 0..n {
                let o = out(r);
                for p in 0..n {
                    for i in 0..count {
                        if o[p * count + i] != Some(leaf(p, i)) {
                            return Err(format!(
                                "rank {r} element {}: {:?}",
                                p * count + i,
                                o[p * count + i]
                            ));
                        }
                    }
                }
            }
        }
        Kind::Broadcast => {
            for r in 0..n {
                if out(r) != leaves_of(spec.root, count) {
                    return Err(format!(
                        "rank {r} did not get the root's data: {:?}",
                        out(r)
                    ));
                }
            }
        }
        Kind::Reduce => {
            let o = out(spec.root);
            for (i, e) in o.iter().enumerate() {
                want_sum(e, &|_| i, &format!("root element {i}"))?;
            }
            for r in (0..n).filter(|r| *r != spec.root) {
                let untouched = if spec.in_place {
                    leaves_of(r, count)
                } else {
                    vec![None; count]
                };
                if out(r) != untouched {
                    return Err(format!("rank {r} (not the root) had its output changed"));
                }
            }
        }
        Kind::AllToAll => {
            for r in 0..n {
                let o = out(r);
                for p in 0..n {
                    for i in 0..count {
                        if o[p * count + i] != Some(leaf(p, r * count + i)) {
                            return Err(format!(
                                "rank {r} element {}: {:?}",
                                p * count + i,
                                o[p * count + i]
                            ));
                        }
                    }
                }
            }
        }
        Kind::Barrier => check_heard(&runs, "barrier")?,
        Kind::P2p => {}
    }
    Ok(())
}

/// No layout, and every even spread of `n` ranks over hosts, in blocks
/// and round robin.
pub fn layouts(n: usize) -> Vec<Option<Layout>> {
    let mut v = vec![None];
    for per_host in (1..=n).filter(|p| n.is_multiple_of(*p)) {
        for cyclic in [false, true] {
            // One host or one rank per host: both placements are the same.
            if !cyclic || (per_host > 1 && per_host < n) {
                v.push(Some(Layout { per_host, cyclic }));
            }
        }
    }
    v
}

/// Every spec the registry tests cover for `kind` on `n` ranks: counts
/// around the rank count, tiny and odd chunks, both reductions, in and out
/// of place, three roots, with and without direct access, every layout,
/// shared memory of none, one-element and four-element pieces, plain
/// buffers peers can read or not.
pub fn specs(kind: Kind, n: usize) -> Vec<CollSpec> {
    let counts: &[usize] = match kind {
        Kind::Barrier => &[0],
        _ => &[0, 1, 7, 23],
    };
    let mut v = Vec::new();
    let mut roots = vec![0, n / 2, n - 1];
    roots.dedup();
    for &count in counts.iter().chain([n.saturating_sub(1), n + 1].iter()) {
        for chunk in [1, 3, 1000] {
            for avg in [false, true] {
                for in_place in [false, true] {
                    for &root in &roots {
                        for direct in [None, Some(Access::Mapped), Some(Access::OneSided)] {
                            // Shared memory and reads of plain buffers only
                            // matter without direct access.
                            let (shared, plain): (&[usize], &[bool]) = match direct {
                                None => (&[0, 3, 8], &[false, true]),
                                Some(_) => (&[0], &[false]),
                            };
                            for (layout, &shared, &plain_reads) in
                                layouts(n).into_iter().flat_map(|l| {
                                    shared
                                        .iter()
                                        .flat_map(move |s| plain.iter().map(move |p| (l, s, p)))
                                })
                            {
                                v.push(CollSpec {
                                    kind,
                                    rank: 0,
                                    nranks: n,
                                    count,
                                    root,
                                    avg,
                                    in_place,
                                    chunk,
                                    elem_size: 4,
                                    direct,
                                    layout,
                                    shared,
                                    plain_reads,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    v.sort_by_key(|s| format!("{s:?}"));
    v.dedup();
    v
}

/// The specs worth checking for `alg`: fields it ignores are normalised
/// away so each distinct schedule is checked once.
pub fn cases(alg: &dyn Algorithm, kind: Kind, n: usize) -> Vec<CollSpec> {
    let mut v: Vec<CollSpec> = specs(kind, n)
        .into_iter()
        .map(|mut s| {
            if !matches!(kind, Kind::Broadcast | Kind::Reduce) {
                s.root = 0;
            }
            if !matches!(kind, Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce) {
                s.avg = false;
            }
            if s.direct.is_some() && alg.supports(&CollSpec { direct: None, ..s }) {
                s.direct = None;
            }
            if s.layout.is_some() && alg.supports(&CollSpec { layout: None, ..s }) {
                s.layout = None;
            }
            if s.shared > 0 && alg.supports(&CollSpec { shared: 0, ..s }) {
                s.shared = 0;
            }
            if s.plain_reads
                && alg.supports(&CollSpec {
                    plain_reads: false,
                    ..s
                })
            {
                s.plain_reads = false;
            }
            s
        })
        .filter(|s| alg.supports(s))
        .collect();
    v.sort_by_key(|s| format!("{s:?}"));
    v.dedup();
    v
}

mod order;
#[cfg(test)]
mod tests;
