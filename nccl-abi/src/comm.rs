//! Communicators: `ncclCommInitRank`, the queries, finalize, destroy and
//! abort, `ncclCommGetAsyncError`, `ncclGetVersion`.
//!
//! An `ncclComm_t` is a pointer to an [`ncclComm`] this library allocated;
//! `ncclCommDestroy` and `ncclCommAbort` free it.

use crate::export;
use crate::id::{decode, ncclUniqueId};
use crate::result::{code_of, ncclSuccess, run, Failure};
use oxccl::{Communicator, Config};
use std::ffi::c_int;

/// The NCCL release whose API this is (`NCCL_VERSION_CODE` of 2.32.6).
pub const NCCL_VERSION_CODE: c_int = 23206;

/// What an `ncclComm_t` points to.
pub struct ncclComm {
    pub(crate) comm: Communicator,
}

pub type ncclComm_t = *mut ncclComm;

/// The configuration from the environment.
pub(crate) fn config() -> Result<Config, Failure> {
    Ok(Config::from_env()?)
}

/// The communicator behind `comm`.
///
/// # Safety
/// `comm` is null or from `ncclCommInitRank`, not destroyed.
pub(crate) unsafe fn get<'a>(comm: ncclComm_t) -> Result<&'a Communicator, Failure> {
    // SAFETY: the caller's contract.
    unsafe { comm.as_ref() }
        .map(|c| &c.comm)
        .ok_or_else(|| Failure::invalid("comm is NULL"))
}

/// A non-negative `int` argument as a count.
pub(crate) fn count(name: &str, v: c_int) -> Result<usize, Failure> {
    usize::try_from(v).map_err(|_| Failure::invalid(format!("{name} = {v} is negative")))
}

export! {
    /// `ncclGetVersion`: `NCCL_VERSION_CODE` of the API this implements.
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        run("ncclGetVersion", || {
            if version.is_null() {
                return Err(Failure::invalid("version is NULL"));
            }
            // SAFETY: non-null; the caller gives room for an int.
            unsafe { version.write(NCCL_VERSION_CODE) };
            Ok(())
        })
    }
}

export! {
    /// `ncclCommInitRank`: join the communicator `commId` describes as
    /// `rank` of `nranks`; blocks until every rank has joined.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
    ) {
        run("ncclCommInitRank", || {
            if comm.is_null() {
                return Err(Failure::invalid("comm is NULL"));
            }
            let n = count("nranks", nranks)?;
            let r = count("rank", rank)?;
            if n == 0 || r >= n {
                return Err(Failure::invalid(format!(
                    "rank {rank} is not a rank of {nranks}"
                )));
            }
            let id = decode(&commId)?;
            let c = Communicator::init_with_config(&id, r, n, config()?)?;
            let handle = Box::into_raw(Box::new(ncclComm { comm: c }));
            // SAFETY: non-null; the caller gives room for a handle.
            unsafe { comm.write(handle) };
            Ok(())
        })
    }
}

export! {
    /// `ncclCommFinalize`: every call issued has completed when it returns
    /// (calls here complete before they return, so there is nothing left
    /// to flush); the communicator stays valid until destroyed.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) {
        run("ncclCommFinalize", || {
            // SAFETY: the caller's contract.
            unsafe { get(comm) }?;
            Ok(())
        })
    }
}

export! {
    /// `ncclCommDestroy`: free the communicator (peers see a clean
    /// departure, not a crash).
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) {
        run("ncclCommDestroy", || {
            if comm.is_null() {
                return Err(Failure::invalid("comm is NULL"));
            }
            // SAFETY: from ncclCommInitRank (Box::into_raw), not destroyed.
            drop(unsafe { Box::from_raw(comm) });
            Ok(())
        })
    }
}

export! {
    /// `ncclCommAbort`: stop every call in flight on every rank (they
    /// return an error naming this abort) and free the communicator.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) {
        run("ncclCommAbort", || {
            if comm.is_null() {
                return Err(Failure::invalid("comm is NULL"));
            }
            // SAFETY: from ncclCommInitRank (Box::into_raw), not destroyed.
            let c = unsafe { Box::from_raw(comm) };
            c.comm.abort();
            Ok(())
        })
    }
}

export! {
    /// `ncclCommCount`: the number of ranks.
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) {
        run("ncclCommCount", || {
            // SAFETY: the caller's contract.
            let c = unsafe { get(comm) }?;
            if count.is_null() {
                return Err(Failure::invalid("count is NULL"));
            }
            // SAFETY: non-null; the caller gives room for an int.
            unsafe { count.write(c.nranks() as c_int) };
            Ok(())
        })
    }
}

export! {
    /// `ncclCommUserRank`: this rank.
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) {
        run("ncclCommUserRank", || {
            // SAFETY: the caller's contract.
            let c = unsafe { get(comm) }?;
            if rank.is_null() {
                return Err(Failure::invalid("rank is NULL"));
            }
            // SAFETY: non-null; the caller gives room for an int.
            unsafe { rank.write(c.rank() as c_int) };
            Ok(())
        })
    }
}

export! {
    /// `ncclCommGetAsyncError`: `ncclSuccess` while the communicator is
    /// sound, else the code of the failure that broke it (a peer lost, an
    /// abort, a timeout), found without a call in flight.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut crate::result::ncclResult_t) {
        run("ncclCommGetAsyncError", || {
            // SAFETY: the caller's contract.
            let c = unsafe { get(comm) }?;
            if asyncError.is_null() {
                return Err(Failure::invalid("asyncError is NULL"));
            }
            let code = c.async_error().map_or(ncclSuccess, |e| code_of(&e));
            // SAFETY: non-null; the caller gives room for a result.
            unsafe { asyncError.write(code) };
            Ok(())
        })
    }
}

/// `NCCL_SPLIT_NOCOLOR`: the rank joins no new communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

export! {
    /// `ncclCommSplit`: every rank of `comm` calls it; ranks of equal
    /// `color` form a new communicator, ordered by `key` (then by their
    /// rank here); `NCCL_SPLIT_NOCOLOR` joins none (`*newcomm` = NULL).
    /// `config` must be NULL (configurations are not taken yet).
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut std::ffi::c_void,
    ) {
        run("ncclCommSplit", || {
            // SAFETY: the caller's contract.
            let c = unsafe { get(comm) }?;
            if newcomm.is_null() {
                return Err(Failure::invalid("newcomm is NULL"));
            }
            if !config.is_null() {
                return Err(Failure::usage(
                    "a config was given: ncclConfig_t is not taken yet (pass NULL)",
                ));
            }
            let color = match color {
                NCCL_SPLIT_NOCOLOR => None,
                c if c >= 0 => Some(c as u32),
                c => {
                    return Err(Failure::invalid(format!(
                        "color {c} is negative (and not NCCL_SPLIT_NOCOLOR)"
                    )))
                }
            };
            let made = c.split_maybe(color, i64::from(key))?;
            let handle = made.map_or(std::ptr::null_mut(), |m| {
                Box::into_raw(Box::new(ncclComm { comm: m }))
            });
            // SAFETY: non-null; the caller gives room for a handle.
            unsafe { newcomm.write(handle) };
            Ok(())
        })
    }
}

export! {
    /// `ncclCommInitAll`: `ndev` ranks of one new communicator, all in this
    /// process (NCCL's one process, many devices), in `comm[0..ndev]`.
    /// Host memory: `devlist` is not used (NULL or not).
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) {
        let _ = devlist;
        run("ncclCommInitAll", || {
            if comm.is_null() {
                return Err(Failure::invalid("comm is NULL"));
            }
            let n = count("ndev", ndev)?;
            if n == 0 {
                return Err(Failure::invalid("ndev is 0"));
            }
            let config = config()?;
            let id = oxccl::UniqueId::with_config(&config)?;
            // Every rank joins at once (each waits for the others).
            let made: Vec<Result<Communicator, oxccl::Error>> = std::thread::scope(|s| {
                let joins: Vec<_> = (0..n)
                    .map(|r| {
                        let (id, config) = (&id, config.clone());
                        s.spawn(move || Communicator::init_with_config(id, r, n, config))
                    })
                    .collect();
                joins
                    .into_iter()
                    .map(|j| j.join().unwrap_or_else(|_| Err(oxccl::Error::System("a rank's thread panicked".into()))))
                    .collect()
            });
            let mut comms = Vec::with_capacity(n);
            for m in made {
                comms.push(m?);
            }
            for (r, c) in comms.into_iter().enumerate() {
                // SAFETY: the caller gives room for ndev handles.
                unsafe { comm.add(r).write(Box::into_raw(Box::new(ncclComm { comm: c }))) };
            }
            Ok(())
        })
    }
}
