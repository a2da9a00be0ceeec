//! `comm-core` owns everything of oxccl that is not a concrete transport or
//! a kernel: the types ([`DataType`], [`ReduceOp`], [`Element`]), the
//! [`Error`] type, configuration, the bootstrap (rendezvous through a root
//! and the control plane that relays failures), the [`Transport`] traits,
//! algorithms as pure [`schedule`]s, the [`executor`] that runs them over
//! links, and the [`Communicator`] that users call.
//!
//! It knows no concrete transport: the `oxccl` facade passes them in.

#![warn(missing_debug_implementations)]

pub use algorithms;
/// Schedules live in the `algorithms` crate (no runtime); re-exported.
pub use algorithms::schedule;
/// The simulator the tuner predicts with; its `Model` is
/// `Config::tuner`'s type.
pub use oxccl_sim as sim;

pub mod api;
pub mod call;
pub mod comm;
pub mod compute;
pub mod config;
pub mod control;
mod cross_memory;
pub mod error;
pub mod exec;
pub mod flight;
pub mod fuzz;
pub mod group;
mod lane;
pub mod mem;
pub mod sys;
pub mod trace;
pub mod transport;
mod tune;
mod turns;
pub mod types;
mod wait;
pub mod wire;
pub mod work;

// Short paths for what transports and tools use most.
pub use control::{bootstrap, env, handshake, id};
pub use exec as executor;
pub use transport::{door, net};

pub use comm::Communicator;
pub use compute::{Compute, HostCompute};
pub use config::{Config, CrossMemory};
pub use error::{Error, Result};
pub use group::Group;
pub use id::UniqueId;
pub use kernels::{bf16, f16};
pub use mem::{
    Buffer, BufferMut, DeviceKind, DeviceSharedBuffer, MemoryRegistration, MemorySpace, Region,
    SharedBuffer,
};
pub use transport::{
    DirectAccess, Endpoint, Link, OneSided, PeerInfo, PeerMemory, Registration, Registry,
    RemoteMemory, SetupCtx, Transport, Transports,
};
pub use types::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};
pub use work::Work;
