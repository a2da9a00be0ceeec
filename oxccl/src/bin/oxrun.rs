//! `oxrun`: start N local ranks of a program with the environment a
//! communicator needs, prefix their output with the rank, and stop the
//! whole job when one rank fails.
//!
//! ```text
//! oxrun -n 4 [--kill-after SECS] [--no-prefix] [--] PROGRAM [ARGS...]
//! ```
//!
//! oxrun hosts the rendezvous root itself and passes `OXCCL_UNIQUE_ID`, so
//! no port needs choosing. Each rank gets `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (torchrun's names, so programs written
//! for torchrun work) and the same as `OXCCL_*`. For several hosts, use the
//! cluster's launcher (srun, mpirun, torchrun) instead: see the README.

use oxccl::{Config, UniqueId};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: oxrun -n N [--kill-after SECS] [--no-prefix] [--] PROGRAM [ARGS...]";

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

struct Opts {
    n: usize,
    kill_after: Duration,
    prefix: bool,
    program: String,
    args: Vec<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Opts, String> {
    let mut n = None;
    let mut kill_after = Duration::from_secs(3);
    let mut prefix = true;
    let mut rest = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" | "-np" | "--np" | "--nproc-per-node" => {
                let v = it.next().ok_or("missing value for -n")?;
                n = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("-n {v:?} is not a number"))?,
                );
            }
            "--kill-after" => {
                let v = it.next().ok_or("missing value for --kill-after")?;
                kill_after = Duration::from_secs_f64(
                    v.parse::<f64>()
                        .map_err(|_| format!("--kill-after {v:?}"))?,
                );
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
        prefix,
        program,
        args: rest,
    })
}

fn describe(status: ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        // SAFETY: strsignal returns a pointer to a static or thread-local string.
        let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }
            .to_string_lossy()
            .into_owned();
        format!("was killed by signal {sig} ({name})")
    } else {
        format!("exited with status {}", status.code().unwrap_or(-1))
    }
}

fn pump(
    rank: usize,
    prefix: bool,
    src: impl std::io::Read + Send + 'static,
    to_err: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let mut out: Vec<u8> = Vec::with_capacity(line.len() + 8);
                    if prefix {
                        out.extend_from_slice(format!("[{rank}] ").as_bytes());
                    }
                    out.extend_from_slice(&line);
                    if !out.ends_with(b"\n") {
                        out.push(b'\n');
                    }
                    // One write per line under the lock: lines never interleave.
                    if to_err {
                        let _ = std::io::stderr().lock().write_all(&out);
                    } else {
                        let _ = std::io::stdout().lock().write_all(&out);
                    }
                }
            }
        }
    })
}

fn signal_all(children: &mut [Option<Child>], sig: i32) {
    for c in children.iter().flatten() {
        // SAFETY: sending a signal to a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, sig) };
    }
}

fn main() {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("oxrun: {e}");
            std::process::exit(2);
        }
    };
    // SAFETY: installing an async-signal-safe handler that only stores an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let mut config = Config::from_env().unwrap_or_else(|e| {
        eprintln!("oxrun: {e}");
        std::process::exit(2);
    });
    // One host: keep the job on loopback unless told otherwise.
    let pin_loopback = config.socket_ifname.is_none();
    if pin_loopback {
        config.socket_ifname = Some("lo".into());
    }
    let id = UniqueId::with_config(&config).unwrap_or_else(|e| {
        eprintln!("oxrun: cannot start the rendezvous root: {e}");
        std::process::exit(2);
    });
    let n = opts.n;
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("OXCCL_RANK", rank.to_string())
            .env("OXCCL_WORLD_SIZE", n.to_string())
            .env("OXCCL_LOCAL_RANK", rank.to_string())
            .env("OXCCL_UNIQUE_ID", id.to_string())
            .env("OXRUN", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if pin_loopback {
            cmd.env("OXCCL_SOCKET_IFNAME", "lo");
        }
        match cmd.spawn() {
            Ok(mut c) => {
                pumps.push(pump(rank, opts.prefix, c.stdout.take().unwrap(), false));
                pumps.push(pump(rank, opts.prefix, c.stderr.take().unwrap(), true));
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!(
                    "oxrun: cannot start {:?} for rank {rank}: {e}",
                    opts.program
                );
                signal_all(&mut children, libc::SIGKILL);
                std::process::exit(2);
            }
        }
    }
    let mut exit_code = 0;
    let mut stopping: Option<Instant> = None;
    let mut running = n;
    while running > 0 {
        let sig = SIGNALLED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!("oxrun: received signal {sig}, stopping all ranks");
            signal_all(&mut children, libc::SIGTERM);
            stopping.get_or_insert_with(Instant::now);
            exit_code = 128 + sig;
        }
        // Reap everything that ended since the last look. When several ranks
        // failed at once, the ones killed by a signal are the likely cause
        // (the others usually exit with an error in reaction): report them first.
        let mut failed: Vec<(usize, u32, ExitStatus)> = Vec::new();
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else {
                continue;
            };
            match c.try_wait() {
                Ok(Some(status)) => {
                    let pid = c.id();
                    *slot = None;
                    running -= 1;
                    if !status.success() {
                        failed.push((rank, pid, status));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("oxrun: waiting for rank {rank}: {e}");
                    *slot = None;
                    running -= 1;
                }
            }
        }
        failed.sort_by_key(|(rank, _, st)| (st.signal().is_none(), *rank));
        for (i, (rank, pid, status)) in failed.iter().enumerate() {
            if stopping.is_none() && i == 0 {
                eprintln!(
                    "oxrun: rank {rank} (pid {pid}) {}; stopping the other ranks",
                    describe(*status)
                );
                exit_code = status.code().filter(|c| *c != 0).unwrap_or(1);
                signal_all(&mut children, libc::SIGTERM);
                stopping = Some(Instant::now());
            } else {
                eprintln!("oxrun: rank {rank} (pid {pid}) {}", describe(*status));
            }
        }
        if let Some(t) = stopping {
            if t.elapsed() > opts.kill_after {
                let left: Vec<usize> = (0..n).filter(|r| children[*r].is_some()).collect();
                if !left.is_empty() {
                    eprintln!(
                        "oxrun: ranks {left:?} did not stop within {:?}; killing them",
                        opts.kill_after
                    );
                    signal_all(&mut children, libc::SIGKILL);
                }
                stopping = Some(Instant::now() + Duration::from_secs(3600));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pumps {
        let _ = p.join();
    }
    std::process::exit(exit_code);
}
