//! The collectives and their `nccl*Config` forms (where the memory may be
//! and what the stream means: [`crate::memory`]). NCCL's in-place conventions: `sendbuff == recvbuff`, and for
//! all_gather `sendbuff == recvbuff + rank * sendcount` elements, for
//! reduce_scatter `recvbuff == sendbuff + rank * recvcount`.

use crate::comm::{count, get, ncclComm_t};
use crate::config::{check_coll_config, ncclCollConfig_t};
use crate::export;
use crate::group::{submit, Coll, Op};
use crate::memory::{check_stream, space_of};
use crate::redop::resolve;
use crate::result::{run, Failure};
use crate::types::{data_type, ncclDataType_t, ncclRedOp_t};
use oxccl::{DataType, Kind, ReduceOp, Region};
use std::ffi::{c_int, c_void};

pub use crate::memory::cudaStream_t;

/// `elems` elements of `dtype` at `ptr`, in the memory space it is in.
pub(crate) fn region(
    what: &str,
    ptr: *const c_void,
    elems: usize,
    dtype: DataType,
) -> Result<Region, Failure> {
    let len = elems
        .checked_mul(dtype.size())
        .ok_or_else(|| Failure::invalid(format!("{what}: {elems} elements overflow")))?;
    if ptr.is_null() && len > 0 {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    Ok(Region {
        space: space_of(ptr)?,
        addr: if ptr.is_null() {
            Region::EMPTY.addr
        } else {
            ptr as usize
        },
        len,
    })
}

/// One collective: check the stream, decode the arguments, run it.
#[allow(clippy::too_many_arguments)]
unsafe fn collective(
    name: &str,
    kind: Kind,
    send: Option<(*const c_void, usize)>,
    recv: (*mut c_void, usize),
    datatype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> crate::result::ncclResult_t {
    run(name, || {
        // SAFETY: the caller's contract.
        unsafe { get(comm) }?;
        check_stream(stream)?;
        let dtype = data_type(datatype)?;
        let (op, premul) = match op {
            // SAFETY: the caller's contract.
            Some(op) => unsafe { resolve(comm, op, dtype) }?,
            None => (ReduceOp::Sum, None),
        };
        let root = count("root", root)?;
        let send = send
            .map(|(p, n)| region("sendbuff", p, n, dtype))
            .transpose()?;
        let recv = region("recvbuff", recv.0, recv.1, dtype)?;
        let op = Op::Coll(Coll {
            kind,
            send,
            recv,
            dtype,
            op,
            root,
            premul,
        });
        // SAFETY: the caller's contract: the buffers hold the elements
        // nccl.h says, stay valid until the call (or its group) completes
        // and nothing else writes them meanwhile.
        unsafe { submit(comm, &[op], stream) }
    })
}

/// The size of `comm` and this rank in it; `None` when it cannot take
/// calls (the call then reports why).
///
/// # Safety
/// `comm` is NULL or from this library, not destroyed.
unsafe fn shape(comm: ncclComm_t) -> Option<(usize, usize)> {
    // SAFETY: the caller's contract.
    let c = unsafe { get(comm) }.ok()?;
    Some((c.nranks(), c.rank()))
}

/// `send` unless it is the same memory as `recv` (in place).
fn unless_same(
    send: *const c_void,
    recv: *mut c_void,
    elems: usize,
) -> Option<(*const c_void, usize)> {
    (!std::ptr::eq(send, recv)).then_some((send, elems))
}

/// Elements of `dtype` to bytes, for pointer arithmetic (wrapping is
/// harmless: the result is only compared).
fn bytes(elems: usize, dtype: ncclDataType_t) -> usize {
    elems.wrapping_mul(data_type(dtype).map_or(1, |d| d.size()))
}

export! {
    /// `ncclAllReduce`.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        collective("ncclAllReduce", Kind::AllReduce, unless_same(sendbuff, recvbuff, count),
            (recvbuff, count), datatype, Some(op), 0, comm, stream)
    }
}

export! {
    /// `ncclBroadcast`: `sendbuff` is read at the root only.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        // Elsewhere it may be anything (NULL too): the receive buffer
        // stands in for it, never read.
        let send = if sendbuff.is_null() { recvbuff as *const c_void } else { sendbuff };
        let send = (!std::ptr::eq(send, recvbuff) || sendbuff.is_null()).then_some((send, count));
        collective("ncclBroadcast", Kind::Broadcast, send, (recvbuff, count), datatype, None,
            root, comm, stream)
    }
}

export! {
    /// `ncclBcast`: broadcast in place.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        collective("ncclBcast", Kind::Broadcast, None, (buff, count), datatype, None, root,
            comm, stream)
    }
}

export! {
    /// `ncclReduce`: `recvbuff` is written at the root only (NULL
    /// elsewhere is fine).
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        let recv_elems = if recvbuff.is_null() { 0 } else { count };
        collective("ncclReduce", Kind::Reduce, unless_same(sendbuff, recvbuff, count),
            (recvbuff, recv_elems), datatype, Some(op), root, comm, stream)
    }
}

export! {
    /// `ncclAllGather`: `sendcount` elements from each rank, rank `r`'s at
    /// `recvbuff + r * sendcount`.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        // SAFETY: the caller's contract.
        let Some((n, me)) = (unsafe { shape(comm) }) else {
            return collective("ncclAllGather", Kind::AllGather, None, (recvbuff, 0), datatype,
                None, 0, comm, stream);
        };
        let mine = (recvbuff as usize).wrapping_add(bytes(me.wrapping_mul(sendcount), datatype));
        let send = (sendbuff as usize != mine).then_some((sendbuff, sendcount));
        collective("ncclAllGather", Kind::AllGather, send, (recvbuff, n.saturating_mul(sendcount)),
            datatype, None, 0, comm, stream)
    }
}

export! {
    /// `ncclReduceScatter`: `recvcount` elements to each rank, the
    /// reduction of every rank's `sendbuff + rank * recvcount`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        // SAFETY: the caller's contract.
        let Some((n, me)) = (unsafe { shape(comm) }) else {
            return collective("ncclReduceScatter", Kind::ReduceScatter, None, (recvbuff, 0),
                datatype, Some(op), 0, comm, stream);
        };
        let total = n.saturating_mul(recvcount);
        let mine = (sendbuff as usize).wrapping_add(bytes(me.wrapping_mul(recvcount), datatype));
        if recvbuff as usize == mine {
            // In place: the whole input, the result in its segment.
            return collective("ncclReduceScatter", Kind::ReduceScatter, None,
                (sendbuff as *mut c_void, total), datatype, Some(op), 0, comm, stream);
        }
        collective("ncclReduceScatter", Kind::ReduceScatter, Some((sendbuff, total)),
            (recvbuff, recvcount), datatype, Some(op), 0, comm, stream)
    }
}

export! {
    /// `ncclAlltoAll`: `count` elements to and from each rank.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        // SAFETY: the caller's contract.
        let n = unsafe { shape(comm) }.map_or(0, |(n, _)| n);
        let total = n.saturating_mul(count);
        collective("ncclAlltoAll", Kind::AllToAll, unless_same(sendbuff, recvbuff, total),
            (recvbuff, total), datatype, None, 0, comm, stream)
    }
}

/// Gather (`to_root`) or scatter: the root's part is a copy, the others'
/// are sends and receives between the root and each rank, one group.
#[allow(clippy::too_many_arguments)]
unsafe fn rooted(
    name: &str,
    to_root: bool,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count_: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> crate::result::ncclResult_t {
    run(name, || {
        // SAFETY: the caller's contract.
        let c = unsafe { get(comm) }?;
        check_stream(stream)?;
        let dtype = data_type(datatype)?;
        let (n, me) = (c.nranks(), c.rank());
        let root = count("root", root)?;
        if root >= n {
            return Err(Failure::invalid(format!(
                "root {root} is not a rank of {n}"
            )));
        }
        let part = |what: &str, base: *const c_void, r: usize| -> Result<Region, Failure> {
            let at =
                (base as usize).wrapping_add(r.wrapping_mul(count_).wrapping_mul(dtype.size()));
            region(
                what,
                if base.is_null() {
                    base
                } else {
                    at as *const c_void
                },
                count_,
                dtype,
            )
        };
        let mut ops = Vec::new();
        if me == root {
            // The root's whole buffer: recvbuff of a gather, sendbuff of a scatter.
            let (whole, what) = match to_root {
                true => (recvbuff as *const c_void, "recvbuff"),
                false => (sendbuff, "sendbuff"),
            };
            region(what, whole, n.saturating_mul(count_), dtype)?;
            for r in 0..n {
                let piece = part(what, whole, r)?;
                if r != me {
                    ops.push(Op::P2p {
                        send: !to_root,
                        region: piece,
                        dtype,
                        peer: r,
                    });
                    continue;
                }
                // The root's own part: from its sendbuff into its piece
                // of recvbuff (gather), from its piece of sendbuff into
                // its recvbuff (scatter).
                let (src, dst) = match to_root {
                    true => (region("sendbuff", sendbuff, count_, dtype)?, piece),
                    false => (piece, region("recvbuff", recvbuff, count_, dtype)?),
                };
                // In place when they are the same memory.
                if src.addr != dst.addr {
                    ops.push(Op::Copy { dst, src });
                }
            }
        } else {
            let (send, buf) = match to_root {
                true => (true, region("sendbuff", sendbuff, count_, dtype)?),
                false => (false, region("recvbuff", recvbuff, count_, dtype)?),
            };
            ops.push(Op::P2p {
                send,
                region: buf,
                dtype,
                peer: root,
            });
        }
        // SAFETY: the caller's contract: the buffers hold the elements
        // nccl.h says and stay valid until the call (or its group) ends.
        unsafe { submit(comm, &ops, stream) }
    })
}

export! {
    /// `ncclGather`: `count` elements from each rank to the root, rank
    /// `i`'s at `recvbuff + i * count` (in place: `sendbuff ==
    /// recvbuff + root * count`).
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        rooted("ncclGather", true, sendbuff, recvbuff, count, datatype, root, comm, stream)
    }
}

export! {
    /// `ncclScatter`: `count` elements from the root's `sendbuff + i *
    /// count` to each rank `i` (in place: `recvbuff == sendbuff + root *
    /// count`).
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) {
        rooted("ncclScatter", false, sendbuff, recvbuff, count, datatype, root, comm, stream)
    }
}

/// A `nccl*Config` call: its configuration checked, then the plain call.
///
/// # Safety
/// `config` is NULL or an `ncclCollConfig_t` of its size.
unsafe fn configured(
    name: &str,
    config: *const ncclCollConfig_t,
    call: impl FnOnce() -> crate::result::ncclResult_t,
) -> crate::result::ncclResult_t {
    // SAFETY: the caller's contract.
    match run(name, || unsafe { check_coll_config(config) }) {
        crate::result::ncclSuccess => call(),
        failed => failed,
    }
}

/// The `nccl*Config` entry points: the plain call's arguments and a
/// trailing `ncclCollConfig_t`.
macro_rules! configured_calls {
    ($($name:ident / $alias:ident => $plain:ident($($arg:ident: $ty:ty),*);)*) => {$(
        export! {
            #[doc = concat!("`", stringify!($name), "`: `", stringify!($plain),
                "` with a per-call configuration ([`check_coll_config`]).")]
            fn $name / $alias($($arg: $ty,)* config: *const ncclCollConfig_t) {
                configured(stringify!($name), config, || $plain($($arg),*))
            }
        }
    )*};
}

configured_calls! {
    ncclAllReduceConfig / pncclAllReduceConfig => ncclAllReduce(sendbuff: *const c_void,
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t,
        comm: ncclComm_t, stream: cudaStream_t);
    ncclBroadcastConfig / pncclBroadcastConfig => ncclBroadcast(sendbuff: *const c_void,
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t);
    ncclReduceConfig / pncclReduceConfig => ncclReduce(sendbuff: *const c_void,
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t);
    ncclAllGatherConfig / pncclAllGatherConfig => ncclAllGather(sendbuff: *const c_void,
        recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t,
        stream: cudaStream_t);
    ncclReduceScatterConfig / pncclReduceScatterConfig => ncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize,
        datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t);
    ncclAlltoAllConfig / pncclAlltoAllConfig => ncclAlltoAll(sendbuff: *const c_void,
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t,
        stream: cudaStream_t);
    ncclGatherConfig / pncclGatherConfig => ncclGather(sendbuff: *const c_void,
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t);
    ncclScatterConfig / pncclScatterConfig => ncclScatter(sendbuff: *const c_void,
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int,
        comm: ncclComm_t, stream: cudaStream_t);
}
