//! `oxccl-selftest`: checks and measurements to run under a launcher.
//!
//! ```text
//! oxrun -n 4 oxccl-selftest matrix              # every collective x dtype x op, exact
//! oxrun -n 2 oxccl-selftest allreduce 64M 20    # time an all_reduce of f32
//! oxrun -n 4 oxccl-selftest init                # time communicator creation
//! oxrun -n 4 oxccl-selftest loop 16M            # all_reduce until an error (fault tests)
//! oxrun -n 4 oxccl-selftest die 2               # rank 2 SIGKILLs itself mid-job
//! oxrun -n 4 oxccl-selftest fail 2              # rank 2 aborts and exits 5 mid-job
//! (direct) oxccl-selftest fault all_gather 16M 1 mid  # fault injection, see tests/faults.rs
//! oxrun -n 4 oxccl-selftest small 10000         # many tiny all_reduces, each checked
//! oxrun -n 2 oxccl-selftest registered-memory 4M # all_reduce from register_memory'd Vecs
//! oxrun -n 3 oxccl-selftest registered 1M direct  # the matrix on alloc_shared buffers
//!   (`direct`: every call runs `direct`; `direct-from=16K`: calls of 16 KiB and up; `messages`: none)
//! oxrun -n 5 oxccl-selftest soak 20000 7        # random calls (seed 7), each checked
//! oxrun -n 4 oxccl-selftest cuda-matrix         # the matrix on device memory (cuda feature)
//! oxrun -n 4 oxccl-selftest cuda-shared 64K    # the same on CUDA IPC buffers (direct)
//! oxrun -n 4 oxccl-selftest cuda-loop 16M       # device all_reduce until an error
//! ```

use oxccl::prelude::*;
use oxccl::selftest::{run_matrix, standard_counts};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("oxccl-selftest: {e}");
    std::process::exit(1);
}

/// Creation failed: reported as the loops report a failed call (`ERROR
/// <rank> <ms> <blamed> <kind>`, `DETAIL`), so a harness sees the culprit
/// a survivor names whether the death struck during creation or a call.
/// (A fast rank can leave creation's last exchange, run a few calls and
/// die while a slower one has not yet seen that exchange complete.)
fn failed_creation(e: oxccl::Error) -> ! {
    let rank = [
        "OXCCL_RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok());
    if let Some(rank) = rank {
        report_failed(rank, &e);
    }
    fail(e)
}

/// `ERROR <rank> <ms> <blamed> <kind>` and `DETAIL <rank> <error>`: how a
/// failed call (or creation) is reported to the harnesses.
fn report_failed(rank: usize, e: &oxccl::Error) {
    println!(
        "ERROR {rank} {} {} {}",
        epoch_ms(),
        e.blamed_rank().map_or(-1, |r| r as i64),
        error_kind(e)
    );
    println!("DETAIL {rank} {e}");
}

fn error_kind(e: &oxccl::Error) -> &'static str {
    match e {
        oxccl::Error::PeerLost { .. } => "PeerLost",
        oxccl::Error::Timeout { .. } => "Timeout",
        oxccl::Error::Mismatch { .. } => "Mismatch",
        oxccl::Error::Aborted { .. } => "Aborted",
        oxccl::Error::Remote { .. } => "Remote",
        _ => "Other",
    }
}

fn bytes_arg(a: Option<&String>, default: usize) -> usize {
    a.map(|s| oxccl::parse_bytes(s).unwrap_or_else(|| fail(format!("bad size {s:?}"))))
        .unwrap_or(default)
}

/// The device modes: ranks share the host's GPUs round robin by local rank.
#[cfg(feature = "cuda")]
fn cuda_mode(comm: &Communicator, mode: &str, args: &[String]) {
    use oxccl::cuda::cudarc::driver::CudaContext;
    let (rank, n) = (comm.rank(), comm.nranks());
    oxccl::cuda::probe().unwrap_or_else(|e| fail(e));
    let devices = CudaContext::device_count()
        .unwrap_or_else(|e| fail(e))
        .max(1) as usize;
    let local = oxccl::launch_env()
        .ok()
        .and_then(|e| e.local_rank)
        .unwrap_or(rank);
    let cuda = oxccl::cuda::Cuda::attach(comm, local % devices).unwrap_or_else(|e| fail(e));
    if mode == "cuda-matrix" || mode == "cuda-shared" {
        let counts = match args.get(1) {
            Some(s) => vec![0, 1, 7, n - 1, n + 1, bytes_arg(Some(s), 0)],
            None => standard_counts(n),
        };
        let t = Instant::now();
        match mode {
            "cuda-matrix" => oxccl::selftest::run_device_matrix(&cuda, &counts),
            _ => oxccl::selftest::run_device_shared_matrix(&cuda, &counts),
        }
        .unwrap_or_else(|e| fail(e));
        if rank == 0 {
            println!(
                "{mode} OK: {n} ranks on {devices} device(s), counts {counts:?}, every collective x dtype x op, in and out of place, in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        return;
    }
    // cuda-loop: device all_reduce until an error (the fault check).
    let count = bytes_arg(args.get(1), 16 << 20) / 4;
    let stream = cuda.context().new_stream().unwrap_or_else(|e| fail(e));
    let mut buf = stream
        .clone_htod(&vec![1.0f32; count])
        .unwrap_or_else(|e| fail(e));
    println!("READY {rank} {} {}", epoch_ms(), std::process::id());
    let mut i = 0u64;
    loop {
        if let Err(e) = cuda.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream) {
            println!(
                "ERROR {rank} {} {}",
                epoch_ms(),
                e.blamed_rank().map_or(-1, |r| r as i64)
            );
            println!("DETAIL {rank} {e:?}");
            std::process::exit(3);
        }
        i += 1;
        if i == 1 {
            println!("RUNNING {rank} {}", epoch_ms());
        }
    }
}

fn main() {
    oxccl::init_logging();
    if let Err(e) = oxccl::dump_flight_on_sigusr1() {
        eprintln!("oxccl-selftest: {e}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("matrix");
    let t0 = Instant::now();
    let comm = Communicator::from_env().unwrap_or_else(|e| failed_creation(e));
    let init_s = t0.elapsed().as_secs_f64();
    let (rank, n) = (comm.rank(), comm.nranks());
    match mode {
        "matrix" => {
            let counts = match args.get(1) {
                Some(s) => vec![0, 1, 7, n - 1, n + 1, bytes_arg(Some(s), 0)],
                None => standard_counts(n),
            };
            match run_matrix(&comm, &counts) {
                Ok(()) => {
                    if rank == 0 {
                        println!("matrix OK: {n} ranks, counts {counts:?}, every collective x dtype x op, in and out of place");
                    }
                }
                Err(e) => fail(e),
            }
        }
        "init" => {
            let mut t = [init_s];
            comm.all_reduce_in_place(&mut t, ReduceOp::Max)
                .unwrap_or_else(|e| fail(e));
            if rank == 0 {
                println!("init of {n} ranks: slowest rank {:.1} ms", t[0] * 1e3);
            }
        }
        "allreduce" => {
            let bytes = bytes_arg(args.get(1), 64 << 20);
            let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
            let count = bytes / 4;
            let mut buf = vec![1.0f32; count];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .unwrap_or_else(|e| fail(e)); // warm-up
            comm.barrier().unwrap_or_else(|e| fail(e));
            let t = Instant::now();
            for _ in 0..iters {
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .unwrap_or_else(|e| fail(e));
            }
            let mut dt = [t.elapsed().as_secs_f64() / iters as f64];
            comm.all_reduce_in_place(&mut dt, ReduceOp::Max)
                .unwrap_or_else(|e| fail(e));
            if rank == 0 {
                let algbw = (count * 4) as f64 / dt[0] / 1e9;
                let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
                println!(
                    "all_reduce f32 sum: {} bytes, {n} ranks, {iters} iters: {:.3} ms, algbw {algbw:.2} GB/s, busbw {busbw:.2} GB/s",
                    count * 4,
                    dt[0] * 1e3
                );
            }
        }
        "registered" => {
            // The matrix on alloc_shared buffers; `direct` (default) or
            // `messages` says which the transport must give.
            let big = bytes_arg(args.get(1), 1 << 20) / 4;
            use oxccl::selftest::DirectFrom;
            let want = match args.get(2).map(String::as_str) {
                None | Some("direct") => DirectFrom::Bytes(0),
                Some("messages") => DirectFrom::Never,
                Some(x) => match x.strip_prefix("direct-from=") {
                    Some(b) => DirectFrom::Bytes(bytes_arg(Some(&b.to_string()), 0)),
                    None => fail(format!(
                        "expected `direct`, `direct-from=BYTES` or `messages`, not {x:?}"
                    )),
                },
            };
            let t = Instant::now();
            oxccl::selftest::run_registered(&comm, want, big).unwrap_or_else(|e| fail(e));
            if rank == 0 {
                println!(
                    "registered OK: {n} ranks, direct {want:?}, every direct collective x dtype x op, in and out of place, up to {big} elements, in {:.1} s",
                    t.elapsed().as_secs_f64()
                );
            }
        }
        "registered-mismatch" => {
            // Rank 1 passes another registered buffer than the others (large
            // enough to run `direct` on every transport that reaches it):
            // every rank must report a mismatch naming both.
            let mut a = comm
                .alloc_shared::<f32>(1 << 16)
                .unwrap_or_else(|e| fail(e));
            let mut b = comm
                .alloc_shared::<f32>(1 << 16)
                .unwrap_or_else(|e| fail(e));
            let buf = if rank == 1 { &mut b } else { &mut a };
            match comm.all_reduce_in_place(buf, ReduceOp::Sum) {
                Err(e @ oxccl::Error::Mismatch { .. })
                    if e.to_string().contains("registered buffers") =>
                {
                    println!("MISMATCH {rank}: {e}")
                }
                Err(e) => fail(format!("expected a mismatch naming the buffers, got {e}")),
                Ok(()) => fail("different registered buffers were not noticed"),
            }
        }
        "registered-memory" => {
            // Plain Vecs registered with `register_memory` (zero-copy sends
            // where a transport supports it), all_reduce checked exactly.
            let count = bytes_arg(args.get(1), 4 << 20) / 4;
            let mut a: Vec<f32> = (0..count).map(|i| ((i % 7) + rank) as f32).collect();
            let mut out = vec![0f32; count];
            // SAFETY: `a` and `out` outlive both registrations (declared
            // after them, so dropped first).
            let (ra, _rb) = unsafe {
                (
                    comm.register_memory(&a).unwrap_or_else(|e| fail(e)),
                    comm.register_memory(&out).unwrap_or_else(|e| fail(e)),
                )
            };
            if ra.is_active() {
                // SAFETY: as above; this registration is refused anyway.
                match unsafe { comm.register_memory(&a[1..]) } {
                    Err(oxccl::Error::InvalidArgument(_)) => {}
                    Err(e) => fail(format!("overlapping registration: {e}")),
                    Ok(_) => fail("an overlapping registration was accepted"),
                }
            }
            let base = (n * (n - 1) / 2) as f32;
            let want = |i: usize| (n * (i % 7)) as f32 + base;
            for _ in 0..3 {
                comm.all_reduce(&a, &mut out, ReduceOp::Sum)
                    .unwrap_or_else(|e| fail(e));
                if let Some(i) = (0..count).find(|&i| out[i] != want(i)) {
                    fail(format!("element {i}: {} instead of {}", out[i], want(i)));
                }
            }
            comm.all_reduce_in_place(&mut a, ReduceOp::Sum)
                .unwrap_or_else(|e| fail(e));
            if let Some(i) = (0..count).find(|&i| a[i] != want(i)) {
                fail(format!(
                    "in place, element {i}: {} instead of {}",
                    a[i],
                    want(i)
                ));
            }
            if rank == 0 {
                println!(
                    "registered-memory OK: {count} floats on {n} ranks, registration active: {}",
                    ra.is_active()
                );
            }
        }
        "loop" | "loop-registered" => {
            // all_reduce until an error; `loop-registered` uses the
            // zero-copy path on registered buffers.
            let bytes = bytes_arg(args.get(1), 16 << 20);
            let registered = mode == "loop-registered";
            let mut buf = vec![1.0f32; bytes / 4];
            let mut shared = if registered {
                Some(
                    comm.alloc_shared::<f32>(bytes / 4)
                        .unwrap_or_else(|e| fail(e)),
                )
            } else {
                None
            };
            println!("READY {rank} {}", epoch_ms());
            let mut i = 0u64;
            loop {
                let r = match shared.as_mut() {
                    Some(s) => comm.all_reduce_in_place(s, ReduceOp::Sum),
                    None => comm.all_reduce_in_place(&mut buf, ReduceOp::Sum),
                };
                if let Err(e) = r {
                    println!(
                        "ERROR {rank} {} {}",
                        epoch_ms(),
                        e.blamed_rank().map_or(-1, |r| r as i64)
                    );
                    println!("DETAIL {rank} {e:?}");
                    std::process::exit(3);
                }
                i += 1;
                if i == 1 {
                    println!("RUNNING {rank} {}", epoch_ms());
                }
            }
        }
        "shrink" => {
            // all_reduce until a peer is lost, then shrink it away and
            // check the survivors' communicator: each adds its world rank
            // plus one, so the sum names exactly who is in it.
            let bytes = bytes_arg(args.get(1), 16 << 20);
            let mut buf = vec![1.0f32; bytes / 4];
            println!("READY {rank} {}", epoch_ms());
            let mut i = 0u64;
            let e = loop {
                if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
                    break e;
                }
                i += 1;
                if i == 1 {
                    println!("RUNNING {rank} {}", epoch_ms());
                }
            };
            let Some(dead) = e.blamed_rank() else {
                println!("DETAIL {rank} {e:?}");
                std::process::exit(3);
            };
            println!("EXCLUDING {rank} {dead}");
            println!("DETAIL {rank} {e:?}");
            let small = comm.shrink(&[dead]).unwrap_or_else(|e| fail(e));
            let mut v = vec![small.world_rank() as f64 + 1.0; 1 << 16];
            small
                .all_reduce_in_place(&mut v, ReduceOp::Sum)
                .unwrap_or_else(|e| fail(e));
            if v.iter().any(|x| *x != v[0]) {
                fail(oxccl::Error::invalid(
                    "shrunk all_reduce differs across elements",
                ));
            }
            println!(
                "SHRUNK {rank} {} {} {} {}",
                small.rank(),
                small.nranks(),
                dead,
                v[0]
            );
        }
        #[cfg(feature = "cuda")]
        "cuda-matrix" | "cuda-shared" | "cuda-loop" => cuda_mode(&comm, mode, &args),
        "soak" => {
            // Random calls, every result checked (same seed on every rank).
            let calls: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
            let seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
            let t = Instant::now();
            match oxccl::selftest::soak(&comm, seed, calls, 1 << 20) {
                Ok(k) if rank == 0 => println!(
                    "soak OK: {k} random calls on {n} ranks in {:.1} s",
                    t.elapsed().as_secs_f64()
                ),
                Ok(_) => {}
                Err(e) => fail(e),
            }
        }
        "small" => {
            // Many tiny all_reduces, each checked: catches lost wake-ups and
            // stalls when ranks outnumber cores.
            let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
            let t = Instant::now();
            for i in 0..iters {
                let mut v = [(rank + i) as f32, 1.0];
                comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
                    .unwrap_or_else(|e| fail(e));
                let want = (0..n).map(|r| (r + i) as f32).sum::<f32>();
                if v != [want, n as f32] {
                    fail(format!("all_reduce #{i}: got {v:?}, want [{want}, {n}]"));
                }
            }
            if rank == 0 {
                let dt = t.elapsed().as_secs_f64();
                println!("small OK: {iters} all_reduces of 8 bytes on {n} ranks in {dt:.3} s ({:.1} us each)", dt * 1e6 / iters as f64);
            }
        }
        "fault" => {
            // Fault injection: loop KIND on BYTES; rank VICTIM dies (SIGKILL)
            // either just before its 4th call ("early": the others are inside
            // it, waiting) or 5 ms into it ("mid": data is flowing).
            let kind = args
                .get(1)
                .map(String::as_str)
                .unwrap_or("all_reduce")
                .to_string();
            let bytes = bytes_arg(args.get(2), 16 << 20);
            let victim: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(n - 1);
            let mid = args.get(4).map(String::as_str) == Some("mid");
            let count = bytes / 4;
            let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
            let mut a = vec![1.0f32; count];
            let mut b = vec![0.0f32; count];
            let mut gathered = vec![0.0f32; count * n];
            // A registered buffer (collective: allocated by every rank).
            let mut shared = if kind == "registered_all_reduce" {
                Some(comm.alloc_shared::<f32>(count).unwrap_or_else(|e| fail(e)))
            } else {
                None
            };
            let die = move || {
                println!("DYING {rank} {}", epoch_ms());
                let _ = std::io::Write::flush(&mut std::io::stdout());
                // SAFETY: raising a signal on ourselves.
                unsafe { libc::raise(libc::SIGKILL) };
            };
            for i in 0.. {
                if rank == victim && i == 3 {
                    if mid {
                        std::thread::spawn(move || {
                            std::thread::sleep(std::time::Duration::from_millis(5));
                            die();
                        });
                    } else {
                        die();
                    }
                }
                let r = match kind.as_str() {
                    "all_reduce" => comm.all_reduce_in_place(&mut a, ReduceOp::Sum),
                    "all_gather" => {
                        comm.all_gather(&a[..count / n], &mut gathered[..count / n * n])
                    }
                    "reduce_scatter" => {
                        comm.reduce_scatter(&a[..count / n * n], &mut b[..count / n], ReduceOp::Sum)
                    }
                    "broadcast" => comm.broadcast_in_place(&mut a, 0),
                    "reduce" => comm.reduce_in_place(&mut a, ReduceOp::Sum, 0),
                    "all_to_all" => comm.all_to_all(&a[..count / n * n], &mut b[..count / n * n]),
                    "registered_all_reduce" => {
                        comm.all_reduce_in_place(shared.as_mut().unwrap(), ReduceOp::Sum)
                    }
                    "send_recv" => comm.send_recv(&a, next, &mut b, prev),
                    other => fail(format!("unknown kind {other}")),
                };
                if let Err(e) = r {
                    report_failed(rank, &e);
                    std::process::exit(3);
                }
            }
        }
        "astray" => {
            // Two faults at call AT of an all_reduce loop on BYTES: rank
            // STALLER stops itself (SIGSTOP: alive, silent) and rank STRAYER
            // calls all_gather instead. What `oxccl-trace why` must untangle
            // from the survivors' flight dumps (tests/flight.rs).
            let bytes = bytes_arg(args.get(1), 4096);
            let staller: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
            let strayer: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
            let at: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(20);
            let count = (bytes / 4).max(n);
            let mut a = vec![1.0f32; count];
            let mut gathered = vec![0.0f32; count / n * n];
            for i in 0.. {
                if i == 1 {
                    println!("RUNNING {rank} {}", epoch_ms());
                }
                if i == at && rank == staller {
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                    // SAFETY: raising a signal on ourselves.
                    unsafe { libc::raise(libc::SIGSTOP) };
                }
                let r = match i == at && rank == strayer {
                    true => comm.all_gather(&a[..count / n], &mut gathered),
                    false => comm.all_reduce_in_place(&mut a, ReduceOp::Max),
                };
                if let Err(e) = r {
                    report_failed(rank, &e);
                    std::process::exit(3);
                }
            }
        }
        "die" => {
            // Rank VICTIM kills itself (SIGKILL) after a few all_reduces:
            // exercises the launcher's and the survivors' failure handling.
            let victim: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(n - 1);
            let mut buf = vec![1.0f32; 1 << 20];
            for i in 0.. {
                if rank == victim && i == 3 {
                    // SAFETY: raising a signal on ourselves.
                    unsafe { libc::raise(libc::SIGKILL) };
                }
                if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
                    println!(
                        "ERROR {rank} {} {}",
                        epoch_ms(),
                        e.blamed_rank().map_or(-1, |r| r as i64)
                    );
                    std::process::exit(3);
                }
            }
        }
        "fail" => {
            // Rank VICTIM fails on purpose after a few all_reduces: it
            // aborts the communicator and exits with status 5 (the others
            // fail in reaction, exit 3, within the same moment): a
            // launcher must name VICTIM, not the first process it reaps.
            let victim: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(n - 1);
            let mut buf = vec![1.0f32; 1 << 10];
            for i in 0.. {
                if rank == victim && i == 3 {
                    comm.abort();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    std::process::exit(5);
                }
                if comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).is_err() {
                    std::process::exit(3);
                }
            }
        }
        other => fail(format!(
            "unknown mode {other:?} (matrix, init, allreduce, loop, die, fail)"
        )),
    }
}
