//! `oxccl-trace merge`: every rank's timeline trace (`trace-COMM-rankR.json`,
//! Chrome trace-event JSON with an `oxccl` section; see `comm_core::trace`)
//! on rank 0's clock, in one file, a process per rank — what Perfetto's UI
//! (ui.perfetto.dev) or `chrome://tracing` opens. And [`check`]: the
//! trace-event format's rules, and what each rank's file holds.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One rank's trace as written.
#[derive(Debug)]
pub struct RankTrace {
    pub path: PathBuf,
    pub comm: String,
    pub rank: u64,
    pub world_rank: u64,
    /// Wall time of the trace's zero (ns since the epoch, this rank's
    /// clock).
    pub anchor_unix_ns: u64,
    /// Rank 0's clock minus this rank's (ns), measured at init.
    pub offset_ns: i64,
    pub rtt_ns: u64,
    pub dropped: u64,
    pub events: Vec<Value>,
}

fn num(v: &Value, name: &str, path: &Path) -> Result<u64, String> {
    v.get(name).and_then(Value::as_u64).ok_or_else(|| {
        format!(
            "{}: oxccl.{name} is missing or not a whole number",
            path.display()
        )
    })
}

/// Parse one rank's trace (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<RankTrace, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let meta = v.get("oxccl").ok_or_else(|| {
        format!(
            "{}: no \"oxccl\" section (not an oxccl trace)",
            path.display()
        )
    })?;
    if meta.get("format").and_then(Value::as_str) != Some("oxccl-trace-1") {
        return Err(format!("{}: not format oxccl-trace-1", path.display()));
    }
    let events = v
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{}: no traceEvents list", path.display()))?
        .clone();
    Ok(RankTrace {
        path: path.to_path_buf(),
        comm: meta
            .get("comm")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{}: oxccl.comm is missing", path.display()))?
            .to_string(),
        rank: num(meta, "rank", path)?,
        world_rank: num(meta, "world_rank", path)?,
        anchor_unix_ns: num(meta, "anchor_unix_ns", path)?,
        offset_ns: meta
            .get("clock_offset_ns")
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("{}: oxccl.clock_offset_ns is missing", path.display()))?,
        rtt_ns: num(meta, "clock_rtt_ns", path)?,
        dropped: num(meta, "dropped", path)?,
        events,
    })
}

/// Every rank's trace in `dir` (`trace-*.json`), by communicator and rank.
pub fn load(dir: &Path) -> Result<Vec<RankTrace>, String> {
    let mut out = crate::read_files(dir, "trace-", "traces", "OXCCL_TRACE")?
        .iter()
        .map(|(path, text)| parse(path, text))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_by(|a, b| (&a.comm, a.rank).cmp(&(&b.comm, b.rank)));
    Ok(out)
}

/// One timeline of every trace: each event moved to rank 0's clock, time
/// zero at the earliest event, a process per rank (its world rank, and the
/// communicator when there are several).
pub fn merge(traces: &[RankTrace]) -> Value {
    let comms: std::collections::BTreeSet<&str> = traces.iter().map(|t| t.comm.as_str()).collect();
    let several = comms.len() > 1;
    // Each event's time on rank 0's clock, in ns since the epoch.
    let global = |t: &RankTrace, e: &Value| -> Option<i128> {
        let ts = e.get("ts")?.as_f64()?;
        Some(t.anchor_unix_ns as i128 + t.offset_ns as i128 + (ts * 1000.0).round() as i128)
    };
    let zero = traces
        .iter()
        .flat_map(|t| t.events.iter().filter_map(move |e| global(t, e)))
        .min()
        .unwrap_or(0);
    let mut events = Vec::new();
    let mut ranks = Vec::new();
    for (k, t) in traces.iter().enumerate() {
        let pid = match several {
            true => k as u64,
            false => t.world_rank,
        };
        for e in &t.events {
            let mut e = e.clone();
            let Some(obj) = e.as_object_mut() else {
                continue;
            };
            obj.insert("pid".into(), json!(pid));
            if obj.get("ph").and_then(Value::as_str) == Some("M") {
                if several {
                    let short: String = t.comm.chars().take(8).collect();
                    let name = format!("comm {short} rank {}", t.rank);
                    obj.insert("args".into(), json!({ "name": name }));
                }
            } else if let Some(g) = global(t, &Value::Object(obj.clone())) {
                obj.insert("ts".into(), json!((g - zero) as f64 / 1000.0));
            }
            events.push(e);
        }
        ranks.push(json!({
            "comm": t.comm, "rank": t.rank, "world_rank": t.world_rank, "pid": pid,
            "clock_offset_ns": t.offset_ns, "clock_rtt_ns": t.rtt_ns, "dropped": t.dropped,
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "oxccl": { "format": "oxccl-merged-1", "zero_unix_ns": zero.to_string(), "ranks": ranks },
    })
}

/// What a trace holds: slices per process and category.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// (pid, category) -> complete slices.
    pub slices: BTreeMap<(u64, String), usize>,
    /// Processes named by metadata events.
    pub named: Vec<u64>,
}

/// Check `v` against the trace-event format (a `traceEvents` list of
/// objects with a name, a phase, numeric pid and tid; complete slices with
/// a time and a duration, neither negative) and count its slices.
pub fn check(v: &Value) -> Result<Counts, String> {
    let list = v
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or("no traceEvents list")?;
    let mut c = Counts::default();
    for (i, e) in list.iter().enumerate() {
        let o: &Map<String, Value> = e.as_object().ok_or(format!("event {i} is not an object"))?;
        let bad = |what: &str| format!("event {i} ({e}): {what}");
        o.get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no name"))?;
        let ph = o
            .get("ph")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no phase"))?;
        let pid = o
            .get("pid")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("no pid"))?;
        o.get("tid")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("no tid"))?;
        match ph {
            "M" => c.named.push(pid),
            "X" => {
                let ts = o
                    .get("ts")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| bad("no ts"))?;
                let dur = o
                    .get("dur")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| bad("no dur"))?;
                if ts < 0.0 || dur < 0.0 {
                    return Err(bad("negative time"));
                }
                let cat = o
                    .get("cat")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                *c.slices.entry((pid, cat)).or_default() += 1;
            }
            other => return Err(bad(&format!("phase {other:?} (oxccl writes X and M)"))),
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(r: u64, anchor: u64, offset: i64, ts: f64) -> RankTrace {
        let text = json!({
            "traceEvents": [
                {"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": format!("rank {r}")}},
                {"name": "all_reduce", "cat": "collective", "ph": "X", "pid": r, "tid": 0, "ts": ts, "dur": 2.0, "args": {}},
            ],
            "oxccl": {"format": "oxccl-trace-1", "comm": "00000000000000ab", "rank": r, "nranks": 2,
                      "world_rank": r, "anchor_unix_ns": anchor, "clock_offset_ns": offset,
                      "clock_rtt_ns": 100, "dropped": 0},
        })
        .to_string();
        parse(Path::new("t.json"), &text).unwrap()
    }

    #[test]
    fn ranks_land_on_rank_0s_clock_and_the_result_checks() {
        // Rank 1's clock is 5 us behind rank 0's (offset +5000 ns): its
        // event at its 10 us is rank 0's 15 us, 5 us after rank 0's.
        let t = [rank(0, 1_000_000, 0, 10.0), rank(1, 1_000_000, 5_000, 10.0)];
        let m = merge(&t);
        let ts: Vec<f64> = m["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["ts"].as_f64().unwrap())
            .collect();
        assert_eq!(ts, [0.0, 5.0]);
        let c = check(&m).unwrap();
        assert_eq!(c.slices[&(1, "collective".to_string())], 1);
        assert_eq!(c.named, [0, 1]);
        assert!(check(&json!({"traceEvents": [{"name": "x", "ph": "X", "pid": 0, "tid": 0, "ts": -1.0, "dur": 1.0}]})).is_err());
        assert!(check(&json!({"events": []})).is_err());
        // Two communicators (named by a short comm id, whatever its text).
        let mut other = rank(0, 1_000_000, 0, 12.0);
        other.comm = "aéééééééé".into();
        let m = merge(&[rank(0, 1_000_000, 0, 10.0), other]);
        assert_eq!(check(&m).unwrap().named, [0, 1]);
        assert!(parse(Path::new("t.json"), "{\"traceEvents\": []}").is_err());
    }
}
