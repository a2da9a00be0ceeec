//! Every `OXCCL_*` environment variable, in one table: its name, what
//! values it accepts and what it does. Readers elsewhere (the transports,
//! the kernels, the launcher) take their ranges from here, and
//! [`check_env`] validates every variable that is set — including those of
//! features this process does not use, so a typo in `OXCCL_IB_TC` on a
//! TCP-only run is still an error rather than a silent no-op.

use super::nccl::{self, Source};
use super::value::{self, MAX_DURATION};
use crate::error::{Error, Result};
use std::time::Duration;

/// What a variable accepts.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Seconds (fractions allowed) in a range.
    Seconds { min: Duration, max: Duration },
    /// Microseconds (fractions allowed) in a range.
    Micros { min: Duration, max: Duration },
    /// A whole number in a range.
    Count { min: usize, max: usize },
    /// A byte size (K/M/G suffixes) in a range.
    Size { min: usize, max: usize },
    /// One of these words (case-insensitive).
    Choice(&'static [&'static str]),
    /// An algorithm name, or `auto`.
    Algorithm,
    /// `host:port` with a port from 1 to 65535.
    HostPort,
    /// A printed unique id.
    UniqueId,
    /// The path of a readable cost-model profile (`oxccl-sim`'s format).
    Profile,
    /// Free text (names, secrets, filters).
    Text,
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    pub name: &'static str,
    pub kind: Kind,
    /// One line for error messages and docs.
    pub what: &'static str,
}

const fn secs(min_ms: u64, max: Duration) -> Kind {
    Kind::Seconds {
        min: Duration::from_millis(min_ms),
        max,
    }
}

/// Most ranks a job may have (bounds every rank variable).
pub const MAX_RANKS: usize = 1 << 16;

/// The table. Keep it sorted by name; README's table mirrors it.
pub const VARS: &[Var] = &[
    Var {
        name: "OXCCL_ALGO",
        kind: Kind::Algorithm,
        what: "force an algorithm",
    },
    Var {
        name: "OXCCL_BUFFSIZE",
        kind: Kind::Size {
            min: 4 << 10,
            max: 1 << 30,
        },
        what: "bytes per pipelined chunk (unset: agreed from the cache on one host, else 1M)",
    },
    Var {
        name: "OXCCL_CACHE_DIR",
        kind: Kind::Text,
        what: "folder for compiled CUDA kernels (default $XDG_CACHE_HOME/oxccl or ~/.cache/oxccl)",
    },
    Var {
        name: "OXCCL_CMA",
        kind: Kind::Choice(&["auto", "on", "off"]),
        what: "copies between the plain buffers of one host's ranks by the kernel (cross-memory attach): auto (where the kernel allows it and a timing at init says it pays), on (where allowed, untimed), off",
    },
    Var {
        name: "OXCCL_CONNECT_TIMEOUT",
        kind: secs(100, Duration::from_secs(3600)),
        what: "how long a rank retries reaching the root before failing",
    },
    Var {
        name: "OXCCL_COPYIN_MEMORY",
        kind: Kind::Size {
            min: 64 << 10,
            max: 1 << 30,
        },
        what: "shared memory the copy-in algorithm stages through, over all of a host's ranks",
    },
    Var {
        name: "OXCCL_CUDA_INCLUDE",
        kind: Kind::Text,
        what: "folder of the CUDA headers nccl.h includes (testing: nccl-abi's C suite; scripts/nccl-headers)",
    },
    Var {
        name: "OXCCL_DEBUG",
        kind: Kind::Choice(&["off", "error", "warn", "info", "debug", "trace"]),
        what: "log level of oxccl's binaries",
    },
    Var {
        name: "OXCCL_FAULT_SEEDS",
        kind: Kind::Text,
        what: "seeds the long fault harnesses replay, comma-separated (testing)",
    },
    Var {
        name: "OXCCL_FAULT_TRIALS",
        kind: Kind::Count {
            min: 1,
            max: 1_000_000,
        },
        what: "trials of the long fault harness (testing)",
    },
    Var {
        name: "OXCCL_FLIGHT_CALLS",
        kind: Kind::Count {
            min: 0,
            max: 1 << 20,
        },
        what: "calls the flight recorder keeps per communicator (default 256; 0: none)",
    },
    Var {
        name: "OXCCL_FLIGHT_DIR",
        kind: Kind::Text,
        what: "folder a failed call writes its communicator's flight recorder into (flight-COMM-rankR.json)",
    },
    Var {
        name: "OXCCL_FUZZ_ITERS",
        kind: Kind::Count {
            min: 0,
            max: usize::MAX,
        },
        what: "iterations of the decoder fuzz tests (testing)",
    },
    Var {
        name: "OXCCL_HOSTID",
        kind: Kind::Text,
        what: "host identity override",
    },
    Var {
        name: "OXCCL_IB_GID_INDEX",
        kind: Kind::Count { min: 0, max: 255 },
        what: "RDMA GID index",
    },
    Var {
        name: "OXCCL_IB_HCA",
        kind: Kind::Text,
        what: "RDMA devices and ports to use",
    },
    Var {
        name: "OXCCL_IB_RETRY_CNT",
        kind: Kind::Count { min: 0, max: 7 },
        what: "RDMA transport retry count",
    },
    Var {
        name: "OXCCL_IB_TC",
        kind: Kind::Count { min: 0, max: 255 },
        what: "RDMA traffic class",
    },
    Var {
        name: "OXCCL_IB_TIMEOUT",
        kind: Kind::Count { min: 0, max: 31 },
        what: "RDMA local ACK timeout exponent",
    },
    Var {
        name: "OXCCL_KERNEL_ISA",
        kind: Kind::Choice(&["baseline", "scalar", "avx2", "avx512"]),
        what: "cap the reduction kernels' instruction set",
    },
    Var {
        name: "OXCCL_LOCAL_RANK",
        kind: Kind::Count {
            min: 0,
            max: MAX_RANKS - 1,
        },
        what: "rank within the host",
    },
    Var {
        name: "OXCCL_NCCL_INCLUDE",
        kind: Kind::Text,
        what: "folder of NVIDIA's nccl.h (testing: nccl-abi's C suite; scripts/nccl-headers)",
    },
    Var {
        name: "OXCCL_NSOCKS",
        kind: Kind::Count { min: 1, max: 16 },
        what: "TCP streams per peer",
    },
    Var {
        name: "OXCCL_NVRTC",
        kind: Kind::Text,
        what: "path of libnvrtc.so.* to load (e.g. from the nvidia-cuda-nvrtc wheel)",
    },
    Var {
        name: "OXCCL_ONESHOT_BYTES",
        kind: Kind::Size {
            min: 0,
            max: 1 << 30,
        },
        what: "largest all-reduce that uses the one-shot algorithm",
    },
    Var {
        name: "OXCCL_RANK",
        kind: Kind::Count {
            min: 0,
            max: MAX_RANKS - 1,
        },
        what: "this process's rank",
    },
    Var {
        name: "OXCCL_REQUIRE_GPU",
        kind: Kind::Choice(&["0", "1"]),
        what: "1: the CUDA device tests fail instead of skipping without a GPU (testing, scripts/gpu-check)",
    },
    Var {
        name: "OXCCL_REQUIRE_LAUNCHERS",
        kind: Kind::Choice(&["0", "1"]),
        what: "1: the launcher tests (mpirun) fail instead of skipping when the launcher is missing (testing, CI)",
    },
    Var {
        name: "OXCCL_REQUIRE_NCCL_H",
        kind: Kind::Choice(&["0", "1"]),
        what: "1: nccl-abi's C tests fail instead of skipping without NVIDIA's nccl.h (testing, CI)",
    },
    Var {
        name: "OXCCL_REQUIRE_NVRTC",
        kind: Kind::Choice(&["0", "1"]),
        what: "1: the CUDA kernel tests fail instead of skipping without NVRTC (testing, CI)",
    },
    Var {
        name: "OXCCL_ROOT",
        kind: Kind::HostPort,
        what: "address of the root that rank 0 hosts",
    },
    Var {
        name: "OXCCL_SECRET",
        kind: Kind::Text,
        what: "job secret for address rendezvous",
    },
    Var {
        name: "OXCCL_SHM_BUFFSIZE",
        kind: Kind::Size {
            min: 4 << 10,
            max: 1 << 30,
        },
        what: "shared-memory ring bytes per direction",
    },
    Var {
        name: "OXCCL_SOCKET_BUFFER",
        kind: Kind::Size {
            min: 64 << 10,
            max: 1 << 30,
        },
        what: "TCP socket buffer request",
    },
    Var {
        name: "OXCCL_SOCKET_IFNAME",
        kind: Kind::Text,
        what: "network interface filter",
    },
    Var {
        name: "OXCCL_SPIN_US",
        kind: Kind::Micros {
            min: Duration::ZERO,
            max: Duration::from_secs(1),
        },
        what: "how long a waiting call spins before sleeping (once per wait: not again between sleeps until something moves)",
    },
    Var {
        name: "OXCCL_STAGE_WRITES",
        kind: Kind::Choice(&["auto", "cached", "streamed"]),
        what: "how copy-in schedules write their shared staging and shm links their rings: auto (streamed while peers' pieces cross between caches), cached, streamed",
    },
    Var {
        name: "OXCCL_STAGING",
        kind: Kind::Choice(&["auto", "always"]),
        what: "staging of messages through host slots: auto (device buffers), always (every call; tests the device path on host memory)",
    },
    Var {
        name: "OXCCL_TIMEOUT",
        kind: secs(1, MAX_DURATION),
        what: "deadline of every wait",
    },
    Var {
        name: "OXCCL_TORCH_FAST",
        kind: Kind::Text,
        what: "the torch backend's C++ fast path: `0` runs every call through Python, `verbose` shows its build (read by the Python package)",
    },
    Var {
        name: "OXCCL_TORCH_FLIGHT_RECORDER",
        kind: Kind::Text,
        what: "`1` keeps torch's own flight-recorder hook on oxccl process groups (by default oxccl records the calls itself; read by the Python package)",
    },
    Var {
        name: "OXCCL_TRACE",
        kind: Kind::Text,
        what: "folder each rank writes its timeline trace into (trace-COMM-rankR.json, for Perfetto; oxccl-trace merge joins them)",
    },
    Var {
        name: "OXCCL_TRACE_MAX_EVENTS",
        kind: Kind::Count {
            min: 0,
            max: 1 << 26,
        },
        what: "events a trace keeps per communicator, the oldest dropped first (default 1048576)",
    },
    Var {
        name: "OXCCL_TRANSPORT",
        kind: Kind::Choice(&["auto", "tcp", "shm", "rdma"]),
        what: "force a transport",
    },
    Var {
        name: "OXCCL_TUNER_PROFILE",
        kind: Kind::Profile,
        what: "cost model (oxccl-sim profile) from which the algorithm of each call is chosen by predicted time",
    },
    Var {
        name: "OXCCL_UNIQUE_ID",
        kind: Kind::UniqueId,
        what: "the rendezvous, as printed by a unique id",
    },
    Var {
        name: "OXCCL_WORLD_SIZE",
        kind: Kind::Count {
            min: 1,
            max: MAX_RANKS,
        },
        what: "number of ranks",
    },
    Var {
        name: "OXCCL_WRITE_CORPUS",
        kind: Kind::Text,
        what: "write the fuzz corpus (testing)",
    },
];

/// The table entry of `name` (a name not in the table is a bug here).
pub fn var(name: &str) -> &'static Var {
    VARS.iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("{name} is not in config::vars::VARS"))
}

/// The variable's value, trimmed; `None` when unset or blank. Once the
/// NCCL library asked for NCCL's names ([`nccl::honour_nccl_names`]), an
/// unset one takes the value of its NCCL alias, translated (one that does
/// not translate is left to [`check_env`] to report).
pub fn raw(name: &str) -> Option<String> {
    sourced(name).map(|(v, _)| v)
}

/// [`raw`], and where the value came from.
pub fn sourced(name: &str) -> Option<(String, Source)> {
    if let Some(v) = own(name) {
        return Some((v, Source::Oxccl));
    }
    if !nccl::honoured() {
        return None;
    }
    let a = nccl::alias_of(name)?;
    let r = own(a.nccl)?;
    let v = (a.translate)(&r).ok()?;
    Some((
        v,
        Source::Nccl {
            name: a.nccl,
            raw: r,
        },
    ))
}

/// `name` exactly as the environment has it, trimmed; `None` when unset
/// or blank.
fn own(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// An error about a value NCCL's variable gave: name that variable too.
fn from_nccl(e: Error, source: &Source) -> Error {
    match source {
        Source::Oxccl => e,
        Source::Nccl { name, raw } => Error::Config(format!("{name}={raw:?}: {e}")),
    }
}

/// Check one value against its variable's kind.
pub fn check(v: &Var, raw: &str) -> Result<()> {
    let name = v.name;
    match v.kind {
        Kind::Seconds { min, max } => value::duration(name, raw, 1.0, min, max).map(drop),
        Kind::Micros { min, max } => value::duration(name, raw, 1e-6, min, max).map(drop),
        Kind::Count { min, max } => value::count(name, raw, min, max).map(drop),
        Kind::Size { min, max } => value::size(name, raw, min, max).map(drop),
        Kind::Choice(c) => value::choice(name, raw, c).map(drop),
        Kind::Algorithm => {
            if raw == "auto" || algorithms::find(raw).is_some() {
                Ok(())
            } else {
                Err(Error::Config(format!(
                    "{name}={raw:?}: expected auto or one of {}",
                    algorithms::names()
                )))
            }
        }
        Kind::HostPort => host_port(name, raw).map(drop),
        Kind::UniqueId => raw
            .parse::<crate::id::UniqueId>()
            .map(drop)
            .map_err(|e| Error::Config(format!("{name}: {e}"))),
        Kind::Profile => profile(name, raw).map(drop),
        Kind::Text => Ok(()),
    }
}

/// Read and parse the cost-model profile at `raw` (the tuner's model).
pub fn profile(name: &str, raw: &str) -> Result<oxccl_sim::Model> {
    let text = std::fs::read_to_string(raw)
        .map_err(|e| Error::Config(format!("{name}={raw:?}: cannot read the profile: {e}")))?;
    let mut m = oxccl_sim::Model::default();
    m.load(&text)
        .map_err(|e| Error::Config(format!("{name}={raw:?}: {e}")))?;
    Ok(m)
}

/// Split `host:port` (IPv6 as `[addr]:port`) and check the port is 1..=65535.
pub fn host_port<'a>(name: &str, raw: &'a str) -> Result<(&'a str, u16)> {
    let bad = || {
        Error::Config(format!(
            "{name}={raw:?}: expected host:port with a port from 1 to 65535 (the root must listen on a port every rank knows)"
        ))
    };
    let (host, port) = raw.trim().rsplit_once(':').ok_or_else(bad)?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(bad)?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

/// Validate every `OXCCL_*` variable that is set: a known one with a bad
/// value is an error naming it and its range; an unknown one is a warning
/// (likely a typo).
pub fn check_env() -> Result<()> {
    for (key, val) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if !key.starts_with("OXCCL_") {
            continue;
        }
        let Some(v) = VARS.iter().find(|v| v.name == key) else {
            tracing::warn!("oxccl: unknown variable {key} ignored (known: see the README's table)");
            continue;
        };
        let Some(val) = val.to_str() else {
            return Err(Error::Config(format!("{key} is not valid UTF-8")));
        };
        if val.trim().is_empty() {
            continue;
        }
        check(v, val.trim())?;
    }
    if nccl::honoured() {
        for a in nccl::ALIASES {
            let Some(r) = own(a.nccl).filter(|_| own(a.oxccl).is_none()) else {
                continue;
            };
            let v = (a.translate)(&r)
                .map_err(|why| Error::Config(format!("{}={r:?}: {why}", a.nccl)))?;
            let source = Source::Nccl {
                name: a.nccl,
                raw: r,
            };
            check(var(a.oxccl), &v).map_err(|e| from_nccl(e, &source))?;
        }
    }
    Ok(())
}

fn typed<T>(name: &str, parse: impl FnOnce(&Var, &str) -> Result<T>) -> Result<Option<T>> {
    let v = var(name);
    sourced(name)
        .map(|(r, source)| parse(v, &r).map_err(|e| from_nccl(e, &source)))
        .transpose()
}

/// A `Seconds` or `Micros` variable, range-checked.
pub fn duration(name: &str) -> Result<Option<Duration>> {
    typed(name, |v, r| match v.kind {
        Kind::Seconds { min, max } => value::duration(name, r, 1.0, min, max),
        Kind::Micros { min, max } => value::duration(name, r, 1e-6, min, max),
        k => panic!("{name} is a {k:?}, not a duration"),
    })
}

/// A `Count` variable, range-checked.
pub fn count(name: &str) -> Result<Option<usize>> {
    typed(name, |v, r| match v.kind {
        Kind::Count { min, max } => value::count(name, r, min, max),
        k => panic!("{name} is a {k:?}, not a count"),
    })
}

/// A `Size` variable, range-checked.
pub fn size(name: &str) -> Result<Option<usize>> {
    typed(name, |v, r| match v.kind {
        Kind::Size { min, max } => value::size(name, r, min, max),
        k => panic!("{name} is a {k:?}, not a size"),
    })
}

/// A `Choice` variable: the canonical spelling of the chosen word.
pub fn choice(name: &str) -> Result<Option<&'static str>> {
    typed(name, |v, r| match v.kind {
        Kind::Choice(c) => value::choice(name, r, c),
        k => panic!("{name} is a {k:?}, not a choice"),
    })
}

/// Any other variable, checked against its kind, as text.
pub fn text(name: &str) -> Result<Option<String>> {
    typed(name, |v, r| check(v, r).map(|_| r.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        for w in VARS.windows(2) {
            assert!(w[0].name < w[1].name, "{} / {}", w[0].name, w[1].name);
        }
    }

    #[test]
    fn host_ports_need_a_port_others_can_know() {
        assert!(host_port("OXCCL_ROOT", "127.0.0.1:0").is_err());
        assert!(host_port("OXCCL_ROOT", "127.0.0.1").is_err());
        assert!(host_port("OXCCL_ROOT", ":80").is_err());
        assert!(host_port("OXCCL_ROOT", "h:70000").is_err());
        assert_eq!(host_port("X", "[::1]:29500").unwrap(), ("[::1]", 29500));
        let e = host_port("OXCCL_ROOT", "127.0.0.1:0").unwrap_err();
        assert!(e.to_string().contains("OXCCL_ROOT"));
    }
}
