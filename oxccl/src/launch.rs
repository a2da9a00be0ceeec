//! Starting N local ranks of a program: the engine behind `oxrun` and the
//! benchmarks' `--np`. Each rank gets the environment a communicator needs
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, the same as
//! `OXCCL_*`, and `OXCCL_UNIQUE_ID` of a root hosted by this process); output
//! lines are passed through with a `[rank]` prefix; when a rank fails, the
//! failure is reported (which rank, exit status or signal), the others are
//! stopped (SIGTERM, then SIGKILL) and the launch returns non-zero — or,
//! with restarts left (`max_restarts`, torchrun's elastic agent), every
//! rank is started again with a fresh root, `OXRUN_RESTART_COUNT` (and
//! torchrun's `TORCHELASTIC_RESTART_COUNT`) telling it which attempt it is,
//! so a program that checkpoints resumes from its last checkpoint.

use crate::{Config, UniqueId};
use comm_core::control::notice::Notice;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// How rank output reaches this process's stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Every line of every rank, prefixed with `[rank] `.
    Prefixed,
    /// Every line of every rank, as is.
    Plain,
    /// Rank 0's stdout as is (byte-exact, for tools whose output is parsed),
    /// other ranks' stdout dropped; every stderr line prefixed.
    Rank0,
}

/// Where each rank may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// Wherever the launcher may (ranks inherit its affinity mask).
    None,
    /// Rank `r` on the `r`-th CPU of the launcher's mask alone, as
    /// `mpirun` binds ranks to cores by default: two ranks never share a
    /// core while another idles (a rank that spins for a peer on its own
    /// core then waits for the peer, not for the scheduler). With fewer
    /// CPUs than ranks, round-robin: rank `r` on CPU `r mod n`, several
    /// ranks a CPU (`mpirun --map-by core --bind-to core:overload-allowed`),
    /// so that each CPU runs the same ranks every call: 4 ranks on 2 CPUs
    /// took 0.73-0.97x the time the scheduler's placement took, 8 bytes to
    /// 16 MiB (docs/PERFORMANCE.md, twenty-sixth round). For ranks of one
    /// thread each (benchmarks); a rank that runs threads of its own (a
    /// trainer's compute pool) wants `None`.
    Cores,
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct Launch {
    pub nranks: usize,
    pub program: String,
    pub args: Vec<String>,
    pub output: Output,
    /// Grace between SIGTERM and SIGKILL when stopping ranks.
    pub kill_after: Duration,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Times the whole job is started again after a rank failed.
    pub max_restarts: usize,
    /// Where each rank may run.
    pub bind: Bind,
}

/// Whether this process already runs as a rank under some launcher.
pub fn under_launcher() -> bool {
    [
        "OXCCL_RANK",
        "RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
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

/// How long a launcher waits for the root's account of a failure once a
/// rank has failed (the notice usually precedes the exit).
const CAUSE_WAIT: Duration = Duration::from_millis(500);

/// Make the child die (SIGKILL) when this launcher dies, however it dies:
/// without it a SIGKILLed launcher leaves every rank running, orphaned.
/// The signal follows the *thread* that spawned the child, and `run`
/// spawns and waits on one thread.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid); it allocates nothing
    // (the error is built from an OS code).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// The CPU of each rank under `bind` (`None`: leave ranks where they are).
fn cpus_to_bind(bind: Bind, nranks: usize) -> Option<Vec<usize>> {
    if bind == Bind::None {
        return None;
    }
    let cpus = comm_core::sys::allowed_cpus();
    if cpus.is_empty() {
        eprintln!("oxrun: this process's CPU mask is unreadable: not binding ranks to cores");
        return None;
    }
    if cpus.len() < nranks {
        eprintln!(
            "oxrun: {nranks} ranks on {} CPUs: binding them round-robin, several to a CPU",
            cpus.len()
        );
    }
    Some(round_robin(&cpus, nranks))
}

/// Rank `r`'s CPU: the `r`-th of `cpus`, round-robin where ranks outnumber
/// them. `cpus` is not empty.
fn round_robin(cpus: &[usize], nranks: usize) -> Vec<usize> {
    (0..nranks).map(|r| cpus[r % cpus.len()]).collect()
}

/// Start the command bound to `cpu` alone.
fn bind_to(cmd: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and makes one
    // system call, allocating nothing (`bind_to_cpu`).
    unsafe {
        cmd.pre_exec(move || comm_core::sys::bind_to_cpu(cpu));
    }
}

fn signal_all(children: &mut [Option<Child>], sig: i32) {
    for c in children.iter().flatten() {
        // SAFETY: sending a signal to a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, sig) };
    }
}

/// Run the ranks to completion, starting them all again after a failure
/// while restarts are left; returns the exit code for this process (0 when
/// every rank of the last attempt succeeded).
pub fn run(l: &Launch) -> i32 {
    // SAFETY: installing an async-signal-safe handler that only stores an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let mut restart = 0;
    loop {
        let (code, interrupted) = attempt(l, restart);
        if code == 0 || interrupted || restart == l.max_restarts {
            if code != 0 && l.max_restarts > 0 && !interrupted {
                eprintln!("oxrun: no restarts left ({} used)", l.max_restarts);
            }
            return code;
        }
        restart += 1;
        eprintln!(
            "oxrun: restarting every rank (restart {restart} of {})",
            l.max_restarts
        );
    }
}

/// One start of every rank (`restart` of them came before): its exit code,
/// and whether a signal to this launcher stopped it.
fn attempt(l: &Launch, restart: usize) -> (i32, bool) {
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oxrun: {e}");
            return (2, false);
        }
    };
    // One host: keep the job on loopback unless told otherwise.
    let pin_loopback = config.socket_ifname.is_none();
    if pin_loopback {
        config.socket_ifname = Some("lo".into());
    }
    let (id, watch) = match UniqueId::watched(&config) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("oxrun: cannot start the rendezvous root: {e}");
            return (2, false);
        }
    };
    let n = l.nranks;
    let cpus = cpus_to_bind(l.bind, n);
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("OXCCL_RANK", rank.to_string())
            .env("OXCCL_WORLD_SIZE", n.to_string())
            .env("OXCCL_LOCAL_RANK", rank.to_string())
            .env("OXCCL_UNIQUE_ID", id.to_string())
            .env("OXRUN", "1")
            .env("OXRUN_RESTART_COUNT", restart.to_string())
            .env("TORCHELASTIC_RESTART_COUNT", restart.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if pin_loopback {
            cmd.env("OXCCL_SOCKET_IFNAME", "lo");
        }
        for (k, v) in &l.env {
            cmd.env(k, v);
        }
        die_with_parent(&mut cmd);
        if let Some(cpus) = &cpus {
            bind_to(&mut cmd, cpus[rank]);
        }
        match cmd.spawn() {
            Ok(mut c) => {
                let (out_mode, err_prefix) = match l.output {
                    Output::Prefixed => (Some(true), true),
                    Output::Plain => (Some(false), false),
                    Output::Rank0 => (if rank == 0 { Some(false) } else { None }, true),
                };
                let out = c.stdout.take().unwrap();
                match out_mode {
                    Some(prefix) => pumps.push(pump(rank, prefix, out, false)),
                    None => pumps.push(std::thread::spawn(move || {
                        let _ = std::io::copy(&mut { out }, &mut std::io::sink());
                    })),
                }
                pumps.push(pump(rank, err_prefix, c.stderr.take().unwrap(), true));
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!("oxrun: cannot start {:?} for rank {rank}: {e}", l.program);
                signal_all(&mut children, libc::SIGKILL);
                return (2, false);
            }
        }
    }
    let mut exit_code = 0;
    let mut interrupted = false;
    let mut stopping: Option<Instant> = None;
    let mut running = n;
    while running > 0 {
        let sig = SIGNALLED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!("oxrun: received signal {sig}, stopping all ranks");
            signal_all(&mut children, libc::SIGTERM);
            stopping.get_or_insert_with(Instant::now);
            exit_code = 128 + sig;
            interrupted = true;
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
        if !failed.is_empty() && stopping.is_none() {
            // Reap order says little (the victim and the ranks failing in
            // reaction end within milliseconds): the root this process
            // hosts relayed the job's first failure, ask it.
            let cause = watch.first_failure(CAUSE_WAIT);
            let culprit = cause.as_ref().and_then(Notice::culprit);
            // The culprit itself may still be on its way out (the others
            // reacted faster): give it a moment, so its exit status is the
            // launch's, before signalling anyone.
            if let Some(c) = culprit.filter(|c| *c < n) {
                let t = Instant::now();
                while let Some(child) = children[c].as_mut() {
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            let pid = child.id();
                            children[c] = None;
                            running -= 1;
                            if !status.success() {
                                failed.push((c, pid, status));
                            }
                        }
                        Ok(None) if t.elapsed() < CAUSE_WAIT => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        _ => break,
                    }
                }
            }
            // The culprit first, then killed ranks, then the lowest rank.
            failed.sort_by_key(|(rank, _, st)| {
                (Some(*rank) != culprit, st.signal().is_none(), *rank)
            });
            let (rank, pid, status) = failed[0];
            match &cause {
                Some(n) => eprintln!(
                    "oxrun: first failure: {n}; rank {rank} (pid {pid}) {}; stopping the other ranks",
                    describe(status)
                ),
                None => eprintln!(
                    "oxrun: rank {rank} (pid {pid}) {}; stopping the other ranks",
                    describe(status)
                ),
            }
            exit_code = status.code().filter(|c| *c != 0).unwrap_or(1);
            signal_all(&mut children, libc::SIGTERM);
            stopping = Some(Instant::now());
            failed.remove(0);
        }
        for (rank, pid, status) in &failed {
            eprintln!("oxrun: rank {rank} (pid {pid}) {}", describe(*status));
        }
        if let Some(t) = stopping {
            if t.elapsed() > l.kill_after {
                let left: Vec<usize> = (0..n).filter(|r| children[*r].is_some()).collect();
                if !left.is_empty() {
                    eprintln!(
                        "oxrun: ranks {left:?} did not stop within {:?}; killing them",
                        l.kill_after
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
    (exit_code, interrupted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_beyond_the_cpus_share_them_round_robin() {
        assert_eq!(round_robin(&[3, 5], 2), [3, 5]);
        assert_eq!(round_robin(&[3, 5], 5), [3, 5, 3, 5, 3]);
        assert_eq!(round_robin(&[0, 1, 2, 3], 2), [0, 1]);
        assert_eq!(cpus_to_bind(Bind::None, 4), None);
    }
}
