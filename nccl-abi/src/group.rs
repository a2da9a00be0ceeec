//! `ncclGroupStart` / `ncclGroupEnd`, `ncclSend` / `ncclRecv`.
//!
//! Between `ncclGroupStart` and `ncclGroupEnd` (nested: the outermost pair
//! counts) this thread's calls are checked and kept, not run. At the end
//! each communicator's calls run as one oxccl group — its sends and
//! receives posted at once, its collectives in the order given — and the
//! communicators' groups run at the same time, so one thread may drive
//! several ranks (NCCL's one-process, many-devices pattern). A send or
//! receive outside a group is a group of one.

use crate::comm::{get, ncclComm, ncclComm_t};
use crate::export;
use crate::result::{run, Failure};
use oxccl::{DataType, Kind, ReduceOp, Region};
use std::cell::RefCell;

/// One call, decoded and checked.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    P2p {
        send: bool,
        region: Region,
        dtype: DataType,
        peer: usize,
    },
    Coll {
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    },
}

/// This thread's open group: its depth and the calls kept so far.
#[derive(Default)]
struct Open {
    depth: usize,
    calls: Vec<(*mut ncclComm, Op)>,
}

thread_local! {
    static GROUP: RefCell<Open> = RefCell::new(Open::default());
}

/// Run `op` on `comm` now, or keep it for `ncclGroupEnd` inside a group.
///
/// # Safety
/// `comm` is from `ncclCommInitRank`, not destroyed; `op`'s memory stays
/// valid until the call (or its group) completes.
pub(crate) unsafe fn submit(comm: ncclComm_t, op: Op) -> Result<(), Failure> {
    let kept = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.calls.push((comm, op));
            true
        } else {
            false
        }
    });
    if kept {
        return Ok(());
    }
    match op {
        // A collective alone is a plain call (no group to set up).
        Op::Coll {
            kind,
            send,
            recv,
            dtype,
            op,
            root,
        } => {
            // SAFETY: the caller's contract.
            let c = unsafe { get(comm) }?;
            // SAFETY: the caller's contract (the call completes before it
            // returns).
            unsafe { c.collective_regions(kind, send, recv, dtype, op, root) }?;
            Ok(())
        }
        // A send or receive alone is a group of one.
        // SAFETY: the caller's contract.
        Op::P2p { .. } => unsafe { run_group(&[(comm, op)]) },
    }
}

/// Run `calls` (each on its communicator) as one group per communicator,
/// all at once; the first error.
///
/// # Safety
/// As [`submit`], for every call.
unsafe fn run_group(calls: &[(ncclComm_t, Op)]) -> Result<(), Failure> {
    let mut comms: Vec<ncclComm_t> = Vec::new();
    for (c, _) in calls {
        if !comms.contains(c) {
            comms.push(*c);
        }
    }
    let mut works = Vec::new();
    for c in comms {
        // SAFETY: the caller's contract.
        let comm = unsafe { get(c) }?;
        let mine: Vec<Op> = calls
            .iter()
            .filter(|(k, _)| *k == c)
            .map(|(_, o)| *o)
            .collect();
        works.push(comm.group_async((), move |g, _| {
            for op in mine {
                // SAFETY: the caller's contract: the memory stays valid
                // until this group completes (waited for below).
                unsafe {
                    match op {
                        Op::P2p {
                            send,
                            region,
                            dtype,
                            peer,
                        } => g.p2p_region(send, region, dtype, peer),
                        Op::Coll {
                            kind,
                            send,
                            recv,
                            dtype,
                            op,
                            root,
                        } => g.collective_regions(kind, send, recv, dtype, op, root),
                    }
                }?;
            }
            Ok(())
        }));
    }
    let mut first = None;
    for w in works {
        if let Err(e) = w.wait() {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), |e| Err(e.into()))
}

export! {
    /// `ncclGroupStart`: keep this thread's calls until `ncclGroupEnd`.
    fn ncclGroupStart / pncclGroupStart() {
        run("ncclGroupStart", || {
            GROUP.with(|g| g.borrow_mut().depth += 1);
            Ok(())
        })
    }
}

export! {
    /// `ncclGroupEnd`: at the outermost end, run the calls kept.
    fn ncclGroupEnd / pncclGroupEnd() {
        run("ncclGroupEnd", || {
            let calls = GROUP.with(|g| {
                let mut g = g.borrow_mut();
                match g.depth {
                    0 => Err(Failure::usage("ncclGroupEnd without ncclGroupStart")),
                    1 => {
                        g.depth = 0;
                        Ok(Some(std::mem::take(&mut g.calls)))
                    }
                    _ => {
                        g.depth -= 1;
                        Ok(None)
                    }
                }
            })?;
            match calls {
                // SAFETY: every call was submitted under the contract of
                // its entry point; its memory is valid until now.
                Some(calls) => unsafe { run_group(&calls) },
                None => Ok(()),
            }
        })
    }
}

/// `ncclSend` and `ncclRecv`'s shared body (their arguments, and which).
#[allow(clippy::too_many_arguments)]
unsafe fn p2p(
    name: &str,
    send: bool,
    buf: *mut std::ffi::c_void,
    count: usize,
    datatype: crate::types::ncclDataType_t,
    peer: std::ffi::c_int,
    comm: ncclComm_t,
    stream: crate::coll::cudaStream_t,
) -> crate::result::ncclResult_t {
    run(name, || {
        // SAFETY: the caller's contract.
        unsafe { get(comm) }?;
        crate::coll::host_stream(stream)?;
        let dtype = crate::types::data_type(datatype)?;
        let what = if send { "sendbuff" } else { "recvbuff" };
        let region = crate::coll::region(what, buf, count, dtype)?;
        let peer = crate::comm::count("peer", peer)?;
        // SAFETY: the caller's contract.
        unsafe {
            submit(
                comm,
                Op::P2p {
                    send,
                    region,
                    dtype,
                    peer,
                },
            )
        }
    })
}

export! {
    /// `ncclSend`: `count` elements to `peer` (matched by its `ncclRecv`).
    fn ncclSend / pncclSend(
        sendbuff: *const std::ffi::c_void,
        count: usize,
        datatype: crate::types::ncclDataType_t,
        peer: std::ffi::c_int,
        comm: ncclComm_t,
        stream: crate::coll::cudaStream_t,
    ) {
        p2p("ncclSend", true, sendbuff as *mut _, count, datatype, peer, comm, stream)
    }
}

export! {
    /// `ncclRecv`: `count` elements from `peer`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut std::ffi::c_void,
        count: usize,
        datatype: crate::types::ncclDataType_t,
        peer: std::ffi::c_int,
        comm: ncclComm_t,
        stream: crate::coll::cudaStream_t,
    ) {
        p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream)
    }
}
