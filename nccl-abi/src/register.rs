//! Buffer registration: `ncclCommRegister` / `ncclCommDeregister`, and
//! the symmetric windows of recent releases (`ncclCommWindowRegister`,
//! `ncclWinGetUserPtr`, `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`).
//!
//! NCCL registers a buffer so that later calls on it skip a copy through
//! its staging buffers. oxccl's calls on host memory take the same path
//! whether a buffer is registered or not, so registering records the
//! buffer (deregistering checks the handle is one of this communicator's)
//! and changes no result. Windows are different: they promise that every
//! rank's buffer can be written by the others (one-sided puts and
//! signals), which oxccl's host transports do not offer, so they are
//! refused with `ncclInvalidUsage`.

use crate::comm::{handle, made, ncclComm_t, put};
use crate::export;
use crate::result::{run, Failure};
use std::ffi::{c_int, c_uint, c_void};

/// A communicator's registered buffers: handle `i + 1` is entry `i`.
#[derive(Default)]
pub(crate) struct Registry(Vec<Option<(usize, usize)>>);

export! {
    /// `ncclCommRegister`: record `size` bytes at `buff` as registered on
    /// `comm`; the handle goes to `*handle`.
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle_: *mut *mut c_void) {
        run("ncclCommRegister", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            made(h)?;
            if buff.is_null() && size > 0 {
                return Err(Failure::invalid("buff is NULL"));
            }
            if handle_.is_null() {
                return Err(Failure::invalid("handle is NULL"));
            }
            let mut r = h.registered.lock().unwrap_or_else(|p| p.into_inner());
            let i = crate::store(&mut r.0, (buff as usize, size));
            // SAFETY: non-null; the caller gives room for a handle.
            unsafe { put("handle", handle_, (i + 1) as *mut c_void) }
        })
    }
}

export! {
    /// `ncclCommDeregister`: forget a registration `ncclCommRegister` made
    /// on `comm`.
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle_: *mut c_void) {
        run("ncclCommDeregister", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            let mut r = h.registered.lock().unwrap_or_else(|p| p.into_inner());
            match (handle_ as usize).checked_sub(1).and_then(|i| r.0.get_mut(i)) {
                Some(e @ Some(_)) => {
                    *e = None;
                    Ok(())
                }
                _ => Err(Failure::invalid(format!(
                    "handle {handle_:?} is not a registration of this communicator (or was deregistered)"
                ))),
            }
        })
    }
}

/// Why windows are refused.
const NO_WINDOWS: &str = "symmetric memory windows (one-sided puts and signals into \
    other ranks' buffers) are not offered by oxccl's host transports; use \
    collectives or ncclSend/ncclRecv";

export! {
    /// `ncclCommWindowRegister`: refused ([`NO_WINDOWS`]).
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut *mut c_void, winFlags: c_int) {
        let _ = (comm, buff, size, win, winFlags);
        run("ncclCommWindowRegister", || Err(Failure::usage(NO_WINDOWS)))
    }
}

export! {
    /// `ncclCommWindowDeregister`: no window can exist.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: *mut c_void) {
        let _ = (comm, win);
        run("ncclCommWindowDeregister", || Err(Failure::usage(NO_WINDOWS)))
    }
}

export! {
    /// `ncclWinGetUserPtr`: no window can exist.
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: *mut c_void, outUserPtr: *mut *mut c_void) {
        let _ = (comm, win, outUserPtr);
        run("ncclWinGetUserPtr", || Err(Failure::usage(NO_WINDOWS)))
    }
}

export! {
    /// `ncclPutSignal`: needs a window.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        peerWin: *mut c_void,
        peerWinOffset: usize,
        sigIdx: c_int,
        ctx: c_int,
        flags: c_uint,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) {
        let _ = (localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags, comm, stream);
        run("ncclPutSignal", || Err(Failure::usage(NO_WINDOWS)))
    }
}

export! {
    /// `ncclSignal`: needs a window.
    fn ncclSignal / pncclSignal(peer: c_int, sigIdx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: *mut c_void) {
        let _ = (peer, sigIdx, ctx, flags, comm, stream);
        run("ncclSignal", || Err(Failure::usage(NO_WINDOWS)))
    }
}

export! {
    /// `ncclWaitSignal`: needs a window.
    fn ncclWaitSignal / pncclWaitSignal(nDesc: c_int, signalDescs: *mut c_void, comm: ncclComm_t, stream: *mut c_void) {
        let _ = (nDesc, signalDescs, comm, stream);
        run("ncclWaitSignal", || Err(Failure::usage(NO_WINDOWS)))
    }
}
