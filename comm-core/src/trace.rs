//! Timeline traces: what each call did and when, for Perfetto.
//!
//! With `OXCCL_TRACE=DIR` (`Config::trace_dir`) a communicator keeps, in
//! memory, a slice per collective (kind, type, count, operator, algorithm,
//! sequence number, bytes), a slice per step of its schedule (send, receive,
//! copy, reduce, phase... with the peer and the bytes) and a slice per wait
//! (the time the call slept, and for whom), at most
//! `OXCCL_TRACE_MAX_EVENTS` of them (the oldest go first). Nothing is
//! written while calls run: the trace goes to `DIR/trace-COMM-rankR.json`
//! (Chrome's trace-event JSON, which Perfetto and `chrome://tracing` open)
//! when the communicator is dropped, when a call fails, or on
//! `Communicator::flush_trace`. Each rank's clock is compared with rank 0's
//! once at init (a few round trips, NTP-style: the offset of the fastest
//! one), and `oxccl-trace merge DIR -o job.json` puts every rank on rank
//! 0's clock in one timeline, a process per rank.
//!
//! Off (the default) it costs a branch per step.

use crate::call::{Fingerprint, Kind};
use crate::sys::Stamp;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Events kept when `OXCCL_TRACE_MAX_EVENTS` is not set.
pub const DEFAULT_MAX_EVENTS: usize = 1 << 20;

/// The track (thread id in the trace) of collectives.
pub const TRACK_CALLS: u32 = 0;
/// The track of local steps (copies, reductions, phases).
pub const TRACK_LOCAL: u32 = 1;
/// The track of waits.
pub const TRACK_WAITS: u32 = 2;
/// Sends to peer `p` go on track `TRACK_PEERS + 2p`, receives from it on
/// the next.
pub const TRACK_PEERS: u32 = 10;

/// What a step slice did: its name in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Send,
    Recv,
    RecvReduce,
    Copy,
    Reduce,
    Divide,
    Combine,
    Phase,
    ReduceFrom,
    ReduceToAll,
    CopyFrom,
    CopyTo,
}

impl StepKind {
    const ALL: [StepKind; 12] = [
        StepKind::Send,
        StepKind::Recv,
        StepKind::RecvReduce,
        StepKind::Copy,
        StepKind::Reduce,
        StepKind::Divide,
        StepKind::Combine,
        StepKind::Phase,
        StepKind::ReduceFrom,
        StepKind::ReduceToAll,
        StepKind::CopyFrom,
        StepKind::CopyTo,
    ];

    /// The kind of a schedule step's action.
    pub fn of(a: &crate::schedule::Action) -> StepKind {
        use crate::schedule::Action as A;
        match a {
            A::Send { .. } => StepKind::Send,
            A::Recv { .. } => StepKind::Recv,
            A::RecvReduce { .. } => StepKind::RecvReduce,
            A::Copy { .. } => StepKind::Copy,
            A::Reduce { .. } => StepKind::Reduce,
            A::Divide { .. } => StepKind::Divide,
            A::Combine { .. } => StepKind::Combine,
            A::Sync => StepKind::Phase,
            A::ReduceFrom { .. } => StepKind::ReduceFrom,
            A::ReduceToAll { .. } => StepKind::ReduceToAll,
            A::CopyFrom { .. } => StepKind::CopyFrom,
            A::CopyTo { .. } => StepKind::CopyTo,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StepKind::Send => "send",
            StepKind::Recv => "recv",
            StepKind::RecvReduce => "recv_reduce",
            StepKind::Copy => "copy",
            StepKind::Reduce => "reduce",
            StepKind::Divide => "divide",
            StepKind::Combine => "combine",
            StepKind::Phase => "phase",
            StepKind::ReduceFrom => "reduce_from",
            StepKind::ReduceToAll => "reduce_to_all",
            StepKind::CopyFrom => "copy_from",
            StepKind::CopyTo => "copy_to",
        }
    }
}

/// What an event says besides its name and time.
#[derive(Clone, Copy, Debug)]
pub enum Detail {
    Call {
        seq: u64,
        call: Fingerprint,
        algorithm: &'static str,
        failed: bool,
    },
    Step {
        step: u32,
        peer: Option<u32>,
        bytes: u64,
    },
    Wait {
        peers: [u32; 4],
        total: u32,
    },
}

/// One slice of the timeline.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub name: &'static str,
    pub track: u32,
    /// Nanoseconds after the tracer's anchor.
    pub start: u64,
    pub dur: u64,
    pub detail: Detail,
}

/// An event as the ring keeps it: six words, written in place under the
/// lock and decoded into an [`Event`] only when the trace is read. (An
/// `Event` is 88 bytes; a traced 1 MiB call keeps about 8, which a long
/// run writes into memory out of cache beside the megabytes the call
/// streams: see `docs/PERFORMANCE.md`, "Timeline tracing's cost".)
///
/// Word 0 says what it is: its sort in the low byte, then
/// - a call: `failed` (bit 8), the algorithm's index (`last_algorithm`,
///   high half); words 3-5: sequence number, fingerprint words;
/// - a step: its kind (bits 8-15), sent (bit 16), has a peer (bit 17),
///   its index in the schedule (high half); words 3-4: bytes, peer;
/// - a wait: how many peers it waited for (high half); words 3-4: the
///   first four, two to a word.
///
/// Words 1 and 2 are the start and the duration (ns).
type Record = [u64; 6];

const CALL: u64 = 1;
const STEP: u64 = 2;
const WAIT: u64 = 3;

/// The kept records: `slots` grows to `max` (its room reserved at
/// creation where the allocator grants it), then record `i` lives in slot
/// `i % max`.
#[derive(Debug)]
struct Ring {
    slots: Vec<Record>,
    /// Records ever pushed, and the first not forgotten.
    pushed: u64,
    first: u64,
}

impl Ring {
    fn new(max: usize) -> Ring {
        let mut slots = Vec::new();
        // Room for every record up front (untouched pages cost nothing),
        // so no push reallocates and copies the ring during a call; a
        // `max` the allocator refuses grows as records come instead.
        let _ = slots.try_reserve_exact(max);
        Ring {
            slots,
            pushed: 0,
            first: 0,
        }
    }

    fn push(&mut self, max: usize, r: Record) {
        let i = (self.pushed % max as u64) as usize;
        match self.slots.get_mut(i) {
            Some(s) => *s = r,
            None => self.slots.push(r),
        }
        self.pushed += 1;
    }

    /// The first record still kept.
    fn oldest(&self, max: usize) -> u64 {
        self.first.max(self.pushed.saturating_sub(max as u64))
    }
}

/// A communicator's trace (see the module docs).
#[derive(Debug)]
pub struct Tracer {
    dir: PathBuf,
    max: usize,
    ring: Mutex<Ring>,
    anchor: Stamp,
    /// Wall time at `anchor`, nanoseconds since the epoch.
    anchor_unix_ns: u64,
    /// Rank 0's clock minus this rank's (nanoseconds), once aligned.
    offset_ns: AtomicI64,
    /// Round trip of the alignment's best exchange (ns; 0: not aligned).
    rtt_ns: AtomicU64,
    /// When the running call started (ns after the anchor), and what it is
    /// (`Fingerprint::to_words`).
    call_start: AtomicU64,
    call: [AtomicU64; 2],
}

impl Tracer {
    pub fn new(dir: PathBuf, max: usize) -> Tracer {
        let anchor = Stamp::now();
        let anchor_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Tracer {
            dir,
            max,
            ring: Mutex::new(Ring::new(max)),
            anchor,
            anchor_unix_ns,
            offset_ns: AtomicI64::new(0),
            rtt_ns: AtomicU64::new(0),
            call_start: AtomicU64::new(0),
            call: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Nanoseconds after the anchor, now.
    pub fn now(&self) -> u64 {
        self.at(Stamp::now())
    }

    /// Nanoseconds after the anchor at `t`.
    pub fn at(&self, t: Stamp) -> u64 {
        t.ns_since(self.anchor)
    }

    /// This rank's wall clock as the trace sees it (ns since the epoch).
    pub fn wall_ns(&self) -> u64 {
        self.anchor_unix_ns + self.now()
    }

    /// Keep a slice that started at `start` (ns after the anchor) and
    /// ends now: `head` and `rest` are its words 0 and 3-5.
    #[inline]
    fn push(&self, head: u64, start: u64, rest: [u64; 3]) {
        if self.max == 0 {
            return;
        }
        let dur = self.now().saturating_sub(start);
        let [a, b, c] = rest;
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.push(self.max, [head, start, dur, a, b, c]);
    }

    /// Call `call` starts at `t`.
    pub fn call_started(&self, t: Stamp, call: Fingerprint) {
        self.call_start.store(self.at(t), Ordering::Relaxed);
        let w = call.to_words();
        self.call[0].store(w[0], Ordering::Relaxed);
        self.call[1].store(w[1], Ordering::Relaxed);
    }

    /// Call `seq` (the one started last) ended now; `algorithm` is the
    /// communicator's index of what ran it (`last_algorithm`).
    pub fn call_ended(&self, seq: u64, algorithm: usize, failed: bool) {
        let head = CALL | u64::from(failed) << 8 | (algorithm as u32 as u64) << 32;
        let start = self.call_start.load(Ordering::Relaxed);
        let w = [
            self.call[0].load(Ordering::Relaxed),
            self.call[1].load(Ordering::Relaxed),
        ];
        self.push(head, start, [seq, w[0], w[1]]);
    }

    /// Step `step` (of kind `kind`) ran from `start` to now, sending to
    /// (`true`) or receiving from `peer`, or local.
    pub fn step(
        &self,
        kind: StepKind,
        step: u32,
        peer: Option<(usize, bool)>,
        bytes: u64,
        start: u64,
    ) {
        let (p, flags) = match peer {
            Some((p, send)) => (p as u64, 2 | u64::from(send)),
            None => (0, 0),
        };
        let head = STEP | (kind as u64) << 8 | flags << 16 | u64::from(step) << 32;
        self.push(head, start, [bytes, p, 0]);
    }

    /// The call slept from `start` until now, waiting for `peers` (the
    /// first four of `total`).
    pub fn wait(&self, start: u64, peers: &[u32], total: u32) {
        let mut named = [0u64; 4];
        for (n, p) in named.iter_mut().zip(peers) {
            *n = u64::from(*p);
        }
        let head = WAIT | u64::from(total) << 32;
        let words = [named[0] | named[1] << 32, named[2] | named[3] << 32, 0];
        self.push(head, start, words);
    }

    /// Forget every event (init's own exchanges are not the user's).
    pub(crate) fn forget(&self) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.first = ring.pushed;
    }

    /// Rank 0's clock minus this rank's, in nanoseconds, and the round
    /// trip it was measured with.
    pub fn set_offset(&self, offset_ns: i64, rtt_ns: u64) {
        self.offset_ns.store(offset_ns, Ordering::Relaxed);
        self.rtt_ns.store(rtt_ns, Ordering::Relaxed);
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<Event> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        (ring.oldest(self.max)..ring.pushed)
            .filter_map(|i| decode(&ring.slots[(i % self.max as u64) as usize]))
            .collect()
    }

    /// Events the ring's bound pushed out (`OXCCL_TRACE_MAX_EVENTS`).
    pub fn dropped(&self) -> u64 {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.oldest(self.max) - ring.first
    }

    /// The trace as Chrome trace-event JSON (times in microseconds after
    /// this rank's anchor; `oxccl` says how to put it on rank 0's clock).
    pub fn to_json(&self, who: &crate::flight::Dumper) -> String {
        let mut s = String::with_capacity(1 << 16);
        s.push_str("{\"traceEvents\": [\n");
        let _ = write!(
            s,
            "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": 0, \"args\": {{\"name\": {}}}}}",
            who.rank,
            crate::flight::quote(&format!("rank {} ({})", who.rank, who.host))
        );
        for e in self.events() {
            let us = |ns: u64| ns as f64 / 1000.0;
            let _ = write!(
                s,
                ",\n{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, \"ts\": {:.3}, \"dur\": {:.3}, \"args\": {{",
                e.name,
                match e.detail {
                    Detail::Call { .. } => "collective",
                    Detail::Step { .. } => "step",
                    Detail::Wait { .. } => "wait",
                },
                who.rank,
                e.track,
                us(e.start),
                us(e.dur)
            );
            match e.detail {
                Detail::Call {
                    seq,
                    call,
                    algorithm,
                    failed,
                } => {
                    let _ = write!(
                        s,
                        "\"seq\": {seq}, \"dtype\": \"{}\", \"count\": {}, \"bytes\": {}, \"algorithm\": \"{algorithm}\", \"failed\": {failed}",
                        call.dtype,
                        call.count,
                        call.count * call.dtype.size() as u64
                    );
                    if matches!(
                        call.kind,
                        Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce
                    ) {
                        let _ = write!(s, ", \"op\": \"{}\"", call.op);
                    }
                    if matches!(call.kind, Kind::Broadcast | Kind::Reduce) {
                        let _ = write!(s, ", \"root\": {}", call.root);
                    }
                }
                Detail::Step { step, peer, bytes } => {
                    let _ = write!(s, "\"step\": {step}, \"bytes\": {bytes}");
                    if let Some(p) = peer {
                        let _ = write!(s, ", \"peer\": {p}");
                    }
                }
                Detail::Wait { peers, total } => {
                    let named: Vec<String> = peers[..(total as usize).min(4)]
                        .iter()
                        .map(|p| p.to_string())
                        .collect();
                    let _ = write!(s, "\"peers\": [{}], \"total\": {total}", named.join(", "));
                }
            }
            s.push_str("}}");
        }
        let _ = write!(
            s,
            "\n],\n\"displayTimeUnit\": \"ns\",\n\"oxccl\": {{\"format\": \"oxccl-trace-1\", \"comm\": \"{:016x}\", \"rank\": {}, \"nranks\": {}, \"world_rank\": {}, \"anchor_unix_ns\": {}, \"clock_offset_ns\": {}, \"clock_rtt_ns\": {}, \"dropped\": {}}}\n}}\n",
            who.comm,
            who.rank,
            who.nranks,
            who.world_rank,
            self.anchor_unix_ns,
            self.offset_ns.load(Ordering::Relaxed),
            self.rtt_ns.load(Ordering::Relaxed),
            self.dropped(),
        );
        s
    }

    /// Write the trace into its folder; the file's path.
    pub fn flush(&self, who: &crate::flight::Dumper) -> std::io::Result<PathBuf> {
        write_whole(
            &self.dir,
            &format!("trace-{:016x}-rank{}.json", who.comm, who.world_rank),
            &self.to_json(who),
        )
    }
}

/// Round trips each rank makes with rank 0 to compare clocks.
const ALIGN_ROUNDS: usize = 8;

/// Compare every rank's trace clock with rank 0's (collective; at init):
/// each rank sends rank 0 its time `t1`, rank 0 answers with when it got
/// it (`t2`) and when it answered (`t3`), the rank notes `t4`; rank 0's
/// clock is ahead by `((t2 - t1) + (t3 - t4)) / 2` if the two legs took as
/// long, to within half the round trip. The round with the shortest round
/// trip is kept. Rank 0 serves the ranks one after another.
pub(crate) fn align_clocks(comm: &crate::Communicator, t: &Tracer) -> crate::Result<()> {
    let (me, n) = (comm.rank(), comm.nranks());
    if me == 0 {
        for peer in 1..n {
            for _ in 0..ALIGN_ROUNDS {
                let mut t1 = [0u64];
                comm.recv(&mut t1, peer)?;
                let t2 = t.wall_ns();
                comm.send(&[t2, t.wall_ns()], peer)?;
            }
        }
        t.set_offset(0, 0);
        return Ok(());
    }
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..ALIGN_ROUNDS {
        let t1 = t.wall_ns();
        comm.send(&[t1], 0)?;
        let mut reply = [0u64; 2];
        comm.recv(&mut reply, 0)?;
        let t4 = t.wall_ns();
        let [t2, t3] = reply;
        let rtt = t4.saturating_sub(t1).saturating_sub(t3.saturating_sub(t2));
        let offset = ((t2 as i128 - t1 as i128) + (t3 as i128 - t4 as i128)) / 2;
        if !matches!(best, Some((r, _)) if r <= rtt) {
            best = Some((rtt, offset as i64));
        }
    }
    if let Some((rtt, offset)) = best {
        t.set_offset(offset, rtt.max(1));
    }
    Ok(())
}

/// Write `text` to `dir/name` whole (a temporary file renamed), creating
/// `dir`: a reader never sees half a file.
pub(crate) fn write_whole(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// A kept record as an event (`None`: a call whose fingerprint does not
/// decode, which no call of this communicator has).
fn decode(r: &Record) -> Option<Event> {
    let [head, start, dur, a, b, c] = *r;
    let high = (head >> 32) as u32;
    let (name, track, detail) = match head & 0xff {
        CALL => {
            let call = Fingerprint::from_words([b, c])?;
            let algorithm = match high {
                u32::MAX => crate::comm::SMALL_PATH,
                i => i as usize,
            };
            let detail = Detail::Call {
                seq: a,
                call,
                algorithm: crate::comm::algorithm_name(algorithm),
                failed: head >> 8 & 1 != 0,
            };
            (call.kind.name(), TRACK_CALLS, detail)
        }
        STEP => {
            let kind = *StepKind::ALL.get((head >> 8 & 0xff) as usize)?;
            let send = head >> 16 & 1 != 0;
            let peer = (head >> 17 & 1 != 0).then_some(b as u32);
            let track = match peer {
                // (Saturating: no rank count reaches it, and a decoder
                // does not panic.)
                Some(p) => TRACK_PEERS
                    .saturating_add(p.saturating_mul(2))
                    .saturating_add(u32::from(!send)),
                None => TRACK_LOCAL,
            };
            let detail = Detail::Step {
                step: high,
                peer,
                bytes: a,
            };
            (kind.name(), track, detail)
        }
        WAIT => {
            let peers = [a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32];
            ("wait", TRACK_WAITS, Detail::Wait { peers, total: high })
        }
        _ => return None,
    };
    Some(Event {
        name,
        track,
        start,
        dur,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DataType, ReduceOp};

    #[test]
    fn keeps_the_last_events_and_writes_chrome_json() {
        let t = Tracer::new(PathBuf::from("/nonexistent"), 3);
        let fp = Fingerprint::new(Kind::AllReduce, DataType::F32, 4).with_op(ReduceOp::Sum);
        for seq in 0..3 {
            t.call_started(Stamp::now(), fp);
            t.step(StepKind::Send, 0, Some((1, true)), 16, t.now());
            t.call_ended(seq, 1, false);
        }
        t.wait(t.now(), &[2, 3], 2);
        let ev = t.events();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[2].name, "wait");
        assert_eq!(t.dropped(), 4);
        let who = crate::flight::Dumper {
            comm: 1,
            rank: 0,
            nranks: 2,
            world_rank: 0,
            host: "h".into(),
        };
        let j = t.to_json(&who);
        assert!(j.starts_with("{\"traceEvents\": ["), "{j}");
        assert!(j.contains("\"peers\": [2, 3]"), "{j}");
        assert!(j.contains("\"dropped\": 4"), "{j}");
    }

    /// Every field of every sort of event comes back as it went in, in
    /// order, across the ring's wrap, and `forget` keeps nothing older.
    #[test]
    fn records_decode_to_the_events_pushed() {
        // Every kind decodes as itself (a record keeps its index in `ALL`).
        let t = Tracer::new(PathBuf::from("/nonexistent"), 16);
        for k in StepKind::ALL {
            t.step(k, 0, None, 0, 0);
        }
        let kinds: Vec<_> = t.events().iter().map(|e| e.name).collect();
        let names: Vec<_> = StepKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(kinds, names);
        let t = Tracer::new(PathBuf::from("/nonexistent"), 5);
        let fp = Fingerprint::new(Kind::Broadcast, DataType::Bf16, 1 << 40).with_root(7);
        t.step(StepKind::Copy, 1, None, 3, 0);
        t.forget();
        assert!(t.events().is_empty());
        assert_eq!(t.dropped(), 0);
        t.call_started(Stamp::now(), fp);
        t.step(
            StepKind::CopyTo,
            u32::MAX,
            Some((70_000, false)),
            u64::MAX,
            5,
        );
        t.step(StepKind::Phase, 9, None, 0, 6);
        t.wait(7, &[1, 2, 3, u32::MAX], 9);
        t.step(StepKind::Send, 2, Some((4, true)), 64, 8);
        t.call_ended(41, crate::comm::SMALL_PATH, true);
        let ev = t.events();
        assert_eq!(t.dropped(), 0, "{ev:?}");
        let names: Vec<_> = ev.iter().map(|e| e.name).collect();
        assert_eq!(names, ["copy_to", "phase", "wait", "send", "broadcast"]);
        let (recv, phase, wait, send, call) = (&ev[0], &ev[1], &ev[2], &ev[3], &ev[4]);
        assert_eq!(recv.track, TRACK_PEERS + 140_001);
        assert!(matches!(
            recv.detail,
            Detail::Step {
                step: u32::MAX,
                peer: Some(70_000),
                bytes: u64::MAX
            }
        ));
        assert_eq!((phase.track, phase.start), (TRACK_LOCAL, 6));
        assert!(matches!(
            phase.detail,
            Detail::Step {
                step: 9,
                peer: None,
                bytes: 0
            }
        ));
        assert_eq!(wait.track, TRACK_WAITS);
        assert!(matches!(
            wait.detail,
            Detail::Wait {
                peers: [1, 2, 3, u32::MAX],
                total: 9
            }
        ));
        assert_eq!((send.track, send.start), (TRACK_PEERS + 8, 8));
        assert!(matches!(
            send.detail,
            Detail::Step {
                step: 2,
                peer: Some(4),
                bytes: 64
            }
        ));
        assert_eq!(call.track, TRACK_CALLS);
        assert!(call.dur > 0);
        match call.detail {
            Detail::Call {
                seq,
                call,
                algorithm,
                failed,
            } => {
                assert_eq!((seq, algorithm, failed), (41, "small", true));
                assert_eq!(call, fp);
            }
            d => panic!("{d:?}"),
        }
        // One more pushes the oldest out.
        t.wait(10, &[], 0);
        assert_eq!(t.dropped(), 1);
        let names: Vec<_> = t.events().iter().map(|e| e.name).collect();
        assert_eq!(names, ["phase", "wait", "send", "broadcast", "wait"]);
    }
}
