//! The error type. Every variant says what happened, to which rank, in which
//! call, and what to check; all are `Clone` so a poisoned communicator can
//! return its original cause to every later call.

use std::fmt;
use std::time::Duration;

/// Result alias used throughout oxccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operation failed.
///
/// Errors are data: every variant that blames a rank carries it twice —
/// `rank` (or `peer`) in this communicator's numbering and `world_rank` in
/// the numbering of the communicator it was split from, transitively (the
/// job's ranks; equal to `rank` on a top-level communicator) — and every
/// error of a call names the call and its sequence number (`during`).
/// New variants may come: match with a wildcard arm.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// Bad arguments, caught before any communication (nothing was sent).
    InvalidArgument(String),
    /// A peer process died or closed its connections.
    PeerLost {
        /// The rank that was lost (this communicator's numbering).
        rank: usize,
        /// The same rank in the job's numbering.
        world_rank: usize,
        /// Its host name as it reported at bootstrap.
        host: String,
        /// Its process id as it reported at bootstrap (0: unknown).
        pid: u32,
        /// The call during which the loss was seen (`all_reduce #12`).
        during: String,
        /// How it was noticed.
        detail: String,
    },
    /// A wait passed its deadline (the communicator's timeout, or the
    /// call's own).
    Timeout {
        /// The call that timed out.
        during: String,
        /// What it waited for.
        waiting_for: String,
        /// The deadline that elapsed.
        after: Duration,
        /// The rank found responsible (the end of the chain of waits), when
        /// one was found; this rank's own number when it was the late one.
        rank: Option<usize>,
        /// The same rank in the job's numbering.
        world_rank: Option<usize>,
    },
    /// Ranks wait for each other in a cycle (each blocked on the next, as
    /// when two ranks both receive before they send): a deadlock in the
    /// program's order of calls, found when the waits timed out.
    WaitCycle {
        /// The call this rank was in.
        during: String,
        /// The ranks of the cycle, in wait order (each waits for the next,
        /// the last for the first).
        ranks: Vec<usize>,
        /// The same ranks in the job's numbering.
        world_ranks: Vec<usize>,
        /// How long the waits lasted.
        after: Duration,
    },
    /// Ranks did not arrive at a monitored barrier in time (see
    /// `Communicator::monitored_barrier`).
    Absent {
        /// The barrier (`monitored_barrier #2`).
        during: String,
        /// Every rank that had not arrived when the time was up.
        ranks: Vec<usize>,
        /// The same ranks in the job's numbering.
        world_ranks: Vec<usize>,
        /// How long the first rank to arrive had waited.
        after: Duration,
    },
    /// Ranks called different collectives (or with different arguments) at
    /// the same position in their sequence.
    Mismatch {
        /// What this rank called (with its sequence number).
        local: String,
        /// The rank that disagreed.
        peer: usize,
        /// The same rank in the job's numbering.
        world_peer: usize,
        /// What that rank called.
        remote: String,
    },
    /// `abort()` was called on this communicator (or on a peer's, when `by`
    /// names another rank).
    Aborted {
        /// The rank whose abort caused this, if not this one.
        by: Option<usize>,
        /// The same rank in the job's numbering.
        world_by: Option<usize>,
    },
    /// Another rank failed and told everyone why.
    Remote {
        /// The rank that reported the failure.
        rank: usize,
        /// The same rank in the job's numbering.
        world_rank: usize,
        /// This rank's call when it heard.
        during: String,
        /// Its error, as text.
        message: String,
    },
    /// Rendezvous with the root failed (unreachable, wrong world size, ...).
    Bootstrap(String),
    /// A connection did not prove the job's secret or named the wrong
    /// communicator or rank.
    Handshake(String),
    /// A transport failed in a way other than a peer going away.
    Transport {
        /// The peer of the failing link.
        peer: usize,
        /// The same rank in the job's numbering.
        world_peer: usize,
        /// The failure (naming the call).
        detail: String,
    },
    /// Bytes from a peer did not follow the protocol.
    Protocol(String),
    /// Configuration (environment or [`crate::Config`]) is invalid.
    Config(String),
    /// A local system resource could not be obtained (memory, mappings).
    System(String),
    /// A device operation failed: which device, and the driver's error
    /// with what was being done (a kernel launch, a copy, an allocation).
    Device { device: String, detail: String },
    /// The call needs something this build or machine lacks (device memory
    /// without a compute engine or link for it, ...); caught before
    /// anything was sent, so the communicator stays usable.
    Unsupported(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }

    /// Whether the error was caught before anything was exchanged, so the
    /// communicator stays usable (argument errors, unsupported memory).
    pub fn is_local(&self) -> bool {
        matches!(self, Error::InvalidArgument(_) | Error::Unsupported(_))
    }

    /// The rank this error blames (this communicator's numbering), where
    /// there is one. A wait cycle blames no single rank: `None`.
    pub fn blamed_rank(&self) -> Option<usize> {
        match self {
            Error::PeerLost { rank, .. } | Error::Remote { rank, .. } => Some(*rank),
            Error::Mismatch { peer, .. } | Error::Transport { peer, .. } => Some(*peer),
            Error::Timeout { rank, .. } => *rank,
            Error::Absent { ranks, .. } => ranks.first().copied(),
            Error::Aborted { by, .. } => *by,
            _ => None,
        }
    }

    /// The rank this error blames in the job's numbering (see the type's
    /// docs), where there is one.
    pub fn blamed_world_rank(&self) -> Option<usize> {
        match self {
            Error::PeerLost { world_rank, .. } | Error::Remote { world_rank, .. } => {
                Some(*world_rank)
            }
            Error::Mismatch { world_peer, .. } | Error::Transport { world_peer, .. } => {
                Some(*world_peer)
            }
            Error::Timeout { world_rank, .. } => *world_rank,
            Error::Absent { world_ranks, .. } => world_ranks.first().copied(),
            Error::Aborted { world_by, .. } => *world_by,
            _ => None,
        }
    }

    /// Fill in what only the communicator knows: the job's numbering of
    /// every rank this error names (`world[rank]`), and the host and pid of
    /// a lost peer (`peers[rank]`). Errors are built inside a call with
    /// `world_* == rank`; the communicator maps them once, on their way out.
    pub(crate) fn in_world(mut self, world: &[usize], peers: &[crate::PeerInfo]) -> Error {
        let w = |r: usize| world.get(r).copied().unwrap_or(r);
        match &mut self {
            Error::PeerLost {
                rank,
                world_rank,
                host,
                pid,
                ..
            } => {
                *world_rank = w(*rank);
                if let Some(p) = peers.get(*rank) {
                    if host.is_empty() {
                        host.clone_from(&p.hostname);
                    }
                    *pid = p.pid;
                }
            }
            Error::Timeout {
                rank, world_rank, ..
            } => *world_rank = rank.map(w),
            Error::WaitCycle {
                ranks, world_ranks, ..
            }
            | Error::Absent {
                ranks, world_ranks, ..
            } => *world_ranks = ranks.iter().map(|r| w(*r)).collect(),
            Error::Mismatch {
                peer, world_peer, ..
            }
            | Error::Transport {
                peer, world_peer, ..
            } => *world_peer = w(*peer),
            Error::Aborted { by, world_by } => *world_by = by.map(w),
            Error::Remote {
                rank, world_rank, ..
            } => *world_rank = w(*rank),
            _ => {}
        }
        self
    }
}

/// `rank 1 (world rank 3)`, or `rank 1` where the two agree.
struct Who(usize, usize);

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who(r, w) if r == w => write!(f, "rank {r}"),
            Who(r, w) => write!(f, "rank {r} (world rank {w})"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::PeerLost {
                rank,
                world_rank,
                host,
                pid,
                during,
                detail,
            } => {
                write!(f, "rank {rank} (")?;
                if world_rank != rank {
                    write!(f, "world rank {world_rank}, ")?;
                }
                write!(f, "host {host}")?;
                if *pid != 0 {
                    write!(f, ", pid {pid}")?;
                }
                write!(
                    f,
                    ") was lost during {during}: {detail}; \
                     check that process's own output and exit status (crash, OOM kill, signal) and the network between the hosts"
                )
            }
            Error::Timeout {
                during,
                waiting_for,
                after,
                ..
            } => write!(
                f,
                "{during} timed out after {:.1}s waiting for {waiting_for}; \
                 a rank may be stuck, stopped or calling collectives in a different order (raise OXCCL_TIMEOUT if the job is just slow)",
                after.as_secs_f64()
            ),
            Error::WaitCycle {
                during,
                ranks,
                world_ranks,
                after,
            } => {
                let chain: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
                write!(
                    f,
                    "{during} is in a wait cycle: ranks {} wait for each other ({} -> {}), none can proceed \
                     (for {:.1}s); a deadlock in the order of calls, e.g. two ranks that both receive before they send \
                     (post the receive with recv_async, or put both in one group)",
                    chain.join(", "),
                    chain.join(" -> "),
                    chain.first().map_or("", |s| s.as_str()),
                    after.as_secs_f64()
                )?;
                if world_ranks != ranks {
                    write!(f, "; world ranks {world_ranks:?}")?;
                }
                Ok(())
            }
            Error::Absent {
                during,
                ranks,
                world_ranks,
                after,
            } => {
                write!(
                    f,
                    "{during}: ranks {ranks:?} did not arrive within {:.1}s of the first rank",
                    after.as_secs_f64()
                )?;
                if world_ranks != ranks {
                    write!(f, " (world ranks {world_ranks:?})")?;
                }
                write!(
                    f,
                    "; they are stuck or slow elsewhere (a hang, a long step, a different order of calls) or dead"
                )
            }
            Error::Mismatch {
                local,
                peer,
                world_peer,
                remote,
            } => write!(
                f,
                "collective mismatch: this rank called {local} while {} called {remote}; \
                 every rank must issue the same collectives with the same arguments in the same order",
                Who(*peer, *world_peer)
            ),
            Error::Aborted { by: None, .. } => {
                write!(f, "communicator aborted by abort() on this rank")
            }
            Error::Aborted {
                by: Some(r),
                world_by,
            } => write!(
                f,
                "communicator aborted by {}",
                Who(*r, world_by.unwrap_or(*r))
            ),
            Error::Remote {
                rank,
                world_rank,
                during,
                message,
            } => write!(
                f,
                "{} failed (this rank was in {during}): {message}",
                Who(*rank, *world_rank)
            ),
            Error::Bootstrap(m) => write!(f, "bootstrap failed: {m}"),
            Error::Handshake(m) => write!(f, "handshake rejected: {m}"),
            Error::Transport {
                peer,
                world_peer,
                detail,
            } => write!(
                f,
                "transport to {} failed: {detail}",
                Who(*peer, *world_peer)
            ),
            Error::Protocol(m) => write!(f, "protocol violation: {m}"),
            Error::Config(m) => write!(f, "configuration error: {m}"),
            Error::System(m) => write!(
                f,
                "system resource failure: {m}; check memory limits (ulimit -v, cgroup memory, vm.max_map_count)"
            ),
            Error::Device { device, detail } => write!(f, "{device} failed: {detail}"),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
        }
    }
}

impl std::error::Error for Error {}
