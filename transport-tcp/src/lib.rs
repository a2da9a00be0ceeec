//! `transport-tcp`: message links over TCP sockets between any two hosts.
//!
//! Each pair of ranks shares `nsocks` streams (`OXCCL_NSOCKS`); the higher
//! rank connects, the lower accepts. Every connection opens with the job
//! handshake (secret proof, communicator id, both ranks, stream index);
//! anything else is logged and dropped while the job goes on. Sockets get
//! `TCP_NODELAY` and large buffers, and are driven non-blocking by the
//! executor; sends use `MSG_NOSIGNAL` so a dead peer is an error, never a
//! `SIGPIPE`.

use comm_core::door::{Admission, Door, Timeouts};
use comm_core::handshake::{self, Hello, Purpose};
use comm_core::transport::{Endpoint, Link, SetupCtx, Transport};
use comm_core::{Error, Result};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{IoSlice, IoSliceMut, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Read deadline for a connection to complete its handshake.
const DOOR_TIMEOUT: Duration = Duration::from_secs(10);

/// The TCP transport (stateless; one [`Endpoint`] per communicator).
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpTransport;

fn configure(s: &Socket, buffer: usize) {
    let _ = s.set_tcp_nodelay(true);
    let _ = s.set_send_buffer_size(buffer);
    let _ = s.set_recv_buffer_size(buffer);
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen(&self, ctx: &SetupCtx) -> Result<Box<dyn Endpoint>> {
        let addr = SocketAddr::new(ctx.bind_addr, 0);
        let bind = || {
            let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                .map_err(|e| Error::Bootstrap(format!("tcp socket: {e}")))?;
            // Accepted sockets inherit the buffer sizes, which must be set
            // before the handshake so TCP window scaling can use them.
            configure(&sock, ctx.config.socket_buffer);
            sock.bind(&SockAddr::from(addr))
                .map_err(|e| Error::Bootstrap(format!("tcp bind {addr}: {e}")))?;
            Ok(sock)
        };
        let port = |s: &Socket| s.local_addr().ok()?.as_socket().map(|a| a.port());
        let sock = comm_core::transport::net::bind_clear_of(ctx.reserved_port, bind, port)?;
        sock.listen(1024)
            .map_err(|e| Error::Bootstrap(format!("tcp listen: {e}")))?;
        let listener: TcpListener = sock.into();
        let local = listener
            .local_addr()
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        let complete = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        let (complete2, ctx2) = (complete.clone(), ctx.clone());
        let door = Door::open(
            "oxccl-tcp",
            listener.as_raw_fd(),
            move || listener.accept(),
            move |(s, peer_addr), _permit| admit(s, peer_addr, &ctx2, &tx, &complete2),
        )?;
        Ok(Box::new(TcpEndpoint {
            local,
            incoming: rx,
            door,
            complete,
        }))
    }
}

type Incoming = (usize, usize, TcpStream);

/// Run the server handshake for one incoming connection.
fn admit(
    s: TcpStream,
    from_addr: SocketAddr,
    ctx: &SetupCtx,
    tx: &Sender<Incoming>,
    complete: &AtomicBool,
) {
    let _ = s.set_nonblocking(false);
    // The whole handshake within one deadline, however slowly bytes come.
    let mut a = Admission::new(s);
    let r = handshake::server(&mut a, &ctx.secret, ctx.comm_id, |h: &Hello| {
        h.check_link(Purpose::Tcp, ctx)?;
        if h.stream as usize >= ctx.config.nsocks {
            return Err(Error::Handshake(format!(
                "stream {} out of range",
                h.stream
            )));
        }
        if complete.load(Ordering::Acquire) {
            return Err(Error::Handshake(
                "links are already complete (duplicate connection)".into(),
            ));
        }
        Ok(())
    });
    match r {
        Ok(h) => {
            let s = a.into_inner();
            let _ = s.set_io_timeout(DOOR_TIMEOUT);
            let _ = tx.send((h.from as usize, h.stream as usize, s));
        }
        Err(e) => tracing::warn!(
            "oxccl tcp: rank {} rejected a connection from {from_addr}: {e}",
            ctx.rank
        ),
    }
}

struct TcpEndpoint {
    local: SocketAddr,
    incoming: Receiver<Incoming>,
    door: Door,
    complete: Arc<AtomicBool>,
}

fn encode_addr(a: &SocketAddr) -> Vec<u8> {
    a.to_string().into_bytes()
}

fn decode_addr(b: &[u8]) -> Result<SocketAddr> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Protocol("peer published an unreadable TCP address".into()))
}

fn connect_stream(
    ctx: &SetupCtx,
    peer: usize,
    addr: SocketAddr,
    stream: usize,
    deadline: Instant,
) -> Result<TcpStream> {
    let mut s: TcpStream = comm_core::door::dial_until(deadline, |left| {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        configure(&sock, ctx.config.socket_buffer);
        sock.connect_timeout(&SockAddr::from(addr), left.min(Duration::from_secs(5)))?;
        Ok(sock.into())
    })
    .map_err(|e| {
        Error::Bootstrap(format!(
            "could not connect to rank {peer} at {addr}: {e}; check OXCCL_SOCKET_IFNAME and firewalls"
        ))
    })?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = s.set_read_timeout(Some(left.min(DOOR_TIMEOUT)));
    let _ = s.set_write_timeout(Some(left.min(DOOR_TIMEOUT)));
    let hello = Hello::new(
        Purpose::Tcp,
        ctx.comm_id,
        ctx.rank,
        peer as u32,
        ctx.nranks,
        stream,
    )?;
    handshake::client(&mut s, &ctx.secret, &hello).map_err(|e| {
        Error::Bootstrap(format!("rank {peer} at {addr} refused our connection: {e}"))
    })?;
    Ok(s)
}

impl Endpoint for TcpEndpoint {
    fn address(&self) -> Vec<u8> {
        encode_addr(&self.local)
    }

    fn connect(
        &mut self,
        ctx: &SetupCtx,
        peers: &[(usize, Vec<u8>)],
        deadline: Instant,
    ) -> Result<Vec<(usize, Box<dyn Link>)>> {
        let nsocks = ctx.config.nsocks;
        let mut streams: Vec<Vec<Option<TcpStream>>> = (0..ctx.nranks)
            .map(|_| (0..nsocks).map(|_| None).collect())
            .collect();
        // Lower-ranked peers: we connect.
        for (peer, addr) in peers.iter().filter(|(p, _)| *p < ctx.rank) {
            let addr = decode_addr(addr)?;
            for (s, slot) in streams[*peer].iter_mut().enumerate() {
                *slot = Some(connect_stream(ctx, *peer, addr, s, deadline)?);
            }
        }
        // Higher-ranked peers connect to us.
        let mut missing: usize = peers.iter().filter(|(p, _)| *p > ctx.rank).count() * nsocks;
        let wanted: Vec<bool> = (0..ctx.nranks)
            .map(|r| peers.iter().any(|(p, _)| *p == r))
            .collect();
        while missing > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            let (from, s, stream) = self.incoming.recv_timeout(left).map_err(|_| {
                let absent: Vec<usize> = (ctx.rank + 1..ctx.nranks)
                    .filter(|r| wanted[*r] && streams[*r].iter().any(|x| x.is_none()))
                    .collect();
                Error::Bootstrap(format!(
                    "ranks {absent:?} did not connect to rank {} in time",
                    ctx.rank
                ))
            })?;
            if !wanted[from] || streams[from][s].is_some() {
                tracing::warn!("oxccl tcp: dropping duplicate or unexpected connection from rank {from} stream {s}");
                continue;
            }
            streams[from][s] = Some(stream);
            missing -= 1;
        }
        self.complete.store(true, Ordering::Release);
        // Setup is over: stop accepting (no link joins a running communicator).
        self.door.close();
        let mut links: Vec<(usize, Box<dyn Link>)> = Vec::new();
        for (peer, _) in peers {
            let socks: Vec<Socket> = streams[*peer]
                .iter_mut()
                .map(|s| {
                    let s = s.take().unwrap();
                    let _ = s.set_read_timeout(None);
                    let _ = s.set_write_timeout(None);
                    s.set_nonblocking(true)
                        .map_err(|e| Error::Bootstrap(e.to_string()))?;
                    Ok(Socket::from(s))
                })
                .collect::<Result<_>>()?;
            links.push((*peer, Box::new(TcpLink { socks })));
        }
        Ok(links)
    }
}

/// Several non-blocking TCP streams to one peer.
pub struct TcpLink {
    socks: Vec<Socket>,
}

impl Link for TcpLink {
    fn streams(&self) -> usize {
        self.socks.len()
    }

    fn write(&mut self, stream: usize, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.socks[stream].send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }

    fn read(&mut self, stream: usize, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        (&self.socks[stream]).read_vectored(bufs)
    }

    fn fd(&self, stream: usize) -> RawFd {
        self.socks[stream].as_raw_fd()
    }

    fn close(&mut self) {
        for s in &self.socks {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
