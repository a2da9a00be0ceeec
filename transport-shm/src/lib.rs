//! `transport-shm`: message links between processes of one host through
//! shared memory.
//!
//! Each linked pair shares one anonymous memfd segment (never named, so
//! nothing can be left in `/dev/shm`) holding two single-producer rings, one
//! per direction, plus four eventfds for sleeping (see [`ring`]). The
//! segment and eventfds travel over an abstract Unix socket (`SCM_RIGHTS`)
//! after the job handshake; that socket stays open for the link's life: when
//! the peer process dies, the kernel closes its end and the link reports
//! end-of-stream, so the executor turns it into `PeerLost` at once.
//!
//! Memory is committed only as rings are used (a memfd is sparse);
//! `OXCCL_SHM_BUFFSIZE` sizes each direction (default: two of the chunks
//! the ranks agreed on, `OXCCL_BUFFSIZE` or the cache-sized automatic one,
//! plus 64 KiB, so a chunk is never half-written).

mod direct;
pub mod ring;
mod sys;

pub use direct::ShmDirect;

use comm_core::door::{Admission, Door, Timeouts};
use comm_core::handshake::{self, Hello, Purpose};
use comm_core::transport::{Endpoint, Link, SetupCtx, Transport};
use comm_core::{Error, Result};
use ring::{Ring, HEADER};
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const DOOR_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_RING: usize = 256 << 10;

/// Ring size per direction: `OXCCL_SHM_BUFFSIZE`, or room for two
/// pipelined chunks (so a writer never waits for a half-read chunk).
fn ring_bytes(chunk: usize) -> Result<usize> {
    Ok(comm_core::config::vars::size("OXCCL_SHM_BUFFSIZE")?
        .unwrap_or((2 * chunk + (64 << 10)).max(MIN_RING)))
}

/// The shared-memory transport.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmTransport;

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn listen(&self, ctx: &SetupCtx) -> Result<Box<dyn Endpoint>> {
        // A random name: unique on this host, and it tells a stranger
        // listing /proc/net/unix nothing about the job (the handshake is
        // what guards the door).
        let name = format!(
            "oxccl-{}",
            comm_core::handshake::Secret::random()?
                .0
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| Error::Bootstrap(format!("shm socket name: {e}")))?;
        let l = UnixListener::bind_addr(&addr)
            .map_err(|e| Error::Bootstrap(format!("shm listen: {e}")))?;
        l.set_nonblocking(true)
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        let (tx, rx) = channel();
        let ctx2 = ctx.clone();
        let door = Door::open(
            "oxccl-shm",
            l.as_raw_fd(),
            move || l.accept().map(|(s, _)| s),
            move |s, _permit| {
                // Unix sockets have no address: name the peer by its process.
                let who = sys::peer_process(&s);
                match admit(s, &ctx2) {
                    Ok(link) => {
                        let _ = tx.send(link);
                    }
                    Err(e) => tracing::warn!(
                        "oxccl shm: rank {} rejected a connection from {who}: {e}",
                        ctx2.rank
                    ),
                }
            },
        )?;
        Ok(Box::new(ShmEndpoint {
            name,
            incoming: rx,
            door,
        }))
    }
}

type Incoming = (usize, Box<dyn Link>);

/// Accept side: check the handshake, receive the segment and eventfds.
fn admit(s: UnixStream, ctx: &SetupCtx) -> Result<Incoming> {
    // The whole admission within one deadline, however slowly bytes come.
    let mut a = Admission::new(s);
    let hello = handshake::server(&mut a, &ctx.secret, ctx.comm_id, |h: &Hello| {
        h.check_link(Purpose::Shm, ctx)
    })?;
    let mut buf = [0u8; 8];
    a.arm()
        .map_err(|e| Error::Handshake(format!("receiving the segment: {e}")))?;
    let (n, fds) = sys::recv_fds(&a.stream, &mut buf, 5)
        .map_err(|e| Error::Handshake(format!("receiving the segment: {e}")))?;
    if n != 8 {
        return Err(Error::Protocol("short segment message".into()));
    }
    let cap = u64::from_le_bytes(buf) as usize;
    if !(4096..=(1 << 30)).contains(&cap) {
        return Err(Error::Protocol(format!("ring size {cap} out of range")));
    }
    let mut fds = fds.into_iter();
    let seg = fds.next().unwrap();
    let ev: Vec<OwnedFd> = fds.collect();
    let map = sys::Mapping::new(&seg, 2 * (HEADER + cap)).map_err(|e| Error::Transport {
        peer: hello.from as usize,
        world_peer: hello.from as usize,
        detail: format!("mmap: {e}"),
    })?;
    a.write_all(&[1])
        .map_err(|e| Error::Handshake(format!("ack: {e}")))?;
    let s = a.into_inner();
    s.set_io_timeout(DOOR_TIMEOUT).ok();
    // Ring 0 carries connector -> acceptor, ring 1 the other way.
    let link = ShmLink::new(map, cap, s, 1, ev).map_err(|e| Error::Transport {
        peer: hello.from as usize,
        world_peer: hello.from as usize,
        detail: e.to_string(),
    })?;
    Ok((hello.from as usize, Box::new(link)))
}

struct ShmEndpoint {
    name: String,
    incoming: Receiver<Incoming>,
    door: Door,
}

impl Endpoint for ShmEndpoint {
    fn address(&self) -> Vec<u8> {
        self.name.as_bytes().to_vec()
    }

    fn connect(
        &mut self,
        ctx: &SetupCtx,
        peers: &[(usize, Vec<u8>)],
        deadline: Instant,
    ) -> Result<Vec<(usize, Box<dyn Link>)>> {
        // (At connect the chunk is the one the ranks agreed on.)
        let cap = ring_bytes(ctx.config.chunk())?;
        let links = comm_core::door::connect_pairwise(
            ctx,
            peers,
            deadline,
            "shared-memory",
            |peer, addr| Ok(Box::new(dial(ctx, peer, addr, cap, deadline)?) as Box<dyn Link>),
            &self.incoming,
        )?;
        // Setup is over: stop accepting (no link joins a running communicator).
        self.door.close();
        Ok(links)
    }

    fn direct(&self) -> Option<std::sync::Arc<dyn comm_core::transport::DirectAccess>> {
        Some(std::sync::Arc::new(ShmDirect))
    }
}

/// Connect side: create the segment and eventfds, hand them over.
fn dial(
    ctx: &SetupCtx,
    peer: usize,
    addr: &[u8],
    cap: usize,
    deadline: Instant,
) -> Result<ShmLink> {
    let sa = SocketAddr::from_abstract_name(addr)
        .map_err(|e| Error::Protocol(format!("shm address of rank {peer}: {e}")))?;
    let mut s = comm_core::door::dial_until(deadline, |_| UnixStream::connect_addr(&sa))
        .map_err(|e| Error::Bootstrap(format!("cannot reach rank {peer} through shared memory: {e} (different network namespace? set OXCCL_TRANSPORT=tcp)")))?;
    s.set_read_timeout(Some(DOOR_TIMEOUT)).ok();
    s.set_write_timeout(Some(DOOR_TIMEOUT)).ok();
    let hello = Hello::new(
        Purpose::Shm,
        ctx.comm_id,
        ctx.rank,
        peer as u32,
        ctx.nranks,
        0,
    )?;
    handshake::client(&mut s, &ctx.secret, &hello)
        .map_err(|e| Error::Bootstrap(format!("rank {peer} refused our shm connection: {e}")))?;
    let len = 2 * (HEADER + cap);
    let seg = sys::memfd(len).map_err(|e| Error::Transport {
        peer,
        world_peer: peer,
        detail: format!("memfd: {e}"),
    })?;
    let map = sys::Mapping::new(&seg, len).map_err(|e| Error::Transport {
        peer,
        world_peer: peer,
        detail: format!("mmap: {e}"),
    })?;
    let ev: Vec<OwnedFd> = (0..4)
        .map(|_| sys::eventfd())
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::Transport {
            peer,
            world_peer: peer,
            detail: format!("eventfd: {e}"),
        })?;
    let mut fds: Vec<RawFd> = vec![seg.as_raw_fd()];
    fds.extend(ev.iter().map(|f| f.as_raw_fd()));
    sys::send_fds(&s, &(cap as u64).to_le_bytes(), &fds).map_err(|e| Error::Transport {
        peer,
        world_peer: peer,
        detail: format!("sending the segment: {e}"),
    })?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack)
        .map_err(|e| Error::Bootstrap(format!("rank {peer} did not map our segment: {e}")))?;
    drop(seg); // the mappings keep the memory alive; nothing is named
    ShmLink::new(map, cap, s, 0, ev).map_err(|e| Error::Transport {
        peer,
        world_peer: peer,
        detail: e.to_string(),
    })
}

/// A link over two shared rings.
pub struct ShmLink {
    out: Ring,
    inp: Ring,
    _map: sys::Mapping,
    sock: UnixStream,
    /// Signalled by us when the consumer of `out` sleeps / waited on by us.
    out_data: OwnedFd,
    out_space: OwnedFd,
    in_data: OwnedFd,
    in_space: OwnedFd,
    epoll: OwnedFd,
    closed: bool,
    /// The peer's socket hung up: its process ended or closed the link.
    peer_gone: bool,
    /// Writes stream past the cache (`Link::stream_writes`).
    streamed: bool,
}

impl ShmLink {
    /// `side` 0 = connector (writes ring 0), 1 = acceptor (writes ring 1).
    /// `ev` = [ring0 data, ring0 space, ring1 data, ring1 space].
    fn new(
        map: sys::Mapping,
        cap: usize,
        sock: UnixStream,
        side: usize,
        ev: Vec<OwnedFd>,
    ) -> std::io::Result<ShmLink> {
        let base = map.ptr();
        // SAFETY: the mapping holds two rings of HEADER + cap bytes, page
        // aligned (so 64-byte aligned), zeroed at creation, and lives in `_map`.
        let (r0, r1) = unsafe { (Ring::new(base, cap), Ring::new(base.add(HEADER + cap), cap)) };
        let mut ev = ev.into_iter();
        let (e0d, e0s, e1d, e1s) = (
            ev.next().unwrap(),
            ev.next().unwrap(),
            ev.next().unwrap(),
            ev.next().unwrap(),
        );
        let (out, inp, out_data, out_space, in_data, in_space) = if side == 0 {
            (r0, r1, e0d, e0s, e1d, e1s)
        } else {
            (r1, r0, e1d, e1s, e0d, e0s)
        };
        sock.set_nonblocking(true)?;
        let epoll = comm_core::net::epoll_of(&[
            sock.as_raw_fd(),
            in_data.as_raw_fd(),
            out_space.as_raw_fd(),
        ])?;
        Ok(ShmLink {
            out,
            inp,
            _map: map,
            sock,
            out_data,
            out_space,
            in_data,
            in_space,
            epoll,
            closed: false,
            peer_gone: false,
            streamed: false,
        })
    }
}

impl Link for ShmLink {
    fn streams(&self) -> usize {
        1
    }

    fn write(&mut self, _stream: usize, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        if self.closed || self.peer_gone {
            return Err(ErrorKind::ConnectionReset.into());
        }
        let (n, wake) = self.out.write(bufs, self.streamed);
        if wake {
            sys::signal(self.out_data.as_raw_fd());
        }
        if n > 0 || bufs.iter().all(|b| b.is_empty()) {
            Ok(n)
        } else {
            Err(ErrorKind::WouldBlock.into())
        }
    }

    fn read(&mut self, _stream: usize, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(0);
        }
        let (n, wake) = self.inp.read(bufs);
        if wake {
            sys::signal(self.in_space.as_raw_fd());
        }
        if n > 0 || bufs.iter().all(|b| b.is_empty()) {
            Ok(n)
        } else if self.peer_gone {
            Ok(0) // nothing buffered and nobody left to send more
        } else {
            Err(ErrorKind::WouldBlock.into())
        }
    }

    fn copies_through_memory(&self) -> bool {
        true
    }

    fn stream_writes(&mut self, streamed: bool) {
        self.streamed = streamed;
    }

    fn arm(&mut self, _stream: usize, read: bool, write: bool) -> bool {
        // Clear stale wake-ups, raise the flags, re-check (eventcount).
        let mut ready = false;
        if read {
            sys::drain(self.in_data.as_raw_fd());
            ready |= self.inp.reader_sleep();
        }
        if write {
            sys::drain(self.out_space.as_raw_fd());
            ready |= self.out.writer_sleep();
        }
        if !ready && comm_core::net::hung_up(self.sock.as_raw_fd()) {
            self.peer_gone = true;
            ready = true;
        }
        ready
    }

    fn fd(&self, _stream: usize) -> RawFd {
        self.epoll.as_raw_fd()
    }

    fn poll_events(&self, _stream: usize, _read: bool, _write: bool) -> i16 {
        // An epoll fd is readable when any watched fd is ready.
        libc::POLLIN
    }

    fn close(&mut self) {
        self.closed = true;
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}
