//! One call's context in the executor: who and what it is, its deadline,
//! the control connection, and how its failures are named (a broken link
//! blamed on its peer unless the control plane explains it; message
//! headers built and checked against the call).

use super::direct::DirectCtx;
use super::header::{WireHeader, HEADER_LEN};
use crate::bootstrap::{Control, ControlEvent, ControlSender};
use crate::call::{Fingerprint, Kind};
use crate::control::failure::{self, notice_to_error};
use crate::control::notice::Notice;
use crate::error::{Error, Result};
use crate::transport::PeerInfo;
use crate::types::DataType;
use crate::wait::{look_until, Stop, EXPLAIN_WAIT, ORPHAN_IDLE};
use std::io::ErrorKind;
use std::ops::ControlFlow;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// The name of a call for messages, formatted only when one is needed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallName {
    pub fp: Fingerprint,
    pub seq: u64,
}

impl std::fmt::Display for CallName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} #{}", self.fp.kind.name(), self.seq)
    }
}

/// How messages describe a call: `all_reduce(count=.., f32, sum) as collective #7`.
pub(crate) fn describe_call(fp: &Fingerprint, seq: u64) -> String {
    if fp.kind == Kind::P2p {
        format!("{fp} as point-to-point message #{seq}")
    } else {
        format!("{fp} as collective #{seq}")
    }
}

/// The last-level cache this rank shares with the communicator's other
/// ranks on its host (taken as one cache: the least any of them
/// reported), and how many ranks share it, this one included. What
/// their calls touch together decides whether an output stays cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedCache {
    pub bytes: usize,
    pub ranks: usize,
}

impl SharedCache {
    /// Rank `rank`'s host cache in `peers`; `None` when none of the
    /// host's ranks knows its cache.
    pub fn of(peers: &[PeerInfo], rank: usize) -> Option<SharedCache> {
        let host = peers.get(rank)?.host_id;
        let local = || peers.iter().filter(|p| p.host_id == host);
        let bytes = local().filter_map(|p| p.llc).min()?;
        Some(SharedCache {
            bytes,
            ranks: local().count(),
        })
    }
}

/// Everything about the current call the executor needs besides buffers.
pub(crate) struct CallCtx<'a> {
    pub rank: usize,
    pub nranks: usize,
    pub dtype: DataType,
    pub op: kernels::Op,
    pub seq: u64,
    pub fp: Fingerprint,
    /// When the call started (its deadline is `timeout` later: see
    /// [`CallCtx::deadline`]).
    pub started: crate::sys::Stamp,
    pub timeout: Duration,
    /// How long to retry before sleeping in `poll(2)`.
    pub spin: Duration,
    /// More ranks on this host than cores: never spin without yielding.
    pub oversubscribed: bool,
    /// Copy-in staging writes forced streamed or cached (`None`: this
    /// rank's hand-off gauge decides).
    pub stage_writes: Option<bool>,
    /// Names the call in messages (`all_reduce #12`); built only on error.
    pub during: CallName,
    pub peers: &'a [PeerInfo],
    /// This rank's host cache, when known ([`SharedCache::of`]).
    pub cache: Option<SharedCache>,
    pub control: &'a mut Control,
    pub sender: &'a std::sync::Mutex<ControlSender>,
    pub abort_fd: RawFd,
    pub aborted: &'a AtomicBool,
    /// Direct access (registered buffers, `Sync` phases), when the call
    /// has it.
    pub direct: Option<DirectCtx<'a>>,
    /// The ids of the call's registered buffers as it publishes them (0:
    /// none): message headers carry them, mismatch reports show them.
    pub ids: u64,
    /// The communicator's flight recorder: a wait that goes to sleep
    /// names the peers it waits for there.
    pub flight: &'a crate::flight::FlightRecorder,
    /// The timeline trace, when one is kept.
    pub trace: Option<&'a crate::trace::Tracer>,
}

impl CallCtx<'_> {
    /// The call's deadline.
    pub fn deadline(&self) -> crate::sys::Stamp {
        self.started.after(self.timeout)
    }

    /// This call goes to sleep waiting for `peers` (the flight recorder's
    /// record of it says so).
    pub(super) fn sleeps_on(&self, peers: impl IntoIterator<Item = usize>) {
        self.flight.waiting(self.seq, peers);
    }

    /// How this rank describes its call in mismatch reports: exactly as
    /// it publishes it (with the registered buffers of a direct call), so a
    /// relayed report is matched to the right side.
    pub(super) fn own(&self) -> String {
        super::direct::describe(&self.fp, self.seq, self.ids)
    }

    /// The ids of the call's registered buffers, as headers carry them.
    fn buf_ids(&self) -> u64 {
        self.ids
    }

    /// Turn a control-plane notice into this call's error.
    pub fn notice_error(&self, n: Notice) -> Error {
        notice_to_error(
            n,
            self.rank,
            self.peers,
            &self.during.to_string(),
            &self.own(),
        )
    }

    /// The root is gone and the call made no progress since: when the
    /// root lived in a rank's process and that process is gone, that rank
    /// died (and took the root along); otherwise say the root is gone.
    pub(super) fn root_gone(&self) -> Error {
        let me = &self.peers[self.rank];
        let host = failure::root_host(self.peers, self.rank)
            .filter(|p| failure::process_alive(me, p) == Some(false));
        if let Some(h) = host {
            return failure::peer_lost(
                h.rank,
                self.peers,
                &self.during.to_string(),
                format!(
                    "its process is gone, and the root it hosted with it (this call made no progress for {} s since)",
                    ORPHAN_IDLE.as_secs()
                ),
            );
        }
        Error::Bootstrap(format!(
            "lost the connection to the rendezvous root during {}, and the call made no progress for {} s since (the launcher or the rank hosting the root ended; failures of other ranks can no longer be detected or relayed)",
            self.during,
            ORPHAN_IDLE.as_secs()
        ))
    }

    /// Wait briefly for the control plane to explain a broken link (another
    /// rank's failure or death, announced by the root).
    pub(super) fn explained(&mut self) -> Option<Error> {
        let left = self.deadline().since(crate::sys::Stamp::now());
        let until = Instant::now() + EXPLAIN_WAIT.min(left);
        let fd = self.control.fd();
        let notice = look_until(
            until,
            || match self.control.poll() {
                Some(ControlEvent::Notice(n)) => ControlFlow::Break(Some(n)),
                // Everything the root sent before it went was read: no
                // explanation can come any more (a root hosted by a rank
                // relays the first failure before that rank may exit).
                Some(ControlEvent::RootGone) => ControlFlow::Break(None),
                _ if self.control.is_gone() => ControlFlow::Break(None),
                Some(ControlEvent::Released(_)) | None => ControlFlow::Continue(()),
            },
            |left| {
                crate::sys::poll_one(fd, libc::POLLIN, left.min(Duration::from_millis(100)));
            },
        );
        notice.map(|n| self.notice_error(n))
    }

    /// The error of a wait that had to stop (see [`crate::wait::Sleep`]):
    /// `Aborted`; the root gone ([`CallCtx::root_gone`]); or, past the
    /// deadline, the root's verdict on the stall this rank reports —
    /// `waiting` says what it waited for, and for whom.
    pub(super) fn stopped(
        &mut self,
        stop: Stop,
        waiting: impl FnOnce(&Self) -> (String, Option<usize>),
    ) -> Error {
        match stop {
            Stop::Aborted => Error::Aborted {
                by: None,
                world_by: None,
            },
            Stop::Orphaned => self.root_gone(),
            Stop::Deadline => {
                let (waiting_for, waits_on) = waiting(self);
                let (during, own) = (self.during.to_string(), self.own());
                failure::stall_error(
                    self.control,
                    self.sender,
                    self.rank,
                    self.peers,
                    waiting_for,
                    waits_on,
                    &during,
                    &own,
                    self.timeout,
                )
            }
        }
    }

    /// After one slice of sleeping on `peer`'s word in shared memory
    /// (which wakes no fd): a failure notice that came meanwhile, or the
    /// peer's process gone. A peer that ended after failing itself (its
    /// error already on its way through the root) is not the cause: the
    /// notice wins, as for a closed link.
    pub(super) fn after_slice(&mut self, peer: usize) -> Result<()> {
        if let Some(ControlEvent::Notice(n)) = self.control.poll() {
            return Err(self.notice_error(n));
        }
        let pid = self.peers.get(peer).map_or(0, |p| p.pid);
        if pid != 0 && crate::sys::process_gone(pid) {
            return Err(self.lost(peer, format!("its process (pid {pid}) no longer exists")));
        }
        Ok(())
    }

    /// A peer's connection broke: the control plane's explanation, else
    /// `failure::closed_link`'s verdict.
    pub(super) fn lost(&mut self, peer: usize, detail: String) -> Error {
        if let Some(e) = self.explained() {
            return e;
        }
        let during = self.during.to_string();
        let root_gone = self.control.is_gone();
        failure::closed_link(self.rank, peer, self.peers, root_gone, &during, detail)
    }

    /// A link call failed. `InvalidData` is the transport's verdict that the
    /// link broke in a precise way (an RDMA work completion in error, a
    /// flow-control violation): a transport error naming the peer, unless
    /// the control plane says the peer died (a dying process can make its
    /// peers' transfers fail in such ways too). Any other error means the
    /// connection is gone: the peer is lost.
    pub(super) fn link_failed(&mut self, peer: usize, what: &str, e: std::io::Error) -> Error {
        if e.kind() == ErrorKind::InvalidData {
            return self.explained().unwrap_or_else(|| Error::Transport {
                peer,
                world_peer: peer,
                detail: format!("{what} during {}: {e}", self.during),
            });
        }
        self.lost(peer, format!("{what} failed: {e}"))
    }

    /// The header of message `msg` (`len` bytes) of this call.
    pub(super) fn header(&self, msg: u32, len: usize) -> [u8; HEADER_LEN] {
        super::header::encode(self.seq, self.buf_ids(), msg, len as u64, &self.fp)
    }

    /// Check a received header against what this rank expects.
    pub(super) fn check_header(
        &self,
        peer: usize,
        h: &[u8; HEADER_LEN],
        msg: u32,
        len: usize,
    ) -> Result<()> {
        let (my_seq, my_fp) = (self.seq, self.fp);
        let Some(WireHeader {
            seq,
            bufs,
            msg: their_msg,
            len: their_len,
            fp,
        }) = WireHeader::parse(h)
        else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent bytes that are not an oxccl message during {}",
                self.during
            )));
        };
        let Some(fp) = fp else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent an unreadable call fingerprint during {}",
                self.during
            )));
        };
        if seq != my_seq || !fp.agrees_with(&my_fp) {
            return Err(Error::Mismatch {
                // Described only now: headers are checked per message.
                local: super::direct::describe(&my_fp, my_seq, self.ids),
                peer,
                world_peer: peer,
                remote: super::direct::describe(&fp, seq, bufs),
            });
        }
        if bufs != self.buf_ids() {
            // Direct steps address peers' buffers by this rank's ids.
            return Err(Error::Mismatch {
                local: self.own(),
                peer,
                world_peer: peer,
                remote: super::direct::describe(&fp, seq, bufs),
            });
        }
        if their_msg != msg || their_len != len as u64 {
            return Err(Error::Protocol(format!(
                "rank {peer} sent message {their_msg} of {their_len} bytes, expected message {msg} of {len} bytes during {}",
                self.during
            )));
        }
        Ok(())
    }
}
