//! `benches`: the `*_perf` benchmark family, compatible with NVIDIA's
//! nccl-tests (flags, defaults, output format, bus-bandwidth factors), run
//! on host memory, and going further: `--np N` launches its own local
//! ranks, `--plot` draws SVG, `-J` and `--csv` write machine-readable
//! results.
//!
//! Every binary is a thin `main` over [`main`] with its [`Coll`]. Output
//! comes from rank 0 only, in nccl-tests' exact layout, so scripts that
//! parse nccl-tests parse ours ([`parse`] is such a parser). The exit
//! status is non-zero when any element of any checked result is wrong.

pub mod args;
pub mod breakdown;
pub mod coll;
#[cfg(feature = "cuda")]
mod device;
pub mod parse;
pub mod plot;
pub mod report;

pub use args::Args;
pub use coll::Coll;

use oxccl::launch::{self, Bind, Launch, Output};
use oxccl::selftest::TestElem;
use oxccl::{with_dtype, Communicator, Config, DataType, ReduceOp, UniqueId};
use report::{Measure, Row};
use std::time::{Duration, Instant};

/// Run benchmark `coll` with this process's arguments; returns the exit code.
pub fn main(coll: Coll) -> i32 {
    oxccl::init_logging();
    if let Err(e) = oxccl::dump_flight_on_sigusr1() {
        eprintln!("{}: {e}", coll.program());
    }
    let argv: Vec<String> = std::env::args().collect();
    let args = match Args::parse(argv[1..].iter().cloned()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    if let Some(np) = args.np {
        if !launch::under_launcher() {
            let exe = std::env::current_exe()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| argv[0].clone());
            return launch::run(&Launch {
                nranks: np,
                program: exe,
                args: argv[1..].to_vec(),
                output: Output::Rank0,
                kill_after: Duration::from_secs(3),
                env: Vec::new(),
                max_restarts: 0,
                // A core per rank only where a process is one rank on host
                // memory: `-t`/`-g` ranks are threads of one process, and a
                // device rank's driver runs threads of its own.
                bind: match args.bind_cores
                    && args.nthreads * args.ngpus == 1
                    && args.mem == args::Mem::Host
                {
                    true => Bind::Cores,
                    false => Bind::None,
                },
            });
        }
    }
    if args.registered && coll == Coll::SendRecv {
        eprintln!(
            "{}: --registered (zero-copy registered buffers) is implemented for every collective, not for sendrecv_perf",
            coll.program()
        );
        return 2;
    }
    let job = match Job::new(&args) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("{}: {e}", coll.program());
            return 1;
        }
    };
    // One rank per thread (`-t`, `-g`); the exit code is the worst.
    let rank = |i: usize| -> i32 {
        let comm = match job.connect(i) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{}: {e}", coll.program());
                return 1;
            }
        };
        match run(coll, &args, &argv, &comm, job.local(i)) {
            Ok(0) => 0,
            Ok(_) => 1,
            Err(e) => {
                eprintln!("{}: rank {}: {e}", coll.program(), comm.rank());
                1
            }
        }
    };
    match args.ranks_per_process() {
        1 => rank(0),
        n => std::thread::scope(|s| {
            let threads: Vec<_> = (0..n).map(|i| s.spawn(move || rank(i))).collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or(1))
                .max()
                .unwrap_or(0)
        }),
    }
}

/// Where this process's ranks join: the launcher's job (its ranks times
/// the ranks per process), or a job of this process alone.
struct Job {
    cfg: Config,
    per_process: usize,
    joins: Joins,
}

/// How a job's ranks find each other.
enum Joins {
    /// Under a launcher: its rank, rank count, local rank and root.
    Launched(oxccl::LaunchEnv),
    /// Alone: the id its ranks share.
    Alone(UniqueId),
}

impl Job {
    fn new(args: &Args) -> oxccl::Result<Job> {
        let mut cfg = Config::from_env()?;
        if args.timeout > 0.0 {
            cfg.timeout = Duration::from_secs_f64(args.timeout);
        }
        if let Some(t) = &args.transport {
            cfg.transport = Some(t.clone());
        }
        if let Some(a) = &args.algo {
            cfg.algo = Some(a.clone());
        }
        if let Some(t) = &args.trace {
            cfg.trace_dir = Some(t.into());
        } else if args.verbose {
            let pid = std::process::id();
            cfg.trace_dir = Some(std::env::temp_dir().join(format!("oxccl-perf-v-{pid}")));
        }
        let joins = match launch::under_launcher() {
            true => Joins::Launched(oxccl::launch_env()?),
            false => {
                if cfg.socket_ifname.is_none() {
                    cfg.socket_ifname = Some("lo".into());
                }
                Joins::Alone(UniqueId::with_config(&cfg)?)
            }
        };
        Ok(Job {
            cfg,
            per_process: args.ranks_per_process(),
            joins,
        })
    }

    /// Join as this process's rank `i` (of `per_process`).
    fn connect(&self, i: usize) -> oxccl::Result<Communicator> {
        let per = self.per_process;
        match &self.joins {
            Joins::Launched(env) => {
                let rank = env.rank * per + i;
                let id = env.root.clone().into_id(rank, self.cfg.timeout)?;
                Communicator::init_with_config(&id, rank, env.nranks * per, self.cfg.clone())
            }
            Joins::Alone(id) => Communicator::init_with_config(id, i, per, self.cfg.clone()),
        }
    }

    /// The local rank of this process's rank `i` (which GPU it takes).
    fn local(&self, i: usize) -> usize {
        // A launcher that names no local rank: the rank, as before.
        let process = match &self.joins {
            Joins::Launched(e) => e.local_rank.unwrap_or(e.rank),
            Joins::Alone(_) => 0,
        };
        process * self.per_process + i
    }
}

/// Everything that varies per output row.
struct Case {
    coll: Coll,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
}

/// Time and check one direction of one size.
fn measure<T: TestElem>(
    comm: &Communicator,
    args: &Args,
    case: &Case,
    bytes: usize,
    in_place: bool,
) -> oxccl::Result<(Timed, coll::Shape)> {
    let n = comm.nranks();
    let shape = case.coll.shape(bytes, T::DTYPE.size(), n);
    let mut wrong = 0u64;
    let mut bufs = case.coll.buffers::<T>(&shape, comm, case.op, in_place);
    // One untimed run on fresh buffers: the checked one, and it also faults
    // every page in (nccl-tests' long-lived buffers never pay that in the loop).
    case.coll
        .run(comm, &mut bufs, case.op, case.root, in_place)?;
    if args.check {
        if args.corrupt_rank == Some(comm.rank()) {
            case.coll.corrupt(comm, &shape, &mut bufs, in_place);
        }
        wrong = case
            .coll
            .wrong(comm, &shape, &bufs, case.op, case.root, in_place);
    }
    let timing = timed(comm, args, wrong, || {
        case.coll.run(comm, &mut bufs, case.op, case.root, in_place)
    })?;
    Ok((timing, shape))
}

/// One direction of one size, measured.
pub(crate) struct Timed {
    /// Seconds per call, combined across ranks as `-a` says.
    secs: f64,
    /// Wrong elements, summed over ranks.
    wrong: u64,
    /// The algorithm the timed calls ran (read after them: the barriers
    /// and the reductions that combine the figures run their own).
    algorithm: &'static str,
}

/// The timed loop (`-n` iterations of `-m` calls, a barrier after each
/// iteration with `-z`), then the time and wrong count across ranks.
fn timed(
    comm: &Communicator,
    args: &Args,
    wrong: u64,
    mut call: impl FnMut() -> oxccl::Result<()>,
) -> oxccl::Result<Timed> {
    comm.barrier()?;
    let mut named = None;
    let t = Instant::now();
    for _ in 0..args.iters {
        for _ in 0..args.agg_iters {
            call()?;
        }
        if args.blocking {
            // Named before the barrier, a call of its own.
            named = comm.last_algorithm();
            comm.barrier()?;
        }
    }
    let elapsed = t.elapsed().as_secs_f64();
    // Otherwise read after the loop, not in it: the timed loop makes the
    // calls and nothing else.
    let algorithm = match args.blocking {
        true => named,
        false => comm.last_algorithm(),
    };
    let algorithm = algorithm.unwrap_or("");
    let (secs, wrong) = across_ranks(comm, args, elapsed, wrong)?;
    Ok(Timed {
        secs,
        wrong,
        algorithm,
    })
}

/// Per-call time combined across ranks as `-a` says, and the wrong count
/// summed over ranks.
fn across_ranks(
    comm: &Communicator,
    args: &Args,
    elapsed: f64,
    wrong: u64,
) -> oxccl::Result<(f64, u64)> {
    let mut secs = [elapsed / (args.iters * args.agg_iters) as f64];
    match args.average {
        0 => comm.broadcast_in_place(&mut secs, 0)?,
        1 => comm.all_reduce_in_place(&mut secs, ReduceOp::Avg)?,
        2 => comm.all_reduce_in_place(&mut secs, ReduceOp::Min)?,
        _ => comm.all_reduce_in_place(&mut secs, ReduceOp::Max)?,
    }
    let mut w = [wrong];
    comm.all_reduce_in_place(&mut w, ReduceOp::Sum)?;
    Ok((secs[0], w[0]))
}

/// [`measure`] on registered buffers (`--registered`): the same data and
/// check, the same calls on `SharedBuffer`s, which the planner runs with the
/// `direct` algorithm (all_reduce, all_gather, broadcast, reduce_scatter)
/// when every rank shares one host.
fn measure_registered<T: TestElem>(
    comm: &Communicator,
    args: &Args,
    case: &Case,
    bytes: usize,
    in_place: bool,
) -> oxccl::Result<(Timed, coll::Shape)> {
    let shape = case.coll.shape(bytes, T::DTYPE.size(), comm.nranks());
    let (r, root, op) = (comm.rank(), case.root, case.op);
    let mut plain = case.coll.buffers::<T>(&shape, comm, case.op, in_place);
    let mut send = comm.alloc_shared::<T>(shape.send_len)?;
    send.copy_from_slice(&plain.send);
    let mut recv = comm.alloc_shared::<T>(shape.recv_len)?;
    recv.copy_from_slice(&plain.recv);
    let run = |send: &mut oxccl::SharedBuffer<T>,
               recv: &mut oxccl::SharedBuffer<T>|
     -> oxccl::Result<()> {
        match (case.coll, in_place) {
            (Coll::AllReduce, true) => comm.all_reduce_in_place(recv, op),
            (Coll::AllReduce, false) => comm.all_reduce(send, recv, op),
            (Coll::AllGather, true) => comm.all_gather_in_place(recv),
            (Coll::AllGather, false) => comm.all_gather(send, recv),
            (Coll::Broadcast, true) => comm.broadcast_in_place(recv, root),
            (Coll::Broadcast, false) => comm.broadcast(send, recv, root),
            (Coll::ReduceScatter, true) => comm.reduce_scatter_in_place(send, op),
            (Coll::ReduceScatter, false) => comm.reduce_scatter(send, recv, op),
            (Coll::Reduce, true) => comm.reduce_in_place(recv, op, root),
            (Coll::Reduce, false) => comm.reduce(send, recv, op, root),
            (Coll::AllToAll, true) => comm.all_to_all_in_place(recv),
            (Coll::AllToAll, false) => comm.all_to_all(send, recv),
            (Coll::SendRecv, _) => unreachable!("refused in main"),
        }
    };
    run(&mut send, &mut recv)?;
    let mut wrong = 0;
    if args.check {
        match case.coll {
            Coll::ReduceScatter if in_place => plain.send.copy_from_slice(&send),
            _ => plain.recv.copy_from_slice(&recv),
        }
        if args.corrupt_rank == Some(r) {
            case.coll.corrupt(comm, &shape, &mut plain, in_place);
        }
        wrong = case
            .coll
            .wrong(comm, &shape, &plain, case.op, case.root, in_place);
    }
    let timing = timed(comm, args, wrong, || run(&mut send, &mut recv))?;
    Ok((timing, shape))
}
fn warmup<T: TestElem>(comm: &Communicator, args: &Args, case: &Case) -> oxccl::Result<()> {
    let shape = case
        .coll
        .shape(args.max_bytes, T::DTYPE.size(), comm.nranks());
    let mut bufs = case.coll.buffers::<T>(&shape, comm, case.op, false);
    for _ in 0..args.warmup_iters {
        case.coll.run(comm, &mut bufs, case.op, case.root, false)?;
    }
    Ok(())
}

/// The device of a `--mem cuda` run (nothing in a build without CUDA).
#[cfg(feature = "cuda")]
type Dev<'c> = device::Device<'c>;
#[cfg(not(feature = "cuda"))]
type Dev<'c> = std::marker::PhantomData<&'c ()>;

fn row(
    comm: &Communicator,
    args: &Args,
    dev: Option<&Dev<'_>>,
    case: &Case,
    bytes: usize,
    series: &str,
) -> oxccl::Result<Row> {
    #[cfg(not(feature = "cuda"))]
    let _ = dev; // always None without CUDA
    let factor = case.coll.bus_factor(comm.nranks());
    let mut out = Vec::new();
    let mut shape = None;
    let mut algorithm = "";
    for in_place in [false, true] {
        let (
            Timed {
                secs,
                wrong,
                algorithm: ran,
            },
            s,
        ) = with_dtype!(case.dtype, T => {
            #[cfg(feature = "cuda")]
            if let Some(d) = dev {
                d.measure::<T>(comm, args, case, bytes, in_place)
            } else if args.registered {
                measure_registered::<T>(comm, args, case, bytes, in_place)
            } else {
                measure::<T>(comm, args, case, bytes, in_place)
            }
            #[cfg(not(feature = "cuda"))]
            if args.registered {
                measure_registered::<T>(comm, args, case, bytes, in_place)
            } else {
                measure::<T>(comm, args, case, bytes, in_place)
            }
        })?;
        let algbw = if secs > 0.0 {
            s.bytes as f64 / secs / 1e9
        } else {
            0.0
        };
        out.push(Measure {
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * factor,
            wrong: args.check.then_some(wrong),
        });
        shape = Some(s);
        if !in_place {
            algorithm = ran;
        }
    }
    let s = shape.unwrap();
    Ok(Row {
        bytes: s.bytes,
        count: s.count,
        dtype: case.dtype.nccl_name().to_string(),
        redop: if case.coll.has_op() {
            case.op.to_string()
        } else {
            "none".into()
        },
        root: if case.coll.has_root() {
            case.root as i64
        } else {
            -1
        },
        oop: out[0],
        ip: out[1],
        series: series.to_string(),
        algorithm: algorithm.to_string(),
    })
}

fn preamble(coll: Coll, args: &Args, comm: &Communicator, dev: Option<&Dev<'_>>) -> String {
    let mut s = format!(
        "# nccl-tests version oxccl-{} nccl-headers=0 nccl-library=0\n",
        env!("CARGO_PKG_VERSION")
    );
    s += &format!("# Collective test starting: {}\n", coll.program());
    let (step, kind) = if args.step_factor > 1 {
        (args.step_factor, "factor")
    } else {
        (args.step_bytes, "bytes")
    };
    s += &format!(
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {step}({kind}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0 unalign: 0\n",
        args.nthreads, args.ngpus, args.min_bytes, args.max_bytes, args.warmup_iters, args.iters, args.agg_iters, u8::from(args.check)
    );
    if args.blocking {
        s += "# Blocking Enabled: wait for completion and barrier after each collective \n";
    }
    s += "#\n# Using devices\n";
    let isa = format!("{:?}", oxccl::kernel_isa()).to_lowercase();
    // Each rank's device, as rank 0 knows it (its own; the others' are
    // chosen by the same rule).
    let mem = match dev {
        #[cfg(feature = "cuda")]
        Some(d) => format!("cuda memory, rank 0 on {}", d.describe()),
        #[cfg(not(feature = "cuda"))]
        Some(_) => unreachable!(),
        None => format!("host memory ({isa})"),
    };
    for p in comm.peers() {
        s += &format!(
            "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [cpu] {mem}\n",
            p.rank, 0, p.pid, p.hostname, p.rank
        );
    }
    s
}

/// Run the whole sweep; returns the total number of wrong elements.
/// `local`: the rank's index among the ranks of its host (which GPU).
fn run(
    coll: Coll,
    args: &Args,
    argv: &[String],
    comm: &Communicator,
    local: usize,
) -> oxccl::Result<u64> {
    let me = comm.rank();
    if coll.has_root() && args.root >= comm.nranks() {
        return Err(oxccl::Error::invalid(format!(
            "root {} is not a rank of {}",
            args.root,
            comm.nranks()
        )));
    }
    let print = |s: &str| {
        if me == 0 {
            print!("{s}");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
    };
    #[cfg(feature = "cuda")]
    let dev = match args.mem {
        args::Mem::Cuda => Some(device::Device::new(comm, local)?),
        args::Mem::Host => None,
    };
    #[cfg(not(feature = "cuda"))]
    let dev: Option<Dev<'_>> = {
        let _ = local;
        None
    };
    print(&preamble(coll, args, comm, dev.as_ref()));
    print(&report::header());
    let ops: Vec<ReduceOp> = if coll.has_op() {
        args.ops.clone()
    } else {
        vec![ReduceOp::Sum]
    };
    let mut rows = Vec::new();
    let mut wrong_total = 0u64;
    let mut cycle = 0;
    while args.run_cycles == 0 || cycle < args.run_cycles {
        for &dtype in &args.dtypes {
            for &op in &ops {
                let case = Case {
                    coll,
                    dtype,
                    op,
                    root: args.root,
                };
                with_dtype!(dtype, T => warmup::<T>(comm, args, &case))?;
                let mut series = if coll.has_op() {
                    format!("{} {}", dtype.nccl_name(), op)
                } else {
                    dtype.nccl_name().to_string()
                };
                if args.run_cycles != 1 {
                    series += &format!(" cycle {cycle}");
                }
                for bytes in args.sizes() {
                    let since = breakdown::mark(&comm.trace_events());
                    let r = row(comm, args, dev.as_ref(), &case, bytes, &series)?;
                    wrong_total += r.oop.wrong.unwrap_or(0) + r.ip.wrong.unwrap_or(0);
                    print(&format!("{}\n", report::row_line(&r)));
                    if args.verbose {
                        let b = breakdown::of(&comm.trace_events(), since);
                        print(&format!("{}\n", breakdown::line(&b)));
                    }
                    rows.push(r);
                }
            }
        }
        cycle += 1;
    }
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.oop.busbw, r.ip.busbw])
        .collect();
    let avg = if bws.is_empty() {
        0.0
    } else {
        bws.iter().sum::<f64>() / bws.len() as f64
    };
    print(&report::algorithms(&rows));
    print(&report::footer(wrong_total, avg, coll.program()));
    if me == 0 {
        write_files(coll, args, argv, comm, &rows, wrong_total, avg)?;
    }
    Ok(wrong_total)
}

fn write_files(
    coll: Coll,
    args: &Args,
    argv: &[String],
    comm: &Communicator,
    rows: &[Row],
    wrong: u64,
    avg: f64,
) -> oxccl::Result<()> {
    let io =
        |path: &str, e: std::io::Error| oxccl::Error::invalid(format!("cannot write {path}: {e}"));
    if let Some(path) = &args.json {
        let doc = report::JsonDoc {
            program: coll.program().into(),
            args: argv.to_vec(),
            nranks: comm.nranks(),
            devices: comm
                .peers()
                .iter()
                .map(|p| (p.rank, p.pid, p.hostname.clone()))
                .collect(),
            min_bytes: args.min_bytes,
            max_bytes: args.max_bytes,
            iters: args.iters,
            warmup_iters: args.warmup_iters,
            check: args.check,
        };
        std::fs::write(path, doc.render(rows, wrong, avg)).map_err(|e| io(path, e))?;
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(coll.program(), comm.nranks(), rows))
            .map_err(|e| io(path, e))?;
    }
    if let Some(path) = &args.plot {
        let title = format!("{} — {} ranks, host memory", coll.program(), comm.nranks());
        std::fs::write(path, plot::svg(&title, rows, args.limit)).map_err(|e| io(path, e))?;
    }
    Ok(())
}
