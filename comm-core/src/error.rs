//! The error type. Every variant says what happened, to which rank, in which
//! call, and what to check; all are `Clone` so a poisoned communicator can
//! return its original cause to every later call.

use std::fmt;
use std::time::Duration;

/// Result alias used throughout oxccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operation failed.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// Bad arguments, caught before any communication (nothing was sent).
    InvalidArgument(String),
    /// A peer process died or closed its connections.
    PeerLost {
        /// The rank that was lost.
        rank: usize,
        /// Its host name as it reported at bootstrap.
        host: String,
        /// The call during which the loss was seen (`all_reduce #12`).
        during: String,
        /// How it was noticed.
        detail: String,
    },
    /// A wait passed the communicator's deadline.
    Timeout {
        /// The call that timed out.
        during: String,
        /// What it waited for.
        waiting_for: String,
        /// The deadline that elapsed.
        after: Duration,
    },
    /// Ranks called different collectives (or with different arguments) at
    /// the same position in their sequence.
    Mismatch {
        /// What this rank called.
        local: String,
        /// The rank that disagreed.
        peer: usize,
        /// What that rank called.
        remote: String,
    },
    /// `abort()` was called on this communicator (or on a peer's, when `by`
    /// names another rank).
    Aborted {
        /// The rank whose abort caused this, if not this one.
        by: Option<usize>,
    },
    /// Another rank failed and told everyone why.
    Remote {
        /// The rank that reported the failure.
        rank: usize,
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
        /// The failure.
        detail: String,
    },
    /// Bytes from a peer did not follow the protocol.
    Protocol(String),
    /// Configuration (environment or [`crate::Config`]) is invalid.
    Config(String),
    /// A local system resource could not be obtained (memory, mappings).
    System(String),
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

    /// The rank this error blames, where there is one.
    pub fn blamed_rank(&self) -> Option<usize> {
        match self {
            Error::PeerLost { rank, .. } | Error::Remote { rank, .. } => Some(*rank),
            Error::Mismatch { peer, .. } | Error::Transport { peer, .. } => Some(*peer),
            Error::Aborted { by } => *by,
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::PeerLost { rank, host, during, detail } => write!(
                f,
                "rank {rank} (host {host}) was lost during {during}: {detail}; \
                 check that process's own output and exit status (crash, OOM kill, signal) and the network between the hosts"
            ),
            Error::Timeout { during, waiting_for, after } => write!(
                f,
                "{during} timed out after {:.1}s waiting for {waiting_for}; \
                 a rank may be stuck, stopped or calling collectives in a different order (raise OXCCL_TIMEOUT if the job is just slow)",
                after.as_secs_f64()
            ),
            Error::Mismatch { local, peer, remote } => write!(
                f,
                "collective mismatch: this rank called {local} while rank {peer} called {remote}; \
                 every rank must issue the same collectives with the same arguments in the same order"
            ),
            Error::Aborted { by: None } => write!(f, "communicator aborted by abort() on this rank"),
            Error::Aborted { by: Some(r) } => write!(f, "communicator aborted by rank {r}"),
            Error::Remote { rank, message } => write!(f, "rank {rank} failed: {message}"),
            Error::Bootstrap(m) => write!(f, "bootstrap failed: {m}"),
            Error::Handshake(m) => write!(f, "handshake rejected: {m}"),
            Error::Transport { peer, detail } => write!(f, "transport to rank {peer} failed: {detail}"),
            Error::Protocol(m) => write!(f, "protocol violation: {m}"),
            Error::Config(m) => write!(f, "configuration error: {m}"),
            Error::System(m) => write!(
                f,
                "system resource failure: {m}; check memory limits (ulimit -v, cgroup memory, vm.max_map_count)"
            ),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
        }
    }
}

impl std::error::Error for Error {}
