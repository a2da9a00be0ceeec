//! The event simulation: every simulated rank's real schedule, run in
//! simulated time over the [`Model`]'s resources.
//!
//! The rules are the executor's (`comm-core/src/exec`): a step starts once
//! its dependencies are done; the messages between two ranks are matched in
//! the order both schedules list them, and each rank sends to (receives
//! from) one peer in that order; one thread does a rank's CPU work, so its
//! steps run one at a time, lowest index first among those that can start;
//! a `Sync` waits for every rank's matching `Sync` and holds no CPU.
//! Messages stream, as over TCP and the shared-memory rings: the first
//! bytes reach the receiver a latency after the sender starts copying, the
//! last a latency after it ends (and after both NICs passed them, between
//! hosts), and a receive ends with its own copy or with the last byte,
//! whichever is later. What is not modelled: finite ring and socket buffers (a send never waits for
//! its receiver; schedules chunk large messages, which bounds what this
//! hides), several streams per link, spinning and wake-up costs, and
//! one-sided (RDMA) direct reads — direct steps are modelled as loads from
//! memory mapped on one host.
//!
//! Periodic mode (see [`Ranks::Periodic`]) simulates only ranks
//! `0..period` (one host): a message to or from any other rank stands for
//! the same message shifted by a multiple of `period`, which is exact when
//! every rank's schedule is the shift of its representative's (checked by
//! [`crate::symmetry`]) and every host is alike.

use crate::model::Model;
use crate::symmetry::Shift;
use crate::topology::Topology;
use algorithms::{Action, Schedule};
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};

/// Which ranks are simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks {
    /// Every rank.
    All,
    /// Ranks `0..period`, each standing for every rank it is carried onto
    /// by `shift` with a multiple of `period` (`period` divides the rank
    /// count; the ranks of one host, so per-host resources are host 0's).
    Periodic(usize, Shift),
}

/// What one simulated call gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Seconds from the call's start on every rank to its end on the last.
    pub time: f64,
    /// Steps simulated (all simulated ranks).
    pub steps: usize,
}

/// A time in seconds that orders totally (the heap needs `Ord`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct At(f64);
impl Eq for At {}
impl PartialOrd for At {
    fn partial_cmp(&self, o: &At) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for At {
    fn cmp(&self, o: &At) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// A message: (sender, receiver, its index between them), with the
/// sender a simulated rank (in periodic mode, see `canon`).
type Key = (u32, u32, u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A step of a simulated rank completed.
    Done { rank: u32, step: u32 },
    /// A message arrived where its receiver can take it.
    Arrive { key: Key },
    /// A sleeping rank woke up (`Model::wake` after a message arrived).
    Wake { rank: u32 },
}

struct Rank {
    id: usize,
    sched: Schedule,
    /// Dependencies not yet done, per step.
    missing: Vec<u32>,
    /// Steps depending on step `i`: `dependents[first[i]..first[i + 1]]`.
    first: Vec<u32>,
    dependents: Vec<u32>,
    /// Per message step: its index among the messages to (from) its peer.
    msg: Vec<u32>,
    /// Per peer, the steps sending to it (receiving from it), in order.
    sends_to: HashMap<u32, Vec<u32>>,
    recvs_from: HashMap<u32, Vec<u32>>,
    started: Vec<bool>,
    /// Steps that can start now: dependencies done, first in their
    /// peer's order, their message arrived (kept up to date on every
    /// change, so picking one never scans blocked steps).
    startable: BTreeSet<u32>,
    next_send: HashMap<u32, u32>,
    next_recv: HashMap<u32, u32>,
    /// Running a CPU step (holding a core).
    running: bool,
    /// Waiting in its pool's queue for a core.
    queued: bool,
    /// Ran out of startable steps: waits for a message, asleep.
    asleep: bool,
    /// Woken by a message, not running until its `Wake` event.
    waking: bool,
    left: usize,
    end: f64,
    syncs: u32,
}

/// A set of cores and the ranks waiting for one.
/// The ranks that reached one `Sync`: how many, the latest arrival, and
/// their (rank, step) to complete when the last arrives.
#[derive(Default)]
struct Barrier {
    arrived: usize,
    latest: f64,
    waiting: Vec<(u32, u32)>,
}

struct Pool {
    free: usize,
    waiting: VecDeque<u32>,
}

struct Nic {
    egress_free: f64,
    ingress_free: f64,
}

struct Sim<'a> {
    m: &'a Model,
    topo: &'a Topology,
    elem: f64,
    period: Option<(usize, Shift)>,
    ranks: Vec<Rank>,
    pools: Vec<Pool>,
    nics: Vec<Nic>,
    heap: BinaryHeap<Reverse<(At, u64, Ev)>>,
    seq: u64,
    /// Messages whose first bytes reached their receiver, with when the
    /// last byte will (a receive cannot end before it).
    arrived: HashMap<Key, f64>,
    /// Messages under way: when their last byte arrives.
    last_byte: HashMap<Key, f64>,
    /// Per `Sync` index, the ranks that reached it.
    barrier: HashMap<u32, Barrier>,
    /// More ranks than cores share a pool: waiting ranks sleep.
    oversubscribed: bool,
}

/// Simulate one call. `scheds[i]` is the schedule of rank `i` (all ranks,
/// or `0..period`); `elem` the element size in bytes.
pub fn simulate(
    m: &Model,
    topo: &Topology,
    elem: usize,
    scheds: Vec<Schedule>,
    ranks: Ranks,
) -> Result<Outcome, String> {
    let n = topo.nranks();
    let period = match ranks {
        Ranks::All => {
            if scheds.len() != n {
                return Err(format!("{} schedules for {n} ranks", scheds.len()));
            }
            None
        }
        Ranks::Periodic(p, how) => {
            if p == 0
                || !n.is_multiple_of(p)
                || p != topo.per_host
                || scheds.len() != p
                || !topo.is_blocks()
            {
                return Err(format!(
                    "periodic simulation needs equal hosts in blocks of {} ranks dividing {n}, got period {p} and {} schedules",
                    topo.per_host,
                    scheds.len()
                ));
            }
            if m.cores > 0 && m.shared_cores && topo.hosts > 1 {
                return Err("periodic simulation cannot model cores shared across hosts".into());
            }
            Some((p, how))
        }
    };
    let npools = if m.shared_cores { 1 } else { topo.hosts };
    let cores = if m.cores == 0 { usize::MAX } else { m.cores };
    let mut sim = Sim {
        m,
        topo,
        elem: elem as f64,
        period,
        ranks: scheds
            .into_iter()
            .enumerate()
            .map(|(i, s)| Rank::new(i, s))
            .collect::<Result<_, _>>()?,
        pools: (0..npools)
            .map(|_| Pool {
                free: cores,
                waiting: VecDeque::new(),
            })
            .collect(),
        nics: (0..topo.hosts)
            .map(|_| Nic {
                egress_free: 0.0,
                ingress_free: 0.0,
            })
            .collect(),
        heap: BinaryHeap::new(),
        seq: 0,
        arrived: HashMap::new(),
        last_byte: HashMap::new(),
        barrier: HashMap::new(),
        // (Per host: the fullest host's ranks against its cores.)
        oversubscribed: m.cores > 0
            && if m.shared_cores {
                topo.nranks() > m.cores
            } else {
                topo.per_host > m.cores
            },
    };
    for r in 0..sim.ranks.len() {
        for s in 0..sim.ranks[r].sched.steps.len() {
            if sim.ranks[r].missing[s] == 0 {
                sim.refresh(r, s as u32);
            }
        }
        sim.try_start(r, 0.0);
    }
    while let Some(Reverse((At(t), _, ev))) = sim.heap.pop() {
        match ev {
            Ev::Done { rank, step } => sim.done(rank as usize, step, t),
            Ev::Arrive { key } => {
                let last = sim.last_byte.remove(&key).unwrap_or(t);
                sim.arrived.insert(key, last);
                let to = sim.wake_of(key);
                let from = sim.sender_of(key) as u32;
                let step = sim.ranks[to]
                    .recvs_from
                    .get(&from)
                    .and_then(|l| l.get(key.2 as usize))
                    .copied();
                if let Some(s) = step {
                    sim.refresh(to, s);
                }
                if sim.ranks[to].asleep && sim.oversubscribed && sim.m.wake > 0.0 {
                    sim.ranks[to].asleep = false;
                    sim.ranks[to].waking = true;
                    sim.at(t + sim.m.wake, Ev::Wake { rank: to as u32 });
                } else {
                    sim.try_start(to, t);
                }
            }
            Ev::Wake { rank } => {
                sim.ranks[rank as usize].waking = false;
                sim.try_start(rank as usize, t);
            }
        }
    }
    let steps = sim.ranks.iter().map(|r| r.sched.steps.len()).sum();
    if let Some(r) = sim.ranks.iter().find(|r| r.left > 0) {
        let stuck = r.started.iter().position(|s| !s);
        return Err(format!(
            "rank {} never finished: {} of its {} steps left{}",
            r.id,
            r.left,
            r.sched.steps.len(),
            stuck
                .map(|s| format!(", e.g. step {s} ({:?})", r.sched.steps[s].action))
                .unwrap_or_default()
        ));
    }
    let time = sim.ranks.iter().map(|r| r.end).fold(0.0, f64::max);
    Ok(Outcome { time, steps })
}

impl Rank {
    fn new(id: usize, sched: Schedule) -> Result<Rank, String> {
        let n = sched.steps.len();
        let mut count = vec![0u32; n + 1];
        let mut missing = vec![0u32; n];
        for (i, st) in sched.steps.iter().enumerate() {
            for &d in &st.deps {
                if d as usize >= i {
                    return Err(format!("rank {id}: step {i} depends on later step {d}"));
                }
                count[d as usize + 1] += 1;
                missing[i] += 1;
            }
        }
        for i in 0..n {
            count[i + 1] += count[i];
        }
        let first = count.clone();
        let mut dependents = vec![0u32; first[n] as usize];
        for (i, st) in sched.steps.iter().enumerate() {
            for &d in &st.deps {
                dependents[count[d as usize] as usize] = i as u32;
                count[d as usize] += 1;
            }
        }
        let mut sends_to = HashMap::<u32, Vec<u32>>::new();
        let mut recvs_from = HashMap::<u32, Vec<u32>>::new();
        let msg = (sched.steps.iter().enumerate())
            .map(|(i, st)| match st.action.message_peer() {
                Some((p, send)) => {
                    let list = if send { &mut sends_to } else { &mut recvs_from };
                    let l = list.entry(p as u32).or_default();
                    l.push(i as u32);
                    l.len() as u32 - 1
                }
                None => 0,
            })
            .collect();
        Ok(Rank {
            id,
            sched,
            missing,
            first,
            dependents,
            msg,
            sends_to,
            recvs_from,
            started: vec![false; n],
            startable: BTreeSet::new(),
            next_send: HashMap::new(),
            next_recv: HashMap::new(),
            running: false,
            queued: false,
            asleep: false,
            waking: false,
            left: n,
            end: 0.0,
            syncs: 0,
        })
    }
}

impl Sim<'_> {
    fn at(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((At(t), self.seq, ev)));
    }

    fn pool_of(&self, rank: usize) -> usize {
        if self.m.shared_cores {
            0
        } else {
            self.topo.host_of(rank)
        }
    }

    /// The key of the message from `src` to `dst` with index `k`: in
    /// periodic mode shifted so that the sender is a simulated rank.
    fn canon(&self, src: usize, dst: usize, k: u32) -> Key {
        let n = self.topo.nranks();
        match self.period {
            None => (src as u32, dst as u32, k),
            Some((p, how)) => {
                // The shift taking `src` back to its representative takes
                // `dst` along.
                let rep = src % p;
                let back = how.between(src, rep, n);
                (rep as u32, how.apply(dst, back, n) as u32, k)
            }
        }
    }

    /// The simulated rank that receives the message `key`.
    fn wake_of(&self, key: Key) -> usize {
        match self.period {
            None => key.1 as usize,
            Some((p, _)) => key.1 as usize % p,
        }
    }

    /// The peer the receiver of `key` hears it from.
    fn sender_of(&self, key: Key) -> usize {
        let n = self.topo.nranks();
        match self.period {
            None => key.0 as usize,
            Some((_, how)) => {
                // The message from rep `c` to `p` stands for the one the
                // shift carrying `p` onto the receiver `w` carries along.
                let (c, p, w) = (key.0 as usize, key.1 as usize, self.wake_of(key));
                how.apply(c, how.between(p, w, n), n)
            }
        }
    }

    /// Put step `s` of rank `r` in its startable set if it can start now.
    fn refresh(&mut self, r: usize, s: u32) {
        if !self.ranks[r].started[s as usize]
            && self.ranks[r].missing[s as usize] == 0
            && self.startable(r, s)
        {
            self.ranks[r].startable.insert(s);
        }
    }

    /// After the `k`-th message to (from) `peer` started: the next may.
    fn advance(&mut self, r: usize, peer: usize, send: bool, k: u32) {
        let rk = &mut self.ranks[r];
        let (next, list) = if send {
            (&mut rk.next_send, &rk.sends_to)
        } else {
            (&mut rk.next_recv, &rk.recvs_from)
        };
        next.insert(peer as u32, k + 1);
        if let Some(&s) = list.get(&(peer as u32)).and_then(|l| l.get(k as usize + 1)) {
            self.refresh(r, s);
        }
    }

    fn bytes(&self, len: usize) -> f64 {
        len as f64 * self.elem
    }

    /// CPU seconds of step `s` of simulated rank `r`.
    fn cost(&self, r: usize, s: usize) -> f64 {
        let m = self.m;
        let me = self.ranks[r].id;
        let local = |peer: usize| self.topo.host_of(peer) == self.topo.host_of(me);
        let n = self.topo.nranks() as f64;
        // A message's CPU part on either side: copying it into or out of a
        // ring (same host) or a socket (another host).
        let transfer = |peer: usize, len: usize| {
            let rate = if local(peer) {
                m.copy_rate
            } else {
                m.socket_rate
            };
            m.msg_overhead + self.bytes(len) / rate
        };
        match self.ranks[r].sched.steps[s].action {
            Action::Send { peer, src } => transfer(peer, src.len),
            Action::Recv { peer, dst } => transfer(peer, dst.len),
            Action::RecvReduce { peer, dst, .. } => {
                transfer(peer, dst.len) + self.bytes(dst.len) / m.reduce_rate
            }
            Action::Copy { src, dst } if src == dst => m.step_overhead,
            Action::Copy { dst, .. }
            | Action::CopyFrom { dst, .. }
            | Action::CopyTo { dst, .. } => m.step_overhead + self.bytes(dst.len) / m.copy_rate,
            Action::Reduce { dst, .. } | Action::Divide { dst } => {
                m.step_overhead + self.bytes(dst.len) / m.reduce_rate
            }
            Action::Combine { dst, .. }
            | Action::ReduceFrom {
                dst, also: None, ..
            } => m.step_overhead + (n - 1.0).max(0.0) * self.bytes(dst.len) / m.reduce_rate,
            // The reduction, and a copy's worth of writing more.
            Action::ReduceFrom { dst, .. } => {
                m.step_overhead
                    + (n - 1.0).max(0.0) * self.bytes(dst.len) / m.reduce_rate
                    + self.bytes(dst.len) / m.copy_rate
            }
            // The reduction, then a copy's worth of writing per peer.
            Action::ReduceToAll { dst, .. } => {
                m.step_overhead
                    + (n - 1.0).max(0.0)
                        * self.bytes(dst.len)
                        * (1.0 / m.reduce_rate + 1.0 / m.copy_rate)
            }
            Action::Sync => 0.0,
        }
    }

    /// Whether step `s` of rank `r` (dependencies done) can start now.
    fn startable(&self, r: usize, s: u32) -> bool {
        let rk = &self.ranks[r];
        let k = rk.msg[s as usize];
        match rk.sched.steps[s as usize].action {
            Action::Send { peer, .. } => {
                rk.next_send.get(&(peer as u32)).copied().unwrap_or(0) == k
            }
            Action::Recv { peer, .. } | Action::RecvReduce { peer, .. } => {
                rk.next_recv.get(&(peer as u32)).copied().unwrap_or(0) == k
                    && self.arrived.contains_key(&self.canon(peer, rk.id, k))
            }
            _ => true,
        }
    }

    /// Start what rank `r` can start at `t`: every `Sync` it reached, and
    /// its first startable CPU step if a core is free (else it queues).
    fn try_start(&mut self, r: usize, t: f64) {
        if self.ranks[r].running || self.ranks[r].waking {
            return;
        }
        loop {
            let Some(&s) = self.ranks[r].startable.iter().next() else {
                // Nothing to do until a message comes: it sleeps (a rank
                // queued for a core or finished does not get here asleep).
                let rk = &mut self.ranks[r];
                rk.asleep = rk.left > 0 && !rk.queued;
                return;
            };
            self.ranks[r].asleep = false;
            if matches!(self.ranks[r].sched.steps[s as usize].action, Action::Sync) {
                self.ranks[r].startable.remove(&s);
                self.ranks[r].started[s as usize] = true;
                self.reach_sync(r, s, t);
                continue;
            }
            let pool = self.pool_of(self.ranks[r].id);
            if self.pools[pool].free == 0 {
                if !self.ranks[r].queued {
                    self.ranks[r].queued = true;
                    self.pools[pool].waiting.push_back(r as u32);
                }
                return;
            }
            self.pools[pool].free -= 1;
            let rk = &mut self.ranks[r];
            rk.startable.remove(&s);
            rk.started[s as usize] = true;
            rk.running = true;
            let k = rk.msg[s as usize];
            let mut end = t + self.cost(r, s as usize);
            match self.ranks[r].sched.steps[s as usize].action {
                Action::Send { peer, src } => {
                    self.advance(r, peer, true, k);
                    // Bytes stream: they leave while the sender copies.
                    let (first, last) = self.transit(r, peer, self.bytes(src.len), t, end);
                    let key = self.canon(self.ranks[r].id, peer, k);
                    self.last_byte.insert(key, last);
                    self.at(first, Ev::Arrive { key });
                }
                Action::Recv { peer, .. } | Action::RecvReduce { peer, .. } => {
                    let key = self.canon(peer, self.ranks[r].id, k);
                    // The receiver copies as bytes come: it ends with its
                    // own copy or with the last byte, whichever is later.
                    if let Some(last) = self.arrived.remove(&key) {
                        end = end.max(last);
                    }
                    self.advance(r, peer, false, k);
                }
                _ => {}
            }
            self.at(
                end,
                Ev::Done {
                    rank: r as u32,
                    step: s,
                },
            );
            return;
        }
    }

    fn reach_sync(&mut self, r: usize, s: u32, t: f64) {
        let k = self.ranks[r].syncs;
        self.ranks[r].syncs += 1;
        let all = self.ranks.len();
        let b = self.barrier.entry(k).or_default();
        b.arrived += 1;
        b.latest = b.latest.max(t);
        b.waiting.push((r as u32, s));
        if b.arrived == all {
            let b = self.barrier.remove(&k).unwrap_or_default();
            for (rank, step) in b.waiting {
                self.at(b.latest + self.m.shm_alpha, Ev::Done { rank, step });
            }
        }
    }

    fn done(&mut self, r: usize, s: u32, t: f64) {
        let action = self.ranks[r].sched.steps[s as usize].action;
        let cpu = !matches!(action, Action::Sync);
        {
            let rk = &mut self.ranks[r];
            if cpu {
                rk.running = false;
            }
            rk.left -= 1;
            rk.end = rk.end.max(t);
            let (a, b) = (
                rk.first[s as usize] as usize,
                rk.first[s as usize + 1] as usize,
            );
            let mut now_ready = Vec::new();
            for i in a..b {
                let d = rk.dependents[i];
                rk.missing[d as usize] -= 1;
                if rk.missing[d as usize] == 0 {
                    now_ready.push(d);
                }
            }
            for d in now_ready {
                self.refresh(r, d);
            }
        }
        if cpu {
            let pool = self.pool_of(self.ranks[r].id);
            self.pools[pool].free += 1;
            while self.pools[pool].free > 0 {
                let Some(w) = self.pools[pool].waiting.pop_front() else {
                    break;
                };
                self.ranks[w as usize].queued = false;
                self.try_start(w as usize, t);
            }
        }
        self.try_start(r, t);
    }

    /// When the first and the last byte of a message whose sender copies it
    /// out from `t` to `done` reach the receiver: through shared memory at
    /// once; between hosts through the sender's NIC (first come, first
    /// served, never finishing before the sender has handed everything),
    /// the wire, and the receiver's NIC.
    fn transit(&mut self, r: usize, peer: usize, bytes: f64, t: f64, done: f64) -> (f64, f64) {
        let me = self.ranks[r].id;
        let (hs, hd) = (self.topo.host_of(me), self.topo.host_of(peer));
        if hs == hd {
            return (t + self.m.shm_alpha, done + self.m.shm_alpha);
        }
        // In periodic mode the receiving host is host 0 (the message shifted).
        let hr = self.topo.host_of(self.wake_of(self.canon(me, peer, 0)));
        let wire = bytes / self.m.nic_rate;
        let out = &mut self.nics[hs];
        let start = t.max(out.egress_free);
        let out_end = (start + wire).max(done);
        out.egress_free = out_end;
        let first = start + self.m.alpha;
        let inn = &mut self.nics[hr];
        let in_start = first.max(inn.ingress_free);
        let last = (in_start + wire).max(out_end + self.m.alpha);
        inn.ingress_free = last;
        (first, last)
    }
}
