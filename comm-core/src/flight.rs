//! The flight recorder: a communicator's last calls, always on.
//!
//! Every collective leaves a record — its sequence number, what it was,
//! the algorithm that ran it, when it was issued, started and ended, how
//! it ended and, while it waits, for which peers — in a ring of the last
//! `OXCCL_FLIGHT_CALLS` calls (default 256). A failed call writes the ring
//! as JSON into `OXCCL_FLIGHT_DIR` (if set), so every survivor of a failure
//! leaves its account; `oxccl-trace why` reads them all and says what
//! happened. `Communicator::recent_calls` returns the ring;
//! [`dump_all`] writes every live communicator's (a program may call it
//! from its own `SIGUSR1` handling: a library installs no handlers).
//!
//! Cheap by construction: a short uncontended lock when a call starts and
//! when it ends (and when it goes to sleep waiting, which is slow anyway),
//! fixed-size records in a ring allocated once, so warm calls allocate
//! nothing (an error's text is the exception).

use crate::call::{Fingerprint, Kind};
use crate::error::Error;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Calls kept when `OXCCL_FLIGHT_CALLS` is not set.
pub const DEFAULT_CALLS: usize = 256;

/// Peers named in a record's wait (the total is kept beside them).
pub const WAIT_NAMED: usize = 4;

/// How a recorded call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallState {
    Running,
    Done,
    Failed,
}

impl CallState {
    pub fn name(self) -> &'static str {
        match self {
            CallState::Running => "running",
            CallState::Done => "done",
            CallState::Failed => "failed",
        }
    }
}

/// One call as the recorder keeps it.
#[derive(Clone, Debug)]
pub struct CallRecord {
    /// The communicator's sequence number of the call (the same call has
    /// the same number on every rank).
    pub seq: u64,
    pub call: Fingerprint,
    /// The algorithm that ran it (`ring`, `small`, ...).
    pub algorithm: &'static str,
    /// When the caller issued it (a queued call waits before it starts).
    pub issued: Instant,
    pub started: Instant,
    pub ended: Option<Instant>,
    pub state: CallState,
    /// Why it failed.
    pub error: Option<String>,
    /// The rank its error blames (this communicator's numbering).
    pub blamed: Option<usize>,
    /// The peers it waited for when it last went to sleep (the first
    /// [`WAIT_NAMED`]), and how many there were.
    pub waiting_for: [u32; WAIT_NAMED],
    pub waiting_total: u32,
}

impl CallRecord {
    /// The peers it last waited for (at most [`WAIT_NAMED`]).
    pub fn waiting(&self) -> &[u32] {
        &self.waiting_for[..(self.waiting_total as usize).min(WAIT_NAMED)]
    }
}

/// A communicator's recorder (see the module docs).
///
/// A ring of slots written by one call at a time (calls of a communicator
/// run one after another, under its state lock) and read by anyone at any
/// time (`recent_calls`, a dump from another thread while a call is stuck)
/// without a lock: each slot is a seqlock — a version made odd while the
/// writer changes the slot's atomic fields, even again after — and a reader
/// retries a slot whose version moved. A write is a dozen relaxed stores.
/// No clock is read for it: a call's start is the clock read the call
/// makes anyway (for its deadline); its end is read only when it failed or
/// went to sleep (then the read is nothing beside the sleep). A call that
/// completed while spinning keeps no end time.
pub struct FlightRecorder {
    /// A power of two of them (the index is a mask, not a division).
    slots: Box<[Slot]>,
    /// Records written so far (the next goes to `written % slots.len()`).
    written: AtomicU64,
    /// Error texts of failed calls, by sequence number (rare; locked).
    errors: Mutex<VecDeque<(u64, String)>>,
    /// Instants are kept as nanoseconds after `anchor.0`; dumps write wall
    /// time (microseconds since the epoch, from `anchor.1`), comparable
    /// across hosts as far as their clocks agree.
    anchor: (Instant, SystemTime),
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("capacity", &self.slots.len())
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish()
    }
}

/// One record's fields as atomics (see [`FlightRecorder`]).
#[derive(Default)]
struct Slot {
    version: AtomicU64,
    seq: AtomicU64,
    call: [AtomicU64; 2],
    /// The `last_algorithm` value of the call; the state in bits 56..;
    /// whether it slept in bit 55.
    meta: AtomicU64,
    issued: AtomicU64,
    started: AtomicU64,
    /// 0: not known.
    ended: AtomicU64,
    /// `usize::MAX`: nobody.
    blamed: AtomicU64,
    waiting_for: [AtomicU32; WAIT_NAMED],
    waiting_total: AtomicU32,
}

const STATE_SHIFT: u32 = 56;
const SLEPT: u64 = 1 << 55;
const ALGO_MASK: u64 = (1 << 55) - 1;

/// A `last_algorithm` value in a slot's bits (the small path's, the
/// largest, as all ones).
fn algorithm_code(a: usize) -> u64 {
    (a as u64).min(ALGO_MASK)
}

fn algorithm_of(meta: u64) -> usize {
    match meta & ALGO_MASK {
        ALGO_MASK => crate::comm::SMALL_PATH,
        a => a as usize,
    }
}

fn state_code(s: CallState) -> u64 {
    match s {
        CallState::Running => 0,
        CallState::Done => 1,
        CallState::Failed => 2,
    }
}

fn state_of(meta: u64) -> CallState {
    match meta >> STATE_SHIFT {
        0 => CallState::Running,
        1 => CallState::Done,
        _ => CallState::Failed,
    }
}

impl Slot {
    /// Change the slot: `f` stores its fields between the two version
    /// steps (the only writer is the call running).
    fn write(&self, f: impl FnOnce(&Slot)) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f(self);
        self.version.store(v.wrapping_add(2), Ordering::Release);
    }
}

impl FlightRecorder {
    /// A recorder of `capacity` calls, rounded up to a power of two (0:
    /// none).
    pub fn new(capacity: usize) -> FlightRecorder {
        let capacity = match capacity {
            0 => 0,
            n => n.next_power_of_two(),
        };
        FlightRecorder {
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            written: AtomicU64::new(0),
            errors: Mutex::new(VecDeque::new()),
            anchor: (Instant::now(), SystemTime::now()),
        }
    }

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    fn ns(&self, t: Instant) -> u64 {
        // At least 1: 0 is "not known".
        (t.saturating_duration_since(self.anchor.0).as_nanos() as u64).max(1)
    }

    fn instant(&self, ns: u64) -> Instant {
        self.anchor.0 + std::time::Duration::from_nanos(ns)
    }

    /// The slot of call `seq` if it is the last one written.
    fn current(&self, seq: u64) -> Option<&Slot> {
        let n = self.written.load(Ordering::Relaxed);
        let slot = self.slots.get(n.checked_sub(1)? as usize & self.mask())?;
        (slot.seq.load(Ordering::Relaxed) == seq).then_some(slot)
    }

    /// Call `seq` started at `started` (issued at `issued`; `algorithm`:
    /// the communicator's `last_algorithm` value for it).
    pub fn start(
        &self,
        seq: u64,
        call: Fingerprint,
        algorithm: usize,
        issued: Instant,
        started: Instant,
    ) {
        if self.slots.is_empty() {
            return;
        }
        let n = self.written.load(Ordering::Relaxed);
        let slot = &self.slots[n as usize & self.mask()];
        let words = call.to_words();
        let started_ns = self.ns(started);
        let issued = match issued < started {
            true => self.ns(issued),
            false => started_ns,
        };
        let started = started_ns;
        slot.write(|s| {
            s.seq.store(seq, Ordering::Relaxed);
            s.call[0].store(words[0], Ordering::Relaxed);
            s.call[1].store(words[1], Ordering::Relaxed);
            s.meta.store(algorithm_code(algorithm), Ordering::Relaxed);
            s.issued.store(issued, Ordering::Relaxed);
            s.started.store(started, Ordering::Relaxed);
            s.ended.store(0, Ordering::Relaxed);
            s.blamed.store(u64::MAX, Ordering::Relaxed);
            s.waiting_total.store(0, Ordering::Relaxed);
        });
        self.written.store(n + 1, Ordering::Release);
    }

    /// The running call `seq` goes to sleep waiting for `peers`.
    pub fn waiting(&self, seq: u64, peers: impl IntoIterator<Item = usize>) {
        let Some(slot) = self.current(seq) else {
            return;
        };
        slot.write(|s| {
            let mut total = 0u32;
            for p in peers {
                if let Some(w) = s.waiting_for.get(total as usize) {
                    w.store(p as u32, Ordering::Relaxed);
                }
                total += 1;
            }
            s.waiting_total.store(total, Ordering::Relaxed);
            s.meta.fetch_or(SLEPT, Ordering::Relaxed);
        });
    }

    /// Call `seq` ended with `outcome`.
    pub fn end(&self, seq: u64, outcome: Result<(), &Error>) {
        let Some(slot) = self.current(seq) else {
            return;
        };
        let meta = slot.meta.load(Ordering::Relaxed);
        let slept = meta & SLEPT != 0;
        let failed = outcome.is_err();
        if !failed && !slept {
            // The common end: one word changes, which a reader sees whole
            // (before or after), so no version step is needed.
            let done = meta & !(0xff << STATE_SHIFT) | state_code(CallState::Done) << STATE_SHIFT;
            slot.meta.store(done, Ordering::Release);
            return;
        }
        let ended = match slept || failed {
            true => self.ns(Instant::now()),
            false => 0,
        };
        let state = match failed {
            true => CallState::Failed,
            false => CallState::Done,
        };
        if let Err(e) = outcome {
            let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
            if errors.len() == self.slots.len() {
                errors.pop_front();
            }
            errors.push_back((seq, e.to_string()));
        }
        slot.write(|s| {
            let meta = s.meta.load(Ordering::Relaxed) & !(0xff << STATE_SHIFT);
            s.meta
                .store(meta | state_code(state) << STATE_SHIFT, Ordering::Relaxed);
            s.ended.store(ended, Ordering::Relaxed);
            if let Err(e) = outcome {
                s.blamed.store(
                    e.blamed_rank().map_or(u64::MAX, |b| b as u64),
                    Ordering::Relaxed,
                );
            }
        });
    }

    /// One slot's record, read consistently (`None` while it is empty).
    fn read(&self, slot: &Slot) -> Option<CallRecord> {
        loop {
            let v = slot.version.load(Ordering::Acquire);
            if v % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let seq = slot.seq.load(Ordering::Relaxed);
            let words = [
                slot.call[0].load(Ordering::Relaxed),
                slot.call[1].load(Ordering::Relaxed),
            ];
            let meta = slot.meta.load(Ordering::Relaxed);
            let issued = slot.issued.load(Ordering::Relaxed);
            let started = slot.started.load(Ordering::Relaxed);
            let ended = slot.ended.load(Ordering::Relaxed);
            let blamed = slot.blamed.load(Ordering::Relaxed);
            let mut waiting_for = [0u32; WAIT_NAMED];
            for (w, a) in waiting_for.iter_mut().zip(&slot.waiting_for) {
                *w = a.load(Ordering::Relaxed);
            }
            let waiting_total = slot.waiting_total.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if slot.version.load(Ordering::Relaxed) != v {
                continue;
            }
            if v == 0 {
                return None;
            }
            let call = Fingerprint::from_words(words)?;
            let state = state_of(meta);
            let error = match state {
                CallState::Failed => self
                    .errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .rev()
                    .find(|(s, _)| *s == seq)
                    .map(|(_, e)| e.clone()),
                _ => None,
            };
            return Some(CallRecord {
                seq,
                call,
                algorithm: crate::comm::algorithm_name(algorithm_of(meta)),
                issued: self.instant(issued),
                started: self.instant(started),
                ended: (ended != 0).then(|| self.instant(ended)),
                state,
                error,
                blamed: (blamed != u64::MAX).then_some(blamed as usize),
                waiting_for,
                waiting_total,
            });
        }
    }

    /// Forget every record (the communicator's sequence numbers start
    /// again: init's own calls are not the user's).
    pub(crate) fn forget(&self) {
        self.written.store(0, Ordering::Release);
    }

    /// The calls kept, oldest first.
    pub fn recent(&self) -> Vec<CallRecord> {
        let n = self.written.load(Ordering::Acquire) as usize;
        let cap = self.slots.len();
        let first = n.saturating_sub(cap);
        let mut out: Vec<CallRecord> = (first..n)
            .filter_map(|i| self.read(&self.slots[i & self.mask()]))
            .collect();
        // A call that started while this read went round may have taken
        // the oldest slot: order by sequence number.
        out.sort_by_key(|r| r.seq);
        out
    }

    /// Microseconds since the epoch at `t`.
    fn wall_us(&self, t: Instant) -> i128 {
        let (i0, w0) = self.anchor;
        let base = w0
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as i128;
        match t.checked_duration_since(i0) {
            Some(d) => base + d.as_micros() as i128,
            None => base - i0.duration_since(t).as_micros() as i128,
        }
    }

    /// The dump: who wrote it, why, and every call kept.
    pub fn to_json(&self, who: &Dumper, reason: &str) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\n  \"format\": \"oxccl-flight-1\",\n  \"comm\": \"{:016x}\",\n  \"rank\": {},\n  \"nranks\": {},\n  \"world_rank\": {},\n  \"host\": {},\n  \"pid\": {},\n  \"reason\": {},\n  \"dumped_us\": {},\n  \"calls\": [",
            who.comm,
            who.rank,
            who.nranks,
            who.world_rank,
            quote(&who.host),
            std::process::id(),
            quote(reason),
            self.wall_us(Instant::now()),
        );
        for (i, r) in self.recent().iter().enumerate() {
            let ended = r
                .ended
                .map_or("null".to_string(), |t| self.wall_us(t).to_string());
            let waiting: Vec<String> = r.waiting().iter().map(|p| p.to_string()).collect();
            let _ = write!(
                s,
                "{}\n    {{\"seq\": {}, \"kind\": \"{}\", \"dtype\": \"{}\", \"count\": {}, \"op\": \"{}\", \"root\": {}, \"algorithm\": \"{}\", \"issued_us\": {}, \"started_us\": {}, \"ended_us\": {}, \"state\": \"{}\", \"error\": {}, \"blamed\": {}, \"waiting_for\": [{}], \"waiting_total\": {}}}",
                if i == 0 { "" } else { "," },
                r.seq,
                r.call.kind.name(),
                r.call.dtype,
                r.call.count,
                op_name(&r.call),
                r.call.root,
                r.algorithm,
                self.wall_us(r.issued),
                self.wall_us(r.started),
                ended,
                r.state.name(),
                r.error.as_deref().map_or("null".to_string(), quote),
                r.blamed.map_or("null".to_string(), |b| b.to_string()),
                waiting.join(", "),
                r.waiting_total,
            );
        }
        s.push_str("\n  ]\n}\n");
        s
    }

    /// Write the dump into `dir` (created if missing); the file's path.
    pub fn dump(&self, dir: &Path, who: &Dumper, reason: &str) -> std::io::Result<PathBuf> {
        crate::trace::write_whole(
            dir,
            &format!("flight-{:016x}-rank{}.json", who.comm, who.world_rank),
            &self.to_json(who, reason),
        )
    }
}

/// Who writes a dump.
#[derive(Clone, Debug)]
pub struct Dumper {
    pub comm: u64,
    pub rank: usize,
    pub nranks: usize,
    pub world_rank: usize,
    pub host: String,
}

fn op_name(f: &Fingerprint) -> String {
    match f.kind {
        Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce => f.op.to_string(),
        _ => "none".into(),
    }
}

/// `s` as a JSON string.
pub(crate) fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(q, "\\u{:04x}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// Every live communicator's recorder in this process, for [`dump_all`].
static LIVE: Mutex<Vec<(Dumper, Weak<FlightRecorder>)>> = Mutex::new(Vec::new());

/// Make `rec` reachable by [`dump_all`] while it lives.
pub(crate) fn register(who: Dumper, rec: &Arc<FlightRecorder>) {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((who, Arc::downgrade(rec)));
}

/// Dump every live communicator of this process into `dir`; the files
/// written. What a program calls on `SIGUSR1` (from a thread of its own:
/// this takes locks and writes files, nothing a signal handler may do).
pub fn dump_all(dir: &Path, reason: &str) -> std::io::Result<Vec<PathBuf>> {
    let live: Vec<_> = {
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        live.iter()
            .filter_map(|(who, w)| w.upgrade().map(|r| (who.clone(), r)))
            .collect()
    };
    live.iter()
        .map(|(who, rec)| rec.dump(dir, who, reason))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DataType, ReduceOp};

    fn fp(kind: Kind) -> Fingerprint {
        Fingerprint {
            kind,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
            count: 10,
        }
    }

    #[test]
    fn keeps_the_last_calls_and_how_they_ended() {
        // 3 calls asked for: a power of two kept, 4.
        let f = FlightRecorder::new(3);
        let t = Instant::now();
        for seq in 0..6 {
            f.start(seq, fp(Kind::AllReduce), 1, t, t);
            if seq < 5 {
                f.end(seq, Ok(()));
            }
        }
        f.waiting(5, [2, 5, 6, 7, 8, 9]);
        let r = f.recent();
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3, 4, 5]);
        assert_eq!(r[2].state, CallState::Done);
        assert_eq!(r[3].state, CallState::Running);
        assert_eq!(r[3].waiting(), [2, 5, 6, 7]);
        assert_eq!(r[3].waiting_total, 6);
        f.end(
            5,
            Err(&Error::InvalidArgument("a \"quoted\"\nreason".into())),
        );
        let who = Dumper {
            comm: 7,
            rank: 1,
            nranks: 4,
            world_rank: 1,
            host: "h".into(),
        };
        let j = f.to_json(&who, "test");
        assert!(j.contains("\"state\": \"failed\""), "{j}");
        assert!(j.contains("\\\"quoted\\\"\\nreason"), "{j}");
        assert!(
            j.contains("\"waiting_for\": [2, 5, 6, 7], \"waiting_total\": 6"),
            "{j}"
        );
    }

    #[test]
    fn a_zero_capacity_recorder_keeps_nothing() {
        let f = FlightRecorder::new(0);
        f.start(0, fp(Kind::Barrier), 1, Instant::now(), Instant::now());
        f.end(0, Ok(()));
        assert!(f.recent().is_empty());
    }
}
