//! `transport-rdma`: message links over InfiniBand / RoCE verbs.
//!
//! Per peer one reliable-connected queue pair ([`link`]): the sender writes
//! into slots of the receiver's registered ring with RDMA WRITE WITH
//! IMMEDIATE, under credit-based flow control ([`credit`]); large sends from
//! registered memory go zero-copy ([`regcache`]), the rest through
//! registered bounce slots. Buffers from `alloc_shared` are exported for
//! direct access ([`direct`]): peers read them with RDMA READ.
//!
//! Setup: every rank listens on a TCP port (published through the
//! communicator's bootstrap); the higher rank of each pair connects, both
//! prove the job secret (the shared handshake), create their QP and ring,
//! swap [`exchange::QpEndpoint`]s, bring the QP to RTS and confirm with one
//! byte each way, so no write can reach a QP that is not ready. The socket
//! stays open for the link's life: its hang-up says the peer process ended.
//!
//! Device, port and GID come from [`device::choose`] (`OXCCL_IB_*`).
//! [`probe`] says whether this host has a device at all; the facade falls
//! back to TCP when it does not.

pub mod credit;
pub mod device;
pub mod exchange;
pub mod regcache;

#[cfg(feature = "verbs")]
pub mod direct;
#[cfg(feature = "verbs")]
pub mod link;
#[cfg(feature = "verbs")]
mod transport;
#[cfg(feature = "verbs")]
pub mod verbs;

#[cfg(feature = "verbs")]
pub use transport::{probe, LoopbackPair, RdmaTransport};
