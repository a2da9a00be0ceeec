//! The accept loop every listener of oxccl shares (rendezvous root, TCP
//! data ports, shared-memory sockets): non-blocking accepts woken by
//! `poll(2)`, a stop flag checked five times a second, and each connection
//! handed to its own thread, so a stranger that connects and says nothing
//! never holds up anyone else. Bounded: at most [`MAX_ADMITTING`]
//! admissions at once, each within [`ADMISSION_DEADLINE`] in total
//! ([`Admission`]); transports close their doors when setup is over
//! (`Endpoint::seal`), so no link can be added to a running communicator.
//! Also the dialing side's retry loop and the pairwise setup that the
//! shared-memory and RDMA transports share.

use crate::error::{Error, Result};
use crate::transport::SetupCtx;
use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most connections a listener admits at once (handshakes in progress).
/// Beyond it, new connections are closed on arrival: a flood of silent
/// clients costs a few file descriptors, not a thread each.
pub const MAX_ADMITTING: usize = 64;

/// Longest a connection may take to complete its whole admission
/// (handshake and what follows), however it trickles its bytes in.
pub const ADMISSION_DEADLINE: Duration = Duration::from_secs(10);

/// One admission slot (see [`MAX_ADMITTING`]); freed when dropped, which a
/// long-lived connection (the root's relay) does once it is admitted.
#[derive(Debug)]
pub struct Permit(Arc<AtomicUsize>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Run on the calling thread until `stop` is set: `accept` returns the next
/// connection (`ErrorKind::WouldBlock` when none is waiting on `fd`), and
/// `admit` runs for it on a new thread named `name`, holding a [`Permit`].
pub fn accept_until<C: Send + 'static>(
    name: &str,
    fd: RawFd,
    stop: &Arc<AtomicBool>,
    mut accept: impl FnMut() -> std::io::Result<C>,
    admit: impl Fn(C, Permit) + Send + Sync + Clone + 'static,
) {
    let admitting = Arc::new(AtomicUsize::new(0));
    let mut turned_away = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match accept() {
            Ok(c) => {
                if admitting.fetch_add(1, Ordering::AcqRel) >= MAX_ADMITTING {
                    admitting.fetch_sub(1, Ordering::AcqRel);
                    turned_away += 1;
                    if turned_away.is_power_of_two() {
                        tracing::warn!(
                            "oxccl: {name}: {MAX_ADMITTING} connections are already being admitted; closed {turned_away} more so far"
                        );
                    }
                    drop(c);
                    continue;
                }
                let (admit, permit) = (admit.clone(), Permit(admitting.clone()));
                let spawned = std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || admit(c, permit));
                if let Err(e) = spawned {
                    tracing::warn!("oxccl: {name}: no thread for a connection: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut p, 1, 200) };
            }
            Err(e) => {
                tracing::warn!("oxccl: {name}: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Sockets whose blocking reads and writes can be given a timeout.
pub trait Timeouts {
    fn set_io_timeout(&self, d: Duration) -> std::io::Result<()>;
}

impl Timeouts for std::net::TcpStream {
    fn set_io_timeout(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl Timeouts for std::os::unix::net::UnixStream {
    fn set_io_timeout(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

/// A socket under admission with one deadline for the whole exchange:
/// every read and write gets the time left, so a client that drips a byte
/// just before each per-read timeout still runs out of time.
#[derive(Debug)]
pub struct Admission<S: Timeouts> {
    pub stream: S,
    deadline: Instant,
}

impl<S: Timeouts> Admission<S> {
    /// Admit `stream` within [`ADMISSION_DEADLINE`] from now.
    pub fn new(stream: S) -> Admission<S> {
        Admission {
            stream,
            deadline: Instant::now() + ADMISSION_DEADLINE,
        }
    }

    /// Give the socket the time left; `TimedOut` when none is.
    pub fn arm(&self) -> std::io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "admission took longer than {} s",
                    ADMISSION_DEADLINE.as_secs()
                ),
            ));
        }
        self.stream.set_io_timeout(left)
    }

    /// The socket, with no deadline left on it.
    pub fn into_inner(self) -> S {
        self.stream
    }
}

impl<S: Timeouts + std::io::Read> std::io::Read for Admission<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.stream.read(buf)
    }
}

impl<S: Timeouts + std::io::Write> std::io::Write for Admission<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// A listener's accept thread, stopped when this is dropped (or closed):
/// what a transport endpoint holds for as long as it accepts peers.
#[derive(Debug)]
pub struct Door {
    stop: Arc<AtomicBool>,
}

impl Door {
    /// Start accepting on a thread named `{name}-accept`: `accept` returns
    /// the next connection (`WouldBlock` when none waits on the non-blocking
    /// listener `fd`), and `admit` runs for each on a `{name}-door` thread.
    pub fn open<C: Send + 'static>(
        name: &str,
        fd: RawFd,
        accept: impl FnMut() -> std::io::Result<C> + Send + 'static,
        admit: impl Fn(C, Permit) + Send + Sync + Clone + 'static,
    ) -> Result<Door> {
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, door_name) = (stop.clone(), format!("{name}-door"));
        std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || accept_until(&door_name, fd, &stop2, accept, admit))
            .map_err(|e| Error::Bootstrap(format!("spawning the {name} accept thread: {e}")))?;
        Ok(Door { stop })
    }

    /// Stop accepting (the thread ends within 200 ms).
    pub fn close(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.close();
    }
}

/// The dialing side's retry: call `attempt` with the time left until it
/// succeeds or `deadline` passes (the peer's listener may not be up yet),
/// 10 ms apart. At the deadline: the last error, in words.
pub fn dial_until<T>(
    deadline: Instant,
    mut attempt: impl FnMut(Duration) -> std::io::Result<T>,
) -> std::result::Result<T, String> {
    let mut last = String::from("the deadline passed before the first attempt");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last);
        }
        match attempt(left) {
            Ok(t) => return Ok(t),
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Link setup where the higher rank of each pair connects: `dial` every
/// lower-ranked peer of `peers` (rank, published address), then take the
/// higher-ranked peers' links from `incoming` (filled by the transport's
/// accept thread) until all arrived or `deadline` passes.
pub fn connect_pairwise<L>(
    ctx: &SetupCtx,
    peers: &[(usize, Vec<u8>)],
    deadline: Instant,
    transport: &str,
    mut dial: impl FnMut(usize, &[u8]) -> Result<L>,
    incoming: &Receiver<(usize, L)>,
) -> Result<Vec<(usize, L)>> {
    let mut links = Vec::new();
    for (peer, addr) in peers.iter().filter(|(p, _)| *p < ctx.rank) {
        links.push((*peer, dial(*peer, addr)?));
    }
    let mut missing = peers.iter().filter(|(p, _)| *p > ctx.rank).count();
    while missing > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (peer, link) = incoming.recv_timeout(left).map_err(|_| {
            Error::Bootstrap(format!(
                "{transport} peers did not connect to rank {} in time",
                ctx.rank
            ))
        })?;
        if peers.iter().any(|(p, _)| *p == peer) && !links.iter().any(|(p, _)| *p == peer) {
            links.push((peer, link));
            missing -= 1;
        }
    }
    Ok(links)
}
