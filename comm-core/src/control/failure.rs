//! Turning what went wrong into the error every rank reports: control-plane
//! notices to errors, the stall verdict of a timeout, a closed link's
//! culprit, and what this rank tells the others about its own error. The
//! one place that maps between [`Notice`] and [`Error`].

use super::bootstrap::{Control, ControlEvent, ControlSender};
use super::notice::Notice;
use crate::error::Error;
use crate::transport::PeerInfo;
use crate::wait::{look_until, EXPLAIN_WAIT};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Turn a control-plane notice into the error of this rank's call
/// (`during` names it for messages, `own` describes it for mismatches;
/// `timeout` is what a verdict's reporters waited when it does not say).
/// Ranks are this communicator's; the communicator maps them to the job's
/// numbering on the way out (`Error::in_world`).
pub(crate) fn notice_to_error(
    n: Notice,
    me: usize,
    peers: &[PeerInfo],
    during: &str,
    own: &str,
) -> Error {
    match n {
        Notice::Lost { rank, detail } => peer_lost(rank, peers, during, detail),
        Notice::Failed {
            origin,
            aborted: true,
            ..
        } => Error::Aborted {
            by: Some(origin),
            world_by: Some(origin),
        },
        Notice::Failed {
            origin, message, ..
        } => Error::Remote {
            rank: origin,
            world_rank: origin,
            during: during.to_string(),
            message,
        },
        // Every rank reports the disagreement as a mismatch, naming the side
        // it does not agree with.
        Notice::Mismatch {
            a,
            a_call,
            b,
            b_call,
        } => {
            let (peer, remote) = if me == a || (me != b && own == a_call) {
                (b, b_call)
            } else if me == b || own == b_call {
                (a, a_call)
            } else {
                (b, b_call)
            };
            Error::Mismatch {
                local: own.to_string(),
                peer,
                world_peer: peer,
                remote,
            }
        }
        Notice::Timeout {
            origin,
            waiting_for,
            after_ms,
            waits_on,
        } => {
            let rank = (waits_on != u32::MAX).then_some(waits_on as usize);
            Error::Timeout {
                during: during.to_string(),
                waiting_for: format!("{waiting_for} (seen by rank {origin})"),
                after: Duration::from_millis(after_ms),
                rank,
                world_rank: rank,
            }
        }
        Notice::Stalled {
            rank,
            detail,
            after_ms,
        } => stalled(me, rank, detail, during, Duration::from_millis(after_ms)),
        Notice::Absent {
            ranks,
            detail,
            after_ms,
        } => Error::Absent {
            during: detail,
            world_ranks: ranks.clone(),
            ranks,
            after: Duration::from_millis(after_ms),
        },
        Notice::Cycle {
            ranks, after_ms, ..
        } => Error::WaitCycle {
            during: during.to_string(),
            world_ranks: ranks.clone(),
            ranks,
            after: Duration::from_millis(after_ms),
        },
    }
}

/// The root's verdict that `rank` is the one everybody waited for. Told to
/// that rank itself, it says so (the late rank is not "waiting for" anyone).
fn stalled(me: usize, rank: usize, detail: String, during: &str, after: Duration) -> Error {
    let waiting_for = if rank == me {
        format!(
            "nothing: the others waited for this rank (rank {me}), which was late to {during} \
             (stopped, slow, or calling collectives in a different order); {detail}"
        )
    } else {
        format!("rank {rank}: {detail}")
    };
    Error::Timeout {
        during: during.to_string(),
        waiting_for,
        after,
        rank: Some(rank),
        world_rank: Some(rank),
    }
}

/// This rank timed out waiting for `waits_on` (`waiting_for` in words):
/// report it to the root, which collects every rank's report for a moment
/// and names the rank at the end of the chain of waits (a stopped or hung
/// process), or the ranks of a cycle of waits, and return that verdict as
/// this call's error — so every survivor names the same culprit, not just
/// its own neighbour.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stall_error(
    control: &mut Control,
    sender: &std::sync::Mutex<ControlSender>,
    me: usize,
    peers: &[PeerInfo],
    waiting_for: String,
    waits_on: Option<usize>,
    during: &str,
    own: &str,
    after: Duration,
) -> Error {
    let report = Notice::Timeout {
        origin: me,
        waiting_for: waiting_for.clone(),
        after_ms: after.as_millis() as u64,
        waits_on: waits_on.map_or(u32::MAX, |r| r as u32),
    };
    if let Ok(mut s) = sender.lock() {
        s.abort(&report);
    }
    let fd = control.fd();
    let verdict = look_until(
        Instant::now() + EXPLAIN_WAIT,
        || match control.poll() {
            Some(ControlEvent::Notice(n)) => ControlFlow::Break(Some(n)),
            Some(ControlEvent::RootGone) => ControlFlow::Break(None),
            Some(ControlEvent::Released(_)) | None => ControlFlow::Continue(()),
        },
        |left| {
            crate::sys::poll_one(fd, libc::POLLIN, left.min(Duration::from_millis(50)));
        },
    );
    if let Some(n) = verdict {
        return notice_to_error(n, me, peers, during, own);
    }
    // No verdict from a root that is still connected: when the root lives
    // in another rank's process, that rank is stopped or hung (it would
    // have answered otherwise) — and every survivor reaches this same
    // conclusion, where naming its own neighbour would not agree.
    if !control.is_gone() {
        if let Some(host) = root_host(peers, me) {
            return Error::Timeout {
                during: during.to_string(),
                waiting_for: format!(
                    "{waiting_for}; the root, in rank {}'s process, gave no verdict within {:.1} s, so rank {} itself is stopped or hung",
                    host.rank,
                    EXPLAIN_WAIT.as_secs_f64(),
                    host.rank
                ),
                after,
                rank: Some(host.rank),
                world_rank: Some(host.rank),
            };
        }
    }
    Error::Timeout {
        during: during.to_string(),
        waiting_for,
        after,
        rank: waits_on,
        world_rank: waits_on,
    }
}

/// The peer (not `me`) whose process hosts the root, if a rank does (rank
/// 0 under `OXCCL_ROOT`; none under a launcher).
pub(crate) fn root_host(peers: &[PeerInfo], me: usize) -> Option<&PeerInfo> {
    peers.iter().find(|p| p.hosts_root && p.rank != me)
}

/// `PeerLost` naming `rank`, with its host and pid from the peer table.
pub(crate) fn peer_lost(rank: usize, peers: &[PeerInfo], during: &str, detail: String) -> Error {
    let p = peers.get(rank);
    Error::PeerLost {
        rank,
        world_rank: rank,
        host: p.map(|p| p.hostname.clone()).unwrap_or_default(),
        pid: p.map_or(0, |p| p.pid),
        during: during.to_string(),
        detail,
    }
}

/// The error for a connection to `peer` that closed with no notice
/// explaining why: `peer` lost — unless another rank ended first. A rank
/// that failed because of a death closes its links too, so:
///
/// - `root_gone` (this rank read the end of its control connection, and
///   with it everything the root sent) and a rank hosts the root: that
///   rank's process ended (the root thread lives as long as it), and it
///   ended first — a rank hosting the root that fails for another reason
///   relays that reason before it may exit, and no notice came. Asked
///   instead, a liveness probe can still see a killed process alive while
///   the kernel closes its files one by one (seen across pretend hosts:
///   its rescue port accepted after its data links had closed).
/// - otherwise, a rank seen gone while `peer` is seen alive; or, `peer`
///   gone too, the rank hosting the root seen gone.
pub(crate) fn closed_link(
    me: usize,
    peer: usize,
    peers: &[PeerInfo],
    root_gone: bool,
    during: &str,
    detail: String,
) -> Error {
    if let Some(h) = root_host(peers, me).filter(|_| root_gone) {
        let detail = match h.rank == peer {
            true => format!("{detail}; the root it hosted went with it, without relaying any failure"),
            false => format!(
                "its process ended, and the root it hosted with it, without relaying any failure \
                 (rank {peer} closed its connection to this rank after: it failed because of this one)"
            ),
        };
        return peer_lost(h.rank, peers, during, detail);
    }
    let alive = |r: usize| process_alive(&peers[me], &peers[r]);
    let dead = match alive(peer) {
        Some(true) => (0..peers.len())
            .filter(|r| *r != me && *r != peer)
            .find(|r| alive(*r) == Some(false)),
        // The peer is gone too. If the rank whose process hosted the root
        // is gone as well, with no notice relayed, it died first: a rank
        // hosting the root that fails for another reason waits for the
        // root to relay that reason before it may exit, and the peer
        // probably failed because of its death (then exited, its root
        // gone, with nobody to tell).
        Some(false) => root_host(peers, me)
            .map(|p| p.rank)
            .filter(|h| *h != peer && alive(*h) == Some(false)),
        None => None,
    };
    match dead {
        Some(d) => peer_lost(
            d,
            peers,
            during,
            if alive(peer) == Some(true) {
                format!(
                    "its process is gone (rank {peer} closed its connection to this rank, but rank {peer}'s \
                     process is alive: it failed because of this one)"
                )
            } else {
                format!(
                    "its process is gone, and the root it hosted with it, without a word (rank {peer}, \
                     whose connection to this rank closed, is gone too: it failed because of this one)"
                )
            },
        ),
        None => peer_lost(peer, peers, during, detail),
    }
}

/// Whether `peer`'s process is alive, as far as `me` can tell: on the same
/// host by its pid, elsewhere by whether its rescue port (bound for as long
/// as its communicator lives) still accepts a connection. `None`: unknown.
pub(crate) fn process_alive(me: &PeerInfo, peer: &PeerInfo) -> Option<bool> {
    if peer.host_id == me.host_id && peer.pid != 0 {
        return Some(!crate::sys::process_gone(peer.pid));
    }
    let addr = peer.rescue?;
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        Ok(_) => Some(true),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(false),
        Err(_) => None,
    }
}

/// Map an own error to what the others should hear (None: not ours to tell).
pub(crate) fn notice_for(rank: usize, e: &Error) -> Option<Notice> {
    match e {
        Error::PeerLost { rank, detail, .. } => Some(Notice::Lost {
            rank: *rank,
            detail: detail.clone(),
        }),
        Error::Aborted { by: None, .. } => Some(Notice::Failed {
            origin: rank,
            aborted: true,
            message: "abort()".into(),
        }),
        Error::Aborted { by: Some(_), .. } | Error::Remote { .. } => None,
        Error::Mismatch {
            local,
            peer,
            remote,
            ..
        } => Some(Notice::Mismatch {
            a: rank,
            a_call: local.clone(),
            b: *peer,
            b_call: remote.clone(),
        }),
        // Reported to the root by `stall_error` before the call returned.
        // The root told everyone already.
        Error::Timeout { .. } | Error::WaitCycle { .. } | Error::Absent { .. } => None,
        Error::InvalidArgument(_) | Error::Unsupported(_) => None,
        other => Some(Notice::Failed {
            origin: rank,
            aborted: false,
            message: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks on pretend hosts of their own (so liveness is probed through
    /// rescue ports); `live` ranks have a listening rescue port, the others
    /// a port nobody listens on.
    fn table(
        n: usize,
        live: &[usize],
        listeners: &mut Vec<std::net::TcpListener>,
    ) -> Vec<PeerInfo> {
        (0..n)
            .map(|r| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                if live.contains(&r) {
                    listeners.push(l);
                }
                PeerInfo {
                    rank: r,
                    hostname: format!("h{r}"),
                    host_id: r as u64,
                    pid: 0,
                    addrs: vec![],
                    rescue: Some(addr),
                    hosts_root: r == 0,
                    cpus: Vec::new(),
                    llc: None,
                }
            })
            .collect()
    }

    #[test]
    fn a_gone_root_blames_its_host_even_while_it_looks_alive() {
        let mut keep = Vec::new();
        // Rank 0 hosts the root; every process still answers its probe, as
        // a killed one does while the kernel closes its files.
        let peers = table(4, &[0, 1, 2, 3], &mut keep);
        let e = closed_link(3, 2, &peers, true, "all_reduce #7", "closed".into());
        assert_eq!(e.blamed_rank(), Some(0), "{e}");
        // With the root still there, the same closure blames the peer.
        let e = closed_link(3, 2, &peers, false, "all_reduce #7", "closed".into());
        assert_eq!(e.blamed_rank(), Some(2), "{e}");
        // The root host's own link: the root host, even while a rank that
        // failed because of it is already gone (here rank 1) and the root
        // host still looks alive.
        let peers = table(4, &[0, 2, 3], &mut keep);
        let e = closed_link(3, 0, &peers, true, "all_reduce #7", "closed".into());
        assert_eq!(e.blamed_rank(), Some(0), "{e}");
    }

    #[test]
    fn a_closed_link_from_a_live_peer_blames_the_rank_seen_gone() {
        let mut keep = Vec::new();
        // Rank 1 is gone (its port refuses); rank 2, alive, closed its link
        // to rank 3 because of it.
        let peers = table(4, &[0, 2, 3], &mut keep);
        let e = closed_link(3, 2, &peers, false, "all_reduce #7", "closed".into());
        assert_eq!(e.blamed_rank(), Some(1), "{e}");
        // Rank 2 gone too, and the root host alive: rank 2 itself.
        let peers = table(4, &[0, 3], &mut keep);
        let e = closed_link(3, 2, &peers, false, "all_reduce #7", "closed".into());
        assert_eq!(e.blamed_rank(), Some(2), "{e}");
    }
}
