//! NCCL's C API (`nccl.h`, 2.32) on oxccl: a program written against NCCL
//! runs on oxccl by linking this library (`libnccl.so.2` by soname) in
//! place of NVIDIA's. Programs include NVIDIA's own `nccl.h`; every type,
//! enum value and struct layout here is that header's.
//!
//! - [`result`]: `ncclResult_t`, the last error's text, oxccl errors as
//!   NCCL codes;
//! - [`types`]: data types and reduction operators;
//! - [`id`]: `ncclUniqueId` (128 bytes) and oxccl's unique id;
//! - [`config`]: `ncclConfig_t` and `ncclCollConfig_t`;
//! - [`comm`]: what a communicator handle is; queries, finalize,
//!   destroy, abort, async errors;
//! - [`init`]: communicators from unique ids (blocking, non-blocking, in
//!   groups); [`resize`]: from communicators (split, shrink, grow) and
//!   revoke, suspend, resume;
//! - [`coll`]: the collectives and their `*Config` forms; [`redop`]:
//!   `ncclRedOpCreatePreMulSum`;
//! - [`group`]: `ncclGroupStart`/`End` (any mix of calls, on any
//!   communicators) and `ncclSend`/`ncclRecv`;
//! - [`mem`]: `ncclMemAlloc`/`ncclMemFree` (host memory here);
//!   [`register`]: buffer registration (and windows, refused);
//! - [`device`]: the device-side API (teams answered, resources refused);
//! - [`param`]: the parameter API and `ncclSetEncryption`; [`debug`]:
//!   `NCCL_DEBUG`-style messages.
//!
//! Memory ([`memory`]): host pointers with a null stream — the call
//! completes before it returns (an extension: NVIDIA's NCCL takes device
//! memory only); with the `cuda` feature also device pointers, ordered on
//! their stream as NCCL's. Every entry point also exists as `pnccl*`,
//! NCCL's profiling alias.
//!
//! Every function of NVIDIA's `libnccl.so.2` 2.32 is here; what cannot be
//! honoured on host memory (windows, the device-side API, TLS, a
//! simulated group end) answers `ncclInvalidUsage` with the reason in
//! `ncclGetLastError`, never a silent no-op.

// The exported names are NCCL's.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
// Every entry point is `unsafe extern "C"`: its contract is the one
// nccl.h documents for the function of the same name (valid pointers of
// the stated sizes, a communicator from ncclCommInitRank not yet
// destroyed); each checks what can be checked (null pointers, counts,
// enum values) and returns an error for the rest of what it can see.
#![allow(clippy::missing_safety_doc)]

pub mod coll;
pub mod comm;
pub mod config;
pub mod debug;
pub mod device;
pub mod group;
pub mod id;
pub mod init;
pub mod mem;
pub mod memory;
pub mod param;
pub mod redop;
pub mod register;
pub mod resize;
pub mod result;
pub mod types;

pub use result::ncclResult_t;

/// Put `x` in the first free entry of a handle table (a new one at the
/// end when none is free) and return its index: the operators and the
/// registrations of a communicator.
pub(crate) fn store<T>(table: &mut Vec<Option<T>>, x: T) -> usize {
    match table.iter().position(Option::is_none) {
        Some(i) => {
            table[i] = Some(x);
            i
        }
        None => {
            table.push(Some(x));
            table.len() - 1
        }
    }
}

/// Define `nccl<Name>` and its profiling alias `pnccl<Name>` with one body.
macro_rules! export {
    ($(#[$m:meta])* fn $name:ident / $alias:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::result::ncclResult_t $body

        #[doc = concat!("`", stringify!($name), "` (NCCL's profiling alias).")]
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::result::ncclResult_t {
            $name($($arg),*)
        }
    };
}
pub(crate) use export;
