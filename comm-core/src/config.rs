//! Typed configuration. Every field has an `OXCCL_*` environment variable
//! (documented in the README); [`Config::from_env`] reads them on top of the
//! defaults, and code can set fields directly.

use crate::error::{Error, Result};
use std::time::Duration;

/// Knobs of a communicator. Cheap to clone; copied into every child of
/// `split`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Deadline of every wait (`OXCCL_TIMEOUT`, seconds, default 600).
    pub timeout: Duration,
    /// TCP streams per peer (`OXCCL_NSOCKS`, 1..=16, default 2).
    pub nsocks: usize,
    /// Bytes per pipelined chunk and per receive staging slot
    /// (`OXCCL_BUFFSIZE`, default 1 MiB, at least 4 KiB).
    pub chunk_bytes: usize,
    /// Interface for transport and bootstrap sockets (`OXCCL_SOCKET_IFNAME`,
    /// a name or prefix like NCCL's: `eth0`, `^docker`, `=eth1`).
    pub socket_ifname: Option<String>,
    /// Socket send/receive buffer request (`OXCCL_SOCKET_BUFFER`, default 4 MiB;
    /// the kernel caps it at net.core.{w,r}mem_max).
    pub socket_buffer: usize,
    /// Forced transport (`OXCCL_TRANSPORT`: `tcp`, `shm`, ...; `auto` or unset
    /// lets the facade choose per peer).
    pub transport: Option<String>,
    /// How long a waiting call retries, yielding the CPU between tries,
    /// before it sleeps in the kernel (`OXCCL_SPIN_US`, default 50 µs; 0
    /// sleeps at once).
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
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: Duration::from_secs(600),
            nsocks: 2,
            chunk_bytes: 1 << 20,
            socket_ifname: None,
            socket_buffer: 4 << 20,
            transport: None,
            spin: Duration::from_micros(50),
            host_id: None,
            algo: None,
            oneshot_bytes: 16 << 10,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse_num(name: &str, v: &str) -> Result<f64> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| Error::Config(format!("{name}={v:?} is not a non-negative number")))
}

/// Parse a byte size with an optional K/M/G suffix (powers of 1024).
pub fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (num, mul) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 1usize << 10),
        (i, 'm' | 'M') => (&v[..i], 1 << 20),
        (i, 'g' | 'G') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

impl Config {
    /// Defaults overridden by `OXCCL_*` variables; bad values are errors.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = env("OXCCL_TIMEOUT") {
            let s = parse_num("OXCCL_TIMEOUT", &v)?;
            if s == 0.0 {
                return Err(Error::Config("OXCCL_TIMEOUT must be > 0 seconds".into()));
            }
            c.timeout = Duration::from_secs_f64(s);
        }
        if let Some(v) = env("OXCCL_NSOCKS") {
            c.nsocks = parse_num("OXCCL_NSOCKS", &v)? as usize;
        }
        if let Some(v) = env("OXCCL_BUFFSIZE") {
            c.chunk_bytes = parse_bytes(&v).ok_or_else(|| {
                Error::Config(format!("OXCCL_BUFFSIZE={v:?} is not a size (e.g. 1M)"))
            })?;
        }
        if let Some(v) = env("OXCCL_SOCKET_BUFFER") {
            c.socket_buffer = parse_bytes(&v).ok_or_else(|| {
                Error::Config(format!("OXCCL_SOCKET_BUFFER={v:?} is not a size (e.g. 4M)"))
            })?;
        }
        if let Some(v) = env("OXCCL_SPIN_US") {
            c.spin = Duration::from_secs_f64(parse_num("OXCCL_SPIN_US", &v)? / 1e6);
        }
        c.socket_ifname = env("OXCCL_SOCKET_IFNAME");
        c.host_id = env("OXCCL_HOSTID");
        c.algo = env("OXCCL_ALGO").filter(|a| a != "auto");
        if let Some(v) = env("OXCCL_ONESHOT_BYTES") {
            c.oneshot_bytes = parse_bytes(&v).ok_or_else(|| {
                Error::Config(format!(
                    "OXCCL_ONESHOT_BYTES={v:?} is not a size (e.g. 16K)"
                ))
            })?;
        }
        c.transport = env("OXCCL_TRANSPORT").filter(|t| t != "auto");
        c.validate()?;
        Ok(c)
    }

    /// Check ranges; called by `from_env` and by communicator init.
    pub fn validate(&self) -> Result<()> {
        if !(1..=16).contains(&self.nsocks) {
            return Err(Error::Config(format!(
                "nsocks (OXCCL_NSOCKS) must be 1..=16, got {}",
                self.nsocks
            )));
        }
        if self.chunk_bytes < 4096 || self.chunk_bytes > (1 << 30) {
            return Err(Error::Config(format!(
                "chunk size (OXCCL_BUFFSIZE) must be 4K..1G, got {}",
                self.chunk_bytes
            )));
        }
        if let Some(a) = &self.algo {
            if algorithms::find(a).is_none() {
                return Err(Error::Config(format!(
                    "algorithm (OXCCL_ALGO) {a:?} is not one of: auto, {}",
                    algorithms::names()
                )));
            }
        }
        if self.timeout.is_zero() {
            return Err(Error::Config("timeout must be > 0".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_suffixes() {
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("8"), Some(8));
        assert_eq!(parse_bytes("4k"), Some(4096));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999999999G"), None);
    }

    #[test]
    fn validation_rejects_out_of_range() {
        let c = Config {
            nsocks: 0,
            ..Config::default()
        };
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        let c = Config {
            chunk_bytes: 10,
            ..Config::default()
        };
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        assert!(Config::default().validate().is_ok());
    }
}
