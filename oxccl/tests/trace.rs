//! Timeline traces (issue 20): with `OXCCL_TRACE` every rank writes a
//! trace of its calls, steps and waits; `oxccl-trace merge` joins them on
//! rank 0's clock into one file the trace-event format accepts, with as
//! many collective slices per rank as calls made.

mod common;

use common::*;
use oxccl::prelude::*;

#[test]
fn every_rank_traces_its_calls_and_the_merge_has_them_all() {
    let dir = std::env::temp_dir().join(format!("oxccl-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = Config {
        trace_dir: Some(dir.clone()),
        ..test_config()
    };
    let n = 4;
    with_ranks(n, cfg, |c| {
        let mut x = vec![1.0f32; 1 << 18];
        let mut g = vec![0.0f32; 1 << 12];
        for _ in 0..10 {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        }
        for _ in 0..3 {
            c.all_gather(&x[..1 << 10], &mut g).unwrap();
        }
        for _ in 0..2 {
            c.broadcast_in_place(&mut x[..16], 0).unwrap();
        }
        // Dropped here: the trace is written.
    });
    let traces = oxccl_trace::merge::load(&dir).unwrap();
    assert_eq!(traces.len(), n);
    for t in &traces {
        // Ranks of one process share a clock: the measured offset is
        // within the round trip it was measured with.
        assert!(
            t.offset_ns.unsigned_abs() <= t.rtt_ns.max(1) + 50_000,
            "rank {}: offset {} ns, rtt {} ns",
            t.rank,
            t.offset_ns,
            t.rtt_ns
        );
        assert_eq!(t.dropped, 0);
    }
    let merged = oxccl_trace::merge::merge(&traces);
    let counts = oxccl_trace::merge::check(&merged).unwrap();
    eprintln!("{:?}", counts.slices);
    for r in 0..n as u64 {
        assert_eq!(
            counts.slices[&(r, "collective".to_string())],
            15,
            "rank {r}"
        );
        assert!(
            counts
                .slices
                .get(&(r, "step".to_string()))
                .copied()
                .unwrap_or(0)
                >= 10,
            "rank {r}"
        );
    }
    let mut named = counts.named.clone();
    named.sort();
    assert_eq!(named, (0..n as u64).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}
