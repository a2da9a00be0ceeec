//! `comm-core` owns everything of oxccl that is not a concrete transport or
//! a kernel.
pub mod call;
pub mod config;
pub mod error;
pub mod handshake;
pub mod net;
pub mod schedule;
pub mod transport;
pub mod types;
pub mod wire;

pub use kernels::{bf16, f16};
pub use types::{DataType, Element, ReduceOp};
