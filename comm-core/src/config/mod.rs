//! Typed configuration. Every field has an `OXCCL_*` environment variable
//! (documented in the README); [`Config::from_env`] reads them on top of the
//! defaults, and code can set fields directly.

pub mod nccl;
pub mod value;
pub mod vars;

pub use value::parse_bytes;

use crate::error::{Error, Result};
use std::time::Duration;

/// Knobs of a communicator. Cheap to clone; copied into every child of
/// `split`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Deadline of every wait (`OXCCL_TIMEOUT`, seconds, default 600,
    /// 0.001 to one year).
    pub timeout: Duration,
    /// How long a rank retries reaching the root before it fails naming
    /// the address (`OXCCL_CONNECT_TIMEOUT`, seconds, default 30): a
    /// mistyped address fails in seconds, not after `timeout`.
    pub connect_timeout: Duration,
    /// TCP streams per peer (`OXCCL_NSOCKS`, 1..=16, default 2).
    pub nsocks: usize,
    /// Bytes per pipelined chunk and per receive staging slot
    /// (`OXCCL_BUFFSIZE`, at least 4 KiB). Unset: the ranks agree on one
    /// at init ([`automatic_chunk`]): sized to the smallest
    /// last-level cache among them when every peer is reached through
    /// mapped shared memory, else [`DEFAULT_CHUNK_BYTES`]. A
    /// communicator's [`config`](crate::Communicator::config) holds the
    /// agreed value.
    pub chunk_bytes: Option<usize>,
    /// Interface for transport and bootstrap sockets (`OXCCL_SOCKET_IFNAME`,
    /// a name or prefix like NCCL's: `eth0`, `^docker`, `=eth1`).
    pub socket_ifname: Option<String>,
    /// Socket send/receive buffer request (`OXCCL_SOCKET_BUFFER`, default 4 MiB,
    /// 64 KiB to 1 GiB; the kernel caps it at net.core.{w,r}mem_max).
    pub socket_buffer: usize,
    /// Forced transport (`OXCCL_TRANSPORT`: `tcp`, `shm`, ...; `auto` or unset
    /// lets the facade choose per peer).
    pub transport: Option<String>,
    /// How long a waiting call retries, yielding the CPU between tries,
    /// before it sleeps in the kernel (`OXCCL_SPIN_US`, default 50 µs; 0
    /// sleeps at once, at most 1 s).
    pub spin: Duration,
    /// Host identity override (`OXCCL_HOSTID`): ranks with the same value
    /// are on one host (shared memory between them); unset, it is derived
    /// from host name, boot id and network namespace.
    pub host_id: Option<String>,
    /// Force an algorithm by name (`OXCCL_ALGO`: any of
    /// `algorithms::names()`) for the collectives it can run; unset, the
    /// registry's rules decide (see `oneshot_bytes`).
    pub algo: Option<String>,
    /// Largest all-reduce (bytes per rank) that uses the one-shot algorithm
    /// when no algorithm is forced (`OXCCL_ONESHOT_BYTES`).
    pub oneshot_bytes: usize,
    /// Shared memory the copy-in algorithm stages plain buffers through,
    /// over all of a host's ranks (`OXCCL_COPYIN_MEMORY`, 64 KiB to 1 GiB;
    /// each rank uses at most 4 MiB of it). Unset: a quarter of the
    /// last-level cache as the kernel reports it (8 MiB when it does not).
    /// Ranks need not agree: they use the smallest any of them has.
    pub copyin_memory: Option<usize>,
    /// Stage every call's messages through host slots, as calls on device
    /// memory are (`OXCCL_STAGING=always`; default `auto`: only those).
    /// Ranks need not agree: staging changes no message.
    pub stage_always: bool,
    /// How a copy-in schedule writes its shared staging, and a link that
    /// copies through memory (shared memory) its ring buffers
    /// (`OXCCL_STAGE_WRITES`): `None` (`auto`, the default) streams them
    /// past the cache only while this rank finds its peers' pieces
    /// crossing between caches (`exec/handoff.rs`); `Some(true)`
    /// (`streamed`) always, `Some(false)` (`cached`) never. Ranks need not
    /// agree: a piece holds the same bytes either way.
    pub stage_writes: Option<bool>,
    /// Whether the ranks of one host copy from each other's plain buffers
    /// through the kernel (cross-memory attach, `process_vm_readv`) where
    /// it lets them, so that a large all_to_all moves each byte once
    /// (`OXCCL_CMA`, default `auto`). Ranks need not agree: at creation
    /// they probe each other, use it only if every rank wants it and every
    /// probe succeeds, and prefer it only where their timings say it pays
    /// (see [`CrossMemory`]).
    pub cross_memory: CrossMemory,
    /// The tuner's cost model (`OXCCL_TUNER_PROFILE`: a profile file in
    /// `oxccl-sim`'s format, e.g. written by `scripts/sim-validate`). With
    /// one, a call no algorithm is forced for runs the algorithm
    /// `oxccl-sim` predicts fastest for its shape on this job's hosts;
    /// without, the registry's rules decide.
    pub tuner: Option<oxccl_sim::Model>,
    /// Calls the flight recorder keeps (`OXCCL_FLIGHT_CALLS`, default 256;
    /// 0 keeps none). See `crate::flight`.
    pub flight_calls: usize,
    /// Where a failed call writes the flight recorder's dump
    /// (`OXCCL_FLIGHT_DIR`; unset: nowhere).
    pub flight_dir: Option<std::path::PathBuf>,
    /// Where each rank writes its timeline trace (`OXCCL_TRACE`; unset:
    /// no trace is kept). See `crate::trace`.
    pub trace_dir: Option<std::path::PathBuf>,
    /// Events a trace keeps, the oldest dropped first
    /// (`OXCCL_TRACE_MAX_EVENTS`, default 1 Mi).
    pub trace_max_events: usize,
}

/// Bytes per pipelined chunk between hosts, and wherever the cache-sized
/// choice does not apply or the cache is unknown.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// The chunk ranks use when `OXCCL_BUFFSIZE` is unset and every peer is
/// reached through mapped shared memory, from each rank's last-level
/// cache (`caches`, one entry per rank, as the peer table gives them, so
/// every rank computes the same): the ranks' rings of two chunks each (one
/// per ring neighbour, see `transport-shm`) take an eighth of the least
/// cache, so the chunks in flight stay cached beside the buffers
/// streaming past them; a power of two from 64 KiB to
/// [`DEFAULT_CHUNK_BYTES`], which is also the answer when no rank knows
/// its cache. A 32 MiB cache gives 2 ranks 1 MiB (the size measured best
/// there) and 4 ranks 512 KiB; an 8 MiB one 256 and 128 KiB, which took
/// 2 ranks' reduce_scatter to 0.55-0.76 of 1 MiB's time and 4 ranks'
/// reduce to 0.39-0.63 (1-64 MiB; docs/PERFORMANCE.md, ninth round).
pub fn automatic_chunk(caches: &[Option<usize>]) -> usize {
    let Some(llc) = caches.iter().flatten().min() else {
        return DEFAULT_CHUNK_BYTES;
    };
    let fit = llc / 8 / (2 * caches.len().max(1));
    fit.checked_ilog2()
        .map_or(0, |log| 1 << log)
        .clamp(64 << 10, DEFAULT_CHUNK_BYTES)
}

/// Copies between the plain buffers of one host's ranks by the kernel
/// ([`Config::cross_memory`], `OXCCL_CMA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrossMemory {
    /// Never: this rank's buffers are not offered to its peers, so no
    /// rank of the communicator uses the kernel's copy.
    Off,
    /// Where the kernel allows it, chosen only where it pays: each rank
    /// times the kernel's copy against a plain one at creation, and the
    /// ranks prefer the single copy when their median share reaches half
    /// (`cross_memory.rs`).
    Auto,
    /// Where the kernel allows it, chosen by size alone (no timing).
    On,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(30),
            nsocks: 2,
            chunk_bytes: None,
            socket_ifname: None,
            socket_buffer: 4 << 20,
            transport: None,
            spin: Duration::from_micros(50),
            host_id: None,
            algo: None,
            oneshot_bytes: 16 << 10,
            copyin_memory: None,
            stage_always: false,
            stage_writes: None,
            cross_memory: CrossMemory::Auto,
            tuner: None,
            flight_calls: crate::flight::DEFAULT_CALLS,
            flight_dir: None,
            trace_dir: None,
            trace_max_events: crate::trace::DEFAULT_MAX_EVENTS,
        }
    }
}

impl Config {
    /// Defaults overridden by `OXCCL_*` variables. Every `OXCCL_*`
    /// variable that is set is validated ([`vars::check_env`]), used here
    /// or not; a bad value is an error naming the variable and its range.
    pub fn from_env() -> Result<Config> {
        vars::check_env()?;
        let mut c = Config::default();
        if let Some(d) = vars::duration("OXCCL_TIMEOUT")? {
            c.timeout = d;
        }
        if let Some(d) = vars::duration("OXCCL_CONNECT_TIMEOUT")? {
            c.connect_timeout = d;
        }
        if let Some(n) = vars::count("OXCCL_NSOCKS")? {
            c.nsocks = n;
        }
        c.chunk_bytes = vars::size("OXCCL_BUFFSIZE")?;
        if let Some(b) = vars::size("OXCCL_SOCKET_BUFFER")? {
            c.socket_buffer = b;
        }
        if let Some(d) = vars::duration("OXCCL_SPIN_US")? {
            c.spin = d;
        }
        c.socket_ifname = vars::text("OXCCL_SOCKET_IFNAME")?;
        c.host_id = vars::text("OXCCL_HOSTID")?;
        c.algo = vars::text("OXCCL_ALGO")?.filter(|a| a != "auto");
        if let Some(b) = vars::size("OXCCL_ONESHOT_BYTES")? {
            c.oneshot_bytes = b;
        }
        c.copyin_memory = vars::size("OXCCL_COPYIN_MEMORY")?;
        c.stage_always = vars::choice("OXCCL_STAGING")? == Some("always");
        c.stage_writes = match vars::choice("OXCCL_STAGE_WRITES")? {
            Some("streamed") => Some(true),
            Some("cached") => Some(false),
            _ => None,
        };
        c.cross_memory = match vars::choice("OXCCL_CMA")? {
            Some("off") => CrossMemory::Off,
            Some("on") => CrossMemory::On,
            _ => CrossMemory::Auto,
        };
        if let Some(p) = vars::text("OXCCL_TUNER_PROFILE")? {
            c.tuner = Some(vars::profile("OXCCL_TUNER_PROFILE", &p)?);
        }
        if let Some(n) = vars::count("OXCCL_FLIGHT_CALLS")? {
            c.flight_calls = n;
        }
        c.flight_dir = vars::text("OXCCL_FLIGHT_DIR")?.map(Into::into);
        c.trace_dir = vars::text("OXCCL_TRACE")?.map(Into::into);
        if let Some(n) = vars::count("OXCCL_TRACE_MAX_EVENTS")? {
            c.trace_max_events = n;
        }
        c.transport = vars::choice("OXCCL_TRANSPORT")?
            .filter(|t| *t != "auto")
            .map(String::from);
        c.validate()?;
        Ok(c)
    }

    /// Check ranges (the same as the variables'); called by `from_env` and
    /// by communicator init, so a config built in code is held to them too.
    pub fn validate(&self) -> Result<()> {
        let range = |field: &str, var: &str, ok: bool, accepted: String| {
            if ok {
                Ok(())
            } else {
                Err(Error::Config(format!("{field} ({var}) must be {accepted}")))
            }
        };
        let durations = |var: &str, d: Duration, field: &str| match vars::var(var).kind {
            vars::Kind::Seconds { min, max } | vars::Kind::Micros { min, max } => range(
                field,
                var,
                (min..=max).contains(&d),
                format!("from {min:?} to {max:?}, got {d:?}"),
            ),
            _ => Ok(()),
        };
        let numbers = |var: &str, n: usize, field: &str| match vars::var(var).kind {
            vars::Kind::Count { min, max } | vars::Kind::Size { min, max } => range(
                field,
                var,
                (min..=max).contains(&n),
                format!("from {min} to {max}, got {n}"),
            ),
            _ => Ok(()),
        };
        durations("OXCCL_TIMEOUT", self.timeout, "timeout")?;
        durations(
            "OXCCL_CONNECT_TIMEOUT",
            self.connect_timeout,
            "connect_timeout",
        )?;
        durations("OXCCL_SPIN_US", self.spin, "spin")?;
        numbers("OXCCL_NSOCKS", self.nsocks, "nsocks")?;
        if let Some(b) = self.chunk_bytes {
            numbers("OXCCL_BUFFSIZE", b, "chunk_bytes")?;
        }
        numbers("OXCCL_SOCKET_BUFFER", self.socket_buffer, "socket_buffer")?;
        numbers("OXCCL_ONESHOT_BYTES", self.oneshot_bytes, "oneshot_bytes")?;
        if let Some(b) = self.copyin_memory {
            numbers("OXCCL_COPYIN_MEMORY", b, "copyin_memory")?;
        }
        numbers("OXCCL_FLIGHT_CALLS", self.flight_calls, "flight_calls")?;
        numbers(
            "OXCCL_TRACE_MAX_EVENTS",
            self.trace_max_events,
            "trace_max_events",
        )?;
        if let Some(a) = &self.algo {
            if algorithms::find(a).is_none() {
                return Err(Error::Config(format!(
                    "algorithm (OXCCL_ALGO) {a:?} is not one of: auto, {}",
                    algorithms::names()
                )));
            }
        }
        Ok(())
    }

    /// Bytes per pipelined chunk: `chunk_bytes`, or [`DEFAULT_CHUNK_BYTES`]
    /// while it is unset (a communicator's config holds the agreed value
    /// from its links on; a transport's `listen` runs before that).
    pub fn chunk(&self) -> usize {
        self.chunk_bytes.unwrap_or(DEFAULT_CHUNK_BYTES)
    }

    /// The settings every rank of a communicator must share, as
    /// (variable, value) pairs: the root compares them at registration and
    /// fails every rank at once, naming the first difference, instead of
    /// letting mismatched ranks wait on each other until the timeout.
    pub fn agreement(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "OXCCL_TRANSPORT",
                self.transport.clone().unwrap_or_else(|| "auto".into()),
            ),
            ("OXCCL_NSOCKS", self.nsocks.to_string()),
            (
                "OXCCL_BUFFSIZE",
                self.chunk_bytes
                    .map_or_else(|| "auto".into(), value::show_bytes),
            ),
            (
                "OXCCL_ALGO",
                self.algo.clone().unwrap_or_else(|| "auto".into()),
            ),
            ("OXCCL_ONESHOT_BYTES", value::show_bytes(self.oneshot_bytes)),
            (
                "OXCCL_TUNER_PROFILE",
                self.tuner
                    .as_ref()
                    .map_or_else(|| "none".into(), |m| profile_digest(&m.to_profile())),
            ),
        ]
    }
}

/// A short, stable name of a profile's content (FNV-1a, 64 bits): what
/// ranks compare, since the profile itself can be longer than a setting.
fn profile_digest(text: &str) -> String {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("profile {h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_chunk_keeps_the_rings_in_an_eighth_of_the_least_cache() {
        let mib = |m: usize| Some(m << 20);
        assert_eq!(automatic_chunk(&[mib(32); 2]), 1 << 20);
        assert_eq!(automatic_chunk(&[mib(32); 4]), 512 << 10);
        assert_eq!(automatic_chunk(&[mib(8); 2]), 256 << 10);
        assert_eq!(automatic_chunk(&[mib(8); 4]), 128 << 10);
        // Every rank computes from the whole table: the least cache, the
        // unknown ones left out.
        assert_eq!(automatic_chunk(&[mib(32), mib(8)]), 256 << 10);
        assert_eq!(
            automatic_chunk(&[mib(8), None, mib(32), mib(32)]),
            128 << 10
        );
        // Not a power of two: rounded down.
        assert_eq!(automatic_chunk(&[mib(12); 2]), 256 << 10);
        // Bounds: huge caches, tiny caches, many ranks, nothing known.
        assert_eq!(automatic_chunk(&[Some(1 << 40); 2]), DEFAULT_CHUNK_BYTES);
        assert_eq!(automatic_chunk(&[Some(1 << 10); 2]), 64 << 10);
        assert_eq!(automatic_chunk(&[mib(8); 1024]), 64 << 10);
        assert_eq!(automatic_chunk(&[None, None]), DEFAULT_CHUNK_BYTES);
        assert_eq!(automatic_chunk(&[]), DEFAULT_CHUNK_BYTES);
        assert_eq!(automatic_chunk(&[Some(0)]), 64 << 10);
    }

    #[test]
    fn validation_rejects_out_of_range() {
        let c = Config {
            nsocks: 0,
            ..Config::default()
        };
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        let c = Config {
            chunk_bytes: Some(10),
            ..Config::default()
        };
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        let c = Config {
            copyin_memory: Some(1000),
            ..Config::default()
        };
        match c.validate() {
            Err(Error::Config(m)) => assert!(m.contains("OXCCL_COPYIN_MEMORY"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(Config::default().validate().is_ok());
    }
}
