//! `trainer`: the reference trainer that shows oxccl serving a real
//! training loop — a small decoder-only transformer (candle, CPU) on a
//! character-level task, trained in one process or with DDP over oxccl,
//! with results equal to single-process training.

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
