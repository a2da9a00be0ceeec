//! `ncclGroupStart` / `ncclGroupEnd` / `ncclGroupSimulateEnd`,
//! `ncclSend` / `ncclRecv`, and how every call runs.
//!
//! Between `ncclGroupStart` and `ncclGroupEnd` (nested: the outermost pair
//! counts) this thread's calls are checked and kept, not run. At the end
//! each communicator's calls run as one oxccl group — its sends and
//! receives posted at once, its collectives in the order given — and the
//! communicators' groups run at the same time, so one thread may drive
//! several ranks (NCCL's one-process, many-devices pattern). Communicators
//! created inside the group are made meanwhile, and the end waits for
//! them (not for those of a non-blocking configuration: it returns
//! `ncclInProgress` while one is still being made). A send or receive
//! outside a group is a group of one; a collective outside a group is a
//! plain call.

use crate::comm::{get, ncclComm, ncclComm_t, Slot};
use crate::export;
use crate::memory::{copy, cudaStream_t, wait_stream};
use crate::redop::{scale, Scalar};
use crate::result::{ncclInProgress, run, Failure};
use oxccl::{DataType, Kind, MemorySpace, ReduceOp, Region};
use std::cell::RefCell;
use std::sync::Arc;

/// One piece of a call, decoded and checked.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    P2p {
        send: bool,
        region: Region,
        dtype: DataType,
        peer: usize,
    },
    Coll(Coll),
    /// `dst = src`, this rank's own part of a gather or scatter.
    Copy {
        dst: Region,
        src: Region,
    },
}

/// A collective, decoded and checked (oxccl's untyped form).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Coll {
    pub kind: Kind,
    pub send: Option<Region>,
    pub recv: Region,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
    /// A made operator's scalar: the input is multiplied by it first.
    pub premul: Option<Scalar>,
}

impl Coll {
    /// Run it on `c` now (complete when it returns).
    ///
    /// # Safety
    /// As [`Communicator::collective_regions`](oxccl::CoreCommunicator::collective_regions).
    unsafe fn run(&self, c: &oxccl::Communicator) -> oxccl::Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            c.collective_regions(
                self.kind, self.send, self.recv, self.dtype, self.op, self.root,
            )
        }
    }

    /// Add it to group `g`.
    ///
    /// # Safety
    /// As `Group::collective_regions`, until the group completes.
    unsafe fn add_to(&self, g: &mut oxccl::Group<'_>) -> oxccl::Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            g.collective_regions(
                self.kind, self.send, self.recv, self.dtype, self.op, self.root,
            )
        }
    }
}

/// What `ncclGroupEnd` waits for besides the calls: communicators being
/// made, a split this rank opts out of.
type Task = Box<dyn FnOnce() -> Result<(), Failure>>;

/// This thread's open group: its depth, the calls kept so far, the tasks.
#[derive(Default)]
struct Open {
    depth: usize,
    /// Each call's communicator, piece and stream (as an address).
    calls: Vec<(*mut ncclComm, Op, usize)>,
    tasks: Vec<Task>,
    /// Non-blocking communicators being made (not waited for).
    pending: Vec<Arc<Slot>>,
}

thread_local! {
    static GROUP: RefCell<Open> = RefCell::new(Open::default());
}

/// Whether this thread is inside `ncclGroupStart` .. `ncclGroupEnd`.
pub(crate) fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// A communicator being made inside the group: `ncclGroupEnd` waits for
/// it, unless it is non-blocking.
pub(crate) fn defer_creation(slot: Arc<Slot>, nonblocking: bool) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if nonblocking {
            g.pending.push(slot);
        } else {
            g.tasks.push(Box::new(move || {
                slot.wait().as_ref().map(|_| ()).map_err(Clone::clone)
            }));
        }
    });
}

/// Run `task` on a thread of its own; `ncclGroupEnd` waits for it.
pub(crate) fn defer_task(
    task: impl FnOnce() -> Result<(), Failure> + Send + 'static,
) -> Result<(), Failure> {
    let t = std::thread::Builder::new()
        .name("oxccl-nccl-task".into())
        .spawn(task)
        .map_err(|e| {
            Failure::new(
                crate::result::ncclSystemError,
                format!("cannot start a thread: {e}"),
            )
        })?;
    GROUP.with(|g| {
        g.borrow_mut().tasks.push(Box::new(move || {
            t.join().unwrap_or_else(|_| {
                Err(Failure::new(
                    crate::result::ncclInternalError,
                    "a group task panicked",
                ))
            })
        }))
    });
    Ok(())
}

impl Op {
    /// The memory this piece touches.
    fn regions(&self) -> Vec<Region> {
        match *self {
            Op::P2p { region, .. } => vec![region],
            Op::Coll(c) => c.send.into_iter().chain([c.recv]).collect(),
            Op::Copy { dst, src } => vec![dst, src],
        }
    }
}

/// The one memory space of a call's pieces (host when they touch none).
fn space_of_call(ops: &[Op]) -> Result<MemorySpace, Failure> {
    let mut space = None;
    for r in ops.iter().flat_map(Op::regions).filter(|r| r.len > 0) {
        match space {
            None => space = Some(r.space),
            Some(s) if s == r.space => {}
            Some(s) => {
                return Err(Failure::usage(format!(
                    "the call's buffers are in {s:?} and in {:?}: all must be host memory \
                     or memory of one device",
                    r.space
                )))
            }
        }
    }
    Ok(space.unwrap_or(MemorySpace::Host))
}

/// Run `ops` (one call's pieces) on `comm` now, or keep them for
/// `ncclGroupEnd` inside a group ([`crate::memory`] says how `stream`
/// orders them).
///
/// # Safety
/// `comm` is from this library, not destroyed; `stream` is NULL or a
/// stream of the program's; the memory of `ops` stays valid until the
/// call (or its group) completes.
pub(crate) unsafe fn submit(
    comm: ncclComm_t,
    ops: &[Op],
    stream: cudaStream_t,
) -> Result<(), Failure> {
    let space = space_of_call(ops)?;
    let kept = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.calls
                .extend(ops.iter().map(|o| (comm, *o, stream as usize)));
            true
        } else {
            false
        }
    });
    if kept {
        return Ok(());
    }
    match (space, ops) {
        // A collective on device memory alone is queued on its stream.
        #[cfg(feature = "cuda")]
        (MemorySpace::Device { ordinal, .. }, [Op::Coll(c)]) if c.premul.is_none() => {
            // SAFETY: the caller's contract.
            let e = unsafe { crate::comm::engine(comm, ordinal) }?;
            // SAFETY: the program's stream of this device (its contract).
            let s = unsafe { crate::memory::cuda::borrowed(e.cuda.context(), stream) };
            let bytes = |r: Region| (r.addr as u64, r.len);
            // SAFETY: the caller's contract: the memory stays valid until
            // the stream passes the call.
            let w = unsafe {
                e.cuda.enqueue_raw(
                    c.kind,
                    c.send.map(bytes),
                    bytes(c.recv),
                    c.dtype,
                    c.op,
                    c.root,
                    &s,
                )
            }?;
            e.keep(w);
            Ok(())
        }
        // A collective on host memory alone is a plain call (no group to
        // set up), after its stream.
        (MemorySpace::Host, [Op::Coll(_)]) => {
            // SAFETY: the caller's contract.
            let c = unsafe { get(comm) }?;
            wait_stream(stream)?;
            let mut scratch = Vec::new();
            // SAFETY: the caller's contract.
            if let Some(Op::Coll(call)) = unsafe { prepare(ops[0], &mut scratch) }? {
                // SAFETY: the caller's contract (the call completes before
                // it returns); the scratch lives until then.
                unsafe { call.run(c) }?;
            }
            Ok(())
        }
        // SAFETY: the caller's contract.
        _ => unsafe {
            run_group(
                &ops.iter()
                    .map(|o| (comm, *o, stream as usize))
                    .collect::<Vec<_>>(),
            )
        },
    }
}

/// Make `op` ready to run: a pre-multiplied input scaled (into `scratch`
/// out of place), a copy done (`None`: nothing left to run).
///
/// # Safety
/// As [`submit`].
unsafe fn prepare(op: Op, scratch: &mut Vec<Vec<u64>>) -> Result<Option<Op>, Failure> {
    match op {
        Op::Copy { dst, src } => {
            // SAFETY: the caller's contract: both are valid for their
            // length (equal), in one space.
            unsafe { copy(dst.space, dst.addr, src.addr, dst.len) }?;
            Ok(None)
        }
        Op::Coll(c) if c.premul.is_some() && c.recv.space != MemorySpace::Host => {
            Err(Failure::usage(
                "a PreMulSum operator on device memory: its scaling runs on the host only, for now",
            ))
        }
        Op::Coll(
            c @ Coll {
                send,
                recv,
                dtype,
                premul: Some(s),
                ..
            },
        ) => {
            let send = match send {
                // In place: the input is overwritten by the result anyway.
                None => {
                    // SAFETY: the caller's contract.
                    unsafe { scale(recv.addr, recv.len, dtype, s) };
                    None
                }
                Some(src) => {
                    let mut copy = vec![0u64; src.len.div_ceil(8)];
                    // SAFETY: `src` is valid for its length (the caller's
                    // contract); the copy has room for it.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src.addr as *const u8,
                            copy.as_mut_ptr() as *mut u8,
                            src.len,
                        )
                    };
                    let addr = copy.as_mut_ptr() as usize;
                    // SAFETY: the copy is ours, 8-byte aligned.
                    unsafe { scale(addr, src.len, dtype, s) };
                    scratch.push(copy);
                    Some(Region {
                        space: MemorySpace::Host,
                        addr,
                        len: src.len,
                    })
                }
            };
            Ok(Some(Op::Coll(Coll {
                send,
                premul: None,
                ..c
            })))
        }
        other => Ok(Some(other)),
    }
}

/// Run `calls` (each on its communicator, after its stream) as one group
/// per communicator, all at once; the first error.
///
/// # Safety
/// As [`submit`], for every call.
unsafe fn run_group(calls: &[(ncclComm_t, Op, usize)]) -> Result<(), Failure> {
    let mut comms: Vec<ncclComm_t> = Vec::new();
    let mut streams: Vec<usize> = Vec::new();
    for (c, _, s) in calls {
        if !comms.contains(c) {
            comms.push(*c);
        }
        if !streams.contains(s) {
            streams.push(*s);
        }
    }
    // Check every communicator before anything runs.
    for c in &comms {
        // SAFETY: the caller's contract.
        unsafe { get(*c) }?;
    }
    // The inputs are ready once their streams are.
    for s in streams {
        wait_stream(s as cudaStream_t)?;
    }
    let mut scratch = Vec::new();
    let mut works = Vec::new();
    for c in comms {
        // SAFETY: checked above.
        let comm = unsafe { get(c) }?;
        let mut mine = Vec::new();
        for (_, op, _) in calls.iter().filter(|(k, _, _)| *k == c) {
            #[cfg(feature = "cuda")]
            if let MemorySpace::Device { ordinal, .. } = space_of_call(&[*op])? {
                // The device's engine moves and reduces its memory.
                // SAFETY: the caller's contract.
                unsafe { crate::comm::engine(c, ordinal) }?;
            }
            // SAFETY: the caller's contract.
            mine.extend(unsafe { prepare(*op, &mut scratch) }?);
        }
        works.push(comm.group_async((), move |g, _| {
            for op in mine {
                // SAFETY: the caller's contract: the memory stays valid
                // until this group completes (waited for below; the
                // scratch lives until then too).
                unsafe {
                    match op {
                        Op::P2p {
                            send,
                            region,
                            dtype,
                            peer,
                        } => g.p2p_region(send, region, dtype, peer),
                        Op::Coll(c) => c.add_to(g),
                        Op::Copy { .. } => Ok(()),
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
    drop(scratch);
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

/// Close one level of this thread's group: at the outermost, what it kept.
fn close() -> Result<Option<Open>, Failure> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(Failure::usage("ncclGroupEnd without ncclGroupStart")),
            1 => Ok(Some(std::mem::take(&mut *g))),
            _ => {
                g.depth -= 1;
                Ok(None)
            }
        }
    })
}

export! {
    /// `ncclGroupEnd`: at the outermost end, run the calls kept and wait
    /// for the communicators made in the group.
    fn ncclGroupEnd / pncclGroupEnd() {
        run("ncclGroupEnd", || {
            let Some(open) = close()? else { return Ok(()) };
            let mut first = None;
            for t in open.tasks {
                if let Err(e) = t() {
                    first.get_or_insert(e);
                }
            }
            if let Some(e) = first {
                return Err(e);
            }
            // SAFETY: every call was submitted under the contract of its
            // entry point; its memory is valid until now.
            unsafe { run_group(&open.calls) }?;
            match open.pending.iter().any(|s| s.outcome().is_none()) {
                true => Err(Failure::new(ncclInProgress, "communicators are being created")),
                false => Ok(()),
            }
        })
    }
}

/// NCCL's `ncclSimInfo_t`.
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub estimatedTime: f32,
}

/// `NCCL_SIM_INFO_INITIALIZER`'s magic.
const SIM_INFO_MAGIC: u32 = 0x7468_5283;

export! {
    /// `ncclGroupSimulateEnd`: end the group without running it. NCCL
    /// estimates the group's time from its GPU model; oxccl's estimate
    /// needs the job's hosts and links (`oxccl-sim`), which a group of
    /// calls does not carry, so the calls are dropped and the answer is
    /// `ncclInvalidUsage` rather than a made-up time.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) {
        run("ncclGroupSimulateEnd", || {
            // SAFETY: NULL or the caller's struct.
            if let Some(s) = unsafe { simInfo.as_ref() } {
                if s.magic != SIM_INFO_MAGIC {
                    return Err(Failure::invalid("simInfo is not initialized with NCCL_SIM_INFO_INITIALIZER"));
                }
            }
            close()?;
            Err(Failure::usage(
                "no time estimate: oxccl predicts times with oxccl-sim from the job's \
                 topology (see `oxccl-sim`), not per group; the group was dropped",
            ))
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
        crate::memory::check_stream(stream)?;
        let dtype = crate::types::data_type(datatype)?;
        let what = if send { "sendbuff" } else { "recvbuff" };
        let region = crate::coll::region(what, buf, count, dtype)?;
        let peer = crate::comm::count("peer", peer)?;
        // SAFETY: the caller's contract.
        unsafe {
            submit(
                comm,
                &[Op::P2p {
                    send,
                    region,
                    dtype,
                    peer,
                }],
                stream,
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
