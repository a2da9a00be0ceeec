//! `comm-core` owns everything of oxccl that is not a concrete transport or
//! a kernel: the types ([`DataType`], [`ReduceOp`], [`Element`]), the
//! [`Error`] type, configuration, the bootstrap (rendezvous through a root
//! and the control plane that relays failures), the [`Transport`] traits,
//! algorithms as pure [`schedule`]s, the [`executor`] that runs them over
//! links, and the [`Communicator`] that users call.
//!
//! It knows no concrete transport: the `oxccl` facade passes them in.

pub use algorithms;
pub use algorithms::schedule;

pub mod api;
pub mod bootstrap;
pub mod call;
pub mod comm;
pub mod config;
pub mod door;
pub mod env;
pub mod error;
pub mod executor;
pub mod fuzz;
pub mod handshake;
pub mod id;
pub mod net;
pub mod registered;
pub mod shmem;
pub mod transport;
pub mod types;
pub mod wire;
pub mod work;

pub use api::P2p;
pub use comm::Communicator;
pub use config::Config;
pub use error::{Error, Result};
pub use id::UniqueId;
pub use kernels::{bf16, f16};
pub use registered::{MemoryRegistration, SharedBuffer};
pub use transport::{
    Endpoint, Link, PeerInfo, Registration, Registry, SetupCtx, Transport, Transports,
};
pub use types::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};
pub use work::Work;
