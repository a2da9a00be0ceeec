//! `oxccl-trace`: seeing inside a job. Reads the flight recorder dumps
//! every rank of a failed job writes into `OXCCL_FLIGHT_DIR` ([`flight`])
//! and says what happened ([`why`]); joins the ranks' timeline traces
//! (`OXCCL_TRACE`) into one on rank 0's clock and checks them ([`merge`]).

pub mod flight;
pub mod merge;
pub mod why;
