//! What the always-on mismatch check costs per message: building the
//! 48-byte header with the call's fingerprint on the sending side, and
//! parsing and comparing it on the receiving side (the sequence number and
//! fingerprint compare is the check; the rest frames the message anyway).
//! Compare with the latency of a small all_reduce (docs/PERFORMANCE.md).
//!
//! `cargo bench -p comm-core --bench fingerprint`

use comm_core::call::{Fingerprint, Kind};
use comm_core::executor::{WireHeader, HEADER_LEN};
use comm_core::{DataType, ReduceOp};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::time::Duration;

fn header(fp: &Fingerprint, seq: u64, msg: u32, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(b"OXM1");
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&msg.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    h[32..48].copy_from_slice(&fp.encode());
    h
}

fn bench(c: &mut Criterion) {
    let fp = Fingerprint::new(Kind::AllReduce, DataType::F32, 2).with_op(ReduceOp::Sum);
    let mut g = c.benchmark_group("message_check");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    g.bench_function("framing_only", |b| {
        b.iter(|| {
            let mut h = [0u8; HEADER_LEN];
            h[..4].copy_from_slice(b"OXM1");
            h[24..32].copy_from_slice(&black_box(8u64).to_le_bytes());
            let len = u64::from_le_bytes(h[24..32].try_into().unwrap());
            black_box(&h[..4] == b"OXM1" && len == 8)
        })
    });
    g.bench_function("framing_and_call_check", |b| {
        b.iter(|| {
            let h = header(black_box(&fp), black_box(7), 0, 8);
            let w = WireHeader::parse(&h).unwrap();
            black_box(w.seq == 7 && w.len == 8 && w.fp.is_some_and(|f| f.agrees_with(&fp)))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
