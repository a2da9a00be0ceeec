//! Transport micro-benchmarks, per transport (TCP, shared memory): ping-pong
//! latency (8 B .. 64 KiB, half a round trip per iteration) and streaming
//! bandwidth (4 MiB messages one way), between two ranks (threads of this
//! process) over a real communicator on loopback.
//!
//! `cargo bench -p benches --bench transport`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxccl::{Communicator, Config, UniqueId};
use std::sync::mpsc::{channel, Sender};
use std::time::{Duration, Instant};

enum Job {
    Echo { bytes: usize, iters: u64 },
    Sink { bytes: usize, iters: u64 },
    Stop,
}

/// Rank 1 runs in a thread and follows the jobs rank 0 announces.
fn pair(transport: &str) -> (Communicator, Sender<Job>, std::thread::JoinHandle<()>) {
    let cfg = Config {
        socket_ifname: Some("lo".into()),
        transport: Some(transport.into()),
        ..Config::default()
    };
    let id = UniqueId::with_config(&cfg).unwrap();
    let (tx, rx) = channel::<Job>();
    let (id2, cfg2) = (id.clone(), cfg.clone());
    let peer = std::thread::spawn(move || {
        let c = Communicator::init_with_config(&id2, 1, 2, cfg2).unwrap();
        let mut buf = vec![0u8; 4 << 20];
        for job in rx {
            match job {
                Job::Echo { bytes, iters } => {
                    for _ in 0..iters {
                        c.recv(&mut buf[..bytes], 0).unwrap();
                        c.send(&buf[..bytes], 0).unwrap();
                    }
                }
                Job::Sink { bytes, iters } => {
                    for _ in 0..iters {
                        c.recv(&mut buf[..bytes], 0).unwrap();
                    }
                    c.send(&[1u8], 0).unwrap();
                }
                Job::Stop => return,
            }
        }
    });
    let c = Communicator::init_with_config(&id, 0, 2, cfg).unwrap();
    (c, tx, peer)
}

fn transports(c: &mut Criterion) {
    for t in ["tcp", "shm"] {
        let (comm, tx, peer) = pair(t);
        let mut buf = vec![1u8; 4 << 20];
        let mut g = c.benchmark_group(format!("{t}_pingpong"));
        g.measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(300))
            .sample_size(10);
        for bytes in [8usize, 1024, 65536] {
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, &bytes| {
                b.iter_custom(|iters| {
                    tx.send(Job::Echo { bytes, iters }).unwrap();
                    let t = Instant::now();
                    for _ in 0..iters {
                        comm.send(&buf[..bytes], 1).unwrap();
                        comm.recv(&mut buf[..bytes], 1).unwrap();
                    }
                    // Report one-way latency: half a round trip.
                    t.elapsed() / 2
                })
            });
        }
        g.finish();
        let mut g = c.benchmark_group(format!("{t}_stream"));
        g.measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(300))
            .sample_size(10);
        let bytes = 4 << 20;
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function("4MiB", |b| {
            b.iter_custom(|iters| {
                tx.send(Job::Sink { bytes, iters }).unwrap();
                let t = Instant::now();
                for _ in 0..iters {
                    comm.send(&buf[..bytes], 1).unwrap();
                }
                comm.recv(&mut buf[..1], 1).unwrap();
                t.elapsed()
            })
        });
        g.finish();
        tx.send(Job::Stop).unwrap();
        peer.join().unwrap();
    }
}

criterion_group!(benches, transports);
criterion_main!(benches);
