//! `trainer`: the reference trainer that shows oxccl serving a real
//! training loop — a small decoder-only transformer (candle, CPU) on a
//! character-level task, trained in one process or over oxccl with DDP
//! (optionally PowerSGD-compressed), ZeRO-3, tensor, pipeline and 3D
//! parallelism, with results equal to single-process training; restarts
//! from checkpoints and continues on survivors when a rank dies.

pub mod checkpoint;
pub mod data;
pub mod estimate;
pub mod model;
pub mod optim;
pub mod plot;
pub mod powersgd;
pub mod pp;
pub mod schedule;
pub mod tp;
pub mod train;
pub mod zero;
