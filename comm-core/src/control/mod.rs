//! The control plane: how ranks find each other (the unique id, the root
//! and its rendezvous), prove they belong to the job (the handshake), read
//! their launcher's environment, and keep one connection each to the root
//! that relays failures for the life of the communicator — and the failure
//! plane on top of it: what a failure is called on the wire ([`notice`]),
//! what the root decides about failures ([`root`], no I/O), and what a rank
//! reports when one reaches it ([`failure`]).

pub mod bootstrap;
pub mod env;
pub mod failure;
pub mod handshake;
pub mod id;
pub mod message;
pub mod notice;
pub mod root;
