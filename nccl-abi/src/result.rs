//! `ncclResult_t`, the text of the last error, and oxccl's errors as
//! NCCL's codes.
//!
//! Every entry point runs its body through [`run`]: an error becomes its
//! code and its message the thread's last error (`ncclGetLastError`); a
//! panic is caught at the boundary (unwinding into C is undefined) and
//! reported as `ncclInternalError`.

use oxccl::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};

/// NCCL's result codes (`nccl.h`).
pub type ncclResult_t = i32;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;
pub const ncclTimeout: ncclResult_t = 8;

/// A failed call: its code and what to tell the user.
#[derive(Clone, Debug)]
pub struct Failure {
    pub code: ncclResult_t,
    pub message: String,
}

impl Failure {
    pub fn new(code: ncclResult_t, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(ncclInvalidArgument, message)
    }
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(ncclInvalidUsage, message)
    }
}

/// The NCCL code of an oxccl error: a peer that died or failed is
/// `ncclRemoteError`, a mismatched call or an aborted communicator
/// `ncclInvalidUsage`, a deadline `ncclTimeout`, bad arguments and
/// settings `ncclInvalidArgument`, the device `ncclUnhandledCudaError`,
/// the system and the network `ncclSystemError`.
pub fn code_of(e: &Error) -> ncclResult_t {
    match e {
        Error::InvalidArgument(_) | Error::Config(_) => ncclInvalidArgument,
        Error::PeerLost { .. } | Error::Remote { .. } | Error::Absent { .. } => ncclRemoteError,
        Error::Timeout { .. } | Error::WaitCycle { .. } => ncclTimeout,
        Error::Mismatch { .. } | Error::Aborted { .. } | Error::Unsupported(_) => ncclInvalidUsage,
        Error::Device { .. } => ncclUnhandledCudaError,
        _ => ncclSystemError,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::new(code_of(&e), e.to_string())
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Remember `message` as this thread's last error (for
/// `ncclGetLastError`), also when the call itself succeeds (an async error
/// found).
pub(crate) fn remember(message: &str) {
    set_last(message);
}

fn set_last(message: &str) {
    // (An interior NUL would cut the text short; it cannot fail otherwise.)
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = text);
}

/// Run an entry point's body: its error as an NCCL code (and the thread's
/// last error), a panic as `ncclInternalError`.
pub fn run(what: &str, body: impl FnOnce() -> Result<(), Failure>) -> ncclResult_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => ncclSuccess,
        Ok(Err(f)) => {
            let text = format!("{what}: {}", f.message);
            // ncclInProgress is no failure: a non-blocking call underway.
            if f.code != ncclInProgress {
                crate::debug::warn(&text);
            }
            set_last(&text);
            f.code
        }
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last(&format!("{what}: internal error: {why}"));
            ncclInternalError
        }
    }
}

/// `ncclGetErrorString`: a static description of `result`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

/// `ncclGetErrorString` (NCCL's profiling alias).
#[no_mangle]
pub extern "C" fn pncclGetErrorString(result: ncclResult_t) -> *const c_char {
    ncclGetErrorString(result)
}

fn error_string(result: ncclResult_t) -> &'static CStr {
    match result {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ncclSystemError => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ncclInternalError => c"internal error - please report this issue to the oxccl developers",
        ncclInvalidArgument => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        ncclInvalidUsage => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        ncclRemoteError => c"remote process exited or there was a network error",
        ncclInProgress => c"NCCL operation in progress",
        ncclTimeout => c"NCCL operation timed out",
        _ => c"unknown result code",
    }
}

/// `ncclGetLastError`: the message of the last error on this thread (the
/// communicator is not used, as in NCCL). Valid until the next failing
/// call on this thread.
#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: *mut crate::comm::ncclComm) -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// `ncclGetLastError` (NCCL's profiling alias).
#[no_mangle]
pub extern "C" fn pncclGetLastError(comm: *mut crate::comm::ncclComm) -> *const c_char {
    ncclGetLastError(comm)
}
