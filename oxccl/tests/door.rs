//! Strangers at the door: connections with a wrong secret, random bytes, an
//! oversized or truncated handshake, a right secret for another
//! communicator, and a client that connects and says nothing are rejected
//! at the rendezvous root, at a TCP data listener and at a shared-memory
//! listener during setup, and the setup completes; after it, every door
//! is closed. A flood of silent clients gets a bounded number of threads
//! and a client dripping its handshake is dropped at the admission
//! deadline.

mod common;
use common::*;
use oxccl::prelude::*;
use oxccl_handshake::{client, Hello, Purpose, Secret, ROOT};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

mod oxccl_handshake {
    pub use oxccl::transport_handshake::*;
}

/// A door: TCP (root, data listener) or an abstract Unix socket (the
/// shared-memory listener).
enum Target {
    Tcp(SocketAddr),
    Unix(Vec<u8>),
}

enum Conn {
    Tcp(TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Conn {
    fn open(to: &Target) -> Conn {
        match to {
            Target::Tcp(a) => Conn::Tcp(connect(*a)),
            Target::Unix(name) => {
                use std::os::linux::net::SocketAddrExt;
                let a = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
                let s = std::os::unix::net::UnixStream::connect_addr(&a).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                Conn::Unix(s)
            }
        }
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Expect the server to close on us (EOF or reset), never to accept.
fn closed_by_server(mut s: impl Read) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return true,
            Ok(_) => continue, // a challenge may come before the close
        }
    }
}

fn attack(
    to: &Target,
    purpose: Purpose,
    comm_id: u64,
    real: &Secret,
    to_rank: u32,
    (from, nranks): (usize, usize),
) {
    // Wrong secret (from a rank that may connect there).
    let mut s = Conn::open(to);
    let h = Hello::new(purpose, comm_id, from, to_rank, nranks, 0).unwrap();
    assert!(
        client(&mut s, &Secret::random().unwrap(), &h).is_err(),
        "wrong secret accepted"
    );
    // Random bytes.
    let mut s = Conn::open(to);
    let mut junk = [0u8; 64];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    s.write_all(&junk).unwrap();
    assert!(closed_by_server(s), "random bytes not rejected");
    // Right secret, another communicator.
    let mut s = Conn::open(to);
    let h = Hello::new(purpose, comm_id ^ 1, from, to_rank, nranks, 0).unwrap();
    assert!(
        client(&mut s, real, &h).is_err(),
        "foreign communicator accepted"
    );
    // Oversized: a valid magic followed by 64 KiB of junk.
    let mut s = Conn::open(to);
    let mut big = b"OXCCLHS1".to_vec();
    big.resize(64 << 10, 0xa5);
    let _ = s.write_all(&big); // the server may close before taking it all
    assert!(closed_by_server(s), "oversized handshake not rejected");
    // Truncated hello, then silence.
    let mut s = Conn::open(to);
    s.write_all(b"OXCCLHS1").unwrap();
    drop(s);
}

/// Wait (up to 3 s) until nothing accepts at `to` any more.
fn door_closes(to: &Target) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        let refused = match to {
            Target::Tcp(a) => TcpStream::connect(a).is_err(),
            Target::Unix(name) => {
                use std::os::linux::net::SocketAddrExt;
                let a = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
                std::os::unix::net::UnixStream::connect_addr(&a).is_err()
            }
        };
        if refused {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn strangers_are_rejected_during_setup_and_doors_close_after_it() {
    let cfg = test_config();
    // The transports' doors, open between listen and the end of connect:
    // attacked while the two real ranks are still to come.
    for t in oxccl::transports(&cfg).unwrap().list {
        let secret = Secret::random().unwrap();
        let ctx = |rank| oxccl::transport::SetupCtx {
            comm_id: 77,
            secret,
            rank,
            nranks: 2,
            config: cfg.clone(),
            bind_addr: "127.0.0.1".parse().unwrap(),
            reserved_port: None,
        };
        let (c0, c1) = (ctx(0), ctx(1));
        let mut e0 = t.listen(&c0).unwrap();
        let mut e1 = t.listen(&c1).unwrap();
        let (a0, a1) = (e0.address(), e1.address());
        let door = match t.name() {
            "tcp" => Target::Tcp(std::str::from_utf8(&a0).unwrap().parse().unwrap()),
            _ => Target::Unix(a0.clone()),
        };
        let purpose = if t.name() == "tcp" {
            Purpose::Tcp
        } else {
            Purpose::Shm
        };
        attack(&door, purpose, 77, &secret, 0, (1, 2));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let (l0, l1) = std::thread::scope(|s| {
            let h = s.spawn(|| e1.connect(&c1, &[(0, a0.clone())], deadline).unwrap());
            let l0 = e0.connect(&c0, &[(1, a1.clone())], deadline).unwrap();
            (l0, h.join().unwrap())
        });
        assert_eq!((l0.len(), l1.len()), (1, 1), "{}", t.name());
        // Setup is over: no late link can be added, secret or not.
        assert!(
            door_closes(&door),
            "{} door still open after setup",
            t.name()
        );
    }
    // The root: attacked before any rank registers, then the job runs.
    let id = UniqueId::with_config(&cfg).unwrap();
    let (secret, root) = (*id.secret(), id.root());
    let silent_root = connect(root);
    // Strangers claim ranks outside the job: a stranger claiming one of
    // its ranks with another secret ends the setup (by design: that is
    // how a misconfigured rank fails everyone at once).
    attack(
        &Target::Tcp(root),
        Purpose::Bootstrap,
        id.comm_id(),
        &secret,
        ROOT,
        (500, 1000),
    );
    std::thread::scope(|s| {
        for r in 0..3 {
            let (id, cfg) = (&id, cfg.clone());
            s.spawn(move || {
                let c = Communicator::init_with_config(id, r, 3, cfg).unwrap();
                let mut v: Vec<f32> = (0..1_000_003).map(|i| (i % 7) as f32).collect();
                c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert!(v
                    .iter()
                    .enumerate()
                    .all(|(i, x)| *x == 3.0 * (i % 7) as f32));
                c.barrier().unwrap();
            });
        }
    });
    assert!(
        door_closes(&Target::Tcp(root)),
        "root door still open after setup"
    );
    drop(silent_root);
}

#[test]
fn a_slow_client_is_dropped_and_a_flood_is_capped_while_ranks_get_in() {
    let cfg = test_config();
    let id = UniqueId::with_config(&cfg).unwrap();
    let root = id.root();
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"));
                comm.is_ok_and(|c| c.starts_with("oxccl-root-conn"))
            })
            .count()
    };
    // A client dripping a byte every second is dropped at the admission
    // deadline (10 s in total), although no single read waits long.
    let mut drip = connect(root);
    let t = std::time::Instant::now();
    let hello = Hello::new(Purpose::Bootstrap, id.comm_id(), 0, ROOT, 2, 0)
        .unwrap()
        .encode();
    let mut dropped = None;
    for b in hello.iter().cycle() {
        std::thread::sleep(Duration::from_secs(1));
        if drip.write_all(&[*b]).is_err() || t.elapsed() > Duration::from_secs(20) {
            dropped = Some(t.elapsed());
            break;
        }
    }
    let took = dropped.unwrap();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(14),
        "a dripping client was dropped after {took:?}"
    );
    // 300 silent connections: at most MAX_ADMITTING (64) get a thread.
    let flood: Vec<TcpStream> = (0..300).map(|_| connect(root)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let most = threads();
    assert!(most <= 64, "{most} door threads for 300 silent clients");
    // Real ranks get in while the flood is still connected: a rank
    // closed on arrival retries until the flood's admissions time out.
    let t = std::time::Instant::now();
    with_ids_ranks(&id, 2, cfg);
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
    drop(flood);
}

fn with_ids_ranks(id: &UniqueId, n: usize, cfg: oxccl::Config) {
    std::thread::scope(|s| {
        for r in 0..n {
            let cfg = cfg.clone();
            s.spawn(move || {
                let c = Communicator::init_with_config(id, r, n, cfg).unwrap();
                c.barrier().unwrap();
            });
        }
    });
}
