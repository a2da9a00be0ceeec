//! What the always-on flight recorder costs per call, and what a traced
//! step costs (`OXCCL_TRACE`). The recorder: the record a call
//! writes when it starts and when it ends (a call that went to sleep also
//! names its peers and reads the clock at its end; that is the slow path
//! and not measured here). Compare with the latency of a small all_reduce
//! (docs/PERFORMANCE.md, "The flight recorder's cost").
//!
//! `cargo bench -p comm-core --bench flight`

use comm_core::call::{Fingerprint, Kind};
use comm_core::flight::FlightRecorder;
use comm_core::sys::Stamp;
use comm_core::trace::{StepKind, Tracer};
use comm_core::{DataType, ReduceOp};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let fp = Fingerprint::new(Kind::AllReduce, DataType::F32, 2).with_op(ReduceOp::Sum);
    let mut g = c.benchmark_group("flight_recorder");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    let rec = FlightRecorder::new(256);
    let t = Stamp::now();
    let mut seq = 0u64;
    g.bench_function("start_and_end_per_call", |b| {
        b.iter(|| {
            rec.start(black_box(seq), black_box(fp), 1, t, t);
            rec.end(black_box(seq), Ok(()));
            seq += 1;
        })
    });
    let off = FlightRecorder::new(0);
    g.bench_function("off_per_call", |b| {
        b.iter(|| {
            off.start(black_box(seq), black_box(fp), 1, t, t);
            off.end(black_box(seq), Ok(()));
            seq += 1;
        })
    });
    // A trace's step slice: the start stamp, the end stamp and the push
    // into its ring (what each step of a traced call costs); into a small
    // ring, and into one of the default size, which the loop cycles
    // through out of cache (as a long traced run does).
    let dir = std::env::temp_dir().join("oxccl-bench-trace-unused");
    for (name, max) in [
        ("trace_step_slice", 1 << 16),
        (
            "trace_step_slice_default_ring",
            comm_core::trace::DEFAULT_MAX_EVENTS,
        ),
    ] {
        let tracer = Tracer::new(dir.clone(), max);
        g.bench_function(name, |b| {
            b.iter(|| {
                let start = tracer.now();
                tracer.step(
                    StepKind::Send,
                    black_box(3),
                    Some((1, true)),
                    1 << 20,
                    start,
                );
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
