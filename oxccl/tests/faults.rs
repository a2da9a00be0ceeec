//! Fault-injection matrix: {TCP, shm} x {all_reduce, all_gather,
//! reduce_scatter, broadcast, reduce, all_to_all, send/recv} x {kill rank 0
//! (the root), a middle rank, the last rank} x {early in the call,
//! mid-transfer, early in a small call (1 KiB: over shared memory, the
//! small-message path)}. Four ranks run
//! the collective in a loop (`oxccl-selftest fault`); the victim SIGKILLs
//! itself. Every survivor must fail with `PeerLost` naming the victim,
//! within 5 s of its death; the worst detection time per transport is
//! printed.

mod common;
use std::io::{BufRead, BufReader};
use std::time::Duration;

const N: usize = 4;

fn case(transport: &str, kind: &str, victim: usize, when: &str) -> u128 {
    // Early deaths use smaller messages (the others wait inside the call);
    // mid-transfer deaths use large ones (data is flowing when it happens).
    let (bytes, when) = match when {
        "early" => ("64K", "early"),
        "small" => ("1K", "early"),
        _ => ("32M", "mid"),
    };
    case_of(N, transport, kind, bytes, victim, when)
}

/// One fault case on `n` ranks looping `kind` on `bytes`; `when`: `early`
/// or `mid`. Returns the slowest survivor's detection time (ms).
fn case_of(n: usize, transport: &str, kind: &str, bytes: &str, victim: usize, when: &str) -> u128 {
    let victim_s = victim.to_string();
    let mut kids =
        common::spawn_selftest(n, &["fault", kind, bytes, &victim_s, when], transport, 60);
    let outs: Vec<Vec<String>> = kids
        .iter_mut()
        .map(|k| {
            BufReader::new(k.stdout.take().unwrap())
                .lines()
                .map_while(Result::ok)
                .collect()
        })
        .collect();
    for mut k in kids {
        let _ = k.wait();
    }
    let ctx = format!("{transport} {kind} on {n} ranks, {bytes} B, victim {victim} {when}");
    let died: u128 = outs[victim]
        .iter()
        .find_map(|l| {
            l.strip_prefix("DYING ")
                .map(|r| r.split_whitespace().nth(1).unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| {
            panic!(
                "{ctx}: the victim did not report its death: {:?}",
                outs[victim]
            )
        });
    let mut worst = 0;
    for (r, lines) in outs.iter().enumerate().filter(|(r, _)| *r != victim) {
        let err = lines
            .iter()
            .find(|l| l.starts_with("ERROR"))
            .unwrap_or_else(|| panic!("{ctx}: rank {r} reported no error: {lines:?}"));
        let f: Vec<&str> = err.split_whitespace().collect();
        let at: u128 = f[2].parse().unwrap();
        let blamed: i64 = f[3].parse().unwrap();
        let detail = lines
            .iter()
            .find(|l| l.starts_with("DETAIL"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(f[4], "PeerLost", "{ctx}: rank {r} got {detail}");
        assert_eq!(
            blamed, victim as i64,
            "{ctx}: rank {r} blamed rank {blamed}: {detail}"
        );
        let took = at.saturating_sub(died);
        assert!(took < 5000, "{ctx}: rank {r} took {took} ms");
        worst = worst.max(took);
    }
    worst
}

fn matrix(transport: &str) {
    let mut worst = 0;
    for kind in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
        "send_recv",
    ] {
        for victim in [0, N / 2, N - 1] {
            for when in ["early", "mid", "small"] {
                let t = case(transport, kind, victim, when);
                eprintln!("{transport} {kind:>14} victim {victim} {when:>5}: every survivor reported PeerLost({victim}); slowest after {t} ms");
                worst = worst.max(t);
            }
        }
    }
    eprintln!("{transport}: worst detection time over 63 cases: {worst} ms");
}

#[test]
fn fault_matrix_tcp() {
    matrix("tcp");
}

#[test]
fn fault_matrix_shm() {
    matrix("shm");
}

/// The single-copy all_gather (2 ranks, plain buffers of 64 KiB to 4 MiB
/// of output: each rank reads the other's input through the kernel) has
/// the same guarantee: waiting for the dead peer or reading its memory,
/// the survivor reports `PeerLost` naming it.
#[test]
fn a_dead_peer_of_a_single_copy_all_gather_is_peer_lost() {
    for victim in [0, 1] {
        for when in ["early", "mid"] {
            for _ in 0..3 {
                let t = case_of(2, "shm", "all_gather", "1M", victim, when);
                eprintln!("single-copy all_gather victim {victim} {when:>5}: PeerLost({victim}) after {t} ms");
            }
        }
    }
}

/// A stopped peer (SIGSTOP) cannot be told from a slow one until the
/// deadline: every survivor must fail with `Timeout` naming it (directly or
/// as relayed by the rank that timed out first) once the configured timeout
/// passes, and none may hang.
#[test]
fn a_stopped_peer_is_a_timeout_naming_it_on_every_survivor() {
    for transport in ["tcp", "shm"] {
        let mut kids = common::spawn_selftest(N, &["loop", "1M"], transport, 2);
        let mut readers = common::wait_running(&mut kids);
        let victim = 2;
        let stopped_at = std::time::Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(kids[victim].id() as i32, libc::SIGSTOP) };
        for (r, reader) in readers.iter_mut().enumerate().filter(|(r, _)| *r != victim) {
            let detail = reader
                .find(|l| l.as_ref().map(|l| l.starts_with("DETAIL")).unwrap_or(true))
                .unwrap()
                .unwrap();
            let took = stopped_at.elapsed();
            assert!(
                detail.contains("Timeout") && detail.contains(&format!("rank {victim}")),
                "{transport}: rank {r}: {detail}"
            );
            assert!(
                took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
                "{transport}: rank {r} after {took:?}"
            );
            eprintln!(
                "{transport}: rank {r} reported the stopped rank {victim} after {:.2} s: {detail}",
                took.as_secs_f64()
            );
        }
        for k in &kids {
            // SAFETY: signalling our own children.
            unsafe { libc::kill(k.id() as i32, libc::SIGKILL) };
        }
        for mut k in kids {
            let _ = k.wait();
        }
    }
}

/// One trial of the random fault harness.
#[derive(Clone, Copy, Debug)]
struct Trial {
    ranks: usize,
    /// `shm` or `tcp` for every pair; `auto` (pretend hosts only): shared
    /// memory inside a host, TCP between hosts.
    transport: &'static str,
    /// `uid`: a root hosted by a launcher (this test) and `OXCCL_UNIQUE_ID`;
    /// `addr`: `OXCCL_ROOT`, rank 0 hosting the root (how mpirun/srun jobs run).
    launch: &'static str,
    signal: i32,
    victim: usize,
    /// Milliseconds after every rank ran its first call.
    delay_ms: u64,
    bytes: &'static str,
    /// Pretend hosts (`OXCCL_HOSTID`), ranks dealt round-robin: 1 is one
    /// host. Across hosts a rank cannot see a peer's process in `/proc`;
    /// it must tell a dead peer from a live one as it would between real
    /// machines (the peer's rescue port).
    hosts: usize,
}

/// xorshift64*: reproducible from the seed printed on failure.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn below(&mut self, m: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % m
    }
}

impl Trial {
    /// A trial on one host.
    fn random(seed: u64) -> Trial {
        let mut rng = Rng::new(seed);
        let mut next = |m: u64| rng.below(m);
        let ranks = 3 + next(6) as usize;
        Trial {
            ranks,
            transport: ["shm", "tcp"][next(2) as usize],
            launch: ["uid", "addr"][next(2) as usize],
            signal: [libc::SIGKILL, libc::SIGSTOP][next(2) as usize],
            // Rank 0 a third of the time: it hosts the root under `addr`.
            victim: if next(3) == 0 {
                0
            } else {
                next(ranks as u64) as usize
            },
            delay_ms: next(300),
            bytes: ["8", "64K", "4M"][next(3) as usize],
            hosts: 1,
        }
    }

    /// The same trial as [`Trial::random`], its ranks spread over 2 or 3
    /// pretend hosts or one host each; shared memory becomes `auto`.
    fn spread(seed: u64) -> Trial {
        let t = Trial::random(seed);
        let mut rng = Rng::new(seed ^ 0x005e_ed0f_4057);
        let hosts = [2, 3, t.ranks][rng.below(3) as usize];
        Trial {
            hosts,
            transport: if t.transport == "shm" { "auto" } else { "tcp" },
            ..t
        }
    }
}

/// Per survivor: (blamed rank, milliseconds from the signal to its error).
fn run_trial(t: &Trial) -> Result<Vec<(i64, u128)>, String> {
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    let n = t.ranks;
    let selftest = env!("CARGO_BIN_EXE_oxccl-selftest");
    let uid = oxccl::UniqueId::serve(
        "127.0.0.1:0".parse().unwrap(),
        oxccl::transport_handshake::Secret::random().unwrap(),
        Duration::from_secs(60),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut kids: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(selftest);
            c.args(["loop", t.bytes])
                .env("OXCCL_RANK", r.to_string())
                .env("OXCCL_WORLD_SIZE", n.to_string())
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env("OXCCL_TIMEOUT", "3")
                .env("OXCCL_TRANSPORT", t.transport)
                .env("OXCCL_HOSTID", format!("pretend-host-{}", r % t.hosts))
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            match t.launch {
                "uid" => c.env("OXCCL_UNIQUE_ID", uid.to_string()),
                _ => c
                    .env("OXCCL_ROOT", format!("127.0.0.1:{port}"))
                    .env("OXCCL_SECRET", format!("trial-{port}")),
            };
            c.spawn().unwrap()
        })
        .collect();
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    for (r, k) in kids.iter_mut().enumerate() {
        let (out, tx) = (k.stdout.take().unwrap(), tx.clone());
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, l));
            }
        });
    }
    let kill_all = |kids: &mut Vec<std::process::Child>| {
        for k in kids.iter_mut() {
            let _ = k.kill();
            let _ = k.wait();
        }
    };
    let mut running = vec![false; n];
    while !running.iter().all(|r| *r) {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((r, l)) if l.starts_with("RUNNING") => running[r] = true,
            Ok(_) => {}
            Err(_) => {
                kill_all(&mut kids);
                return Err(format!("ranks did not start: {running:?}"));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(t.delay_ms));
    let signalled = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(kids[t.victim].id() as i32, t.signal) };
    let mut verdicts: Vec<Option<(i64, u128)>> = vec![None; n];
    let mut details = vec![String::new(); n];
    let survivors = || (0..n).filter(|r| *r != t.victim);
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while survivors().any(|r| verdicts[r].is_none()) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((r, l)) => {
                if let Some(rest) = l.strip_prefix("ERROR ") {
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    let at: u128 = f[1].parse().unwrap();
                    verdicts[r] = Some((f[2].parse().unwrap(), at.saturating_sub(signalled)));
                } else if l.starts_with("DETAIL") {
                    details[r] = l;
                }
            }
            Err(_) => {
                kill_all(&mut kids);
                let silent: Vec<usize> = survivors().filter(|r| verdicts[*r].is_none()).collect();
                return Err(format!(
                    "HANG: survivors {silent:?} reported nothing in 30 s"
                ));
            }
        }
    }
    // Let DETAIL lines arrive, then clean up (the stopped victim too).
    std::thread::sleep(Duration::from_millis(50));
    while let Ok((r, l)) = rx.try_recv() {
        if l.starts_with("DETAIL") {
            details[r] = l;
        }
    }
    kill_all(&mut kids);
    let out: Vec<(i64, u128)> = survivors().map(|r| verdicts[r].unwrap()).collect();
    let wrong: Vec<String> = survivors()
        .filter(|r| verdicts[*r].unwrap().0 != t.victim as i64)
        .map(|r| format!("rank {r} blamed {}: {}", verdicts[r].unwrap().0, details[r]))
        .collect();
    if !wrong.is_empty() {
        return Err(format!("wrong culprit: {}", wrong.join(" | ")));
    }
    Ok(out)
}

fn harness(plan: impl IntoIterator<Item = (u64, Trial)>) {
    let mut failures = Vec::new();
    let mut times: std::collections::BTreeMap<String, Vec<u128>> = Default::default();
    let mut trials = 0;
    for (seed, t) in plan {
        trials += 1;
        eprintln!("seed {seed}: {t:?}");
        match run_trial(&t) {
            Ok(v) => {
                let sig = if t.signal == libc::SIGKILL {
                    "SIGKILL"
                } else {
                    "SIGSTOP"
                };
                let hosts = if t.hosts == 1 { "" } else { " hosts" };
                let key = format!("{sig} {} {}{hosts}", t.launch, t.transport);
                times.entry(key).or_default().extend(v.iter().map(|x| x.1));
            }
            Err(e) => failures.push(format!("seed {seed} {t:?}: {e}")),
        }
    }
    for (k, mut v) in times {
        v.sort_unstable();
        eprintln!(
            "{k}: {} survivor reports, detection min {} ms, median {} ms, max {} ms",
            v.len(),
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
    eprintln!("{trials} trials, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The random fault harness, short: seeds chosen to cover both launch
/// modes x both signals x rank 0 or another rank as the victim, plus the
/// four seeds of the long run that found wrong culprits before (rank 0
/// hosting the root SIGKILLed over TCP; a stall verdict lost as rank 0
/// exited).
#[test]
fn random_faults_every_survivor_names_the_victim() {
    harness([9, 16, 0, 6, 11, 10, 1, 3, 1000, 1014, 1017, 1034].map(|s| (s, Trial::random(s))));
}

/// The same harness with ranks on pretend hosts (`OXCCL_HOSTID`), where
/// liveness is not read from `/proc`: seeds covering both launch modes x
/// both signals x rank 0 or another rank as the victim, plus seeds of the
/// long run that named a wrong culprit when rank 0, hosting the root, did
/// not wait for the first cause to be relayed before exiting (1007, 1009,
/// 1018, 1049) and when a gone root was not taken as its host's end
/// (1057, 1098: a killed rank 0's rescue port still accepted).
#[test]
fn random_faults_across_hosts_every_survivor_names_the_victim() {
    let seeds = [
        9, 16, 0, 6, 11, 10, 1, 3, 1007, 1009, 1018, 1049, 1057, 1098,
    ];
    harness(seeds.map(|s| (s, Trial::spread(s))));
}

/// The long run (`cargo test --release -p oxccl --test faults -- --ignored`).
#[test]
#[ignore]
fn random_faults_long() {
    harness(long_seeds().map(|s| (s, Trial::random(s))));
}

/// The long runs' seeds: `OXCCL_FAULT_SEEDS` (a comma-separated list, to
/// replay failures), else `OXCCL_FAULT_TRIALS` (default 200) from 1000.
fn long_seeds() -> impl Iterator<Item = u64> {
    let var = |name| std::env::var(name).ok();
    let listed: Option<Vec<u64>> = var("OXCCL_FAULT_SEEDS").map(|v| {
        v.split(',')
            .map(|s| s.trim().parse().expect("OXCCL_FAULT_SEEDS: seeds"))
            .collect()
    });
    let n = var("OXCCL_FAULT_TRIALS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    listed
        .unwrap_or_else(|| (1000..1000 + n).collect())
        .into_iter()
}

/// The long run across pretend hosts (`OXCCL_FAULT_TRIALS`, ignored).
#[test]
#[ignore]
fn random_faults_across_hosts_long() {
    harness(long_seeds().map(|s| (s, Trial::spread(s))));
}
