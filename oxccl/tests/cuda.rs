//! Collectives on CUDA device memory (the `cuda` feature).
//!
//! Without a GPU (CI, most machines) only the first tests run: attaching
//! an engine fails with a typed error naming what is missing, and device
//! memory on a communicator without an engine for it fails the one call
//! that passed it, before anything is sent, leaving the communicator
//! usable. The device matrix needs a GPU: it skips without one, and fails
//! instead with `OXCCL_REQUIRE_GPU=1` (`scripts/gpu-check` sets it). Ranks
//! are threads sharing the one device, over shared memory and TCP.

mod common;
use common::*;
use oxccl::cuda::Cuda;
use oxccl::{DeviceKind, Error, Kind, MemorySpace, ReduceOp, Region};

/// Whether a GPU is here; panics when one is required but missing.
fn gpu() -> bool {
    let required = std::env::var("OXCCL_REQUIRE_GPU").as_deref() == Ok("1");
    match oxccl::cuda::probe() {
        Ok(()) => true,
        Err(e) if required => panic!("OXCCL_REQUIRE_GPU=1 but {e}"),
        Err(e) => {
            eprintln!("skipped (no GPU here): {e}");
            false
        }
    }
}

#[test]
fn without_a_driver_attaching_is_unsupported_and_says_what_is_missing() {
    if oxccl::cuda::probe().is_ok() {
        eprintln!("skipped: this machine has a driver");
        return;
    }
    with_ranks(1, test_config(), |comm| {
        match Cuda::attach(&comm, 0) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("libcuda") || m.contains("NVRTC"), "{m}")
            }
            other => panic!("attach without a driver: {other:?}"),
        }
        // The communicator is untouched.
        let mut x = [1.0f32; 4];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
    });
}

#[test]
fn device_memory_without_an_engine_fails_that_call_only() {
    with_ranks(2, test_config(), |comm| {
        if comm.rank() == 0 {
            // Never dereferenced: no engine reaches it, so nothing runs.
            let dev = Region {
                space: MemorySpace::Device {
                    kind: DeviceKind::Cuda,
                    ordinal: 0,
                },
                addr: 1 << 40,
                len: 64,
            };
            // SAFETY: the region is rejected before any memory is touched.
            let r = unsafe {
                comm.collective_regions(
                    Kind::AllReduce,
                    None,
                    dev,
                    oxccl::DataType::F32,
                    ReduceOp::Sum,
                    0,
                )
            };
            match r {
                Err(Error::Unsupported(m)) => assert!(m.contains("device 0"), "{m}"),
                other => panic!("device memory without an engine: {other:?}"),
            }
        }
        // Both ranks go on with the same next call.
        let mut x = [comm.rank() as f32 + 1.0; 3];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, [3.0; 3]);
    });
}

fn device_matrix(n: usize, mixed: bool) {
    if !gpu() {
        return;
    }
    let cfg = |r: usize| match mixed {
        true => host_config(r % 2),
        false => test_config(),
    };
    let counts = oxccl::selftest::standard_counts(n);
    for r in with_rank_configs(n, cfg, |comm| {
        let cuda = Cuda::attach(&comm, 0).map_err(|e| e.to_string())?;
        oxccl::selftest::run_device_matrix(&cuda, &counts)
    }) {
        r.unwrap();
    }
}

#[test]
fn device_matrix_1_rank() {
    device_matrix(1, false)
}

#[test]
fn device_matrix_2_ranks_shm() {
    device_matrix(2, false)
}

#[test]
fn device_matrix_4_ranks_mixed() {
    device_matrix(4, true)
}

#[test]
fn device_matrix_8_ranks_shm() {
    device_matrix(8, false)
}

/// The stream gate on its own: a held stream does not pass it until the
/// host opens it, and passes promptly once opened (the device polls a
/// word of pinned host memory).
#[test]
fn a_stream_gate_holds_a_stream_until_opened() {
    if !gpu() {
        return;
    }
    use oxccl::cuda::cudarc::driver::CudaContext;
    use oxccl::cuda::StreamGate;
    use std::time::{Duration, Instant};
    let ctx = CudaContext::new(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let gate = StreamGate::new(&ctx).unwrap();
    let value = gate.hold(&s).unwrap();
    let passed = s.record_event(None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(!passed.is_complete(), "the stream ran past a closed gate");
    gate.open(value);
    let t = Instant::now();
    while !passed.is_complete() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the stream did not pass the opened gate within 5 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "the stream passed the gate {:?} after it opened",
        t.elapsed()
    );
}

/// NCCL's stream semantics for queued calls: the call returns while the
/// caller's stream is still held back (by a gate the test opens), the
/// collective then runs after the stream's earlier work (the upload), and
/// work queued on the stream afterwards (the download) sees the result.
#[test]
fn a_queued_collective_returns_at_once_and_orders_with_the_stream() {
    if !gpu() {
        return;
    }
    use oxccl::cuda::cudarc::driver::DevicePtr;
    use oxccl::cuda::StreamGate;
    for r in with_ranks(2, test_config(), |comm| {
        let cuda = Cuda::attach(&comm, 0).map_err(|e| e.to_string())?;
        let ctx = cuda.context().clone();
        let s = ctx.new_stream().map_err(|e| e.to_string())?;
        let gate = StreamGate::new(&ctx).map_err(|e| e.to_string())?;
        let n = 1 << 20;
        // The upload comes from pinned memory: one from pageable memory
        // stages through the driver's buffers and waits for the stream,
        // which the gate holds (the test would deadlock itself).
        // SAFETY: every element is written before the copy reads it.
        let mut host = unsafe { ctx.alloc_pinned::<f32>(n) }.map_err(|e| e.to_string())?;
        for (i, x) in host
            .as_mut_slice()
            .map_err(|e| e.to_string())?
            .iter_mut()
            .enumerate()
        {
            *x = (i % 5) as f32 + comm.rank() as f32;
        }
        let mut buf = s.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
        let held = gate.hold(&s).map_err(|e| e.to_string())?;
        // Queued behind the gate: nothing of this has run yet.
        s.memcpy_htod(&host, &mut buf).map_err(|e| e.to_string())?;
        let ptr = buf.device_ptr(&s).0;
        // SAFETY: `buf` lives until the stream is synchronised below.
        let work = unsafe {
            cuda.enqueue_raw(
                Kind::AllReduce,
                None,
                (ptr, n * 4),
                oxccl::DataType::F32,
                ReduceOp::Sum,
                0,
                &s,
            )
        }
        .map_err(|e| e.to_string())?;
        std::thread::sleep(std::time::Duration::from_millis(200));
        if work.is_done() {
            return Err("the queued call completed while its stream was held".into());
        }
        gate.open(held);
        work.wait().map_err(|e| e.to_string())?;
        let got = s.clone_dtoh(&buf).map_err(|e| e.to_string())?;
        match (0..n).find(|&i| got[i] != 2.0 * (i % 5) as f32 + 1.0) {
            Some(i) => Err(format!("element {i}: {}", got[i])),
            None => Ok(()),
        }
    }) {
        r.unwrap();
    }
}

fn device_shared_matrix(n: usize) {
    if !gpu() {
        return;
    }
    let counts = [0, 1, 7, n + 1, 100_003];
    for r in with_ranks(n, test_config(), |comm| {
        let cuda = Cuda::attach(&comm, 0).map_err(|e| e.to_string())?;
        oxccl::selftest::run_device_shared_matrix(&cuda, &counts)
    }) {
        r.unwrap();
    }
}

/// Device memory every rank reaches directly: the direct algorithm on the
/// device engine over peers' memory (ranks as threads of one process here;
/// `oxccl-selftest cuda-shared` under oxrun does it across processes, with
/// CUDA IPC).
#[test]
fn device_shared_matrix_2_ranks() {
    device_shared_matrix(2)
}

#[test]
fn device_shared_matrix_4_ranks() {
    device_shared_matrix(4)
}
