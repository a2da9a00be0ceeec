//! `oxrun`: start N local ranks of a program with the environment a
//! communicator needs, prefix their output with the rank, and stop the
//! whole job when one rank fails.
//!
//! ```text
//! oxrun -n 4 [--kill-after SECS] [--max-restarts K] [--bind none|cores] [--no-prefix] [--] PROGRAM [ARGS...]
//! ```
//!
//! `--bind cores`: rank `r` runs on the `r`-th CPU of oxrun's affinity
//! mask alone (as `mpirun` binds by default), for ranks of one thread
//! each; the default, `none`, leaves ranks wherever oxrun may run, as
//! torchrun does (a rank with a compute pool of its own needs cores).
//!
//! `--max-restarts K`: when a rank fails, stop the others and start every
//! rank again, up to K times (torchrun's elastic restarts); the program
//! resumes from its own checkpoint (`OXRUN_RESTART_COUNT` says which
//! attempt it is).
//!
//! oxrun hosts the rendezvous root itself and passes `OXCCL_UNIQUE_ID`, so
//! no port needs choosing. Each rank gets `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (torchrun's names, so programs written
//! for torchrun work) and the same as `OXCCL_*`. For several hosts, use the
//! cluster's launcher (srun, mpirun, torchrun) instead: see the README.

use oxccl::launch::{self, Bind, Launch, Output};
use std::time::Duration;

const USAGE: &str =
    "usage: oxrun -n N [--kill-after SECS] [--max-restarts K] [--bind none|cores] [--no-prefix] [--] PROGRAM [ARGS...]";

struct Opts {
    n: usize,
    kill_after: Duration,
    max_restarts: usize,
    bind: Bind,
    prefix: bool,
    program: String,
    args: Vec<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Opts, String> {
    let mut n = None;
    let mut kill_after = Duration::from_secs(3);
    let mut prefix = true;
    let mut max_restarts = 0;
    let mut bind = Bind::None;
    let mut rest = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" | "-np" | "--np" | "--nproc-per-node" => {
                let v = it.next().ok_or("missing value for -n")?;
                n = Some(
                    oxccl::settings::count("-n", &v, 1, oxccl::vars::MAX_RANKS)
                        .map_err(|e| e.to_string())?,
                );
            }
            "--kill-after" => {
                let v = it.next().ok_or("missing value for --kill-after")?;
                kill_after = oxccl::settings::duration(
                    "--kill-after",
                    &v,
                    1.0,
                    Duration::ZERO,
                    Duration::from_secs(3600),
                )
                .map_err(|e| e.to_string())?;
            }
            "--max-restarts" => {
                let v = it.next().ok_or("missing value for --max-restarts")?;
                max_restarts = oxccl::settings::count("--max-restarts", &v, 0, 1000)
                    .map_err(|e| e.to_string())?;
            }
            "--bind" => {
                bind = match it.next().as_deref() {
                    Some("none") => Bind::None,
                    Some("cores") => Bind::Cores,
                    Some(v) => return Err(format!("--bind takes none or cores, not {v:?}")),
                    None => return Err("missing value for --bind (none or cores)".into()),
                }
            }
            "--no-prefix" => prefix = false,
            "-h" | "--help" => return Err(USAGE.into()),
            "--" => {
                rest.extend(it.by_ref());
                break;
            }
            s if s.starts_with('-') && rest.is_empty() => {
                return Err(format!("unknown option {s}\n{USAGE}"))
            }
            _ => {
                rest.push(a);
                rest.extend(it.by_ref());
                break;
            }
        }
    }
    let n = n.ok_or_else(|| format!("missing -n\n{USAGE}"))?;
    if n == 0 {
        return Err("-n must be at least 1".into());
    }
    if rest.is_empty() {
        return Err(format!("missing PROGRAM\n{USAGE}"));
    }
    let program = rest.remove(0);
    Ok(Opts {
        n,
        kill_after,
        max_restarts,
        bind,
        prefix,
        program,
        args: rest,
    })
}

fn main() {
    oxccl::init_logging();
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("oxrun: {e}");
            std::process::exit(2);
        }
    };
    let code = launch::run(&Launch {
        nranks: opts.n,
        program: opts.program,
        args: opts.args,
        output: if opts.prefix {
            Output::Prefixed
        } else {
            Output::Plain
        },
        kill_after: opts.kill_after,
        env: Vec::new(),
        max_restarts: opts.max_restarts,
        bind: opts.bind,
    });
    std::process::exit(code);
}
