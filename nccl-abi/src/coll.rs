//! The collectives, on host memory with a null stream (complete when they
//! return). NCCL's in-place conventions: `sendbuff == recvbuff`, and for
//! all_gather `sendbuff == recvbuff + rank * sendcount` elements, for
//! reduce_scatter `recvbuff == sendbuff + rank * recvcount`.

use crate::comm::{count, get, ncclComm_t};
use crate::export;
use crate::group::{submit, Op};
use crate::result::{run, Failure};
use crate::types::{data_type, ncclDataType_t, ncclRedOp_t, red_op};
use oxccl::{DataType, Kind, MemorySpace, ReduceOp, Region};
use std::ffi::{c_int, c_void};

/// CUDA's `cudaStream_t`.
pub type cudaStream_t = *mut c_void;

/// Calls take host memory and complete before they return: only the
/// NULL stream fits.
pub(crate) fn host_stream(stream: cudaStream_t) -> Result<(), Failure> {
    match stream.is_null() {
        true => Ok(()),
        false => Err(Failure::usage(
            "a stream was given: this build of oxccl's libnccl takes host memory with a \
             NULL stream only (device memory needs the cuda feature)",
        )),
    }
}

/// `elems` elements of `dtype` at `ptr`, host memory.
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
        space: MemorySpace::Host,
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
        host_stream(stream)?;
        let dtype = data_type(datatype)?;
        let op = op.map(red_op).transpose()?.unwrap_or(ReduceOp::Sum);
        let root = count("root", root)?;
        let send = send
            .map(|(p, n)| region("sendbuff", p, n, dtype))
            .transpose()?;
        let recv = region("recvbuff", recv.0, recv.1, dtype)?;
        let op = Op::Coll {
            kind,
            send,
            recv,
            dtype,
            op,
            root,
        };
        // SAFETY: the caller's contract: the buffers hold the elements
        // nccl.h says, stay valid until the call (or its group) completes
        // and nothing else writes them meanwhile.
        unsafe { submit(comm, op) }
    })
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
        // SAFETY: the caller's contract (null is refused inside).
        let Some(c) = (unsafe { comm.as_ref() }) else {
            return collective("ncclAllGather", Kind::AllGather, None, (recvbuff, 0), datatype,
                None, 0, comm, stream);
        };
        let (n, me) = (c.comm.nranks(), c.comm.rank());
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
        // SAFETY: the caller's contract (null is refused inside).
        let Some(c) = (unsafe { comm.as_ref() }) else {
            return collective("ncclReduceScatter", Kind::ReduceScatter, None, (recvbuff, 0),
                datatype, Some(op), 0, comm, stream);
        };
        let (n, me) = (c.comm.nranks(), c.comm.rank());
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
        // SAFETY: the caller's contract (null is refused inside).
        let n = unsafe { comm.as_ref() }.map_or(0, |c| c.comm.nranks());
        let total = n.saturating_mul(count);
        collective("ncclAlltoAll", Kind::AllToAll, unless_same(sendbuff, recvbuff, total),
            (recvbuff, total), datatype, None, 0, comm, stream)
    }
}
