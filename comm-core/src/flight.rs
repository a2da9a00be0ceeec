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
//! Cheap by construction (about 5 ns a call; docs/PERFORMANCE.md): no lock
//! and no clock read of its own — a call's start is a few stores into one
//! cache line of a ring allocated once, its end one store — so warm calls
//! allocate nothing (an error's text is the exception). A call that goes
//! to sleep or fails records more, beside a sleep or an error.

use crate::call::{Fingerprint, Kind};
use crate::error::Error;
use crate::sys::Stamp;
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
/// retries a slot whose version moved. A call's start is eight relaxed
/// stores into one cache line; its end, when it neither failed nor slept,
/// is one store outside the ring (`ended_before`: calls run in sequence
/// order, so every call before that number has ended). No clock is read
/// for it: a call's start is the clock read the call makes anyway (for its
/// deadline); its end is read only when it failed or went to sleep (then
/// the read is nothing beside the sleep). A call that completed while
/// spinning keeps no end time.
pub struct FlightRecorder {
    /// A power of two of them (the index is a mask, not a division).
    slots: Box<[Slot]>,
    /// Records written so far (the next goes to `written % slots.len()`).
    written: AtomicU64,
    /// Every call numbered below this has ended (the state of a record
    /// still marked running before it is "done").
    ended_before: AtomicU64,
    /// One more than the number of the last call that went to sleep (its
    /// end takes the slow path: it records when).
    slept: AtomicU64,
    /// Error texts of failed calls, by sequence number (rare; locked).
    errors: Mutex<VecDeque<(u64, String)>>,
    /// Times are kept as nanoseconds after `anchor.0` (read together with
    /// `anchor.1`, the same moment as an `Instant`); dumps write wall time
    /// (microseconds since the epoch, from `anchor.2`), comparable across
    /// hosts as far as their clocks agree.
    anchor: (Stamp, Instant, SystemTime),
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("capacity", &self.slots.len())
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish()
    }
}

/// One record's fields as atomics (see [`FlightRecorder`]). Every call
/// writes the first seven words, one cache line; the rest only a call that
/// slept or failed writes, and `meta` says which of them are its own (a
/// slot's fields from an older call are left as they were, unread).
#[derive(Default)]
#[repr(C, align(64))]
struct Slot {
    version: AtomicU64,
    seq: AtomicU64,
    call: [AtomicU64; 2],
    /// The `last_algorithm` value of the call; the state in bits 56..;
    /// whether it slept (`waiting_*` are its own) in bit 55.
    meta: AtomicU64,
    issued: AtomicU64,
    started: AtomicU64,
    /// The call's when it slept or failed and has ended.
    ended: AtomicU64,
    /// The call's when it failed (`u64::MAX`: nobody).
    blamed: AtomicU64,
    waiting_for: [AtomicU32; WAIT_NAMED],
    waiting_total: AtomicU32,
}

const STATE_SHIFT: u32 = 56;
const SLEPT: u64 = 1 << 55;
const ALGO_MASK: u64 = (1 << 55) - 1;

/// A `last_algorithm` value in a slot's bits (the small path's, the
/// largest, as all ones).
#[inline]
fn algorithm_code(a: usize) -> u64 {
    (a as u64).min(ALGO_MASK)
}

fn algorithm_of(meta: u64) -> usize {
    match meta & ALGO_MASK {
        ALGO_MASK => crate::comm::SMALL_PATH,
        a => a as usize,
    }
}

#[inline]
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
    #[inline]
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
            ended_before: AtomicU64::new(0),
            slept: AtomicU64::new(0),
            errors: Mutex::new(VecDeque::new()),
            anchor: (Stamp::now(), Instant::now(), SystemTime::now()),
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    #[inline]
    fn ns(&self, t: Stamp) -> u64 {
        // At least 1: 0 is "not known".
        t.ns_since(self.anchor.0).max(1)
    }

    fn instant(&self, ns: u64) -> Instant {
        self.anchor.1 + std::time::Duration::from_nanos(ns)
    }

    /// The slot of call `seq` if it is the last one written.
    #[inline]
    fn current(&self, seq: u64) -> Option<&Slot> {
        let n = self.written.load(Ordering::Relaxed);
        let slot = self.slots.get(n.checked_sub(1)? as usize & self.mask())?;
        (slot.seq.load(Ordering::Relaxed) == seq).then_some(slot)
    }

    /// Call `seq` started at `started` (issued at `issued`; `algorithm`:
    /// the communicator's `last_algorithm` value for it).
    #[inline]
    pub fn start(
        &self,
        seq: u64,
        call: Fingerprint,
        algorithm: usize,
        issued: Stamp,
        started: Stamp,
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
        self.slept.store(seq + 1, Ordering::Relaxed);
    }

    /// Call `seq` ended with `outcome`.
    #[inline]
    pub fn end(&self, seq: u64, outcome: Result<(), &Error>) {
        if self.slots.is_empty() {
            return;
        }
        if outcome.is_ok() && self.slept.load(Ordering::Relaxed) != seq + 1 {
            // The common end: nothing in its record changes.
            self.ended_before.store(seq + 1, Ordering::Release);
            return;
        }
        self.end_slow(seq, outcome);
    }

    /// [`FlightRecorder::end`] of a call that slept or failed (out of
    /// line: the common end stays a few instructions in the caller).
    #[cold]
    #[inline(never)]
    fn end_slow(&self, seq: u64, outcome: Result<(), &Error>) {
        if let Some(slot) = self.current(seq) {
            self.end_record(slot, seq, outcome);
        }
        self.ended_before.store(seq + 1, Ordering::Release);
    }

    /// Write how call `seq`, which slept or failed, ended into its record.
    fn end_record(&self, slot: &Slot, seq: u64, outcome: Result<(), &Error>) {
        let failed = outcome.is_err();
        let ended = self.ns(Stamp::now());
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
            let state = match state_of(meta) {
                // Ended, and not worth a word in its record (see
                // `FlightRecorder`).
                CallState::Running if seq < self.ended_before.load(Ordering::Acquire) => {
                    CallState::Done
                }
                s => s,
            };
            // Which of the slow fields are this call's (see `Slot`).
            let slept = meta & SLEPT != 0;
            let ended = match state {
                CallState::Failed => ended,
                CallState::Done if slept => ended,
                _ => 0,
            };
            let blamed = match state {
                CallState::Failed => blamed,
                _ => u64::MAX,
            };
            let waiting_total = match slept {
                true => waiting_total,
                false => 0,
            };
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
        self.ended_before.store(0, Ordering::Release);
        self.slept.store(0, Ordering::Relaxed);
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
        let (_, i0, w0) = self.anchor;
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
        let t = Stamp::now();
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
        // A call that slept keeps when it ended; one that did not keeps
        // none, and neither names peers of an older call in its slot.
        f.start(6, fp(Kind::AllGather), 1, t, t);
        f.waiting(6, [3]);
        f.end(6, Ok(()));
        f.start(7, fp(Kind::Broadcast), 1, t, t);
        f.end(7, Ok(()));
        f.start(8, fp(Kind::Broadcast), 1, t, t);
        f.end(8, Ok(()));
        // In the slot of call 5, which slept and failed.
        f.start(9, fp(Kind::Broadcast), 1, t, t);
        let r = f.recent();
        let (slept, quick, running) = (&r[0], &r[1], &r[3]);
        assert_eq!((slept.seq, slept.state), (6, CallState::Done));
        assert!(slept.ended.is_some());
        assert_eq!(slept.waiting(), [3]);
        assert_eq!((quick.seq, quick.state), (7, CallState::Done));
        assert_eq!(
            (quick.ended, quick.waiting(), quick.blamed),
            (None, &[][..], None)
        );
        assert_eq!((running.seq, running.state), (9, CallState::Running));
        assert_eq!(
            (running.ended, running.waiting(), running.blamed),
            (None, &[][..], None)
        );
        // Numbering starts again after `forget`: call 0 runs.
        f.forget();
        f.start(0, fp(Kind::AllReduce), 1, t, t);
        assert_eq!(f.recent()[0].state, CallState::Running);
    }

    #[test]
    fn a_zero_capacity_recorder_keeps_nothing() {
        let f = FlightRecorder::new(0);
        f.start(0, fp(Kind::Barrier), 1, Stamp::now(), Stamp::now());
        f.end(0, Ok(()));
        assert!(f.recent().is_empty());
    }
}
