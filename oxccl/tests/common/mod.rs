//! In-process harness: threads as ranks over the real transports (shared
//! memory between ranks of one host, TCP on loopback otherwise).
#![allow(dead_code)]

use oxccl::prelude::*;
use std::time::Duration;

/// Configuration for tests: loopback only, a deadline that turns a hang
/// into a failure.
pub fn test_config() -> Config {
    Config {
        socket_ifname: Some("lo".into()),
        timeout: Duration::from_secs(120),
        ..Config::default()
    }
}

/// [`test_config`] with every peer forced onto TCP.
pub fn tcp_config() -> Config {
    Config {
        transport: Some("tcp".into()),
        ..test_config()
    }
}

/// [`test_config`] on a pretend host: ranks with the same `host` use shared
/// memory between them, TCP to the others.
pub fn host_config(host: usize) -> Config {
    Config {
        host_id: Some(format!("test-host-{host}")),
        ..test_config()
    }
}

/// Run `f` on `n` ranks (one thread each) of a fresh communicator.
pub fn with_ranks<R: Send>(n: usize, cfg: Config, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    with_rank_configs(n, |_| cfg.clone(), f)
}

/// [`with_ranks`] with a configuration per rank (e.g. a host id each, to
/// build a communicator that mixes shared memory and TCP).
pub fn with_rank_configs<R: Send>(
    n: usize,
    cfg: impl Fn(usize) -> Config,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let id = UniqueId::with_config(&cfg(0)).expect("root");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, cfg, f) = (&id, cfg(r), &f);
                s.spawn(move || f(Communicator::init_with_config(id, r, n, cfg).expect("init")))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Start `n` ranks of `oxccl-selftest ARGS` as separate processes (not
/// under oxrun, which would stop survivors itself), joined through a root
/// hosted by this test process; stdout piped for the test to read.
pub fn spawn_selftest(
    n: usize,
    args: &[&str],
    transport: &str,
    timeout_s: u32,
) -> Vec<std::process::Child> {
    spawn_selftest_env(n, args, transport, timeout_s, |_| Vec::new())
}

/// [`spawn_selftest`] with more variables for rank `r`: `env(r)`.
#[allow(dead_code)]
pub fn spawn_selftest_env(
    n: usize,
    args: &[&str],
    transport: &str,
    timeout_s: u32,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<std::process::Child> {
    let id = UniqueId::serve(
        "127.0.0.1:0".parse().unwrap(),
        oxccl::transport_handshake::Secret::random().unwrap(),
        Duration::from_secs(60),
    )
    .unwrap();
    (0..n)
        .map(|r| {
            std::process::Command::new(env!("CARGO_BIN_EXE_oxccl-selftest"))
                .args(args)
                .env("OXCCL_RANK", r.to_string())
                .env("OXCCL_WORLD_SIZE", n.to_string())
                .env("OXCCL_UNIQUE_ID", id.to_string())
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env("OXCCL_TIMEOUT", timeout_s.to_string())
                .env("OXCCL_TRANSPORT", transport)
                .envs(env(r))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Each child's stdout as lines, read until every rank printed `RUNNING`
/// (it completed a first collective); the readers go on from there.
pub fn wait_running(
    kids: &mut [std::process::Child],
) -> Vec<std::io::Lines<std::io::BufReader<std::process::ChildStdout>>> {
    use std::io::BufRead;
    let mut readers: Vec<_> = kids
        .iter_mut()
        .map(|k| std::io::BufReader::new(k.stdout.take().unwrap()).lines())
        .collect();
    for r in readers.iter_mut() {
        while !r
            .next()
            .expect("rank output")
            .unwrap()
            .starts_with("RUNNING")
        {}
    }
    readers
}

/// A local port held bound, never listening, while the fd lives: a
/// connection to it is refused, and no other socket (a root another test
/// starts meanwhile) can take it, as it could a port merely free.
pub fn refusing_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a fresh fd owned below; `addr` and
    // `len` are valid for the calls that write them.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket");
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let sa = &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr;
        assert_eq!(libc::bind(fd, sa, len), 0, "bind");
        let mut got = len;
        assert_eq!(libc::getsockname(fd, sa, &mut got), 0, "getsockname");
        (owned, u16::from_be(addr.sin_port))
    }
}

/// A local port nobody listens on (at the moment of asking), for a rank
/// that a launcher starts to listen on later. Taken below the kernel's
/// ephemeral range where it can: a port of that range, free when asked,
/// can go to any process's next listener on port 0 or outgoing connection
/// before the rank binds it (under mpirun, whose daemons open such
/// sockets meanwhile, the root once failed with "Address already in
/// use"). Each call of a test process takes a different port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_from.saturating_sub(LOWEST);
    if span >= 1_000 {
        let start = std::process::id().wrapping_mul(7_919);
        for _ in 0..span {
            let k = CALLS.fetch_add(1, Ordering::Relaxed);
            let port = LOWEST + start.wrapping_add(k) % span;
            // The rank listens on every interface: the port must be free there.
            if std::net::TcpListener::bind(("0.0.0.0", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
