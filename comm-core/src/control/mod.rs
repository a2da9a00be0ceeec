//! The control plane: how ranks find each other (the unique id, the root
//! and its rendezvous), prove they belong to the job (the handshake), read
//! their launcher's environment, and keep one connection each to the root
//! that relays failures for the life of the communicator.

pub mod bootstrap;
pub mod env;
pub mod handshake;
pub mod id;
