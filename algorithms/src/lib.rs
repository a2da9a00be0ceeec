//! oxccl's algorithms, with no runtime: each collective algorithm is a pure
//! function from a [`CollSpec`] (kind, rank, rank count, count, chunking,
//! whether peers' memory is directly accessible) to the ordered steps one
//! rank performs, its [`Schedule`]. The runtime (`comm-core`) executes
//! schedules over links and compute engines; the symbolic checker
//! ([`check`]) runs every rank's schedule together without I/O, with input
//! and output aliased for in-place calls, and proves each result complete,
//! exactly-once, identical on every rank and free of ordering hazards. A
//! simulator can reuse both without the runtime.
//!
//! Adding an algorithm: one file implementing [`Algorithm`], one line in
//! [`algorithm::REGISTRY`].

pub mod algorithm;
pub mod bruck;
pub mod chain;
pub mod check;
pub mod copyin;
pub mod dbtree;
pub mod direct;
pub mod dissemination;
pub mod doubling;
pub mod halving;
pub mod hier;
pub mod oneshot;
pub mod p2p;
pub mod pairwise;
pub mod ring;
pub mod scatter;
pub mod schedule;
pub mod single_copy;
pub mod spec;
pub mod staged;
pub mod tree;

pub use algorithm::{choose, find, names, Algorithm, REGISTRY};
pub use p2p::{p2p, P2pStep};
pub use schedule::{
    chunks, seg_len, seg_off, Action, BufId, Schedule, Span, Step, INPUT, OUTPUT, SCRATCH, SHARED,
    STAGE,
};
pub use spec::{Access, CollSpec, Kind, Layout, Tuning};
pub use staged::staged;
