//! Communicators from unique ids: `ncclCommInitRank`,
//! `ncclCommInitRankConfig`, `ncclCommInitRankScalable`,
//! `ncclCommInitAll`.
//!
//! Creation blocks until every rank has joined, except with a
//! non-blocking configuration (it returns `ncclInProgress` at once; the
//! program polls `ncclCommGetAsyncError`) and inside a group (the ranks a
//! thread creates between `ncclGroupStart` and `ncclGroupEnd` join at the
//! same time, and `ncclGroupEnd` waits for them).

use crate::comm::{config, count, ncclComm, ncclComm_t, put};
use crate::config::{comm_config, ncclConfig_t, CommConfig};
use crate::export;
use crate::id::{decode, ncclUniqueId};
use crate::result::{ncclInProgress, run, Failure};
use oxccl::Communicator;
use std::ffi::c_int;

/// Check `rank` of `nranks`.
pub(crate) fn rank_of(rank: c_int, nranks: c_int) -> Result<(usize, usize), Failure> {
    let n = count("nranks", nranks)?;
    let r = count("rank", rank)?;
    if n == 0 || r >= n {
        return Err(Failure::invalid(format!(
            "rank {rank} is not a rank of {nranks}"
        )));
    }
    Ok((r, n))
}

/// Make a communicator with `make` as `config` and the calling context
/// say (now, in the background, or for `ncclGroupEnd`) and put its handle
/// in `*comm`; `ncclInProgress` when it is not made yet and the
/// configuration is non-blocking.
///
/// # Safety
/// `comm` is NULL or has room for a handle.
pub(crate) unsafe fn make_into(
    comm: *mut ncclComm_t,
    config: CommConfig,
    make: impl FnOnce() -> Result<Communicator, Failure> + Send + 'static,
) -> Result<(), Failure> {
    if comm.is_null() {
        return Err(Failure::invalid("comm is NULL"));
    }
    let in_group = crate::group::in_group();
    let nonblocking = config.nonblocking;
    let (handle, slot) = ncclComm::create(config, nonblocking || in_group, make)?;
    // SAFETY: non-null; the caller's contract.
    unsafe { put("comm", comm, handle) }?;
    if in_group {
        crate::group::defer_creation(slot, nonblocking);
        return Ok(());
    }
    match (nonblocking, slot.outcome()) {
        (true, None) => Err(Failure::new(
            ncclInProgress,
            "the communicator is being created",
        )),
        _ => Ok(()),
    }
}

/// `ncclCommInitRankConfig`'s body, for the three entry points.
unsafe fn init_rank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    cfg: *const ncclConfig_t,
) -> Result<(), Failure> {
    let (r, n) = rank_of(rank, nranks)?;
    // SAFETY: the caller's contract.
    let cc = unsafe { comm_config(cfg) }?;
    let id = decode(id)?;
    let config = config()?;
    // SAFETY: the caller's contract.
    unsafe {
        make_into(comm, cc, move || {
            Ok(Communicator::init_with_config(&id, r, n, config)?)
        })
    }
}

export! {
    /// `ncclCommInitRank`: join the communicator `commId` describes as
    /// `rank` of `nranks`.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
    ) {
        run("ncclCommInitRank", || init_rank(comm, nranks, &commId, rank, std::ptr::null()))
    }
}

export! {
    /// `ncclCommInitRankConfig`: `ncclCommInitRank` with a configuration
    /// (NULL: the defaults); `blocking = 0` returns `ncclInProgress` at
    /// once.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) {
        run("ncclCommInitRankConfig", || init_rank(comm, nranks, &commId, rank, config))
    }
}

export! {
    /// `ncclCommInitRankScalable`: NCCL spreads its bootstrap over `nId`
    /// roots; oxccl's rendezvous has one root, so it uses `commIds[0]`
    /// (every rank passes the same list) and the others stay idle.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t,
        nranks: c_int,
        myrank: c_int,
        nId: c_int,
        commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) {
        run("ncclCommInitRankScalable", || {
            if count("nId", nId)? == 0 || commIds.is_null() {
                return Err(Failure::invalid("no unique id given (nId is 0 or commIds is NULL)"));
            }
            // SAFETY: non-null; the caller gives nId >= 1 ids.
            let first = unsafe { &*commIds };
            init_rank(newcomm, nranks, first, myrank, config)
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
                let (h, _) = ncclComm::create(CommConfig::default(), false, move || Ok(c))?;
                // SAFETY: the caller gives room for ndev handles.
                unsafe { comm.add(r).write(h) };
            }
            Ok(())
        })
    }
}
