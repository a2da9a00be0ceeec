//! The accept loop every listener of oxccl shares (rendezvous root, TCP
//! data ports, shared-memory sockets): non-blocking accepts woken by
//! `poll(2)`, a stop flag checked five times a second, and each connection
//! handed to its own thread, so a stranger that connects and says nothing
//! (the door threads read with a deadline) never holds up anyone else.

use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
