//! Where a rank learns who it is when started by a launcher: `OXCCL_*`
//! first, then torchrun, Open MPI, PMI, Slurm.
//!
//! | source | rank | world size | local rank |
//! |---|---|---|---|
//! | oxccl / oxrun | `OXCCL_RANK` | `OXCCL_WORLD_SIZE` | `OXCCL_LOCAL_RANK` |
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | PMI (MPICH, Intel MPI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` |
//! | Slurm | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//!
//! The rendezvous comes from `OXCCL_UNIQUE_ID` (a printed [`UniqueId`]), or
//! from `OXCCL_ROOT=host:port`, or from torchrun's `MASTER_ADDR` and
//! `MASTER_PORT` (plus one under torchrun, whose own store holds that
//! port). With an address only, rank 0 hosts the root, and the secret is
//! `OXCCL_SECRET` if set, otherwise derived from the job (this guards
//! against accidents between jobs, not against an attacker: set
//! `OXCCL_SECRET` or pass a unique id for that).

use crate::config::vars::{host_port, MAX_RANKS};
use crate::error::{Error, Result};
use crate::handshake::Secret;
use crate::id::UniqueId;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// What the environment says about this process's place in the job.
#[derive(Clone, Debug)]
pub struct LaunchEnv {
    pub rank: usize,
    pub nranks: usize,
    pub local_rank: Option<usize>,
    /// Which launcher's variables were used (`oxccl`, `torchrun`, ...).
    pub source: &'static str,
    /// How to reach the root.
    pub root: RootSpec,
}

/// The rendezvous, as the environment gives it.
#[derive(Clone, Debug)]
pub enum RootSpec {
    /// A full id: the root already runs (launcher) or another rank starts it.
    Id(UniqueId),
    /// An address: rank 0 starts the root there.
    Addr { addr: SocketAddr, secret: Secret },
}

impl RootSpec {
    /// The id to join; for `Addr` on rank 0 this starts the root.
    pub fn into_id(self, rank: usize, init_timeout: Duration) -> Result<UniqueId> {
        match self {
            RootSpec::Id(id) => Ok(id),
            RootSpec::Addr { addr, secret } if rank == 0 => {
                UniqueId::serve(addr, secret, init_timeout).or_else(|_| {
                    // The name may resolve to an address this host cannot
                    // bind (NAT, alias): listen on every interface instead.
                    let any = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
                    UniqueId::serve(any, secret, init_timeout).map(|served| served.reached_at(addr))
                })
            }
            RootSpec::Addr { addr, secret } => Ok(UniqueId::from_parts(addr, secret)),
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn num(name: &str) -> Result<Option<usize>> {
    match var(name) {
        None => Ok(None),
        Some(v) => v
            .parse::<usize>()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}={v:?}: expected a whole number"))),
    }
}

fn resolve(hostport: &str, what: &str) -> Result<SocketAddr> {
    hostport
        .to_socket_addrs()
        .map_err(|e| Error::Config(format!("{what}={hostport:?} does not resolve: {e}")))?
        .next()
        .ok_or_else(|| Error::Config(format!("{what}={hostport:?} resolves to no address")))
}

/// Read the launcher variables.
pub fn launch_env() -> Result<LaunchEnv> {
    const SOURCES: [(&str, &str, &str, &str); 5] = [
        (
            "oxccl",
            "OXCCL_RANK",
            "OXCCL_WORLD_SIZE",
            "OXCCL_LOCAL_RANK",
        ),
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        (
            "openmpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
        ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ];
    let mut found = None;
    for (source, r, s, l) in SOURCES {
        if let (Some(rank), Some(size)) = (num(r)?, num(s)?) {
            found = Some((source, rank, size, num(l)?, (r, s)));
            break;
        }
    }
    let Some((source, rank, nranks, local_rank, (r_var, s_var))) = found else {
        return Err(Error::Config(
            "no rank/world size in the environment: run under oxrun, torchrun, mpirun or srun, \
             or set OXCCL_RANK and OXCCL_WORLD_SIZE"
                .into(),
        ));
    };
    if nranks == 0 || nranks > MAX_RANKS {
        return Err(Error::Config(format!(
            "{s_var}={nranks}: expected a number of ranks from 1 to {MAX_RANKS}"
        )));
    }
    if rank >= nranks {
        return Err(Error::Config(format!(
            "{r_var}={rank} is not a rank of {s_var}={nranks} (ranks are 0 to {})",
            nranks - 1
        )));
    }
    let root = if let Some(id) = var("OXCCL_UNIQUE_ID") {
        RootSpec::Id(
            id.parse()
                .map_err(|e| Error::Config(format!("OXCCL_UNIQUE_ID: {e}")))?,
        )
    } else {
        let (addr, what) = if let Some(r) = var("OXCCL_ROOT") {
            host_port("OXCCL_ROOT", &r)?;
            (resolve(&r, "OXCCL_ROOT")?, "OXCCL_ROOT")
        } else if let (Some(a), Some(p)) = (var("MASTER_ADDR"), num("MASTER_PORT")?) {
            if !(1..=65534).contains(&p) {
                return Err(Error::Config(format!(
                    "MASTER_PORT={p}: expected a port from 1 to 65534"
                )));
            }
            // torchrun's agent store listens on MASTER_PORT itself.
            let port = if var("TORCHELASTIC_RUN_ID").is_some() {
                p + 1
            } else {
                p
            };
            (
                resolve(&format!("{a}:{port}"), "MASTER_ADDR/MASTER_PORT")?,
                "MASTER_ADDR",
            )
        } else {
            return Err(Error::Config(format!(
                "{source} gave rank {rank} of {nranks} but no rendezvous: set OXCCL_UNIQUE_ID, or OXCCL_ROOT=host:port \
                 (an address of rank 0's host and a free port), or MASTER_ADDR and MASTER_PORT"
            )));
        };
        let secret = match var("OXCCL_SECRET") {
            Some(s) => Secret::derive(&s),
            None => {
                let job = [
                    "SLURM_JOB_ID",
                    "TORCHELASTIC_RUN_ID",
                    "OMPI_MCA_ess_base_jobid",
                    "PMI_JOBID",
                ]
                .iter()
                .find_map(|v| var(v))
                .unwrap_or_default();
                Secret::derive(&format!("{what}|{addr}|{nranks}|{job}"))
            }
        };
        RootSpec::Addr { addr, secret }
    };
    Ok(LaunchEnv {
        rank,
        nranks,
        local_rank,
        source,
        root,
    })
}
