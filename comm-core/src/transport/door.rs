//! The accept loop every listener of oxccl shares (rendezvous root, TCP
//! data ports, shared-memory sockets): non-blocking accepts woken by
//! `poll(2)`, a stop flag checked five times a second, and each connection
//! handed to its own thread, so a stranger that connects and says nothing
//! (the door threads read with a deadline) never holds up anyone else.
//! Also the dialing side's retry loop and the pairwise setup that the
//! shared-memory and RDMA transports share.

use crate::error::{Error, Result};
use crate::transport::SetupCtx;
use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run on the calling thread until `stop` is set: `accept` returns the next
/// connection (`ErrorKind::WouldBlock` when none is waiting on `fd`), and
/// `admit` runs for it on a new thread named `name`.
pub fn accept_until<C: Send + 'static>(
    name: &str,
    fd: RawFd,
    stop: &Arc<AtomicBool>,
    mut accept: impl FnMut() -> std::io::Result<C>,
    admit: impl Fn(C) + Send + Sync + Clone + 'static,
) {
    while !stop.load(Ordering::Relaxed) {
        match accept() {
            Ok(c) => {
                let admit = admit.clone();
                let _ = std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || admit(c));
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
        admit: impl Fn(C) + Send + Sync + Clone + 'static,
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
