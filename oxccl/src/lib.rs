//! # oxccl
//!
//! Collective communication for Rust: all_reduce, all_gather,
//! reduce_scatter, broadcast, reduce, all_to_all, send/recv and barrier
//! across processes and hosts, on host memory (and, with transports added
//! by features, devices). An alternative to NCCL, Gloo and MPI collectives
//! that never hangs silently: a dead or misbehaving peer is an error on
//! every survivor.
//!
//! This crate is the facade: it re-exports the API of `comm-core`, picks a
//! transport per peer, and reads the launcher environment.
//!
//! ```no_run
//! use oxccl::prelude::*;
//!
//! // Under `oxrun -n 4`, torchrun, mpirun or srun:
//! let comm = Communicator::from_env()?;
//! let mut grads = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
//! # Ok::<(), oxccl::Error>(())
//! ```

#![warn(missing_debug_implementations)]

pub use comm_core::call::{Fingerprint, Kind};
pub use comm_core::env::{launch_env, LaunchEnv, RootSpec};
pub use comm_core::{algorithms, compute, flight, schedule, sim, trace, transport};
pub use comm_core::{
    as_bytes, as_bytes_mut, bf16, f16, Buffer, BufferMut, Compute, Config, CrossMemory, DataType,
    DeviceKind, DeviceSharedBuffer, Element, Error, Group, HostCompute, MemoryRegistration,
    MemorySpace, PeerInfo, ReduceOp, Region, Result, SharedBuffer, UniqueId, Work,
};

/// The engine's communicator type, without this crate's constructors
/// (what [`Communicator`] dereferences to).
pub use comm_core::Communicator as CoreCommunicator;

mod communicator;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod launch;
pub mod selftest;

pub use communicator::Communicator;

/// The connection handshake, for tools and tests that speak to oxccl ports.
pub use comm_core::handshake as transport_handshake;

use comm_core::transport::Transports;
use std::sync::{Arc, Once};
use transport_shm::ShmTransport;
use transport_tcp::TcpTransport;

/// What most programs need: `use oxccl::prelude::*;`.
pub mod prelude {
    pub use crate::{init_logging, Communicator};
    pub use comm_core::{
        Buffer, BufferMut, Config, DataType, Element, Error, ReduceOp, Result, UniqueId, Work,
    };
}

/// Index of TCP in the set [`transports`] builds.
const TCP: usize = 0;
/// Index of shared memory in that set.
const SHM: usize = 1;
/// Index of RDMA in that set, when this host has a device.
const RDMA: usize = 2;

/// The transport set for a configuration and the per-peer rule: a peer on
/// the same host (same host identity: host name, boot id and network
/// namespace) gets shared memory; a peer on another host gets RDMA when
/// this build has the `rdma` feature and the host an RDMA device, TCP
/// otherwise. `OXCCL_TRANSPORT=tcp|shm|rdma` forces one for every peer
/// (`shm` is an error for a peer on another host; `rdma` without a device
/// is an error saying so).
pub fn transports(config: &Config) -> Result<Transports> {
    let forced = match config.transport.as_deref() {
        None => None,
        Some("tcp") => Some(TCP),
        Some("shm") => Some(SHM),
        Some("rdma") => Some(RDMA),
        Some(other) => {
            return Err(Error::Config(format!(
                "OXCCL_TRANSPORT={other:?}: the transports are tcp, shm and rdma (or auto)"
            )))
        }
    };
    let mut list: Vec<Arc<dyn comm_core::transport::Transport>> =
        vec![Arc::new(TcpTransport), Arc::new(ShmTransport)];
    // Forced tcp or shm never uses RDMA: do not even open a device.
    let rdma = match forced {
        None | Some(RDMA) => rdma_transport(forced == Some(RDMA))?,
        Some(_) => None,
    };
    let has_rdma = match rdma {
        Some(t) => {
            list.push(t);
            true
        }
        None => false,
    };
    if !has_rdma {
        // Validated (the variable table checks every OXCCL_* value), but
        // without effect here: say so rather than ignore it silently.
        for v in comm_core::config::vars::VARS {
            if v.name.starts_with("OXCCL_IB_") && comm_core::config::vars::raw(v.name).is_some() {
                tracing::warn!(
                    "oxccl: {} is set but this process uses no RDMA transport ({}), so it has no effect",
                    v.name,
                    if cfg!(feature = "rdma") {
                        "no device found, or another transport forced"
                    } else {
                        "built without the rdma feature"
                    }
                );
            }
        }
    }
    Ok(Transports {
        list,
        choose: Arc::new(move |_cfg, me, peer| match forced {
            Some(SHM) if peer.host_id != me.host_id => Err(Error::Config(format!(
                "OXCCL_TRANSPORT=shm, but rank {} runs on host {} and rank {} on host {}",
                me.rank, me.hostname, peer.rank, peer.hostname
            ))),
            Some(t) => Ok(t),
            None if peer.host_id == me.host_id => Ok(SHM),
            None if has_rdma => Ok(RDMA),
            None => Ok(TCP),
        }),
    })
}

/// The RDMA device this host would use (`OXCCL_IB_HCA` applied), if any;
/// always `None` in a build without the `rdma` feature.
pub fn rdma_device() -> Result<Option<String>> {
    #[cfg(feature = "rdma")]
    return Ok(transport_rdma::probe()?.map(|t| t.device().to_string()));
    #[cfg(not(feature = "rdma"))]
    Ok(None)
}

/// The RDMA transport when this host has a device. Without one, automatic
/// selection falls back to TCP (one info line per process); a forced
/// `rdma` is an error that says what is missing.
#[cfg(feature = "rdma")]
fn rdma_transport(forced: bool) -> Result<Option<Arc<dyn comm_core::transport::Transport>>> {
    match transport_rdma::probe()? {
        Some(t) => {
            tracing::info!("RDMA device {} for peers on other hosts", t.device());
            Ok(Some(Arc::new(t)))
        }
        None if forced => Err(Error::Config(
            "OXCCL_TRANSPORT=rdma, but no RDMA device was found on this host (none listed by \
             ibv_get_device_list, or none with an active port passes OXCCL_IB_HCA); \
             OXCCL_IB_HCA selects a device, e.g. OXCCL_IB_HCA=mlx5_0:1"
                .into(),
        )),
        None => {
            static ONCE: Once = Once::new();
            ONCE.call_once(|| tracing::info!("no RDMA device found; peers on other hosts use TCP"));
            Ok(None)
        }
    }
}

#[cfg(not(feature = "rdma"))]
fn rdma_transport(forced: bool) -> Result<Option<Arc<dyn comm_core::transport::Transport>>> {
    if forced {
        return Err(Error::Config(
            "OXCCL_TRANSPORT=rdma, but this build has no RDMA support (build oxccl with \
             `--features rdma`, which needs libibverbs)"
                .into(),
        ));
    }
    Ok(None)
}

/// The flight recorder (see [`flight`]) of every live communicator of
/// this process written into `OXCCL_FLIGHT_DIR` (else the working folder)
/// whenever the process gets `SIGUSR1` — `kill -USR1 PID` on a job that
/// seems stuck. This installs signal handling, so only a program calls it
/// (oxccl's binaries do), first thing in `main`, before it starts threads:
/// `SIGUSR1` is blocked in the calling thread (and the threads it starts
/// later) and taken by a thread of its own, which writes the files (a
/// signal handler could not).
pub fn dump_flight_on_sigusr1() -> Result<()> {
    // SAFETY: a signal set built and used locally; pthread_sigmask only
    // changes this thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(Error::System("blocking SIGUSR1".into()));
        }
        set
    };
    std::thread::Builder::new()
        .name("oxccl-sigusr1".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: waits for a signal of `set`, blocked in every thread.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            let dir = std::env::var_os("OXCCL_FLIGHT_DIR").unwrap_or_else(|| ".".into());
            match flight::dump_all(std::path::Path::new(&dir), "SIGUSR1") {
                Ok(files) => {
                    for f in files {
                        eprintln!("oxccl: flight recorder written to {}", f.display());
                    }
                }
                Err(e) => eprintln!("oxccl: SIGUSR1: writing the flight recorder: {e}"),
            }
        })
        .map_err(|e| Error::System(format!("cannot start the SIGUSR1 thread: {e}")))?;
    Ok(())
}

/// Print oxccl's logs to stderr: a global `tracing` subscriber filtered by
/// `RUST_LOG` when it is set, else by `OXCCL_DEBUG` (`warn` by default;
/// `info`, `debug`, `trace`) for oxccl's crates. For programs: oxccl's
/// binaries call it first thing; the library never does (it only emits
/// `tracing` events), so an application keeps its own subscriber. Does
/// nothing when a global subscriber is already set, or the second time.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = match std::env::var("RUST_LOG") {
            Ok(spec) => tracing_subscriber::EnvFilter::try_new(spec),
            Err(_) => {
                let level = match comm_core::config::vars::choice("OXCCL_DEBUG") {
                    Ok(l) => l.unwrap_or("warn"),
                    Err(e) => {
                        // No logger yet to report it through.
                        eprintln!("oxccl: {e}; logging at warn");
                        "warn"
                    }
                };
                tracing_subscriber::EnvFilter::try_new(format!(
                    "warn,comm_core={level},transport_tcp={level},transport_shm={level},transport_rdma={level},oxccl={level}"
                ))
            }
        }
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// Parse a byte size with an optional K/M/G suffix (`64M`), as every
/// oxccl tool accepts it.
pub use comm_core::config::parse_bytes;

/// Range-checked parsing of settings (sizes, durations, counts, choices)
/// with errors naming the setting, and the table of every `OXCCL_*`
/// variable: what oxccl's tools use for their flags.
pub use comm_core::config::{value as settings, vars};

/// NCCL's environment variables read as oxccl's (for the NCCL C library).
pub use comm_core::config::nccl as nccl_env;

pub use comm_core::with_dtype;

/// The instruction set the reduction kernels run with on this machine.
pub fn kernel_isa() -> kernels::Isa {
    kernels::Isa::detect()
}
