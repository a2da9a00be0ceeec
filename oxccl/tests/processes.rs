//! Separate processes: the correctness matrix through `oxrun`, the
//! launcher's failure handling, launching with torchrun's variables, and
//! SIGKILL of a rank in the middle of a long all_reduce.

mod common;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const OXRUN: &str = env!("CARGO_BIN_EXE_oxrun");
const SELFTEST: &str = env!("CARGO_BIN_EXE_oxccl-selftest");

fn oxrun(n: usize, args: &[&str]) -> std::process::Output {
    Command::new(OXRUN)
        .arg("-n")
        .arg(n.to_string())
        .arg(SELFTEST)
        .args(args)
        .env("OXCCL_TIMEOUT", "120")
        .output()
        .expect("run oxrun")
}

#[test]
fn matrix_through_oxrun() {
    for n in [1, 2, 3, 4, 5, 8] {
        let out = oxrun(n, &["matrix"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "n={n}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("[0] matrix OK: {n} ranks")),
            "{stdout}"
        );
    }
}

/// The matrix in separate processes with each logarithmic and the
/// hierarchical algorithm forced, on 2 pretend hosts of 2 ranks each
/// (`OXCCL_HOSTID`: shared memory inside a host, TCP between).
#[test]
fn forced_algorithms_in_processes_on_two_hosts() {
    for algo in [
        "doubling", "bruck", "tree", "dbtree", "halving", "scatter", "hier",
    ] {
        let kids = common::spawn_selftest_env(4, &["matrix"], "auto", 120, |r| {
            vec![
                ("OXCCL_ALGO", algo.to_string()),
                ("OXCCL_HOSTID", format!("forced-host-{}", r / 2)),
            ]
        });
        for (r, k) in kids.into_iter().enumerate() {
            let out = k.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{algo}, rank {r}: {stdout}");
            assert!(
                r > 0 || stdout.contains("matrix OK: 4 ranks"),
                "{algo}: {stdout}"
            );
        }
    }
}

#[test]
fn oxrun_reports_a_killed_rank_and_stops_the_others() {
    let t = Instant::now();
    let out = oxrun(4, &["die", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("rank 2 (pid"), "{err}");
    assert!(err.contains("first failure: rank 2 was lost"), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
}

/// Each rank's `Cpus_allowed_list`, by rank, from `oxrun -n N ARGS -- sh`.
fn allowed_cpus_under_oxrun(n: usize, args: &[&str]) -> (Vec<String>, String) {
    let out = Command::new(OXRUN)
        .args(["-n", &n.to_string()])
        .args(args)
        .args(["--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"])
        .output()
        .expect("run oxrun");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lists: Vec<(usize, String)> = text
        .lines()
        .filter_map(|l| {
            let (rank, rest) = l.strip_prefix('[')?.split_once("] ")?;
            let list = rest.strip_prefix("Cpus_allowed_list:")?.trim();
            Some((rank.parse().ok()?, list.to_string()))
        })
        .collect();
    lists.sort();
    let lists = lists.into_iter().map(|(_, l)| l).collect();
    (lists, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn oxrun_binds_each_rank_to_a_core_of_its_own_when_asked() {
    // The CPUs of this process's mask (`nproc` counts the mask; std's
    // count is less under a CPU quota).
    let nproc = Command::new("nproc").output().expect("nproc");
    let cpus: usize = String::from_utf8_lossy(&nproc.stdout)
        .trim()
        .parse()
        .unwrap();
    let (unbound, _) = allowed_cpus_under_oxrun(2, &[]);
    assert_eq!(unbound.len(), 2, "{unbound:?}");
    assert_eq!(
        unbound[0], unbound[1],
        "unbound ranks share the launcher's mask"
    );
    if cpus >= 2 {
        let (bound, _) = allowed_cpus_under_oxrun(2, &["--bind", "cores"]);
        assert_eq!(bound.len(), 2, "{bound:?}");
        for list in &bound {
            assert!(list.parse::<usize>().is_ok(), "one CPU each: {bound:?}");
        }
        assert_ne!(bound[0], bound[1], "a CPU each: {bound:?}");
    }
    // More ranks than CPUs: one CPU each, round-robin (rank `cpus` back
    // on rank 0's), and the launch says so.
    let (many, err) = allowed_cpus_under_oxrun(cpus + 1, &["--bind", "cores"]);
    assert_eq!(many.len(), cpus + 1, "{many:?}");
    for list in &many {
        assert!(list.parse::<usize>().is_ok(), "one CPU each: {many:?}");
    }
    assert_eq!(many[cpus], many[0], "round-robin: {many:?}");
    if cpus >= 2 {
        assert_ne!(many[1], many[0], "{many:?}");
    }
    assert!(err.contains("binding them round-robin"), "{err}");
    let bad = Command::new(OXRUN)
        .args(["-n", "2", "--bind", "sockets", "true"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--bind takes none or cores"));
}

#[test]
fn oxrun_rejects_bad_usage() {
    let out = Command::new(OXRUN).arg("-n").arg("x").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(OXRUN).arg("-n").arg("2").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing PROGRAM"));
}

#[test]
fn torchrun_style_environment() {
    let port = common::free_port();
    let kids: Vec<Child> = (0..3)
        .map(|r| {
            Command::new(SELFTEST)
                .arg("init")
                .env_clear()
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "3")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env("OXCCL_TIMEOUT", "60")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().unwrap())
        .collect();
    for o in &outs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }
    assert!(String::from_utf8_lossy(&outs[0].stdout).contains("init of 3 ranks"));
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Start `n` ranks of `selftest loop` directly (not under oxrun, which
/// would stop the survivors itself) with a root hosted by this process.
fn spawn_loop(n: usize, bytes: &str, transport: &str) -> Vec<Child> {
    spawn_mode(n, "loop", bytes, transport)
}

fn spawn_mode(n: usize, mode: &str, bytes: &str, transport: &str) -> Vec<Child> {
    common::spawn_selftest(n, &[mode, bytes], transport, 60)
}

fn sigkill_test(transport: &str) {
    sigkill_mode_test("loop", transport)
}

fn sigkill_mode_test(mode: &str, transport: &str) {
    for victim in [0usize, 1, 3] {
        let n = 4;
        let mut kids = spawn_mode(n, mode, "32M", transport);
        // Wait until every rank completed one all_reduce.
        let mut readers = common::wait_running(&mut kids);
        std::thread::sleep(Duration::from_millis(150)); // in the middle of a later one
        let killed_at = now_ms();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(kids[victim].id() as i32, libc::SIGKILL) };
        for (r, reader) in readers.iter_mut().enumerate() {
            if r == victim {
                continue;
            }
            let line = reader
                .find(|l| l.as_ref().map(|l| l.starts_with("ERROR")).unwrap_or(true))
                .expect("error line")
                .unwrap();
            let f: Vec<&str> = line.split_whitespace().collect();
            let at: u128 = f[2].parse().unwrap();
            let blamed: i64 = f[3].parse().unwrap();
            let detail = reader.next().unwrap().unwrap();
            assert_eq!(blamed, victim as i64, "rank {r} blamed {blamed}: {detail}");
            assert!(detail.contains("PeerLost"), "rank {r}: {detail}");
            let took = at.saturating_sub(killed_at);
            assert!(took < 5000, "rank {r} took {took} ms to report");
            eprintln!("{mode} {transport}: victim {victim}: rank {r} reported PeerLost({victim}) after {took} ms");
        }
        for mut k in kids {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

/// SIGKILL one rank mid-job; the survivors shrink it away and their new
/// communicator's all_reduce is exact (the sum of survivors' world ranks).
fn shrink_after_sigkill(transport: &str, root_on_rank0: bool) {
    for victim in [0usize, 2] {
        let n = 4;
        let mut kids = if root_on_rank0 {
            // Started as torchrun starts ranks: rank 0 hosts the root, so
            // killing it kills the old communicator's root too.
            let port = common::free_port().to_string();
            (0..n)
                .map(|r| {
                    Command::new(SELFTEST)
                        .args(["shrink", "4M"])
                        .env_clear()
                        .env("RANK", r.to_string())
                        .env("WORLD_SIZE", n.to_string())
                        .env("MASTER_ADDR", "127.0.0.1")
                        .env("MASTER_PORT", &port)
                        .env("OXCCL_SOCKET_IFNAME", "lo")
                        .env("OXCCL_TIMEOUT", "60")
                        .env("OXCCL_TRANSPORT", transport)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect()
        } else {
            spawn_mode(n, "shrink", "4M", transport)
        };
        let mut readers = common::wait_running(&mut kids);
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(kids[victim].id() as i32, libc::SIGKILL) };
        let expect: f64 = (0..n)
            .filter(|r| *r != victim)
            .map(|r| r as f64 + 1.0)
            .sum();
        for (r, reader) in readers.iter_mut().enumerate() {
            if r == victim {
                continue;
            }
            let line = reader
                .find(|l| l.as_ref().map(|l| l.starts_with("SHRUNK")).unwrap_or(true))
                .expect("a SHRUNK line")
                .unwrap();
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f[0], "SHRUNK", "rank {r}: {line}");
            let new_rank: usize = f[2].parse().unwrap();
            assert_eq!(new_rank, if r < victim { r } else { r - 1 }, "{line}");
            assert_eq!(f[3], "3", "{line}");
            assert_eq!(
                f[4],
                victim.to_string(),
                "rank {r} excluded {}: {line}",
                f[4]
            );
            assert_eq!(f[5].parse::<f64>().unwrap(), expect, "{line}");
        }
        for mut k in kids {
            let status = k.wait().unwrap();
            let _ = status;
        }
        eprintln!("shrink {transport} (root on rank 0: {root_on_rank0}): victim {victim}: survivors shrank and summed {expect}");
    }
}

#[test]
fn shrink_after_sigkill_gives_exact_collectives_shm() {
    shrink_after_sigkill("shm", false);
}

#[test]
fn shrink_after_sigkill_gives_exact_collectives_tcp() {
    shrink_after_sigkill("tcp", false);
}

#[test]
fn shrink_after_sigkill_of_the_rank_hosting_the_root() {
    shrink_after_sigkill("shm", true);
}

#[test]
fn sigkill_mid_all_reduce_is_peer_lost_on_every_survivor_within_5s_tcp() {
    sigkill_test("tcp");
}

#[test]
fn sigkill_mid_all_reduce_is_peer_lost_on_every_survivor_within_5s_shm() {
    sigkill_test("shm");
}

fn dev_shm() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn shared_memory_leaves_nothing_in_dev_shm_after_exit_or_sigkill() {
    let before = dev_shm();
    // Normal exit.
    let out = oxrun(4, &["allreduce", "4M", "3"]);
    assert!(out.status.success());
    assert_eq!(dev_shm(), before, "a normal exit left files in /dev/shm");
    // SIGKILL of every rank in the middle of traffic.
    let mut kids = spawn_loop(4, "8M", "shm");
    let _readers = common::wait_running(&mut kids);
    // The segments are memfds: visible in the maps as deleted files, never in /dev/shm.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", kids[0].id())).unwrap();
    assert!(
        maps.contains("memfd:oxccl-shm"),
        "rank 0 maps no oxccl segment"
    );
    for k in &kids {
        // SAFETY: signalling our own children.
        unsafe { libc::kill(k.id() as i32, libc::SIGKILL) };
    }
    for mut k in kids {
        let _ = k.wait();
    }
    assert_eq!(
        dev_shm(),
        before,
        "SIGKILL of all ranks left files in /dev/shm"
    );
}

#[test]
fn ten_thousand_small_all_reduces_on_4_ranks_sharing_2_cores() {
    // A generous bound on the total (not a timing assertion on one call):
    // a lost wake-up would stall a call until the 60 s timeout.
    let t = Instant::now();
    let out = oxrun(4, &["small", "10000"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("small OK: 10000"), "{stdout}");
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "took {:?}",
        t.elapsed()
    );
    eprintln!("{}", stdout.trim());
}

#[test]
fn sigkill_mid_registered_all_reduce_is_peer_lost_within_5s() {
    sigkill_mode_test("loop-registered", "shm");
}

#[test]
fn oxrun_names_the_rank_that_failed_first_not_the_first_it_reaps() {
    // Rank 2 aborts and exits with status 5; the others fail in reaction
    // and exit 3 within the same moment. Reap order would name rank 0.
    for _ in 0..3 {
        let out = oxrun(4, &["fail", "2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{err}");
        let first = err
            .lines()
            .find(|l| l.contains("stopping the other ranks"))
            .unwrap_or_else(|| panic!("no report: {err}"));
        assert!(
            first.contains("first failure: rank 2 aborted") && first.contains("rank 2 (pid"),
            "{err}"
        );
    }
}

/// The children of `pid` (every thread's list).
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let c = std::fs::read_to_string(t.unwrap().path().join("children")).unwrap_or_default();
        v.extend(c.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
    }
    v
}

/// Whether `pid` is gone (or a zombie, i.e. dead).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn ranks_die_with_a_sigkilled_oxrun() {
    let mut run = Command::new(OXRUN)
        .args(["-n", "3", SELFTEST, "loop", "64K"])
        .env("OXCCL_TIMEOUT", "120")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until every rank runs.
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(run.stdout.take().unwrap()).lines();
    let mut running = 0;
    while running < 3 {
        if lines.next().unwrap().unwrap().contains("RUNNING") {
            running += 1;
        }
    }
    let ranks = children_of(run.id());
    assert_eq!(ranks.len(), 3, "{ranks:?}");
    run.kill().unwrap(); // SIGKILL: no handler of oxrun's runs
    run.wait().unwrap();
    let t = Instant::now();
    while !ranks.iter().all(|p| dead(*p)) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "ranks {ranks:?} outlived oxrun"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
