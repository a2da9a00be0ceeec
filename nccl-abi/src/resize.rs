//! Communicators from communicators: `ncclCommSplit`, `ncclCommShrink`,
//! `ncclCommGrow` (with `ncclCommGetUniqueId`); and the states a
//! communicator passes through around them: `ncclCommRevoke`,
//! `ncclCommSuspend` / `ncclCommResume`, `ncclCommMemStats`.
//!
//! A new communicator inherits its parent's configuration when `config`
//! is NULL; it is made now, in the background (non-blocking), or for
//! `ncclGroupEnd`, as in [`crate::init`].

use crate::comm::{config, count, get, handle, made, ncclComm, ncclComm_t, put, Slot};
use crate::config::{comm_config, ncclConfig_t, CommConfig};
use crate::export;
use crate::id::{decode, encode, ncclUniqueId, NCCL_UNIQUE_ID_BYTES};
use crate::init::make_into;
use crate::result::{run, Failure};
use oxccl::Communicator;
use std::ffi::c_int;
use std::sync::atomic::Ordering;

/// `NCCL_SPLIT_NOCOLOR`: the rank joins no new communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_ABORT`: abort the parent's calls before shrinking.
pub const NCCL_SHRINK_ABORT: c_int = 1;
/// `NCCL_SUSPEND_MEM`.
pub const NCCL_SUSPEND_MEM: c_int = 1;

/// The child's configuration: `config`'s, else the parent's.
///
/// # Safety
/// `config` is NULL or an `ncclConfig_t` of its size.
unsafe fn child_config(
    parent: &ncclComm,
    config: *const ncclConfig_t,
) -> Result<CommConfig, Failure> {
    match config.is_null() {
        true => Ok(parent.config.clone()),
        // SAFETY: the caller's contract.
        false => unsafe { comm_config(config) },
    }
}

/// The parent's communicator, from a thread that outlives the call.
fn parent_of(slot: &Slot) -> Result<&Communicator, Failure> {
    match slot.outcome() {
        Some(Ok(c)) => Ok(c),
        _ => Err(Failure::invalid("the parent communicator is not usable")),
    }
}

export! {
    /// `ncclCommSplit`: every rank of `comm` calls it; ranks of equal
    /// `color` form a new communicator, ordered by `key` (then by their
    /// rank here); `NCCL_SPLIT_NOCOLOR` joins none (`*newcomm` = NULL).
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) {
        run("ncclCommSplit", || {
            // SAFETY: the caller's contract.
            unsafe { get(comm) }?;
            // SAFETY: the caller's contract.
            let parent = unsafe { handle(comm) }?;
            let color = match color {
                NCCL_SPLIT_NOCOLOR => None,
                c if c >= 0 => Some(c as u32),
                c => {
                    return Err(Failure::invalid(format!(
                        "color {c} is negative (and not NCCL_SPLIT_NOCOLOR)"
                    )))
                }
            };
            // SAFETY: the caller's contract.
            let cc = unsafe { child_config(parent, config) }?;
            if color.is_none() {
                // Take part, join nothing: no handle to make. Inside a
                // group the others may be driven by this thread: take
                // part from a thread of its own, waited for at the end.
                // SAFETY: the caller gives room for a handle.
                unsafe { put("newcomm", newcomm, std::ptr::null_mut()) }?;
                let slot = parent.slot.clone();
                let opt_out = move || -> Result<(), Failure> {
                    parent_of(&slot)?.split_maybe(None, i64::from(key))?;
                    Ok(())
                };
                return match crate::group::in_group() {
                    true => crate::group::defer_task(opt_out),
                    false => opt_out(),
                };
            }
            let slot = parent.slot.clone();
            // SAFETY: the caller gives room for a handle.
            unsafe {
                make_into(newcomm, cc, move || {
                    let p = parent_of(&slot)?;
                    p.split_maybe(color, i64::from(key))?
                        .ok_or_else(|| Failure::invalid("split made no communicator"))
                })
            }
        })
    }
}

export! {
    /// `ncclCommShrink`: every rank not in `excludeRanksList` calls it and
    /// gets a communicator without those ranks, numbered in the old order.
    /// It works after ranks died (the parent failed): with
    /// `NCCL_SHRINK_ABORT` the parent's calls are aborted first.
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut c_int,
        excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrinkFlags: c_int,
    ) {
        run("ncclCommShrink", || {
            // SAFETY: the caller's contract.
            let parent = unsafe { handle(comm) }?;
            let c = made(parent)?;
            let k = count("excludeRanksCount", excludeRanksCount)?;
            if k > 0 && excludeRanksList.is_null() {
                return Err(Failure::invalid("excludeRanksList is NULL"));
            }
            let mut excluded = Vec::with_capacity(k);
            for i in 0..k {
                // SAFETY: non-null; the caller gives k ranks.
                let r = unsafe { *excludeRanksList.add(i) };
                excluded.push(count("excluded rank", r)?);
            }
            match shrinkFlags {
                0 => {}
                NCCL_SHRINK_ABORT => c.abort(),
                f => return Err(Failure::invalid(format!(
                    "shrinkFlags = {f}: expected NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT"
                ))),
            }
            // SAFETY: the caller's contract.
            let cc = unsafe { child_config(parent, config) }?;
            let slot = parent.slot.clone();
            // SAFETY: the caller gives room for a handle.
            unsafe {
                make_into(newcomm, cc, move || Ok(parent_of(&slot)?.shrink(&excluded)?))
            }
        })
    }
}

export! {
    /// `ncclCommGetUniqueId`: an id for `ncclCommGrow`, made by the one
    /// rank of `comm` that passes it to the new ranks (it hosts the
    /// rendezvous). One at a time: the next only after a grow used it.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) {
        run("ncclCommGetUniqueId", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            made(h)?;
            let mut slot = h.grow_id.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_some() {
                return Err(Failure::usage(
                    "the unique id made before has not been used by ncclCommGrow yet",
                ));
            }
            let id = oxccl::UniqueId::with_config(&config()?)?;
            let bytes = encode(&id)?;
            // SAFETY: the caller gives room for an id.
            unsafe { put("uniqueId", uniqueId, bytes) }?;
            *slot = Some(id);
            Ok(())
        })
    }
}

/// The grow's id, from the rank of `parent` that has it to every rank of
/// `parent`: who has it is agreed first (exactly one must).
fn share_grow_id(
    parent: &Communicator,
    mine: Option<&ncclUniqueId>,
) -> Result<ncclUniqueId, Failure> {
    let n = parent.nranks();
    let mut flags = vec![0u8; n];
    parent.all_gather(&[u8::from(mine.is_some())], &mut flags[..])?;
    let holders: Vec<usize> = (0..n).filter(|r| flags[*r] != 0).collect();
    let [root] = holders[..] else {
        return Err(Failure::usage(format!(
            "ncclCommGrow: exactly one existing rank passes the unique id; ranks {holders:?} did"
        )));
    };
    let mut bytes = mine.map_or([0u8; NCCL_UNIQUE_ID_BYTES], |m| m.internal);
    parent.broadcast_in_place(&mut bytes[..], root)?;
    Ok(ncclUniqueId { internal: bytes })
}

export! {
    /// `ncclCommGrow`: a communicator of `nRanks` from `comm`'s ranks (same
    /// numbers, `rank` = -1) and new ones (`comm` = NULL, `rank` from
    /// `comm`'s size up). The existing rank that made `uniqueId` with
    /// `ncclCommGetUniqueId` passes it, the other existing ranks NULL; the
    /// new ranks pass it too.
    fn ncclCommGrow / pncclCommGrow(
        comm: ncclComm_t,
        nRanks: c_int,
        uniqueId: *const ncclUniqueId,
        rank: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) {
        run("ncclCommGrow", || {
            let n = count("nRanks", nRanks)?;
            // SAFETY: NULL or an id, the caller's contract.
            let given = unsafe { uniqueId.as_ref() };
            let settings = crate::comm::config()?;
            if comm.is_null() {
                // A new rank.
                let id = given.ok_or_else(|| Failure::invalid("a new rank (comm NULL) needs uniqueId"))?;
                let (r, n) = crate::init::rank_of(rank, nRanks)?;
                let id = decode(id)?;
                // SAFETY: the caller's contract.
                let cc = unsafe { comm_config(config) }?;
                // SAFETY: the caller gives room for a handle.
                return unsafe {
                    make_into(newcomm, cc, move || Ok(Communicator::init_with_config(&id, r, n, settings)?))
                };
            }
            // SAFETY: the caller's contract.
            let parent = unsafe { handle(comm) }?;
            let c = made(parent)?;
            if rank != -1 {
                return Err(Failure::invalid(format!(
                    "rank = {rank}: an existing rank keeps its number (pass -1)"
                )));
            }
            if n <= c.nranks() {
                return Err(Failure::invalid(format!(
                    "nRanks = {n}: a grow needs more than the {} ranks there are", c.nranks()
                )));
            }
            let bytes = share_grow_id(c, given)?;
            // The rank that made the id joins with it (it hosts the root).
            let hosted = parent.grow_id.lock().unwrap_or_else(|p| p.into_inner()).take();
            let id = match (given, hosted) {
                (Some(_), Some(h)) if encode(&h)?.internal == bytes.internal => h,
                _ => decode(&bytes)?,
            };
            let me = c.rank();
            // SAFETY: the caller's contract.
            let cc = unsafe { child_config(parent, config) }?;
            // SAFETY: the caller gives room for a handle.
            unsafe {
                make_into(newcomm, cc, move || Ok(Communicator::init_with_config(&id, me, n, settings)?))
            }
        })
    }
}

export! {
    /// `ncclCommRevoke`: stop every call in flight on every rank (as an
    /// abort) but keep the communicator, quiescent, for `ncclCommShrink`,
    /// `ncclCommSplit` of its survivors or `ncclCommDestroy`; its calls
    /// are refused from now on. `revokeFlags` must be 0.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) {
        run("ncclCommRevoke", || {
            if revokeFlags != 0 {
                return Err(Failure::invalid(format!(
                    "revokeFlags = {revokeFlags}: must be NCCL_REVOKE_DEFAULT (0)"
                )));
            }
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            made(h)?.abort();
            h.revoked.store(true, Ordering::Release);
            Ok(())
        })
    }
}

export! {
    /// `ncclCommSuspend`: refuse calls until `ncclCommResume`. With
    /// `NCCL_SUSPEND_MEM` NCCL frees its GPU memory meanwhile; calls here
    /// hold none (host memory, and buffers kept per peer, not per device).
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) {
        run("ncclCommSuspend", || {
            if flags & !NCCL_SUSPEND_MEM != 0 {
                return Err(Failure::invalid(format!("flags = {flags:#x}: only NCCL_SUSPEND_MEM is defined")));
            }
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            made(h)?;
            if h.suspended.swap(true, Ordering::AcqRel) {
                return Err(Failure::usage("the communicator is already suspended"));
            }
            Ok(())
        })
    }
}

export! {
    /// `ncclCommResume`: take calls again.
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) {
        run("ncclCommResume", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            if !h.suspended.swap(false, Ordering::AcqRel) {
                return Err(Failure::usage("the communicator is not suspended"));
            }
            Ok(())
        })
    }
}

/// `ncclCommMemStat_t`.
const STAT_GPU_MEM_SUSPEND: c_int = 0;
const STAT_GPU_MEM_SUSPENDED: c_int = 1;
const STAT_GPU_MEM_PERSIST: c_int = 2;
const STAT_GPU_MEM_TOTAL: c_int = 3;

export! {
    /// `ncclCommMemStats`: the GPU memory the communicator holds — none
    /// (host memory) — and whether it is suspended.
    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) {
        run("ncclCommMemStats", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            made(h)?;
            let v = match stat {
                STAT_GPU_MEM_SUSPENDED => u64::from(h.suspended.load(Ordering::Acquire)),
                STAT_GPU_MEM_SUSPEND | STAT_GPU_MEM_PERSIST | STAT_GPU_MEM_TOTAL => 0,
                s => return Err(Failure::invalid(format!("stat = {s} is not an ncclCommMemStat_t"))),
            };
            // SAFETY: the caller gives room for a u64.
            unsafe { put("value", value, v) }
        })
    }
}
