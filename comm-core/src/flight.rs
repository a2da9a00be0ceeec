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
#[derive(Debug)]
pub struct FlightRecorder {
    calls: Mutex<VecDeque<CallRecord>>,
    capacity: usize,
    /// Wall time at `anchor`: records keep `Instant`s, dumps write wall
    /// time (microseconds since the epoch), comparable across hosts as far
    /// as their clocks agree.
    anchor: (Instant, SystemTime),
}

impl FlightRecorder {
    pub fn new(capacity: usize) -> FlightRecorder {
        FlightRecorder {
            calls: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
            anchor: (Instant::now(), SystemTime::now()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<CallRecord>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Call `seq` starts now (issued at `issued`).
    pub fn start(&self, seq: u64, call: Fingerprint, algorithm: &'static str, issued: Instant) {
        if self.capacity == 0 {
            return;
        }
        let now = Instant::now();
        let mut calls = self.lock();
        if calls.len() == self.capacity {
            calls.pop_front();
        }
        calls.push_back(CallRecord {
            seq,
            call,
            algorithm,
            issued: issued.min(now),
            started: now,
            ended: None,
            state: CallState::Running,
            error: None,
            blamed: None,
            waiting_for: [0; WAIT_NAMED],
            waiting_total: 0,
        });
    }

    /// The running call `seq` sleeps waiting for `peers`.
    pub fn waiting(&self, seq: u64, peers: impl IntoIterator<Item = usize>) {
        let mut calls = self.lock();
        if let Some(r) = calls.back_mut().filter(|r| r.seq == seq) {
            r.waiting_total = 0;
            for p in peers {
                if let Some(slot) = r.waiting_for.get_mut(r.waiting_total as usize) {
                    *slot = p as u32;
                }
                r.waiting_total += 1;
            }
        }
    }

    /// Call `seq` ended with `outcome`.
    pub fn end(&self, seq: u64, outcome: Result<(), &Error>) {
        let now = Instant::now();
        let mut calls = self.lock();
        if let Some(r) = calls.back_mut().filter(|r| r.seq == seq) {
            r.ended = Some(now);
            match outcome {
                Ok(()) => r.state = CallState::Done,
                Err(e) => {
                    r.state = CallState::Failed;
                    r.error = Some(e.to_string());
                    r.blamed = e.blamed_rank();
                }
            }
        }
    }

    /// The calls kept, oldest first.
    pub fn recent(&self) -> Vec<CallRecord> {
        self.lock().iter().cloned().collect()
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
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!(
            "flight-{:016x}-rank{}.json",
            who.comm, who.world_rank
        ));
        // Written whole, then renamed: a reader never sees half a dump.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, self.to_json(who, reason))?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
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
fn quote(s: &str) -> String {
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
        let f = FlightRecorder::new(3);
        let t = Instant::now();
        for seq in 0..5 {
            f.start(seq, fp(Kind::AllReduce), "ring", t);
            if seq < 4 {
                f.end(seq, Ok(()));
            }
        }
        f.waiting(4, [2, 5, 6, 7, 8, 9]);
        let r = f.recent();
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(r[1].state, CallState::Done);
        assert_eq!(r[2].state, CallState::Running);
        assert_eq!(r[2].waiting(), [2, 5, 6, 7]);
        assert_eq!(r[2].waiting_total, 6);
        f.end(
            4,
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
        f.start(0, fp(Kind::Barrier), "ring", Instant::now());
        f.end(0, Ok(()));
        assert!(f.recent().is_empty());
    }
}
