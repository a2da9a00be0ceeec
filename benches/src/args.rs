//! Command-line flags: nccl-tests' with their meanings and defaults, plus
//! oxccl's additions.

use oxccl::{DataType, ReduceOp};

/// Where the benchmark's buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    Host,
    /// Device memory of the GPU `local rank % GPUs` (the `cuda` feature).
    Cuda,
}

impl Mem {
    /// nccl-tests' default, device buffers, where this build and host can
    /// have them; host memory otherwise.
    pub fn default_for_build() -> Mem {
        #[cfg(feature = "cuda")]
        if oxccl::cuda::probe().is_ok() {
            return Mem::Cuda;
        }
        Mem::Host
    }

    fn parse(v: &str) -> Result<Mem, String> {
        match v {
            "host" => Ok(Mem::Host),
            "cuda" if cfg!(feature = "cuda") => Ok(Mem::Cuda),
            "cuda" => Err(
                "--mem cuda: this build has no CUDA support (build the benches with --features cuda)"
                    .into(),
            ),
            other => Err(format!("--mem {other:?}: use host or cuda")),
        }
    }
}

/// Parsed flags.
#[derive(Clone, Debug)]
pub struct Args {
    pub min_bytes: usize,
    pub max_bytes: usize,
    /// Multiply by this between sizes (`-f`); 0 when `-i` is used.
    pub step_factor: usize,
    /// Add this between sizes (`-i`).
    pub step_bytes: usize,
    pub iters: usize,
    pub warmup_iters: usize,
    pub agg_iters: usize,
    pub check: bool,
    pub dtypes: Vec<DataType>,
    pub ops: Vec<ReduceOp>,
    pub root: usize,
    /// 0: rank 0's time, 1: average, 2: minimum, 3: maximum.
    pub average: u8,
    pub blocking: bool,
    /// Seconds (`-T`), 0 = library default.
    pub timeout: f64,
    pub json: Option<String>,
    /// 0 = forever.
    pub run_cycles: usize,
    pub np: Option<usize>,
    /// `--bind`: each `--np` rank on a core of its own, round-robin where
    /// ranks outnumber cores (the default, as `mpirun` binds), or wherever
    /// the scheduler puts it.
    pub bind_cores: bool,
    /// `-t` and `-g`: this process runs `nthreads * ngpus` ranks (what
    /// nccl-tests drives per process), one thread each, each on GPU
    /// `local % gpus`.
    pub nthreads: usize,
    pub ngpus: usize,
    pub transport: Option<String>,
    pub algo: Option<String>,
    pub registered: bool,
    /// Where the buffers live (`--mem`).
    pub mem: Mem,
    pub plot: Option<String>,
    /// Machine limit (GB/s) drawn on the plot.
    pub limit: Option<f64>,
    pub csv: Option<String>,
    /// `--trace DIR`: every rank writes its timeline trace there
    /// (`OXCCL_TRACE`; `oxccl-trace merge DIR -o job.json` joins them).
    pub trace: Option<String>,
    /// `-v`: after each row, where its calls spent their time (from the
    /// trace; without `--trace`, one is kept in a temporary folder).
    pub verbose: bool,
    /// Debug: this rank corrupts one element of every checked result.
    pub corrupt_rank: Option<usize>,
}

impl Default for Args {
    fn default() -> Args {
        Args {
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 1,
            step_bytes: 1 << 20,
            iters: 20,
            warmup_iters: 1,
            agg_iters: 1,
            check: true,
            dtypes: vec![DataType::F32],
            ops: vec![ReduceOp::Sum],
            root: 0,
            average: 1,
            blocking: false,
            timeout: 0.0,
            json: None,
            run_cycles: 1,
            np: None,
            bind_cores: true,
            nthreads: 1,
            ngpus: 1,
            transport: None,
            algo: None,
            registered: false,
            mem: Mem::default_for_build(),
            plot: None,
            limit: None,
            csv: None,
            trace: None,
            verbose: false,
            corrupt_rank: None,
        }
    }
}

/// Usage text (`-h`).
pub const USAGE: &str = "\
USAGE: <collective>_perf
  [-t,--nthreads <num threads>]          ranks (threads) per process (default 1)
  [-g,--ngpus <gpus per thread>]         ranks per thread (default 1): -t x -g ranks per process,
                                         each a thread with its own communicator, on GPU local % gpus
  [-b,--minbytes <min size in bytes>]    K/M/G suffixes (default 32M)
  [-e,--maxbytes <max size in bytes>]    (default 32M)
  [-i,--stepbytes <increment size>]      (default 1M)
  [-f,--stepfactor <increment factor>]   (default: disabled)
  [-n,--iters <iteration count>]         (default 20)
  [-m,--agg_iters <aggregated iteration count>] (default 1)
  [-w,--warmup_iters <warmup iteration count>]  (default 1)
  [-N,--run_cycles <cycle count>]        run & print each cycle (default 1; 0=infinite)
  [-p,--parallel_init <0/1>]             accepted for compatibility
  [-c,--check <check iteration count>]   0 disables the check (default 1)
  [-o,--op <sum/prod/min/max/avg/all>]   (default sum)
  [-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/all>] (default float)
  [-r,--root <root>]                     (default 0)
  [-z,--blocking <0/1>]                  wait and barrier after each collective (default 0)
  [-y,--stream_null <0/1>]               accepted for compatibility
  [-T,--timeout <time in seconds>]       communicator timeout
  [-G,--cudagraph <num graph launches>]  accepted for compatibility; must be 0
  [-C,--report_cputime <0/1>]            accepted for compatibility
  [-a,--average <0/1/2/3>]               time across ranks: 0 rank 0, 1 avg, 2 min, 3 max (default 1)
  [-J,--output_file <file>]              write results as JSON
  oxccl additions:
  [--np <ranks>]                         launch this many local ranks (unless already under a launcher)
  [--bind <cores|none>]                  --np ranks each on a core of its own, round-robin where ranks outnumber cores
                                         (default cores, as mpirun binds; only for one rank per process on host memory)
  [--transport <auto|tcp|shm|rdma>]      force a transport
  [--algo <auto|NAME>]                   force an algorithm (ring, oneshot, chain, direct, ...)
  [--registered]                         use communicator-registered buffers (with --mem cuda: CUDA IPC buffers)
  [--mem <host|cuda>]                    buffer memory (default: cuda in a cuda build on a host with a GPU, else host)
  [--plot <file.svg>]                    bus bandwidth and time against size
  [--limit <GB/s>]                       draw a machine limit on the plot
  [--csv <file.csv>]                     write results as CSV
  [--trace <dir>]                        every rank writes its timeline trace into dir (OXCCL_TRACE)
  [-v,--verbose]                         after each row, rank 0's time per call by kind of step (send/recv,
                                         reduce, copy, phases, waiting), from its trace
  [-h,--help]";

/// Most ranks `--np` starts on this host.
pub const MAX_LOCAL_RANKS: usize = 1024;

/// Parse a size with an optional K/M/G suffix.
pub fn parse_size(flag: &str, s: &str) -> Result<usize, String> {
    oxccl::parse_bytes(s)
        .ok_or_else(|| format!("{flag}={s:?}: invalid size (use e.g. 8, 64K, 256M, 1G)"))
}

fn parse_num<T: std::str::FromStr>(flag: &str, s: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{flag}={s:?}: invalid value"))
}

impl Args {
    /// Ranks this process runs (`-t` times `-g`).
    pub fn ranks_per_process(&self) -> usize {
        self.nthreads * self.ngpus
    }

    /// Parse flags (`-b 8`, `--minbytes 8`, `--minbytes=8`).
    pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut a = Args::default();
        let mut factor_set = false;
        let mut it = argv.into_iter();
        while let Some(raw) = it.next() {
            let (flag, inline) = match raw.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (raw.clone(), None),
            };
            let no_value = matches!(
                flag.as_str(),
                "--registered" | "-h" | "--help" | "-v" | "--verbose"
            );
            let val = if no_value {
                String::new()
            } else {
                match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .ok_or_else(|| format!("missing value for {flag}"))?,
                }
            };
            match flag.as_str() {
                "-h" | "--help" => return Err(USAGE.to_string()),
                "-t" | "--nthreads" | "-g" | "--ngpus" => {
                    let n: usize = parse_num(&flag, &val)?;
                    if n == 0 || n > MAX_LOCAL_RANKS {
                        return Err(format!("{flag}={n}: between 1 and {MAX_LOCAL_RANKS}"));
                    }
                    match flag.as_str() {
                        "-t" | "--nthreads" => a.nthreads = n,
                        _ => a.ngpus = n,
                    }
                    if a.ranks_per_process() > MAX_LOCAL_RANKS {
                        return Err(format!(
                            "-t x -g: at most {MAX_LOCAL_RANKS} ranks per process"
                        ));
                    }
                }
                "-b" | "--minbytes" => a.min_bytes = parse_size(&flag, &val)?,
                "-e" | "--maxbytes" => a.max_bytes = parse_size(&flag, &val)?,
                "-i" | "--stepbytes" => a.step_bytes = parse_size(&flag, &val)?,
                "-f" | "--stepfactor" => {
                    a.step_factor = parse_num(&flag, &val)?;
                    factor_set = true;
                }
                "-n" | "--iters" => a.iters = parse_num(&flag, &val)?,
                "-m" | "--agg_iters" => a.agg_iters = parse_num(&flag, &val)?,
                "-w" | "--warmup_iters" => a.warmup_iters = parse_num(&flag, &val)?,
                "-N" | "--run_cycles" => a.run_cycles = parse_num(&flag, &val)?,
                "-c" | "--check" => a.check = parse_num::<usize>(&flag, &val)? > 0,
                "-o" | "--op" => {
                    a.ops = if val == "all" {
                        ReduceOp::ALL.to_vec()
                    } else {
                        vec![ReduceOp::parse(&val).ok_or_else(|| format!("unknown op {val:?}"))?]
                    }
                }
                "-d" | "--datatype" => {
                    a.dtypes = if val == "all" {
                        DataType::ALL.to_vec()
                    } else {
                        vec![DataType::parse(&val)
                            .ok_or_else(|| format!("unknown datatype {val:?}"))?]
                    }
                }
                "-r" | "--root" => a.root = parse_num(&flag, &val)?,
                "-z" | "--blocking" => a.blocking = parse_num::<usize>(&flag, &val)? > 0,
                "-T" | "--timeout" => {
                    // 0 keeps the library's timeout; otherwise the range
                    // OXCCL_TIMEOUT accepts.
                    a.timeout = if parse_num::<f64>(&flag, &val).ok() == Some(0.0) {
                        0.0
                    } else {
                        oxccl::settings::duration(
                            &flag,
                            &val,
                            1.0,
                            std::time::Duration::from_millis(1),
                            oxccl::settings::MAX_DURATION,
                        )
                        .map_err(|e| e.to_string())?
                        .as_secs_f64()
                    }
                }
                "-a" | "--average" => {
                    a.average = parse_num(&flag, &val)?;
                    if a.average > 3 {
                        return Err("-a must be 0, 1, 2 or 3".into());
                    }
                }
                "-J" | "--output_file" => a.json = Some(val),
                "-G" | "--cudagraph" => {
                    if parse_num::<usize>(&flag, &val)? != 0 {
                        return Err("-G (CUDA graphs) does not apply to host memory".into());
                    }
                }
                "-p" | "--parallel_init" | "-y" | "--stream_null" | "-C" | "--report_cputime" => {
                    parse_num::<usize>(&flag, &val)?;
                }
                "--np" => {
                    a.np = Some(
                        oxccl::settings::count(&flag, &val, 1, MAX_LOCAL_RANKS)
                            .map_err(|e| e.to_string())?,
                    )
                }
                "--bind" => {
                    a.bind_cores = match val.as_str() {
                        "cores" => true,
                        "none" => false,
                        _ => return Err(format!("--bind takes cores or none, not {val:?}")),
                    }
                }
                "--transport" => a.transport = Some(val).filter(|t| t != "auto"),
                "--algo" => a.algo = Some(val),
                "--registered" => a.registered = true,
                "--mem" => a.mem = Mem::parse(&val)?,
                "--plot" => a.plot = Some(val),
                "--limit" => {
                    a.limit = Some(
                        parse_num::<f64>(&flag, &val)
                            .ok()
                            .filter(|l| l.is_finite() && *l > 0.0)
                            .ok_or_else(|| {
                                format!("{flag}={val:?}: expected a positive number of GB/s")
                            })?,
                    )
                }
                "--csv" => a.csv = Some(val),
                "--trace" => a.trace = Some(val),
                "-v" | "--verbose" => a.verbose = true,
                "--corrupt-rank" => a.corrupt_rank = Some(parse_num(&flag, &val)?),
                other => return Err(format!("unknown option {other}\n{USAGE}")),
            }
        }
        if !factor_set {
            a.step_factor = 0;
        }
        if a.min_bytes > a.max_bytes {
            return Err(format!(
                "minbytes {} > maxbytes {}",
                a.min_bytes, a.max_bytes
            ));
        }
        if a.iters == 0 || a.agg_iters == 0 {
            return Err("-n and -m must be at least 1".into());
        }
        if a.step_factor == 1 || (a.step_factor == 0 && a.step_bytes == 0) {
            return Err("the step (-f > 1 or -i > 0) must make sizes grow".into());
        }
        if let Some(algo) = &a.algo {
            if algo != "auto" && oxccl::algorithms::find(algo).is_none() {
                return Err(format!(
                    "--algo {algo:?}: use auto or one of {}",
                    oxccl::algorithms::names()
                ));
            }
        }
        if a.algo.as_deref() == Some("auto") {
            a.algo = None;
        }
        Ok(a)
    }

    /// The sizes to run, in bytes, smallest first.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            let next = if self.step_factor > 1 {
                s.saturating_mul(self.step_factor)
            } else {
                s + self.step_bytes
            };
            if next <= s {
                break;
            }
            s = next;
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn nccl_flags_and_sizes() {
        let a = p("-b 8 -e 64M -f 2 -c 1 -n 5 -w 2 -d all -o all -a 3 -z 1").unwrap();
        assert_eq!(a.sizes().len(), 24);
        assert_eq!(a.sizes()[0], 8);
        assert_eq!(*a.sizes().last().unwrap(), 64 << 20);
        assert_eq!(a.dtypes.len(), 10);
        assert_eq!(a.ops.len(), 5);
        assert_eq!(
            (a.iters, a.warmup_iters, a.average, a.blocking),
            (5, 2, 3, true)
        );
        let a =
            p("--minbytes=1K --maxbytes=4K --stepbytes=1K --datatype=bfloat16 --op=max").unwrap();
        assert_eq!(a.sizes(), vec![1024, 2048, 3072, 4096]);
        assert_eq!(a.dtypes, vec![DataType::Bf16]);
        assert_eq!(a.ops, vec![ReduceOp::Max]);
    }

    #[test]
    fn threads_and_gpus_multiply_into_ranks_per_process() {
        assert_eq!(p("").unwrap().ranks_per_process(), 1);
        let a = p("-t 2 -g 3").unwrap();
        assert_eq!((a.nthreads, a.ngpus, a.ranks_per_process()), (2, 3, 6));
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(p("-b 1G -e 1M").is_err());
        assert!(p("-d float128").is_err());
        assert!(p("-o xor").is_err());
        assert!(p("-a 7").is_err());
        assert!(p("-g 0").is_err());
        assert!(p("-t 64 -g 64").is_err());
        assert!(p("--bogus 1").is_err());
        assert!(p("-b").is_err());
        assert!(p("--algo spanning-tree").is_err());
        assert!(p("--algo oneshot").is_ok());
    }

    #[test]
    fn hostile_flag_values_are_errors_naming_the_flag() {
        let cases = [
            "-T inf",
            "-T 1e300",
            "-T -1",
            "-T NaN",
            "-T 1e-12",
            "--timeout=1e19",
            "--np 0",
            "--np 99999",
            "--np 1.5",
            "--limit inf",
            "--limit -3",
            "-n -1",
            "-n 99999999999999999999999",
            "-w x",
            "-r -1",
            "-b 99999999999999999999G",
        ];
        for c in cases {
            let e = p(c).expect_err(c);
            let flag = c.split([' ', '=']).next().unwrap();
            assert!(e.contains(flag), "{c}: {e}");
        }
        assert_eq!(p("-T 0").unwrap().timeout, 0.0);
        assert_eq!(p("-T 2.5").unwrap().timeout, 2.5);
    }
}
