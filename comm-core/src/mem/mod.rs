//! Memory: where bytes live ([`MemorySpace`]), a described range of them
//! ([`Region`]), the buffer traits every call takes ([`Buffer`],
//! [`BufferMut`]), and memory registered with a communicator
//! ([`SharedBuffer`], [`MemoryRegistration`]).
//!
//! Below the API nothing holds a Rust slice: schedules name buffers by id,
//! the executor resolves them to regions, compute engines and links act on
//! regions of the spaces they reach. That is what lets device memory (a
//! CUDA engine, CUDA IPC links) slot in without touching algorithms.

mod buffer;
mod memfd;
mod region;
pub mod shared;

pub use buffer::{Buffer, BufferMut};
pub use memfd::MemfdMemory;
pub use region::{DeviceKind, MemorySpace, Region};
pub use shared::{DeviceSharedBuffer, MemoryRegistration, SharedBuffer};
