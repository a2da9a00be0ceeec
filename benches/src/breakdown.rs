//! `-v`: where a row's calls spent their time, from this rank's timeline
//! trace (the run keeps one: `--trace DIR`, or a temporary folder).
//! Busy times per call, by kind of step: sending and receiving, reducing,
//! copying, direct phases, and sleeping while waiting for peers. Steps of
//! one call overlap (a send and a receive at once), so the parts may add
//! up to more than the call.

use oxccl::trace::{Detail, Event};

/// The kinds of time, in print order.
const KINDS: [&str; 5] = ["send/recv", "reduce", "copy", "phases", "waiting"];

fn kind(e: &Event) -> Option<usize> {
    match e.detail {
        Detail::Wait { .. } => Some(4),
        Detail::Call { .. } => None,
        Detail::Step { .. } => Some(match e.name {
            "send" | "recv" | "recv_reduce" => 0,
            "reduce" | "combine" | "reduce_from" | "reduce_to_all" | "divide" => 1,
            "copy" | "copy_from" | "copy_to" => 2,
            _ => 3,
        }),
    }
}

/// Where the calls that started at or after `since` (the trace's clock)
/// spent their time.
#[derive(Debug, Default, PartialEq)]
pub struct Breakdown {
    pub calls: usize,
    /// Nanoseconds in the calls, and per kind (see [`KINDS`]).
    pub call_ns: u64,
    pub kind_ns: [u64; 5],
}

/// The end of the latest event so far: what the next row starts after.
pub fn mark(events: &[Event]) -> u64 {
    events.iter().map(|e| e.start + e.dur).max().unwrap_or(0)
}

/// The breakdown of the calls started at or after `since`.
pub fn of(events: &[Event], since: u64) -> Breakdown {
    let calls: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.start >= since && matches!(e.detail, Detail::Call { .. }))
        .map(|e| (e.start, e.start + e.dur))
        .collect();
    let mut b = Breakdown {
        calls: calls.len(),
        call_ns: calls.iter().map(|(s, e)| e - s).sum(),
        ..Breakdown::default()
    };
    for e in events.iter().filter(|e| e.start >= since) {
        let Some(k) = kind(e) else { continue };
        if calls
            .iter()
            .any(|(s, end)| e.start >= *s && e.start <= *end)
        {
            b.kind_ns[k] += e.dur;
        }
    }
    b
}

/// One comment line of the report.
pub fn line(b: &Breakdown) -> String {
    if b.calls == 0 {
        return "#   breakdown: no traced calls".into();
    }
    let per = |ns: u64| ns as f64 / b.calls as f64 / 1000.0;
    let parts: Vec<String> = KINDS
        .iter()
        .zip(b.kind_ns)
        .map(|(k, ns)| format!("{k} {:.2}", per(ns)))
        .collect();
    format!(
        "#   breakdown (rank 0, us per call, {} calls): in calls {:.2}; {}",
        b.calls,
        per(b.call_ns),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::{DataType, Fingerprint, Kind};

    fn ev(name: &'static str, start: u64, dur: u64, detail: Detail) -> Event {
        Event {
            name,
            track: 0,
            start,
            dur,
            detail,
        }
    }

    #[test]
    fn steps_count_towards_the_calls_they_ran_in() {
        let call = Detail::Call {
            seq: 0,
            call: Fingerprint::new(Kind::AllReduce, DataType::F32, 4),
            algorithm: "ring",
            failed: false,
        };
        let step = Detail::Step {
            step: 0,
            peer: Some(1),
            bytes: 8,
        };
        let wait = Detail::Wait {
            peers: [1, 0, 0, 0],
            total: 1,
        };
        let events = [
            ev("all_reduce", 0, 100, call),
            ev("send", 10, 20, step),
            ev("all_reduce", 1000, 200, call),
            ev("reduce", 1010, 50, step),
            ev("wait", 1100, 90, wait),
            ev("copy", 5000, 7, step), // in no call
        ];
        assert_eq!(mark(&events[..2]), 100);
        let b = of(&events, 500);
        assert_eq!(b.calls, 1);
        assert_eq!(b.call_ns, 200);
        assert_eq!(b.kind_ns, [0, 50, 0, 0, 90]);
        assert!(line(&b).contains("reduce 0.05"), "{}", line(&b));
    }
}
