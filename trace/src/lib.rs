//! `oxccl-trace`: seeing inside a job after the fact. Reads the flight
//! recorder dumps every rank of a failed job writes into `OXCCL_FLIGHT_DIR`
//! ([`flight`]) and says what happened ([`why`]).

pub mod flight;
pub mod why;
