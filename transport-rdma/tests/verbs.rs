//! Link-level tests against a real verbs device (run inside the Soft-RoCE
//! VM by `scripts/rdma-ci`; on a host without a device each test prints why
//! it is skipped and passes). Two endpoints of one process connect over the
//! device; the tests drive the links by hand, as the executor does.
#![cfg(feature = "verbs")]

use comm_core::handshake::{self, Hello, Purpose, Secret};
use comm_core::transport::{
    Link, OneSided, PeerMemory, Registration, Registry, SetupCtx, Transport,
};
use comm_core::{Config, Region};
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport_rdma::link::RdmaLink;
use transport_rdma::{LoopbackPair, RdmaTransport};

fn transport() -> Option<RdmaTransport> {
    // Short ACK timeout and few retries so a dead QP fails fast here.
    std::env::set_var("OXCCL_IB_TIMEOUT", "10");
    std::env::set_var("OXCCL_IB_RETRY_CNT", "2");
    match transport_rdma::probe().expect("probe") {
        Some(t) => Some(t),
        None => {
            println!("skipped: no RDMA device on this host (run scripts/rdma-ci)");
            None
        }
    }
}

/// Rank 0's link to rank 1 and rank 1's to rank 0, over the device, with
/// rank 0's registry and rank 1's direct access.
fn loopback(t: &RdmaTransport, chunk: usize) -> LoopbackPair {
    t.loopback_pair(Config {
        chunk_bytes: Some(chunk),
        ..Config::default()
    })
    .expect("loopback pair")
}

/// The links and rank 0's registry.
fn pair(t: &RdmaTransport, chunk: usize) -> (RdmaLink, RdmaLink, Arc<dyn Registry>) {
    let p = loopback(t, chunk);
    (p.links.0, p.links.1, p.registry)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// Wait (as the executor does) until `f` stops saying WouldBlock: arm the
/// link, then sleep in poll(2) on its fd for up to `sleep_ms` at a time.
fn wait_for<L: Link + ?Sized, T>(
    link: &mut L,
    sleep_ms: i32,
    mut f: impl FnMut(&mut L) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match f(link) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(Instant::now() < until, "no progress for 20 s");
                if !link.arm(0, true, true) {
                    let mut p = libc::pollfd {
                        fd: link.fd(0),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut p, 1, sleep_ms) };
                }
            }
            r => return r,
        }
    }
}

/// [`wait_for`] with short sleeps.
fn drive<L: Link + ?Sized, T>(
    link: &mut L,
    f: impl FnMut(&mut L) -> std::io::Result<T>,
) -> std::io::Result<T> {
    wait_for(link, 100, f)
}

#[test]
fn a_stream_arrives_intact_and_a_full_window_stops_the_sender() {
    let Some(t) = transport() else { return };
    // 64 KiB chunks: 16 KiB slots, 8 of them = 128 KiB in flight at most.
    let (mut a, mut b, _reg) = pair(&t, 64 << 10);
    let data = pattern(3 << 20, 7);
    // Write without reading: the sender must stop at the receiver's window.
    let mut sent = 0;
    loop {
        match a.write(0, &[IoSlice::new(&data[sent..sent + 1000])]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(
            sent <= 8 * (16 << 10),
            "sender overran the receiver: {sent} bytes accepted"
        );
    }
    assert!(sent > 0);
    println!("window full after {sent} bytes (8 slots, 1000-byte writes)");
    // Now alternate writes of varied shapes with reads of varied sizes.
    let mut got = Vec::with_capacity(data.len());
    let mut x = 12345u64;
    while got.len() < data.len() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        if sent < data.len() {
            let k = (1 + (x >> 33) as usize % 70_000).min(data.len() - sent);
            let split = k / 3;
            let bufs = [
                IoSlice::new(&data[sent..sent + split]),
                IoSlice::new(&data[sent + split..sent + k]),
            ];
            match a.write(0, &bufs) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        let want = 1 + (x >> 40) as usize % 50_000;
        let mut buf = vec![0u8; want];
        let n = drive(&mut b, |l| l.read(0, &mut [IoSliceMut::new(&mut buf)])).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == data, "bytes differ");
}

#[test]
fn registered_memory_is_sent_zero_copy() {
    let Some(t) = transport() else { return };
    let (mut a, mut b, reg) = pair(&t, 1 << 20);
    let data = pattern(4 << 20, 3);
    let _r =
        comm_core::transport::Registration::new(reg, comm_core::Region::host(&data[..])).unwrap();
    // The first call only posts (nothing is done until a completion).
    let first = a.write(0, &[IoSlice::new(&data)]);
    assert!(
        matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock),
        "a zero-copy write reports bytes only after completion: {first:?}"
    );
    let mut sent = 0;
    let mut got = vec![0u8; data.len()];
    let mut recvd = 0;
    while recvd < data.len() {
        if sent < data.len() {
            match a.write(0, &[IoSlice::new(&data[sent..])]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        recvd += drive(&mut b, |l| {
            l.read(0, &mut [IoSliceMut::new(&mut got[recvd..])])
        })
        .unwrap();
    }
    while sent < data.len() {
        sent += drive(&mut a, |l| l.write(0, &[IoSlice::new(&data[sent..])])).unwrap();
    }
    assert!(got == data, "bytes differ");
}

#[test]
fn a_closed_peer_ends_the_stream_and_fails_writes() {
    let Some(t) = transport() else { return };
    let (mut a, b, _reg) = pair(&t, 1 << 20);
    drop(b); // QP to error, socket closed: what a dead process leaves
    let mut buf = [0u8; 16];
    let r = drive(&mut a, |l| l.read(0, &mut [IoSliceMut::new(&mut buf)]));
    assert_eq!(r.unwrap(), 0, "end of stream");
    let e = a.write(0, &[IoSlice::new(b"x")]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
}

#[test]
fn writes_to_a_dead_queue_pair_fail_with_the_verb_and_status() {
    let Some(t) = transport() else { return };
    let (mut a, mut b, _reg) = pair(&t, 1 << 20);
    // The peer's QP goes to the error state but its process (socket) lives:
    // only the device can tell, through a failed work completion.
    b.fail_queue_pair();
    let t0 = Instant::now();
    let r: std::io::Result<()> = drive(&mut a, |l| {
        l.write(0, &[IoSlice::new(&[1u8; 4096])])?;
        Err(ErrorKind::WouldBlock.into())
    });
    let e = r.unwrap_err();
    println!("after {:?}: {e}", t0.elapsed());
    let msg = e.to_string();
    assert!(
        msg.contains("RDMA WRITE WITH IMMEDIATE") || msg.contains("SEND WITH IMMEDIATE"),
        "{msg}"
    );
    assert!(msg.contains("rank 1") && msg.contains("status"), "{msg}");
}

fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[test]
fn a_waiting_reader_sleeps_on_the_completion_channel() {
    let Some(t) = transport() else { return };
    let (mut a, mut b, _reg) = pair(&t, 1 << 20);
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        a.write(0, &[IoSlice::new(b"wake up")]).unwrap();
        a // kept alive until the reader is done
    });
    let (cpu0, t0) = (thread_cpu(), Instant::now());
    let mut buf = [0u8; 16];
    // As the executor waits: arm, then sleep in poll(2) on the link's fd,
    // with a timeout far longer than the writer's delay, so only the
    // completion event can end the sleep in time.
    let n = wait_for(&mut b, 20_000, |l| {
        l.read(0, &mut [IoSliceMut::new(&mut buf)])
    })
    .unwrap();
    let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
    let _a = writer.join().unwrap();
    println!("waited {wall:?} using {cpu:?} of CPU");
    assert_eq!(&buf[..n], b"wake up");
    assert!(
        wall < Duration::from_secs(10),
        "the completion event did not wake the reader"
    );
    assert!(cpu < wall / 4, "the wait burned {cpu:?} of CPU in {wall:?}");
}

/// The server closes on us (EOF or reset) instead of going on.
fn closed_by_server(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return true,
            Ok(_) => continue, // a challenge may come before the close
        }
    }
}

#[test]
fn strangers_at_the_setup_port_are_refused_while_the_pair_connects() {
    let Some(t) = transport() else { return };
    let secret = Secret::random().unwrap();
    let ctx = |rank| SetupCtx {
        comm_id: 42,
        secret,
        rank,
        nranks: 2,
        config: Config::default(),
        bind_addr: "127.0.0.1".parse().unwrap(),
        reserved_port: None,
    };
    let (c0, c1) = (ctx(0), ctx(1));
    let mut e0 = t.listen(&c0).unwrap();
    let a0 = e0.address();
    let door: SocketAddr = std::str::from_utf8(&a0).unwrap().parse().unwrap();
    let open = || {
        let s = TcpStream::connect(door).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    };
    let as_rank1 = |purpose, comm_id| Hello::new(purpose, comm_id, 1, 0, 2, 0).unwrap();
    // A wrong secret.
    let wrong = Secret::random().unwrap();
    assert!(handshake::client(&mut open(), &wrong, &as_rank1(Purpose::Rdma, 42)).is_err());
    // The right secret for another communicator, and for another transport.
    assert!(handshake::client(&mut open(), &secret, &as_rank1(Purpose::Rdma, 43)).is_err());
    assert!(handshake::client(&mut open(), &secret, &as_rank1(Purpose::Tcp, 42)).is_err());
    // Random bytes.
    let mut s = open();
    s.write_all(&[0x5a; 64]).unwrap();
    assert!(closed_by_server(s), "random bytes not refused");
    // A valid handshake followed by a garbage endpoint: no link is made.
    let mut s = open();
    handshake::client(&mut s, &secret, &as_rank1(Purpose::Rdma, 42)).unwrap();
    comm_core::wire::write_frame(&mut s, b"not an endpoint").unwrap();
    assert!(closed_by_server(s), "a garbage endpoint was not refused");
    // A stranger that connects and says nothing (kept open meanwhile).
    let _silent = open();
    // The real rank 1 still connects, and the link carries bytes.
    let mut e1 = t.listen(&c1).unwrap();
    let a1 = e1.address();
    let deadline = Instant::now() + Duration::from_secs(30);
    let h = std::thread::spawn(move || {
        let mut l = e1.connect(&c1, &[(0, a0)], deadline).unwrap();
        assert_eq!(l.len(), 1);
        (e1, l.pop().unwrap().1)
    });
    let mut l0 = e0.connect(&c0, &[(1, a1)], deadline).unwrap();
    let (_e1, mut l1) = h.join().unwrap();
    assert_eq!((l0.len(), l0[0].0), (1, 1));
    let mut l0 = l0.pop().unwrap().1;
    assert_eq!(l0.write(0, &[IoSlice::new(b"ping")]).unwrap(), 4);
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        got += drive(&mut *l1, |l| {
            l.read(0, &mut [IoSliceMut::new(&mut buf[got..])])
        })
        .unwrap();
    }
    assert_eq!(&buf, b"ping");
}

#[test]
fn closing_with_zero_copy_writes_in_flight_is_clean() {
    let Some(t) = transport() else { return };
    let (mut a, mut b, reg) = pair(&t, 1 << 20);
    let data = pattern(4 << 20, 9);
    let _r =
        comm_core::transport::Registration::new(reg, comm_core::Region::host(&data[..])).unwrap();
    let first = a.write(0, &[IoSlice::new(&data)]);
    assert!(matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock));
    // What abort() does to every link: the QP goes to the error state (the
    // device flushes the writes in flight) and the socket shuts.
    a.close();
    let e = a.write(0, &[IoSlice::new(b"x")]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(a.read(0, &mut [IoSliceMut::new(&mut [0u8; 8])]).unwrap(), 0);
    // The peer reads whatever had landed, then the end of the stream.
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        match drive(&mut b, |l| l.read(0, &mut [IoSliceMut::new(&mut buf)])) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(total <= data.len());
    // Destroying QPs and CQs with flushed work outstanding must not hang.
    drop(a);
    drop(b);
}

/// One-sided reads (what the `direct` algorithm does over RDMA): rank 1
/// exports memory, rank 0 reads it into registered memory with RDMA READ.
/// A read of several chunks, an empty one and a small one complete in
/// order; memory that is not registered is refused before anything is
/// posted; a wrong key fails the link with the verb named.
#[test]
fn one_sided_reads_copy_the_peers_exported_memory_in_order() {
    let Some(t) = transport() else { return };
    let p = loopback(&t, 1 << 20);
    let (mut a, _b) = p.links;
    let len = (3 << 20) + 4099; // several READ_CHUNKs and a ragged end
    let (theirs, handle) = p.direct.export(len).unwrap();
    let data = pattern(len, 5);
    // SAFETY: the exported mapping holds at least `len` bytes, alive here.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), theirs.region().ptr(), len) };
    let PeerMemory::Remote(remote) = p.direct.import(1, &handle, len).unwrap() else {
        panic!("RDMA memory is imported as remote")
    };
    let mut got = vec![0u8; len];
    let dst = Region::host_mut(&mut got[..]);
    // Unregistered: refused at once, the link stays usable.
    // SAFETY: nothing is posted (refused); `got` outlives the link's use.
    let e = unsafe { OneSided::start_read(&mut a, dst, remote) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let _reg = Registration::new(p.registry.clone(), dst).unwrap();
    let big = len - 100;
    // SAFETY: `got` is registered, alive and untouched until the reads
    // complete (waited for below).
    let tickets = unsafe {
        [
            OneSided::start_read(&mut a, dst.sub(0, big), remote.sub(0, big).unwrap()).unwrap(),
            OneSided::start_read(&mut a, dst.sub(big, 0), remote.sub(big, 0).unwrap()).unwrap(),
            OneSided::start_read(&mut a, dst.sub(big, 100), remote.sub(big, 100).unwrap()).unwrap(),
        ]
    };
    assert_eq!(tickets, [0, 1, 2]);
    drive(&mut a, |l| match l.reads_completed()? {
        c if c > tickets[2] => Ok(c),
        _ => Err(ErrorKind::WouldBlock.into()),
    })
    .unwrap();
    assert!(got == data, "the bytes read differ from the exported ones");
    // A key the peer never issued: the device refuses the read.
    let bad = comm_core::RemoteMemory {
        key: remote.key ^ 0x5a5a,
        ..remote.sub(0, 4096).unwrap()
    };
    // SAFETY: as above.
    unsafe { OneSided::start_read(&mut a, dst.sub(0, 4096), bad) }.unwrap();
    let e = drive(&mut a, |l| match l.reads_completed()? {
        c if c > 3 => Ok(c),
        _ => Err(ErrorKind::WouldBlock.into()),
    })
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("RDMA READ"), "{e}");
    println!("one-sided: {len} bytes read exactly; a bad key: {e}");
}
