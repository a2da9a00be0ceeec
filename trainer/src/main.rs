//! `trainer`: train the reference transformer single-process or with DDP.
//!
//! ```text
//! trainer --mode single --steps 300
//! oxrun -n 4 trainer --mode ddp --steps 300 --batch 32
//! oxrun -n 4 trainer --mode zero3 --steps 300 --batch 32
//! oxrun -n 4 trainer --mode ddp --tp 2 --steps 300 --batch 32
//! oxrun -n 8 trainer --mode ddp --tp 2 --pp 2 --micro-batches 4 --schedule 1f1b --layers 4
//! trainer --estimate --params 70e9 --ranks 64 --tp 8 --pp 4
//! ```

use oxccl::Communicator;
use std::io::Write;
use trainer::data::Corpus;
use trainer::model::ModelConfig;
use trainer::optim::AdamW;
use trainer::train::{TrainConfig, TrainState};

const USAGE: &str = "usage: trainer [--mode single|ddp|zero3] [--tp T] [--pp P] [--micro-batches M] [--schedule gpipe|1f1b] [--steps N] [--batch ROWS] [--seq T] [--d-model D] [--layers L] [--heads H]
               [--accum K] [--lr LR] [--seed S] [--data FILE] [--bucket-mb MB] [--save PATH] [--resume PATH]
               [--metrics FILE.csv] [--log-every N] [--checkpoint PATH [--checkpoint-every N]]
               [--on-failure exit|shrink] [--powersgd RANK]
       trainer --estimate [--params P] [--ranks N] [--tp T] [--pp P] [--micro-batches M] [--schedule S] [--seq T]
       trainer --plot OUT.svg LABEL=METRICS.csv...";

struct Cli {
    mode: String,
    /// Tensor-parallel group size and pipeline stages (DDP across
    /// replicas), micro-batches per step and their schedule.
    tp: usize,
    pp: usize,
    micro: Option<usize>,
    schedule: trainer::schedule::Schedule,
    steps: u64,
    cfg: TrainConfig,
    data: Option<String>,
    save: Option<String>,
    resume: Option<String>,
    /// Resumed from when it exists, written every `checkpoint_every` steps
    /// and at the end (elastic restarts: `oxrun --max-restarts`).
    checkpoint: Option<String>,
    checkpoint_every: u64,
    /// DDP: when a rank dies, continue on the survivors.
    shrink: bool,
    /// DDP: average gradients compressed by PowerSGD at this rank.
    powersgd: Option<usize>,
    metrics: Option<String>,
    log_every: u64,
    estimate: bool,
    est_params: f64,
    est_ranks: usize,
    /// `--seq` when given (the estimate's default is 2048, not the
    /// trainer's 32).
    est_seq: Option<usize>,
}

fn parse() -> Result<Cli, String> {
    let mut c = Cli {
        mode: "single".into(),
        tp: 1,
        pp: 1,
        micro: None,
        schedule: trainer::schedule::Schedule::OneFOneB,
        steps: 300,
        cfg: TrainConfig {
            model: ModelConfig {
                vocab: 0,
                d_model: 64,
                layers: 2,
                heads: 4,
                seq: 32,
            },
            batch: 16,
            accum: 1,
            seed: 1,
            opt: AdamW::default(),
            bucket_bytes: 25 << 20,
        },
        data: None,
        save: None,
        resume: None,
        checkpoint: None,
        checkpoint_every: 0,
        shrink: false,
        powersgd: None,
        metrics: None,
        log_every: 25,
        estimate: false,
        est_params: 7e9,
        est_ranks: 8,
        est_seq: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| format!("missing value for {a}\n{USAGE}"))
        };
        let num = |v: String| {
            v.parse::<f64>()
                .map_err(|_| format!("{a}: {v:?} is not a number"))
        };
        match a.as_str() {
            "--mode" => c.mode = val()?,
            "--tp" => c.tp = (num(val()?)? as usize).max(1),
            "--pp" => c.pp = (num(val()?)? as usize).max(1),
            "--micro-batches" => c.micro = Some((num(val()?)? as usize).max(1)),
            "--schedule" => c.schedule = val()?.parse()?,
            "--steps" => c.steps = num(val()?)? as u64,
            "--batch" => c.cfg.batch = num(val()?)? as usize,
            "--seq" => {
                c.cfg.model.seq = num(val()?)? as usize;
                c.est_seq = Some(c.cfg.model.seq);
            }
            "--d-model" => c.cfg.model.d_model = num(val()?)? as usize,
            "--layers" => c.cfg.model.layers = num(val()?)? as usize,
            "--heads" => c.cfg.model.heads = num(val()?)? as usize,
            "--accum" => c.cfg.accum = num(val()?)? as usize,
            "--lr" => c.cfg.opt.lr = num(val()?)? as f32,
            "--seed" => c.cfg.seed = num(val()?)? as u64,
            "--bucket-mb" => c.cfg.bucket_bytes = (num(val()?)? * (1 << 20) as f64) as usize,
            "--data" => c.data = Some(val()?),
            "--save" => c.save = Some(val()?),
            "--resume" => c.resume = Some(val()?),
            "--checkpoint" => c.checkpoint = Some(val()?),
            "--checkpoint-every" => c.checkpoint_every = num(val()?)? as u64,
            "--powersgd" => c.powersgd = Some((num(val()?)? as usize).max(1)),
            "--on-failure" => {
                c.shrink = match val()?.as_str() {
                    "exit" => false,
                    "shrink" => true,
                    v => return Err(format!("--on-failure {v:?}: use exit or shrink")),
                }
            }
            "--metrics" => c.metrics = Some(val()?),
            "--log-every" => c.log_every = (num(val()?)? as u64).max(1),
            "--estimate" => c.estimate = true,
            "--params" => c.est_params = num(val()?)?,
            "--ranks" => c.est_ranks = (num(val()?)? as usize).max(1),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if !["single", "ddp", "zero3"].contains(&c.mode.as_str()) {
        return Err(format!("--mode {:?}: use single, ddp or zero3", c.mode));
    }
    if (c.tp > 1 || c.pp > 1) && c.mode != "ddp" && !c.estimate {
        return Err(format!(
            "--tp {} --pp {} run with --mode ddp (data parallelism across replicas), not {}",
            c.tp, c.pp, c.mode
        ));
    }
    if c.shrink && (c.mode != "ddp" || c.tp > 1 || c.pp > 1) {
        return Err("--on-failure shrink continues from the state every rank holds: DDP only (ZeRO-3, tensor and pipeline parallel ranks hold parts that die with a rank; restart them from a checkpoint with oxrun --max-restarts)".into());
    }
    if c.powersgd.is_some() && (c.mode != "ddp" || c.tp > 1 || c.pp > 1) {
        return Err(
            "--powersgd compresses DDP's gradient average: --mode ddp without --tp/--pp".into(),
        );
    }
    if c.micro.is_some() && c.pp == 1 && !c.estimate {
        return Err(
            "--micro-batches divides a pipeline's step: give --pp too (or --accum without one)"
                .into(),
        );
    }
    Ok(c)
}

/// `trainer --estimate`: memory per rank for a model of `params` on
/// `ranks` ranks, tensor × pipeline parallel as `--tp`/`--pp` say, data
/// parallel over the rest, each ZeRO stage (see `trainer::estimate`).
fn estimate(cli: &Cli) {
    use trainer::estimate::{per_rank, Plan, Shape};
    let (t, p) = (cli.tp, cli.pp);
    if !cli.est_ranks.is_multiple_of(t * p) {
        eprintln!(
            "trainer: {} ranks do not divide into tensor parallel {t} x pipeline {p}",
            cli.est_ranks
        );
        std::process::exit(2);
    }
    let d = cli.est_ranks / (t * p);
    let m = Shape::of(cli.est_params);
    let seq = cli.est_seq.unwrap_or(2048);
    let micro_batches = cli.micro.unwrap_or(if p > 1 { 4 * p } else { 1 });
    println!(
        "{:.3e} parameters ({} layers, hidden {}, {} heads) on {} ranks: tensor parallel {t} x pipeline {p} x data parallel {d}; micro-batches of 1 x {seq} tokens, {micro_batches} per step, {:?}",
        m.params, m.layers, m.hidden, m.heads, cli.est_ranks, cli.schedule
    );
    println!("mixed-precision Adam (fp16 parameters 2 B, gradients 2 B, fp32 master + m + v 12 B per parameter); activations fp16 without recomputation, of the first pipeline stage:");
    println!(
        "  {:<10} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "data par.", "parameters", "gradients", "optimizer", "activations", "total GB"
    );
    for zero in 0..=3u8 {
        let plan = Plan {
            t,
            p,
            d,
            zero,
            seq,
            micro_batch: 1,
            micro_batches,
            schedule: cli.schedule,
        };
        let r = per_rank(&m, &plan);
        let gb = |b: f64| format!("{:.1}", b / 1e9);
        println!(
            "  {:<10} {:>12} {:>12} {:>12} {:>12} {:>12}",
            match zero {
                0 => "DDP".to_string(),
                z => format!("ZeRO-{z}"),
            },
            gb(r.params),
            gb(r.grads),
            gb(r.optimizer),
            gb(r.activations),
            gb(r.total())
        );
    }
}

/// `trainer --plot OUT.svg label=metrics.csv ...`: loss curves side by side.
fn plot_command(args: &[String]) -> ! {
    let Some((out, runs)) = args.split_first() else {
        eprintln!("{USAGE}");
        std::process::exit(2)
    };
    let mut series = Vec::new();
    for r in runs {
        let (label, path) = r.split_once('=').unwrap_or((r, r));
        match trainer::plot::read_metrics(path) {
            Ok(p) => series.push((label.to_string(), p)),
            Err(e) => {
                eprintln!("trainer: {path}: {e}");
                std::process::exit(2)
            }
        }
    }
    if let Err(e) = std::fs::write(out, trainer::plot::svg("training loss", &series)) {
        eprintln!("trainer: {out}: {e}");
        std::process::exit(1)
    }
    std::process::exit(0)
}

/// Live heap bytes, counted (the measurement behind the pipeline's
/// activation memory: what a step holds at its peak above what it started
/// with). A binary may install a global allocator; the library does not.
mod alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static LIVE: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    struct Counting;

    fn grew(n: usize) {
        let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }

    // SAFETY: every call is forwarded to the system allocator unchanged;
    // the counters only observe sizes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, forwarded.
            let p = unsafe { System.alloc(l) };
            if !p.is_null() {
                grew(l.size());
            }
            p
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            // SAFETY: as `alloc`.
            let p = unsafe { System.alloc_zeroed(l) };
            if !p.is_null() {
                grew(l.size());
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: as `alloc`.
            unsafe { System.dealloc(p, l) };
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            // SAFETY: as `alloc`.
            let q = unsafe { System.realloc(p, l, new) };
            if !q.is_null() {
                LIVE.fetch_sub(l.size(), Ordering::Relaxed);
                grew(new);
            }
            q
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Live bytes now; the peak is measured from here.
    pub fn live() -> usize {
        let now = LIVE.load(Ordering::Relaxed);
        PEAK.store(now, Ordering::Relaxed);
        now
    }

    /// The most bytes live above `base` since [`live`] returned it.
    pub fn peak_since(base: usize) -> usize {
        PEAK.load(Ordering::Relaxed).saturating_sub(base)
    }
}

/// The pipeline's figures over a run (from the second step: the first
/// pays one-time setup).
#[derive(Default)]
struct PipeReport {
    steps: usize,
    busy: f64,
    seconds: f64,
    in_flight: usize,
    step_bytes: usize,
}

impl PipeReport {
    fn add(&mut self, s: &trainer::train::StepStats, p: &trainer::pp::PipeStats, bytes: usize) {
        self.steps += 1;
        if self.steps > 1 {
            self.busy += p.busy_seconds;
            self.seconds += s.seconds;
        }
        self.in_flight = self.in_flight.max(p.peak_in_flight);
        self.step_bytes = self.step_bytes.max(bytes);
    }

    fn print(&self, l: &trainer::pp::Layout, m: usize, schedule: trainer::schedule::Schedule) {
        let idle = 1.0 - self.busy / self.seconds.max(1e-12);
        println!(
            "pipeline stage {} of {} (part {} of {}, replica {}): {schedule:?}, {m} micro-batches: idle {:.1} % of the step (theory's bubble {:.1} %), at most {} micro-batches held, step peak {} B above its start",
            l.stage(),
            l.p,
            l.part(),
            l.t,
            l.dp.rank(),
            100.0 * idle,
            100.0 * trainer::schedule::ideal_bubble(l.p, m),
            self.in_flight,
            self.step_bytes
        );
    }
}

fn main() {
    oxccl::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--plot") {
        plot_command(&args[1..]);
    }
    let cli = match parse() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if cli.estimate {
        estimate(&cli);
        return;
    }
    let corpus = match &cli.data {
        Some(path) => Corpus::from_file(path).unwrap_or_else(|e| {
            eprintln!("trainer: {e}");
            std::process::exit(2)
        }),
        None => Corpus::markov(cli.cfg.seed ^ 0xda7a, 200_000),
    };
    let mut cfg = cli.cfg.clone();
    cfg.model.vocab = corpus.vocab.len();
    let mut comm = if cli.mode != "single" {
        Some(Communicator::from_env().unwrap_or_else(|e| {
            eprintln!("trainer: {e}");
            std::process::exit(1)
        }))
    } else {
        None
    };
    let (rank, mut n) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.nranks()));
    // Prints the progress (rank 0, or the lowest survivor after a shrink).
    let mut leader = rank == 0;
    // Tensor-parallel groups of `--tp` ranks, `--pp` pipeline stages;
    // DDP across the replicas.
    let layout = comm
        .as_ref()
        .filter(|_| cli.tp > 1 || cli.pp > 1)
        .map(|c| trainer::pp::Layout::split(c, cli.tp, cli.pp));
    let layout = match layout.transpose() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("trainer: {e}");
            std::process::exit(2);
        }
    };
    // A pipeline's micro-batches are its accumulation steps.
    let micro = match cli.pp {
        1 => cfg.accum,
        p => cli.micro.unwrap_or(2 * p),
    };
    if cli.pp > 1 && cfg.accum > 1 {
        eprintln!("trainer: a pipeline accumulates over its micro-batches: give --micro-batches, not --accum");
        std::process::exit(2);
    }
    let mut checked = trainer::tp::validate(&cfg.model, cli.tp)
        .and_then(|_| trainer::pp::validate(&cfg.model, cli.pp));
    if layout.is_none() {
        checked = checked.and_then(|_| trainer::train::validate(&cfg, n));
    }
    if let Err(e) = checked {
        eprintln!("trainer: {e}");
        std::process::exit(2);
    }
    let lens: Vec<usize> = cfg.model.unit_lens();
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("trainer: rank {rank}: {e}");
        std::process::exit(1)
    };
    // A checkpoint left by an earlier attempt of this job (a restart) is
    // where it resumes.
    let resume = match &cli.checkpoint {
        Some(p) if std::path::Path::new(p).exists() => Some(p.clone()),
        _ => cli.resume.clone(),
    };
    // Single and DDP hold the whole state; ZeRO-3 this rank's shard.
    let mut full: Option<TrainState> = None;
    let mut shard: Option<trainer::zero::ShardState> = None;
    if cli.mode == "zero3" {
        shard = Some(match &resume {
            Some(path) => {
                trainer::checkpoint::load_shard(path, rank, n, &lens).unwrap_or_else(|e| fail(&e))
            }
            None => trainer::zero::ShardState::new(&cfg, rank, n),
        });
    } else if let Some(l) = &layout {
        // This rank's part; a checkpoint holds the whole state (of any layout).
        let (r, s) = (l.part(), l.stage());
        full = Some(match &resume {
            Some(path) => {
                let whole = trainer::checkpoint::load(path, &lens).unwrap_or_else(|e| fail(&e));
                trainer::pp::shard_state(&cfg.model, &whole, r, l.t, s, l.p)
            }
            None => trainer::pp::init_state(&cfg, r, l.t, s, l.p),
        });
    } else {
        full = Some(match &resume {
            Some(path) => trainer::checkpoint::load(path, &lens).unwrap_or_else(|e| fail(&e)),
            None => TrainState::new(&cfg),
        });
    }
    let current_step = |full: &Option<TrainState>, shard: &Option<trainer::zero::ShardState>| {
        full.as_ref()
            .map_or_else(|| shard.as_ref().unwrap().step, |f| f.step)
    };
    if let (Some(path), 0) = (&resume, rank) {
        println!(
            "trainer: resumed from step {} of {path}",
            current_step(&full, &shard)
        );
    }
    let ckpt = Checkpointing {
        model: &cfg.model,
        layout: layout.as_ref(),
    };
    // A resumed or restarted run continues its metrics (rows after the
    // checkpoint that an interrupted attempt wrote appear again: the later
    // ones count).
    let restarted = ["OXRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|n| n != "0"));
    let mut metrics = cli.metrics.as_ref().filter(|_| rank == 0).map(|p| {
        let resumed = (resume.is_some() || restarted) && std::path::Path::new(p).exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(resumed)
            .write(true)
            .truncate(!resumed)
            .open(p)
            .unwrap_or_else(|e| {
                eprintln!("trainer: {p}: {e}");
                std::process::exit(2)
            });
        if !resumed {
            writeln!(f, "step,loss,tokens_per_s,comm_share,comm_bytes").unwrap();
        }
        f
    });
    if rank == 0 {
        println!(
            "trainer: mode {}{} on {n} rank(s), {} parameters, batch {} x {} tokens, accum {}, from step {}",
            cli.mode,
            match &layout {
                None => String::new(),
                Some(l) => format!(
                    " (tensor parallel {} x pipeline {} x data parallel {}{})",
                    l.t,
                    l.p,
                    l.d,
                    match l.p {
                        1 => String::new(),
                        _ => format!(", {micro} micro-batches, {:?}", cli.schedule),
                    }
                ),
            },
            cfg.model.parameters(),
            cfg.batch,
            cfg.model.seq,
            cfg.accum,
            current_step(&full, &shard)
        );
    }
    let (mut tokens, mut secs, mut comm_secs) = (0usize, 0.0, 0.0);
    let mut pipe = PipeReport::default();
    let mut powersgd = cli
        .powersgd
        .map(|r| trainer::powersgd::PowerSgd::new(&cfg.model.layout(), r, cfg.seed));
    let mut comm_bytes = 0;
    let mut memory = trainer::zero::Memory::default();
    // A live bar on a terminal (rank 0); plain log lines always.
    let bar = if rank == 0 && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new(cli.steps);
        b.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap());
        b.set_position(current_step(&full, &shard));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    while current_step(&full, &shard) < cli.steps {
        let s = match (&mut full, &mut shard) {
            (Some(st), _) => match &layout {
                Some(l) => {
                    let par = trainer::pp::Parallel::of(l, micro, cli.schedule);
                    let before = alloc::live();
                    let (s, ps) =
                        trainer::pp::step(&cfg, &corpus, st, &par).unwrap_or_else(|e| fail(&e));
                    pipe.add(&s, &ps, alloc::peak_since(before));
                    s
                }
                None => match trainer::train::step_averaging(
                    &cfg,
                    &corpus,
                    st,
                    comm.as_ref(),
                    match powersgd.as_mut() {
                        Some(p) => trainer::train::Averaging::PowerSgd(p),
                        None => trainer::train::Averaging::Full,
                    },
                ) {
                    Ok(s) => s,
                    Err(trainer::train::TrainError::Comm(e)) if cli.shrink => {
                        let old = comm.take().expect("DDP has a communicator");
                        eprintln!("trainer: rank {rank}: {e}; continuing without that rank");
                        let c = trainer::train::shrink_and_agree(&old, &e, st, &cfg)
                            .unwrap_or_else(|e| fail(&e));
                        (n, leader) = (c.nranks(), c.rank() == 0);
                        if leader {
                            println!(
                                "trainer: continuing on {n} ranks from step {} (the batch spread over them)",
                                st.step
                            );
                        }
                        comm = Some(c);
                        continue;
                    }
                    Err(e) => fail(&e),
                },
            },
            (None, Some(sh)) => {
                let (s, m) = trainer::zero::step(&cfg, &corpus, sh, comm.as_ref().unwrap())
                    .unwrap_or_else(|e| fail(&e));
                memory = m;
                s
            }
            _ => unreachable!(),
        };
        let at = current_step(&full, &shard);
        bar.set_position(at);
        bar.set_message(format!(
            "loss {:.4}  {:.0} tokens/s  comm {:.0}%",
            s.loss,
            (s.tokens * n) as f64 / s.seconds,
            100.0 * s.comm_seconds / s.seconds.max(1e-9)
        ));
        tokens += s.tokens * n;
        comm_bytes = s.comm_bytes;
        secs += s.seconds;
        comm_secs += s.comm_seconds;
        if let Some(f) = metrics.as_mut() {
            // One write per row: a rank stopped mid-row leaves no half line
            // for the restarted run to append to.
            let row = format!(
                "{at},{:.6},{:.1},{:.4},{}\n",
                s.loss,
                s.tokens as f64 * n as f64 / s.seconds,
                s.comm_seconds / s.seconds,
                s.comm_bytes
            );
            f.write_all(row.as_bytes()).unwrap();
        }
        // The step's row before its checkpoint: a rank stopped between the
        // two must not leave a checkpoint whose step has no row (a restart
        // resumes after the checkpoint and would never write it).
        if let Some(path) = cli.checkpoint.as_ref().filter(|_| {
            cli.checkpoint_every > 0 && at % cli.checkpoint_every == 0 && at < cli.steps
        }) {
            ckpt.save(path, &full, &shard, comm.as_ref())
                .unwrap_or_else(|e| fail(&e));
        }
        if leader && (at % cli.log_every == 0 || at == cli.steps) {
            println!(
                "step {:>5}  loss {:.4}  {:>8.0} tokens/s  communication {:>4.1}%",
                at,
                s.loss,
                tokens as f64 / secs,
                100.0 * comm_secs / secs.max(1e-9)
            );
            tokens = 0;
            secs = 0.0;
            comm_secs = 0.0;
        }
    }
    bar.finish_and_clear();
    // What this rank holds (f32 throughout this trainer).
    let p = 4 * full
        .as_ref()
        .map_or(0, |st| st.params.iter().map(Vec::len).sum::<usize>());
    let m = match &shard {
        Some(sh) => trainer::zero::Memory {
            peak_gathered: memory.peak_gathered,
            ..sh.memory()
        },
        None => trainer::zero::Memory {
            params: p,
            grads: p,
            optimizer: 2 * p,
            peak_gathered: 0,
        },
    };
    println!(
        "memory rank {rank}: parameters {} B, gradients {} B, optimizer {} B, persistent {} B, peak gathered {} B",
        m.params,
        m.grads,
        m.optimizer,
        m.persistent(),
        m.peak_gathered
    );
    if let Some(l) = layout.as_ref().filter(|l| l.p > 1) {
        pipe.print(l, micro, cli.schedule);
    }
    if leader && comm_bytes > 0 {
        println!(
            "gradient bytes per step per rank: {comm_bytes} ({} uncompressed{})",
            4 * cfg.model.parameters(),
            match cli.powersgd {
                Some(r) => format!(
                    ", PowerSGD rank {r}: {:.1}x less",
                    (4 * cfg.model.parameters()) as f64 / comm_bytes as f64
                ),
                None => String::new(),
            }
        );
    }
    for path in cli.save.iter().chain(&cli.checkpoint) {
        ckpt.save(path, &full, &shard, comm.as_ref())
            .unwrap_or_else(|e| fail(&e));
    }
}

/// Writing the run's state, whatever its layout.
struct Checkpointing<'a> {
    model: &'a ModelConfig,
    layout: Option<&'a trainer::pp::Layout>,
}

impl Checkpointing<'_> {
    /// Save to `path` (collective): ZeRO-3 shards as they are, every other
    /// layout as the whole state (rank 0 writes it; tensor- and
    /// pipeline-parallel parts are gathered first).
    fn save(
        &self,
        path: &str,
        full: &Option<TrainState>,
        shard: &Option<trainer::zero::ShardState>,
        comm: Option<&Communicator>,
    ) -> Result<(), String> {
        let rank = comm.map_or(0, |c| c.rank());
        if let (Some(sh), Some(c)) = (shard, comm) {
            trainer::checkpoint::save_shard(sh, path, c).map_err(|e| e.to_string())?;
            if rank == 0 {
                println!(
                    "trainer: saved step {} to {path} (+ one shard file per rank)",
                    sh.step
                );
            }
            return Ok(());
        }
        let Some(st) = full else { return Ok(()) };
        let gathered;
        let whole = match self.layout {
            Some(l) => {
                gathered =
                    trainer::pp::gather_state(self.model, st, l).map_err(|e| e.to_string())?;
                &gathered
            }
            None => st,
        };
        if rank == 0 {
            trainer::checkpoint::save(whole, path).map_err(|e| format!("{path}: {e}"))?;
            println!("trainer: saved step {} to {path}", whole.step);
        }
        // Nobody reads it back (a restart) before it is complete.
        if let Some(c) = comm {
            c.barrier().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
