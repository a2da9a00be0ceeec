//! oxccl as a training framework uses it, in one file: four ranks as a 2x2
//! grid of tensor-parallel groups ({0, 1} and {2, 3}) and data-parallel
//! groups ({0, 2} and {1, 3}).
//!
//! Every step:
//! - **pipeline**: in each tensor-parallel pair, stage 0 sends stage 1 a
//!   shape header (`u32`) and the activations (`bf16`) in one group;
//! - **tensor parallel**: the pair all-reduces its partial outputs;
//! - **data parallel**: gradients live in the framework's own storage
//!   (`Bucket`, not a `Vec`), are all-reduced bucket by bucket as
//!   "backward" produces them (`all_reduce_async`), and are waited for with
//!   `wait_timeout` so that a stuck step is noticed;
//! - **logging**: the global loss is summed over the world.
//!
//! Every result is checked exactly. A watchdog thread asks every
//! communicator whether the job is failing (`async_error`) and aborts them
//! all when one is, so no wait outlives a failure. On failure each rank
//! prints which rank of the job (world rank) is to blame.
//!
//! ```text
//! oxrun -n 4 target/release/grid [--steps N] [--die RANK:STEP]
//! ```
//!
//! `--die 3:5` makes world rank 3 SIGKILL itself in step 5 (to see what the
//! survivors report).

use oxccl::{
    as_bytes, as_bytes_mut, bf16, Buffer, BufferMut, Communicator, Error, ReduceOp, Region,
};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Gradient elements per bucket, and buckets per step.
const BUCKET: usize = 1 << 16;
const BUCKETS: usize = 4;
/// Activations per pipeline message.
const ACTIVATIONS: usize = 4096;
/// How long one bucket may take before the step is declared stuck.
const STEP_LIMIT: Duration = Duration::from_secs(30);

/// The framework's own gradient storage: one flat allocation per bucket.
struct Bucket {
    data: Box<[f32]>,
}

// SAFETY: the region is exactly the bucket's own initialised, aligned
// elements, borrowed (or, for async calls, owned) with the bucket.
unsafe impl Buffer<f32> for Bucket {
    fn region(&self) -> Region {
        Region::host(as_bytes(&self.data))
    }
}

// SAFETY: as above; `&mut self` is exclusive.
unsafe impl BufferMut<f32> for Bucket {
    fn region_mut(&mut self) -> Region {
        Region::host_mut(as_bytes_mut(&mut self.data))
    }
}

/// The three communicators of this rank.
struct Grid {
    world: Communicator,
    tp: Communicator,
    dp: Communicator,
}

impl Grid {
    fn all(&self) -> [&Communicator; 3] {
        [&self.world, &self.tp, &self.dp]
    }
}

/// Set by SIGTERM (the launcher stopping the job): the watchdog aborts.
static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

struct Args {
    steps: u32,
    die: Option<(usize, u32)>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        steps: 20,
        die: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--steps" => a.steps = value.parse().map_err(|_| format!("--steps {value}"))?,
            "--die" => {
                let (r, s) = value
                    .split_once(':')
                    .ok_or(format!("--die {value}: RANK:STEP"))?;
                let bad = || format!("--die {value}: RANK:STEP");
                a.die = Some((r.parse().map_err(|_| bad())?, s.parse().map_err(|_| bad())?));
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    // An application's choices, not the library's: logs to stderr, and a
    // SIGTERM handler so a stopped job still reports why.
    oxccl::init_logging();
    // SAFETY: the handler only stores an atomic (async-signal-safe).
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("grid: {e}");
            return ExitCode::from(2);
        }
    };
    let world = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("grid: {e}");
            return ExitCode::from(2);
        }
    };
    let r = world.rank();
    if world.nranks() != 4 {
        eprintln!("grid: needs 4 ranks (oxrun -n 4), has {}", world.nranks());
        return ExitCode::from(2);
    }
    let groups = world
        .split((r / 2) as u32, r as i64)
        .and_then(|tp| Ok((tp, world.split((r % 2) as u32, r as i64)?)));
    let (tp, dp) = match groups {
        Ok(g) => g,
        Err(e) => {
            eprintln!("grid: splitting: {e}");
            return ExitCode::from(2);
        }
    };
    let grid = Arc::new(Grid { world, tp, dp });
    let failure: Arc<Mutex<Option<Error>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (grid, failure, done) = (grid.clone(), failure.clone(), done.clone());
        std::thread::spawn(move || watch(&grid, &failure, &done))
    };
    let result = train(&grid, &args, &failure);
    done.store(true, Ordering::SeqCst);
    let _ = watchdog.join();
    match result {
        Ok(loss) => {
            println!("OK world rank {r}: {} steps, last loss {loss}", args.steps);
            ExitCode::SUCCESS
        }
        Err(e) => {
            report(&grid, &failure, e);
            ExitCode::FAILURE
        }
    }
}

/// Every 20 ms: is any communicator failing? Then abort all of them, so
/// that whatever the training thread waits for returns at once.
fn watch(grid: &Grid, failure: &Mutex<Option<Error>>, done: &AtomicBool) {
    while !done.load(Ordering::SeqCst) {
        let found = grid.all().iter().find_map(|c| c.async_error());
        let terminated = TERMINATED.load(Ordering::SeqCst);
        if found.is_some() || terminated {
            if let Some(e) = found {
                failure.lock().unwrap().get_or_insert(e);
            }
            for c in grid.all() {
                c.abort();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Why this rank failed, in the job's numbering: the world communicator's
/// diagnosis when it has one (it sees every death), else the first error.
fn report(grid: &Grid, failure: &Mutex<Option<Error>>, first: Error) {
    let r = grid.world.world_rank();
    // The world's verdict may still be on its way from its root.
    let until = Instant::now() + Duration::from_secs(2);
    let mut cause = grid.world.async_error();
    while !cause
        .as_ref()
        .is_some_and(|e| e.blamed_world_rank().is_some())
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(20));
        cause = grid.world.async_error();
    }
    let cause = cause
        .filter(|e| e.blamed_world_rank().is_some())
        .or_else(|| failure.lock().unwrap().clone())
        .unwrap_or_else(|| first.clone());
    let blamed = cause
        .blamed_world_rank()
        .map_or("none".to_string(), |w| w.to_string());
    println!("FAILED world rank {r}: blamed world rank {blamed}: {cause}");
    println!("FIRST world rank {r}: {first}");
}

fn train(grid: &Grid, args: &Args, failure: &Mutex<Option<Error>>) -> Result<f64, Error> {
    let (world, tp, dp) = (&grid.world, &grid.tp, &grid.dp);
    let me = world.world_rank();
    let mut loss = 0.0;
    for step in 0..args.steps {
        if args.die == Some((me, step)) {
            // SAFETY: signalling this process itself.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        pipeline(tp, step)?;
        tensor_parallel(tp, step)?;
        data_parallel(dp, step, failure)?;
        // The global loss: each rank contributes its world rank + step.
        let mut l = [me as f64 + step as f64];
        world.all_reduce_in_place(&mut l, ReduceOp::Sum)?;
        check(l[0] == 6.0 + 4.0 * step as f64, "the world's loss sum")?;
        loss = l[0];
    }
    Ok(loss)
}

fn check(ok: bool, what: &str) -> Result<(), Error> {
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(format!("wrong result: {what}"))),
    }
}

/// Stage 0 sends stage 1 a header and bf16 activations, in one group.
fn pipeline(tp: &Communicator, step: u32) -> Result<(), Error> {
    let value = |i: usize| bf16::from_f32(((i + step as usize) % 256) as f32);
    if tp.rank() == 0 {
        let header = [step, ACTIVATIONS as u32];
        let acts: Vec<bf16> = (0..ACTIVATIONS).map(value).collect();
        tp.group(|g| {
            g.send(&header, 1)?;
            g.send(&acts, 1)
        })
    } else {
        let mut header = [0u32; 2];
        let mut acts = vec![bf16::ZERO; ACTIVATIONS];
        tp.group(|g| {
            g.recv(&mut header, 0)?;
            g.recv(&mut acts, 0)
        })?;
        check(header == [step, ACTIVATIONS as u32], "the pipeline header")?;
        check(
            acts.iter().enumerate().all(|(i, a)| *a == value(i)),
            "the pipeline activations",
        )
    }
}

/// The pair sums its partial outputs.
fn tensor_parallel(tp: &Communicator, step: u32) -> Result<(), Error> {
    let mut partial = vec![(tp.rank() + 1) as f32 * step as f32; 1024];
    tp.all_reduce_in_place(&mut partial, ReduceOp::Sum)?;
    check(
        partial.iter().all(|p| *p == 3.0 * step as f32),
        "the tensor-parallel sum",
    )
}

/// Gradient buckets are averaged as they become ready; the step waits for
/// each with a bound, giving up (and aborting) if the job is failing.
fn data_parallel(
    dp: &Communicator,
    step: u32,
    failure: &Mutex<Option<Error>>,
) -> Result<(), Error> {
    let grad = |b: usize| (dp.world_rank() * 10 + b) as f32 + step as f32;
    let pending: Vec<_> = (0..BUCKETS)
        .map(|b| {
            let bucket = Bucket {
                data: vec![grad(b); BUCKET].into_boxed_slice(),
            };
            dp.all_reduce_async(bucket, ReduceOp::Avg)
        })
        .collect();
    for (b, work) in pending.into_iter().enumerate() {
        let started = Instant::now();
        while !work.wait_timeout(Duration::from_millis(100)) {
            if let Some(e) = failure.lock().unwrap().clone() {
                dp.abort();
                return Err(e);
            }
            if started.elapsed() > STEP_LIMIT {
                dp.abort();
                return Err(Error::invalid(format!(
                    "bucket {b} of step {step} is stuck"
                )));
            }
        }
        let bucket = work.wait()?;
        // The partners' world ranks differ by 2: the mean is mine +- 10.
        let mean = (dp.world_ranks().iter().sum::<usize>() * 10 / 2 + b) as f32 + step as f32;
        check(
            bucket.len() == BUCKET && bucket.data.iter().all(|g| *g == mean),
            "a data-parallel bucket",
        )?;
    }
    Ok(())
}
