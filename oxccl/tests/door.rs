//! Strangers at the door: connections with a wrong secret, random bytes, an
//! oversized or truncated handshake, a right secret for another
//! communicator, a duplicate rank, a rank out of range, and a client
//! that connects and says nothing are rejected at the rendezvous root, at
//! a TCP data listener and at a shared-memory listener, while collectives
//! of the job complete.

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

fn attack(to: Target, purpose: Purpose, comm_id: u64, real: &Secret, to_rank: u32) {
    // Wrong secret (from a rank that may connect there).
    let mut s = Conn::open(&to);
    let h = Hello::new(purpose, comm_id, 2, to_rank, 3, 0).unwrap();
    assert!(
        client(&mut s, &Secret::random().unwrap(), &h).is_err(),
        "wrong secret accepted"
    );
    // Random bytes.
    let mut s = Conn::open(&to);
    let mut junk = [0u8; 64];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    s.write_all(&junk).unwrap();
    assert!(closed_by_server(s), "random bytes not rejected");
    // Right secret, another communicator.
    let mut s = Conn::open(&to);
    let h = Hello::new(purpose, comm_id ^ 1, 2, to_rank, 3, 0).unwrap();
    assert!(
        client(&mut s, real, &h).is_err(),
        "foreign communicator accepted"
    );
    // Oversized: a valid magic followed by 64 KiB of junk.
    let mut s = Conn::open(&to);
    let mut big = b"OXCCLHS1".to_vec();
    big.resize(64 << 10, 0xa5);
    let _ = s.write_all(&big); // the server may close before taking it all
    assert!(closed_by_server(s), "oversized handshake not rejected");
    // Truncated hello, then silence.
    let mut s = Conn::open(&to);
    s.write_all(b"OXCCLHS1").unwrap();
    drop(s);
}

#[test]
fn strangers_are_rejected_while_the_job_runs() {
    let cfg = test_config();
    let id = UniqueId::with_config(&cfg).unwrap();
    let secret = *id.secret();
    let root = id.root();
    // A silent client at the root, held open for the whole test.
    let silent_root = connect(root);
    std::thread::scope(|s| {
        for r in 0..3 {
            let (id, cfg) = (&id, cfg.clone());
            s.spawn(move || {
                let c = Communicator::init_with_config(id, r, 3, cfg).unwrap();
                let data_addr: SocketAddr = std::str::from_utf8(&c.peers()[1].addrs[0])
                    .unwrap()
                    .parse()
                    .unwrap();
                let silent_data = connect(data_addr);
                if r == 0 {
                    attack(Target::Tcp(root), Purpose::Bootstrap, c.id(), &secret, ROOT);
                    attack(Target::Tcp(data_addr), Purpose::Tcp, c.id(), &secret, 1);
                    attack(
                        Target::Unix(c.peers()[1].addrs[1].clone()),
                        Purpose::Shm,
                        c.id(),
                        &secret,
                        1,
                    );
                    // A duplicate of rank 2's connection, with the right secret.
                    let mut d = connect(data_addr);
                    let h = Hello::new(Purpose::Tcp, c.id(), 2, 1, 3, 0).unwrap();
                    assert!(
                        client(&mut d, &secret, &h).is_err(),
                        "duplicate rank accepted"
                    );
                    // A second registration as rank 2 at the root.
                    let mut d = connect(root);
                    let h = Hello::new(Purpose::Bootstrap, c.id(), 2, ROOT, 3, 0).unwrap();
                    client(&mut d, &secret, &h).unwrap(); // the door opens for the secret...
                    assert!(
                        closed_by_server_after_register(d, 2, 3),
                        "late registration accepted"
                    );
                    // A registration claiming a rank outside the job.
                    let mut d = connect(root);
                    let h = Hello::new(Purpose::Bootstrap, c.id(), 500, ROOT, 1000, 0).unwrap();
                    client(&mut d, &secret, &h).unwrap();
                    assert!(
                        closed_by_server_after_register(d, 500, 1000),
                        "out-of-range rank accepted"
                    );
                }
                // The job is undisturbed.
                let mut v: Vec<f32> = (0..1_000_003).map(|i| (i % 7) as f32).collect();
                c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert!(v
                    .iter()
                    .enumerate()
                    .all(|(i, x)| *x == 3.0 * (i % 7) as f32));
                c.barrier().unwrap();
                drop(silent_data);
            });
        }
    });
    drop(silent_root);
}

/// ...but a registration after the table went out is refused.
fn closed_by_server_after_register(mut s: TcpStream, rank: u32, nranks: u32) -> bool {
    let mut reg = vec![1u8];
    reg.extend_from_slice(&nranks.to_le_bytes());
    reg.extend_from_slice(&rank.to_le_bytes());
    reg.extend_from_slice(&0u16.to_le_bytes()); // hostname ""
    reg.extend_from_slice(&0u64.to_le_bytes());
    reg.extend_from_slice(&0u32.to_le_bytes());
    reg.push(0);
    let mut frame = (reg.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&reg);
    s.write_all(&frame).unwrap();
    let mut len = [0u8; 4];
    if s.read_exact(&mut len).is_err() {
        return true;
    }
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    body[0] == 11 // reject
}
