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
use std::collections::VecDeque;
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

/// A communicator's trace (see the module docs).
#[derive(Debug)]
pub struct Tracer {
    dir: PathBuf,
    max: usize,
    events: Mutex<VecDeque<Event>>,
    dropped: AtomicU64,
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
            events: Mutex::new(VecDeque::with_capacity(max.min(1 << 16))),
            dropped: AtomicU64::new(0),
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

    fn push(&self, e: Event) {
        if self.max == 0 {
            return;
        }
        let mut ev = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if ev.len() == self.max {
            ev.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ev.push_back(e);
    }

    /// Call `call` starts at `t`.
    pub fn call_started(&self, t: Stamp, call: Fingerprint) {
        self.call_start.store(self.at(t), Ordering::Relaxed);
        let w = call.to_words();
        self.call[0].store(w[0], Ordering::Relaxed);
        self.call[1].store(w[1], Ordering::Relaxed);
    }

    /// Call `seq` (the one started last) ended now.
    pub fn call_ended(&self, seq: u64, algorithm: &'static str, failed: bool) {
        let start = self.call_start.load(Ordering::Relaxed);
        let w = [
            self.call[0].load(Ordering::Relaxed),
            self.call[1].load(Ordering::Relaxed),
        ];
        let Some(call) = Fingerprint::from_words(w) else {
            return;
        };
        self.push(Event {
            name: call.kind.name(),
            track: TRACK_CALLS,
            start,
            dur: self.now().saturating_sub(start),
            detail: Detail::Call {
                seq,
                call,
                algorithm,
                failed,
            },
        });
    }

    /// Step `step` (named `name`) ran from `start` to now.
    pub fn step(
        &self,
        name: &'static str,
        step: u32,
        peer: Option<(usize, bool)>,
        bytes: u64,
        start: u64,
    ) {
        let track = match peer {
            Some((p, send)) => TRACK_PEERS + 2 * p as u32 + u32::from(!send),
            None => TRACK_LOCAL,
        };
        self.push(Event {
            name,
            track,
            start,
            dur: self.now().saturating_sub(start),
            detail: Detail::Step {
                step,
                peer: peer.map(|(p, _)| p as u32),
                bytes,
            },
        });
    }

    /// The call slept from `start` until now, waiting for `peers`.
    pub fn wait(&self, start: u64, peers: &[u32], total: u32) {
        let mut named = [0u32; 4];
        for (n, p) in named.iter_mut().zip(peers) {
            *n = *p;
        }
        self.push(Event {
            name: "wait",
            track: TRACK_WAITS,
            start,
            dur: self.now().saturating_sub(start),
            detail: Detail::Wait {
                peers: named,
                total,
            },
        });
    }

    /// Forget every event (init's own exchanges are not the user's).
    pub(crate) fn forget(&self) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Rank 0's clock minus this rank's, in nanoseconds, and the round
    /// trip it was measured with.
    pub fn set_offset(&self, offset_ns: i64, rtt_ns: u64) {
        self.offset_ns.store(offset_ns, Ordering::Relaxed);
        self.rtt_ns.store(rtt_ns, Ordering::Relaxed);
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
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
            self.dropped.load(Ordering::Relaxed),
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

/// The name of a schedule step's action in traces.
pub fn step_name(a: &crate::schedule::Action) -> &'static str {
    use crate::schedule::Action as A;
    match a {
        A::Send { .. } => "send",
        A::Recv { .. } => "recv",
        A::RecvReduce { .. } => "recv_reduce",
        A::Copy { .. } => "copy",
        A::Reduce { .. } => "reduce",
        A::Divide { .. } => "divide",
        A::Combine { .. } => "combine",
        A::Sync => "phase",
        A::ReduceFrom { .. } => "reduce_from",
        A::ReduceToAll { .. } => "reduce_to_all",
        A::CopyFrom { .. } => "copy_from",
        A::CopyTo { .. } => "copy_to",
    }
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
            t.step("send", 0, Some((1, true)), 16, t.now());
            t.call_ended(seq, "ring", false);
        }
        t.wait(t.now(), &[2, 3], 2);
        let ev = t.events();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[2].name, "wait");
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
}
