//! GB/s of `dst += src` per dtype and size, beside a plain memcpy of the same
//! bytes. Throughput counts the bytes of one operand (as nccl-tests counts
//! message size); the loop itself reads 2x and writes 1x that.
//!
//! `cargo bench -p kernels --bench reduce` (add `-- 64MiB` to filter).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kernels::{bf16, f16, reduce_assign, Op, Scalar};
use std::time::Duration;

const SIZES: [usize; 5] = [4 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20];

fn label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{}KiB", bytes >> 10)
    }
}

fn bench_sum<T: Scalar>(c: &mut Criterion, name: &str, one: T) {
    let mut g = c.benchmark_group(format!("sum_{name}"));
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(10);
    for bytes in SIZES {
        let n = bytes / std::mem::size_of::<T>();
        let src = vec![one; n];
        let mut dst = vec![T::default(); n];
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(label(bytes)), &bytes, |b, _| {
            b.iter(|| reduce_assign(Op::Sum, black_box(&mut dst), black_box(&src)))
        });
    }
    g.finish();
}

fn bench_memcpy(c: &mut Criterion) {
    let mut g = c.benchmark_group("memcpy");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(10);
    for bytes in SIZES {
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes];
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(label(bytes)), &bytes, |b, _| {
            b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
    }
    g.finish();
}

/// memcpy of the same sizes split over two threads: the machine's memory
/// bandwidth when both cores copy (what two ranks on this host share).
fn bench_memcpy_2threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("memcpy_2threads");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(10);
    for bytes in SIZES {
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes];
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(label(bytes)), &bytes, |b, _| {
            b.iter(|| {
                let (d0, d1) = dst.split_at_mut(bytes / 2);
                let (s0, s1) = src.split_at(bytes / 2);
                std::thread::scope(|s| {
                    s.spawn(|| black_box(d1).copy_from_slice(black_box(s1)));
                    black_box(d0).copy_from_slice(black_box(s0));
                });
            })
        });
    }
    g.finish();
}

fn all(c: &mut Criterion) {
    bench_memcpy(c);
    bench_memcpy_2threads(c);
    bench_sum(c, "f32", 1f32);
    bench_sum(c, "bf16", bf16::ONE);
    bench_sum(c, "f16", f16::ONE);
    bench_sum(c, "i32", 1i32);
}

criterion_group!(benches, all);
criterion_main!(benches);
