//! Runs a [`Schedule`]: the only place where schedules meet bytes.
//!
//! One thread drives a call. Message steps run over the links: each (peer,
//! stream) pair has a FIFO of sends and one of receives, in schedule order;
//! the k-th message to a peer travels on stream `k % streams`, so both
//! sides agree where each message goes without negotiating. Local steps
//! (copies, reductions, the division of `Avg`) and direct steps on mapped
//! memory (reading peers' registered buffers) are started on the compute
//! engine; direct reads of remote memory are started on the link to its
//! owner ([`crate::transport::OneSided`]); `Sync` steps are fences across
//! ranks ([`direct`]). Non-blocking writes and
//! reads advance whatever is ready; when nothing is, the thread sleeps in
//! `poll(2)` on the fds it needs (links with messages or one-sided reads
//! pending) plus the control connection (failure notices from other ranks),
//! the abort eventfd and the engine's completion fd, bounded by the call's
//! deadline.
//!
//! Every message starts with a 48-byte header naming the call (sequence
//! number, fingerprint), the message index and the payload length, so a
//! rank that runs a different call is reported as a mismatch and a stray
//! or truncated message can never be taken for data.

mod call;
mod direct;
mod handoff;
pub(crate) mod header;
pub(crate) mod small;

pub(crate) use call::{describe_call, CallCtx, CallName, SharedCache};

use direct::PeerSpan;
pub(crate) use direct::{buffer_ids, describe};
pub(crate) use direct::{
    copyin_memory, shared_bytes, DirectCtx, PlainReads, SyncFlags, COPYIN_MIN, FLAG_PAGE,
    SHARED_BYTES,
};
pub use header::{WireHeader, HEADER_LEN};

use crate::bootstrap::ControlEvent;
use crate::compute::{Compute, HostCompute, Pending};
use crate::error::{Error, Result};
use crate::mem::Region;
use crate::schedule::{Action, Schedule, Span, INPUT, OUTPUT, SCRATCH, SHARED, STAGE};
use crate::transport::{Link, Registration, Registry};
use crate::wait::{Sleep, Spin, Stop};
use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Streams per link the staging table is sized for.
pub const MAX_STREAMS: usize = 16;

/// The data-moving state a communicator owns between calls.
pub struct Net {
    /// One link per peer (None for self).
    pub links: Vec<Option<Box<dyn Link>>>,
    staging: Vec<Vec<u64>>,
    scratch: Vec<u64>,
    /// Host staging memory of staged schedules ([`STAGE`]) when the
    /// call's engine offers none of its own.
    stage: Vec<u64>,
    pollfds: Vec<libc::pollfd>,
    work: Work,
    /// The engines of local work: the host engine first, then any added
    /// for memory it cannot reach (a CUDA engine per device). A call runs
    /// on the first that reaches all its buffers.
    engines: Vec<Box<dyn Compute>>,
    /// Where scratch memory must be registered to receive one-sided reads
    /// (the registry of the transport serving direct access, when it is
    /// one-sided), and that registration.
    scratch_registry: Option<Arc<dyn Registry>>,
    scratch_reg: Option<Registration>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let links = self.links.iter().filter(|l| l.is_some()).count();
        f.debug_struct("Net").field("links", &links).finish()
    }
}

/// Per-call bookkeeping, kept between calls so that a call allocates
/// nothing once the communicator has warmed up (small-message latency).
#[derive(Default)]
struct Work {
    chans: Vec<Chan>,
    nchans: usize,
    msg_of: Vec<u32>,
    sent: Vec<u32>,
    recvd: Vec<u32>,
    locals: Vec<u32>,
    done: Vec<bool>,
    /// Sources of a reduction.
    srcs: Vec<Region>,
    /// Destinations of a fanned-out reduction.
    dsts: Vec<Region>,
    /// Local work an asynchronous engine has not completed yet.
    inflight: Vec<(u32, Pending)>,
    /// One-sided reads in flight: (step, peer, the read's ticket).
    remote: Vec<(u32, usize, u64)>,
    started: Vec<bool>,
    /// When each step started (ns on the trace's clock; with a trace only).
    began: Vec<u64>,
    /// How fast peers' staged pieces reach this rank: whether its staging
    /// writes stream (kept from call to call).
    handoff: handoff::Handoff,
}

impl Net {
    pub fn new(links: Vec<Option<Box<dyn Link>>>) -> Net {
        let n = links.len();
        Net {
            links,
            staging: (0..n * MAX_STREAMS).map(|_| Vec::new()).collect(),
            scratch: Vec::new(),
            stage: Vec::new(),
            pollfds: Vec::new(),
            work: Work::default(),
            engines: vec![Box::new(HostCompute::new())],
            scratch_registry: None,
            scratch_reg: None,
        }
    }

    /// Register scratch memory with `registry` whenever direct steps need
    /// it as a destination of one-sided reads.
    pub fn set_scratch_registry(&mut self, registry: Arc<dyn Registry>) {
        self.scratch_registry = Some(registry);
    }

    /// At least `bytes` of scratch memory, registered when one-sided reads
    /// may land in it (`register`).
    fn scratch_of(&mut self, bytes: usize, register: bool) -> Result<Region> {
        if self.scratch.len() * 8 < bytes {
            // Unregistered before the memory moves.
            self.scratch_reg = None;
            self.scratch.resize(bytes.div_ceil(8), 0);
        }
        if register && bytes > 0 && self.scratch_reg.is_none() {
            if let Some(r) = &self.scratch_registry {
                let all = Region::host_mut(crate::types::as_bytes_mut(&mut self.scratch[..]));
                self.scratch_reg = Some(Registration::new(r.clone(), all)?);
            }
        }
        Ok(Region::host_mut(
            &mut crate::types::as_bytes_mut(&mut self.scratch[..])[..bytes],
        ))
    }

    /// Add an engine for memory the earlier ones cannot reach.
    pub fn add_engine(&mut self, engine: Box<dyn Compute>) {
        self.engines.push(engine);
    }

    /// The engine of a call on `bufs`: the first that reaches every
    /// buffer, else the first that reaches every buffer holding bytes (an
    /// empty `&[]` beside device memory). Zero-length device buffers still
    /// go to their device's engine: a staged schedule copies them.
    /// The host engine (always the first).
    pub(crate) fn host_engine(&mut self) -> &mut dyn Compute {
        self.engines[0].as_mut()
    }

    pub(crate) fn engine_for(&self, bufs: &[Region]) -> Result<usize> {
        let all = |e: &dyn Compute| bufs.iter().all(|b| e.reaches(b.space));
        let full = |e: &dyn Compute| bufs.iter().all(|b| b.len == 0 || e.reaches(b.space));
        let found = (self.engines.iter().position(|e| all(e.as_ref())))
            .or_else(|| self.engines.iter().position(|e| full(e.as_ref())));
        if let Some(i) = found {
            return Ok(i);
        }
        let what = bufs
            .iter()
            .filter(|b| b.len > 0)
            .map(|b| format!("{} bytes of {}", b.len, b.space))
            .collect::<Vec<_>>()
            .join(" and ");
        let names = self
            .engines
            .iter()
            .map(|e| e.name())
            .collect::<Vec<_>>()
            .join(", ");
        Err(Error::Unsupported(format!(
            "no compute engine of this communicator reaches all of {what} (engines: {names}; device memory needs a device engine added, e.g. oxccl's cuda feature)"
        )))
    }

    /// At least `bytes` of host staging memory for the call's engine.
    fn stage_of(&mut self, engine: usize, bytes: usize) -> Result<Region> {
        if let Some(r) = self.engines[engine].staging(bytes)? {
            return Ok(r);
        }
        if self.stage.len() * 8 < bytes {
            self.stage.resize(bytes.div_ceil(8), 0);
        }
        Ok(Region::host_mut(
            &mut crate::types::as_bytes_mut(&mut self.stage[..])[..bytes],
        ))
    }

    /// Close every link (used on poison and drop).
    pub fn close_all(&mut self) {
        for l in self.links.iter_mut().flatten() {
            l.close();
        }
    }
}

/// Per (peer, stream) progress of one call.
struct Chan {
    peer: usize,
    stream: usize,
    sends: Vec<u32>,
    recvs: Vec<u32>,
    s_head: usize,
    s_off: usize,
    s_hdr: [u8; HEADER_LEN],
    r_head: usize,
    r_off: usize,
    r_hdr: [u8; HEADER_LEN],
}

/// The executor-owned memory of a call: scratch (in the engine's space)
/// and host staging.
#[derive(Clone, Copy)]
struct Owned {
    scratch: Region,
    stage: Region,
    shared: Region,
}

/// The memory of `sp`: a caller buffer, scratch or staging. Spans outside
/// their buffer are a schedule bug: they panic rather than touch memory.
fn region(bufs: &[Region], own: Owned, sp: Span, es: usize) -> Region {
    let base = match sp.buf {
        SCRATCH => own.scratch,
        STAGE => own.stage,
        SHARED => own.shared,
        b => bufs[b as usize],
    };
    base.sub(sp.off * es, sp.len * es)
}

/// Run `sched` with `bufs` indexed by [`BufId`] (INPUT and OUTPUT first) on
/// engine `engine` (the caller chose it with [`Net::engine_for`]).
///
/// [`BufId`]: crate::schedule::BufId
pub(crate) fn execute(
    sched: &Schedule,
    bufs: &[Region],
    net: &mut Net,
    engine: usize,
    cx: &mut CallCtx<'_>,
) -> Result<()> {
    let mut w = std::mem::take(&mut net.work);
    let r = execute_with(sched, bufs, net, engine, cx, &mut w);
    if r.is_err() {
        // Work still in flight must end before the caller's memory is
        // handed back; the call's own error stays the one reported.
        if let Err(e) = net.engines[engine].quiesce() {
            let name = net.engines[engine].name();
            tracing::warn!("oxccl: the {name} engine after a failed call: {e}");
        }
    }
    net.work = w;
    r
}

fn execute_with(
    sched: &Schedule,
    bufs: &[Region],
    net: &mut Net,
    engine: usize,
    cx: &mut CallCtx<'_>,
    w: &mut Work,
) -> Result<()> {
    let es = cx.dtype.size();
    let nsteps = sched.steps.len();
    if nsteps == 0 {
        return Ok(());
    }
    // Scratch memory in the engine's space (on the host: u64 keeps every
    // element type aligned, registered when one-sided reads may land in
    // it), and host staging for staged schedules.
    let scratch = match net.engines[engine].workspace(sched.scratch * es)? {
        Some(r) => r,
        None => net.scratch_of(sched.scratch * es, cx.direct.is_some())?,
    };
    let stage = net.stage_of(engine, sched.stage * es)?;
    let shared = match sched.shared {
        0 => Region::host_mut(&mut []),
        n => direct_ctx(cx)?.shared_own(n * es)?,
    };
    let own = Owned {
        scratch,
        stage,
        shared,
    };
    // Whether the call's output stays cached: what the ranks sharing this
    // rank's cache touch in the call fits it (`None`: no cache is known).
    // Then copies up to an eighth of the cache stay there too
    // (`keep_up_to`, `copy_into`).
    let fits = match (
        bufs.get(INPUT as usize),
        bufs.get(OUTPUT as usize),
        cx.cache,
    ) {
        (Some(i), Some(o), Some(cache)) => Some(!outgrows_cache(i, o, cache)),
        _ => None,
    };
    let keep_up_to = match (fits, cx.cache) {
        (Some(true), Some(cache)) => cache.bytes / 8,
        _ => 0,
    };
    // In a phased call (direct steps), what a copy moves from executor-owned
    // memory (shared, scratch) into the output is final; an output that
    // would not stay cached is better streamed past the cache (without
    // reading each line for ownership first).
    let stream_out = cx.direct.is_some()
        && match fits {
            Some(fits) => !fits,
            None => bufs
                .get(OUTPUT as usize)
                .is_some_and(|o| o.len >= kernels::copy::STREAM_MIN),
        };
    // Staging writes — into the copy-in's shared memory and into the rings
    // of links that copy through memory — stream while this rank's gauge
    // finds staged pieces crossing between caches (`handoff`), unless
    // `OXCCL_STAGE_WRITES` forces either way; a probe call measures (on
    // every rank at once: the call numbers and sizes are shared), one of
    // a few MiB or more until its judgements settle (`settling`).
    let biggest = bufs
        .iter()
        .take(OUTPUT as usize + 1)
        .map(|b| b.len)
        .max()
        .unwrap_or(0);
    let (probe, streams) = match cx.stage_writes {
        Some(forced) => (false, forced),
        None => (
            w.handoff.probing(cx.seq, biggest),
            w.handoff.streams(cx.seq, biggest),
        ),
    };
    let mut staging = Staging {
        probe,
        settling: probe && handoff::Handoff::settles_in_call(biggest),
        streams,
    };
    let judge = handoff::Handoff::judge_bytes(biggest);
    stage_writes_on_links(&mut net.links, staging.streams);
    // Which copies stream (`final_copy`): a local copy (`local`) may also
    // move the own input, unless peers read this rank's output during the
    // call, and then none of its local copies into it stream.
    let streams = |src: Span, dst: Span, local: bool| {
        stream_out
            && match local {
                true => !sched.output_read && final_copy(src, dst, true),
                false => final_copy(src, dst, false),
            }
    };

    // Assign every message its index and its (peer, stream) channel.
    w.nchans = 0;
    w.msg_of.clear();
    w.msg_of.resize(nsteps, 0);
    w.sent.clear();
    w.sent.resize(cx.nranks, 0);
    w.recvd.clear();
    w.recvd.resize(cx.nranks, 0);
    w.locals.clear();
    w.done.clear();
    w.done.resize(nsteps, false);
    w.started.clear();
    w.started.resize(nsteps, false);
    if cx.trace.is_some() {
        w.began.clear();
        w.began.resize(nsteps, 0);
    }
    w.inflight.clear();
    w.remote.clear();
    let Work {
        chans,
        nchans,
        msg_of,
        sent,
        recvd,
        locals,
        done,
        srcs,
        dsts,
        inflight,
        remote,
        started,
        began,
        handoff,
    } = w;
    // With a trace: step `i` starts now / ended now (a slice with its
    // peer and bytes).
    let trace = cx.trace;
    let begin = |began: &mut [u64], i: usize| {
        if let Some(t) = trace {
            began[i] = t.now();
        }
    };
    let ended = |began: &[u64], i: usize, bytes: usize| {
        if let Some(t) = trace {
            let action = &sched.steps[i].action;
            let peer = action.message_peer().or(match *action {
                Action::CopyFrom { peer, .. } | Action::CopyTo { peer, .. } => Some((peer, false)),
                _ => None,
            });
            let kind = crate::trace::StepKind::of(action);
            t.step(kind, i as u32, peer, bytes as u64, began[i]);
        }
    };
    let compute = &mut net.engines[engine];
    for (i, st) in sched.steps.iter().enumerate() {
        let Some((peer, is_send)) = st.action.message_peer() else {
            locals.push(i as u32);
            continue;
        };
        let link = net
            .links
            .get(peer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "schedule of {} talks to rank {peer}, which has no link",
                    cx.during
                ))
            })?;
        let counter = if is_send {
            &mut sent[peer]
        } else {
            &mut recvd[peer]
        };
        let msg = *counter;
        *counter += 1;
        let stream = msg as usize % link.streams().min(MAX_STREAMS);
        let c = match chans[..*nchans]
            .iter()
            .position(|c| c.peer == peer && c.stream == stream)
        {
            Some(c) => c,
            None => {
                let fresh = Chan {
                    peer,
                    stream,
                    sends: Vec::new(),
                    recvs: Vec::new(),
                    s_head: 0,
                    s_off: 0,
                    s_hdr: [0; HEADER_LEN],
                    r_head: 0,
                    r_off: 0,
                    r_hdr: [0; HEADER_LEN],
                };
                if *nchans < chans.len() {
                    // Reuse the slot and its lists' capacity.
                    let old = &mut chans[*nchans];
                    let (mut sends, mut recvs) = (
                        std::mem::take(&mut old.sends),
                        std::mem::take(&mut old.recvs),
                    );
                    sends.clear();
                    recvs.clear();
                    *old = Chan {
                        sends,
                        recvs,
                        ..fresh
                    };
                } else {
                    chans.push(fresh);
                }
                *nchans += 1;
                *nchans - 1
            }
        };
        if is_send {
            chans[c].sends.push(i as u32);
        } else {
            chans[c].recvs.push(i as u32);
        }
        msg_of[i] = msg;
    }

    let chans = &mut chans[..*nchans];
    // Room for every fd a wait can need (channels, control, abort, engine),
    // now: a call that first sleeps late must not allocate then.
    net.pollfds.clear();
    net.pollfds.reserve(chans.len() + cx.nranks + 3);
    let mut remaining = nsteps;
    let mut spin = Spin::new(cx.spin, cx.oversubscribed);
    // The peer (and phase) a `Sync` last found lagging.
    let mut lagged: Option<(usize, u32)> = None;
    // From the first sleep after progress stopped until something moves.
    let mut asleep: Option<Sleep> = None;
    let ready = |done: &[bool], i: u32| {
        sched.steps[i as usize]
            .deps
            .iter()
            .all(|d| done[*d as usize])
    };
    // `Sync` steps are fences: the next one waits for every earlier step,
    // and no later local step starts before it completed.
    let next_sync_from = |from: usize| {
        sched.steps[from..]
            .iter()
            .position(|s| s.action == Action::Sync)
            .map(|p| p + from)
    };
    let mut next_sync = next_sync_from(0);
    let mut first_local = 0;
    let mut syncs_passed: u32 = 0;
    let mut arrived = false;

    loop {
        let mut progressed = false;
        let mut sync_wait: Option<(usize, u32)> = None;

        // Asynchronous local work that completed.
        let mut k = 0;
        while k < inflight.len() {
            let (i, p) = inflight[k];
            if compute.poll(p)? {
                inflight.swap_remove(k);
                done[i as usize] = true;
                ended(began, i as usize, 0);
                remaining -= 1;
                progressed = true;
            } else {
                k += 1;
            }
        }
        // One-sided reads that completed.
        let mut k = 0;
        while k < remote.len() {
            let (i, peer, ticket) = remote[k];
            let os = net.links[peer].as_mut().and_then(|l| l.one_sided());
            match os.map(|os| os.reads_completed()) {
                Some(Ok(c)) if c > ticket => {
                    remote.swap_remove(k);
                    done[i as usize] = true;
                    ended(began, i as usize, 0);
                    remaining -= 1;
                    progressed = true;
                }
                Some(Ok(_)) => k += 1,
                Some(Err(e)) => return Err(cx.link_failed(peer, "reading its memory", e)),
                // A read was started on this link: it has one-sided reads.
                None => {
                    return Err(Error::Protocol(format!(
                        "{}: rank {peer}'s link lost its one-sided reads (internal error)",
                        cx.during
                    )))
                }
            }
        }

        // Local steps whose inputs are ready.
        // Local steps are listed in schedule order: the scan starts at the
        // first one not done and stops past the next `Sync` (nothing passes
        // it), so a long schedule of pieces costs no quadratic scanning.
        while first_local < locals.len() && done[locals[first_local] as usize] {
            first_local += 1;
        }
        for &i in locals[first_local..].iter() {
            let iu = i as usize;
            if next_sync.is_some_and(|s| iu > s) {
                break;
            }
            if done[iu] || started[iu] || !ready(done, i) {
                continue;
            }
            if !arrived {
                begin(began, iu);
            }
            let timed = staging.probe.then(crate::sys::Stamp::now);
            let pending = match sched.steps[iu].action {
                Action::Copy { src, dst }
                    if streams(src, dst, true) || (dst.buf == SHARED && staging.streams) =>
                {
                    compute.copy_final(region(bufs, own, dst, es), region(bufs, own, src, es))?
                }
                Action::Copy { src, dst } => copy_into(
                    compute.as_mut(),
                    keep_up_to,
                    region(bufs, own, dst, es),
                    region(bufs, own, src, es),
                )?,
                Action::Divide { dst } => {
                    compute.divide(cx.dtype, region(bufs, own, dst, es), cx.nranks)?
                }
                Action::Reduce { dst, a, b } => {
                    srcs.clear();
                    srcs.push(region(bufs, own, a, es));
                    srcs.push(region(bufs, own, b, es));
                    compute.reduce(cx.dtype, cx.op, region(bufs, own, dst, es), srcs)?
                }
                Action::Combine {
                    dst,
                    input,
                    slots,
                    me,
                } => {
                    srcs.clear();
                    for k in 0..cx.nranks {
                        let sp = if k == me {
                            input
                        } else {
                            Span::new(slots.buf, slots.off + k * dst.len, dst.len)
                        };
                        srcs.push(region(bufs, own, sp, es));
                    }
                    compute.reduce(cx.dtype, cx.op, region(bufs, own, dst, es), srcs)?
                }
                Action::ReduceFrom {
                    dst,
                    src,
                    own: mine,
                    also,
                } => {
                    let dx = direct_ctx(cx)?;
                    let at = region(bufs, own, src, es);
                    srcs.clear();
                    for k in 0..cx.nranks {
                        if k == cx.rank {
                            srcs.push(region(bufs, own, mine, es));
                            continue;
                        }
                        match dx.peer_span(src.buf, at, k)? {
                            PeerSpan::Mapped(r) => srcs.push(r),
                            PeerSpan::Remote(_) | PeerSpan::Process { .. } => {
                                return Err(Error::Protocol(format!(
                                    "schedule of {} reduces memory this process does not map (one-sided schedules read it into scratch; internal error)",
                                    cx.during
                                )))
                            }
                        }
                    }
                    let to = region(bufs, own, dst, es);
                    match also {
                        // The own output first: streamed when final.
                        Some(a) => {
                            // The staged copy peers read streams too when
                            // the hand-offs' gauge says so: streamed
                            // destinations go first.
                            let also = region(bufs, own, a, es);
                            let out = stream_out && a.buf == OUTPUT;
                            let staged = dst.buf == SHARED && staging.streams;
                            let (first, second) = match !out && staged {
                                true => (to, also),
                                false => (also, to),
                            };
                            dsts.clear();
                            dsts.push(first);
                            dsts.push(second);
                            let streamed = usize::from(out) + usize::from(staged);
                            compute.reduce_fanout(cx.dtype, cx.op, dsts, srcs, streamed)?
                        }
                        None => compute.reduce(cx.dtype, cx.op, to, srcs)?,
                    }
                }
                Action::ReduceToAll {
                    dst,
                    src,
                    own: mine,
                } => {
                    let dx = direct_ctx(cx)?;
                    let (at, to) = (region(bufs, own, src, es), region(bufs, own, dst, es));
                    srcs.clear();
                    dsts.clear();
                    for k in 0..cx.nranks {
                        if k == cx.rank {
                            srcs.push(region(bufs, own, mine, es));
                            dsts.push(to);
                            continue;
                        }
                        match (dx.peer_span(src.buf, at, k)?, dx.peer_span(dst.buf, to, k)?) {
                            (PeerSpan::Mapped(from), PeerSpan::Mapped(into)) => {
                                srcs.push(from);
                                dsts.push(into);
                            }
                            _ => {
                                return Err(Error::Protocol(format!(
                                    "schedule of {} writes rank {k}'s memory through a one-sided link, which only reads (internal error)",
                                    cx.during
                                )))
                            }
                        }
                    }
                    let streamed = match stream_out && dst.buf == OUTPUT {
                        true => dsts.len(),
                        false => 0,
                    };
                    compute.reduce_fanout(cx.dtype, cx.op, dsts, srcs, streamed)?
                }
                Action::CopyFrom { peer, src, dst } => {
                    let dx = direct_ctx(cx)?;
                    let to = region(bufs, own, dst, es);
                    match dx.peer_span(src.buf, region(bufs, own, src, es), peer)? {
                        PeerSpan::Mapped(from) if streams(src, dst, false) => {
                            compute.copy_final(to, from)?
                        }
                        PeerSpan::Mapped(from) => {
                            copy_into(compute.as_mut(), keep_up_to, to, from)?
                        }
                        PeerSpan::Process { pid, addr } => {
                            if !to.space.is_host() {
                                return Err(Error::Protocol(format!(
                                    "schedule of {} copies a peer's plain buffer into memory the kernel cannot write (internal error)",
                                    cx.during
                                )));
                            }
                            // SAFETY: `to` is host memory of the call's
                            // buffers or scratch, alive for the call, and
                            // no other step touches it meanwhile (the
                            // schedule's dependencies, checked
                            // symbolically).
                            let read =
                                unsafe { crate::sys::read_process(pid, addr, to.ptr(), to.len) };
                            if let Err(e) = read {
                                // Its process gone (or exiting, its memory
                                // released): lost, as a closed link says;
                                // else the kernel refused (rights).
                                let gone = crate::sys::read_found_exited(&e)
                                    || crate::sys::process_gone(pid);
                                return Err(match gone {
                                    true => {
                                        cx.lost(peer, format!("reading its buffer failed: {e}"))
                                    }
                                    false => Error::Transport {
                                        peer,
                                        world_peer: peer,
                                        detail: format!(
                                            "reading its buffer during {}: {e}",
                                            cx.during
                                        ),
                                    },
                                });
                            }
                            Pending::DONE
                        }
                        PeerSpan::Remote(from) => {
                            let Some(os) = net.links[peer].as_mut().and_then(|l| l.one_sided())
                            else {
                                return Err(Error::Protocol(format!(
                                    "schedule of {} reads rank {peer}'s memory, but the link to it has no one-sided reads (internal error)",
                                    cx.during
                                )));
                            };
                            // SAFETY: `to` is the call's buffer or scratch,
                            // alive for the call; no other step touches it
                            // before this one completes (the schedule's
                            // dependencies, checked symbolically), and a
                            // failed call closes the link, ending the read.
                            let ticket = match unsafe { os.start_read(to, from) } {
                                Ok(t) => t,
                                Err(e) => {
                                    return Err(cx.link_failed(peer, "reading its memory", e))
                                }
                            };
                            started[iu] = true;
                            remote.push((i, peer, ticket));
                            progressed = true;
                            continue;
                        }
                    }
                }
                Action::CopyTo { peer, src, dst } => {
                    let dx = direct_ctx(cx)?;
                    let from = region(bufs, own, src, es);
                    match dx.peer_span(dst.buf, region(bufs, own, dst, es), peer)? {
                        PeerSpan::Mapped(to) if streams(src, dst, false) => compute.copy_final(to, from)?,
                        PeerSpan::Mapped(to) => copy_into(compute.as_mut(), keep_up_to, to, from)?,
                        PeerSpan::Remote(_) | PeerSpan::Process { .. } => {
                            return Err(Error::Protocol(format!(
                                "schedule of {} writes rank {peer}'s memory, which this rank can only read (a one-sided link, or the peer's plain buffer; internal error)",
                                cx.during
                            )))
                        }
                    }
                }
                Action::Sync => {
                    // The fence: checked until this rank arrives, not on
                    // every retry while it waits for its peers.
                    if !arrived && !done[..iu].iter().all(|d| *d) {
                        continue;
                    }
                    let (me, n) = (cx.rank, cx.nranks);
                    let first = (syncs_passed == 0).then_some((cx.fp, cx.seq));
                    if first.is_some() && !arrived {
                        // Peers read this rank's buffers once it arrives:
                        // a device engine may still be waiting for the
                        // caller's stream to finish writing them (a
                        // stream-ordered call), so its queue drains first,
                        // within the call's deadline (immediate for the CPU
                        // engine).
                        let fence = compute.fence()?;
                        let mut sleep = None;
                        while !compute.poll(fence)? {
                            let sleep = sleep.get_or_insert_with(|| Sleep::new(cx.deadline()));
                            if let Err(stop) = sleep.look(cx.aborted, cx.control.is_gone()) {
                                return Err(cx.stopped(stop, |cx| {
                                    (
                                        format!(
                                            "this rank's {} engine to finish the work {} waits for (the caller's stream)",
                                            compute.name(),
                                            cx.during
                                        ),
                                        None,
                                    )
                                }));
                            }
                            std::thread::yield_now();
                        }
                    }
                    let dx = direct_ctx(cx)?;
                    let target = dx.base.wrapping_add(syncs_passed + 1);
                    if !arrived {
                        direct::arrive(dx, me, target, first)?;
                        arrived = true;
                        progressed = true;
                    }
                    match direct::lagging(dx, me, n, target, first)? {
                        Some(peer) => {
                            // Another peer lags now: the one before
                            // arrived, which is movement (the spin starts
                            // again: the rest may be microseconds away).
                            progressed |= lagged.is_some_and(|l| l != (peer, target));
                            lagged = Some((peer, target));
                            sync_wait = Some((peer, target));
                        }
                        None => {
                            done[iu] = true;
                            ended(began, iu, 0);
                            remaining -= 1;
                            progressed = true;
                            syncs_passed += 1;
                            arrived = false;
                            next_sync = next_sync_from(iu + 1);
                        }
                    }
                    continue;
                }
                _ => unreachable!("message steps run on channels"),
            };
            if let Some(t0) = timed {
                handoff_step(handoff, &sched.steps[iu].action, es, t0, staging.streams);
                // Judged here too, not only when the rank waits: a rank
                // whose peers are always ahead would run its whole call
                // before looking.
                staging.settle(handoff, judge, &mut net.links);
            }
            progressed = true;
            if compute.poll(pending)? {
                done[iu] = true;
                ended(began, iu, 0);
                remaining -= 1;
            } else {
                started[iu] = true;
                inflight.push((i, pending));
            }
        }

        for ch in chans.iter_mut() {
            // Sends, in order, as far as the socket takes them.
            while ch.s_head < ch.sends.len() {
                let i = ch.sends[ch.s_head];
                if !ready(done, i) {
                    break;
                }
                let Action::Send { src, .. } = sched.steps[i as usize].action else {
                    unreachable!()
                };
                let r = region(bufs, own, src, es);
                let (p, n) = (r.ptr(), r.len);
                if ch.s_off == 0 {
                    ch.s_hdr = cx.header(msg_of[i as usize], n);
                    begin(began, i as usize);
                }
                // SAFETY: the span was bounds-checked by `mem`; the caller keeps the
                // buffer alive and unmodified for the call.
                let payload = unsafe { std::slice::from_raw_parts(p, n) };
                let link = net.links[ch.peer].as_mut().unwrap();
                let t0 =
                    (staging.probe && link.copies_through_memory()).then(crate::sys::Stamp::now);
                let r = {
                    if ch.s_off < HEADER_LEN {
                        link.write(
                            ch.stream,
                            &[IoSlice::new(&ch.s_hdr[ch.s_off..]), IoSlice::new(payload)],
                        )
                    } else {
                        link.write(
                            ch.stream,
                            &[IoSlice::new(&payload[ch.s_off - HEADER_LEN..])],
                        )
                    }
                };
                match r {
                    Ok(k) => {
                        if let Some(t0) = t0.filter(|_| k > 0) {
                            handoff.wrote(
                                k,
                                crate::sys::Stamp::now().ns_since(t0),
                                staging.streams,
                            );
                            // Judged here too, and after each read: a
                            // rank's writes may run a whole call's share
                            // ahead of its reads (`Handoff::open_writes`).
                            staging.settle(handoff, judge, &mut net.links);
                        }
                        ch.s_off += k;
                        progressed |= k > 0;
                        if ch.s_off == HEADER_LEN + n {
                            ch.s_off = 0;
                            ch.s_head += 1;
                            done[i as usize] = true;
                            ended(began, i as usize, n);
                            remaining -= 1;
                        } else {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let peer = ch.peer;
                        return Err(cx.link_failed(peer, "sending to it", e));
                    }
                }
            }
            // Receives, in order.
            while ch.r_head < ch.recvs.len() {
                let i = ch.recvs[ch.r_head];
                if !ready(done, i) {
                    break;
                }
                let (dst, reduce_with) = match sched.steps[i as usize].action {
                    Action::Recv { dst, .. } => (dst, None),
                    Action::RecvReduce { dst, with, .. } => (dst, Some(with)),
                    _ => unreachable!(),
                };
                let dreg = region(bufs, own, dst, es);
                let (dptr, n) = (dreg.ptr(), dreg.len);
                // Reductions land in a staging slot first; plain receives go
                // straight into the destination.
                let target = if reduce_with.is_some() {
                    let st = &mut net.staging[ch.peer * MAX_STREAMS + ch.stream];
                    if st.len() * 8 < n {
                        st.resize(n.div_ceil(8), 0);
                    }
                    st.as_mut_ptr() as *mut u8
                } else {
                    dptr
                };
                // SAFETY: `target` has at least n bytes (destination span checked by
                // `mem`, or the staging slot sized above) and nothing else aliases it now.
                let payload = unsafe { std::slice::from_raw_parts_mut(target, n) };
                let link = net.links[ch.peer].as_mut().unwrap();
                let t0 =
                    (staging.probe && link.copies_through_memory()).then(crate::sys::Stamp::now);
                let r = {
                    if ch.r_off < HEADER_LEN {
                        let (h, _) = ch.r_hdr.split_at_mut(HEADER_LEN);
                        link.read(
                            ch.stream,
                            &mut [
                                IoSliceMut::new(&mut h[ch.r_off..]),
                                IoSliceMut::new(payload),
                            ],
                        )
                    } else {
                        link.read(
                            ch.stream,
                            &mut [IoSliceMut::new(&mut payload[ch.r_off - HEADER_LEN..])],
                        )
                    }
                };
                match r {
                    Ok(0) if HEADER_LEN + n > ch.r_off => {
                        let peer = ch.peer;
                        return Err(cx.lost(
                            peer,
                            "its connection closed (process exited or was killed)".into(),
                        ));
                    }
                    Ok(k) => {
                        if let Some(t0) = t0.filter(|_| k > 0) {
                            handoff.read(k, crate::sys::Stamp::now().ns_since(t0));
                            staging.settle(handoff, judge, &mut net.links);
                        }
                        let before = ch.r_off;
                        ch.r_off += k;
                        progressed |= k > 0;
                        if before == 0 && k > 0 {
                            begin(began, i as usize);
                        }
                        if before < HEADER_LEN && ch.r_off >= HEADER_LEN {
                            let (peer, hdr) = (ch.peer, ch.r_hdr);
                            cx.check_header(peer, &hdr, msg_of[i as usize], n)?
                        }
                        if ch.r_off == HEADER_LEN + n {
                            ch.r_off = 0;
                            ch.r_head += 1;
                            if let Some(with) = reduce_with {
                                // dst = with op incoming. The staging slot is
                                // reused by the next receive on this channel,
                                // so the engine must finish before then (the
                                // host engine always has).
                                srcs.clear();
                                srcs.push(region(bufs, own, with, es));
                                srcs.push(Region::host(
                                    // SAFETY: the staging slot holds n bytes.
                                    unsafe { std::slice::from_raw_parts(target, n) },
                                ));
                                let p = compute.reduce(cx.dtype, cx.op, dreg, srcs)?;
                                if !compute.poll(p)? {
                                    return Err(Error::Unsupported(format!(
                                        "compute engine {} completes reductions asynchronously; receive-reduce needs it synchronous",
                                        compute.name()
                                    )));
                                }
                            }
                            done[i as usize] = true;
                            ended(began, i as usize, n);
                            remaining -= 1;
                        } else {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let peer = ch.peer;
                        return Err(cx.link_failed(peer, "receiving from it", e));
                    }
                }
            }
        }

        if remaining == 0 {
            handoff.ended(staging.probe);
            return Ok(());
        }
        staging.settle(handoff, judge, &mut net.links);
        if progressed {
            spin.moved();
            asleep = None;
        } else {
            // Spin (yielding, so a peer sharing this core can run) for a
            // while before sleeping: a wake-up through poll costs far more
            // than a few retries when the data is microseconds away.
            if spin.turn() {
                if cx.aborted.load(Ordering::Relaxed) {
                    return Err(Error::Aborted {
                        by: None,
                        world_by: None,
                    });
                }
                continue;
            }
            let sleep = asleep.get_or_insert_with(|| Sleep::new(cx.deadline()));
            let waits = Waits {
                sync: sync_wait,
                compute: !inflight.is_empty(),
                remote,
            };
            let compute_fd = match inflight.is_empty() {
                true => None,
                false => compute.completion_fd()?,
            };
            // Armed, look once more (an eventcount): work that completed
            // before the engine cleared its fd would wake nobody.
            if compute_fd.is_some() {
                let mut any = false;
                for (_, p) in inflight.iter() {
                    any |= compute.poll(*p)?;
                }
                if any {
                    continue;
                }
            }
            wait(
                chans,
                done,
                sched,
                &mut net.links,
                &mut net.pollfds,
                compute_fd,
                cx,
                sleep,
                waits,
            )?;
        }
    }
}

/// Tell the links that copy through memory whether their staging writes
/// stream.
fn stage_writes_on_links(links: &mut [Option<Box<dyn Link>>], streams: bool) {
    for link in links.iter_mut().flatten() {
        if link.copies_through_memory() {
            link.stream_writes(streams);
        }
    }
}

/// How a call writes its staging, and whether it still probes.
struct Staging {
    /// The call times its copies for the hand-off gauge.
    probe: bool,
    /// The probe settles within the call (`Handoff::settle`).
    settling: bool,
    /// Staging writes (the copy-in's and the links') stream.
    streams: bool,
}

impl Staging {
    /// After a timed copy in a call that settles: once the gauge has
    /// settled (judgements of `judge` bytes) the rest of the call writes
    /// as it settled and times nothing; until then as its open judgement
    /// wants (`Handoff::open_writes`). The links are told of each turn.
    fn settle(
        &mut self,
        gauge: &mut handoff::Handoff,
        judge: u64,
        links: &mut [Option<Box<dyn Link>>],
    ) {
        if !self.settling {
            return;
        }
        let (streams, settled) = match gauge.settle(judge) {
            Some(streams) => (streams, true),
            None => (gauge.open_writes(judge), false),
        };
        if streams != self.streams {
            stage_writes_on_links(links, streams);
            self.streams = streams;
        }
        if settled {
            (self.settling, self.probe) = (false, false);
        }
    }
}

/// A probe's step `action`, started at `t0`, ended now: the gauge counts
/// this rank's copies into its staging (streamed or not: `streamed`) and
/// out of peers'.
fn handoff_step(
    gauge: &mut handoff::Handoff,
    action: &Action,
    es: usize,
    t0: crate::sys::Stamp,
    streamed: bool,
) {
    let ns = || crate::sys::Stamp::now().ns_since(t0);
    match *action {
        Action::Copy { dst, .. } if dst.buf == SHARED => gauge.wrote(dst.len * es, ns(), streamed),
        Action::CopyFrom { src, .. } if src.buf == SHARED => gauge.read(src.len * es, ns()),
        // Not reductions: they move several times the bytes they read
        // from peers, and would read as slow hand-offs on any placement.
        _ => {}
    }
}

/// Whether a copy from `src` into `dst` writes final output that nothing
/// reads back during the call, so that it may stream past the cache: out
/// of executor-owned memory (shared staging, scratch) into the output,
/// and, for a local copy (`own_input`) when peers do not read this rank's
/// output, from the own input (an all_to_all's own block, an all_gather's
/// own segment: 4 ranks, out of place, paired alternating runs, 0.91 /
/// 0.96 / 0.92 of the time at 1 / 2 / 4 MiB, faster in 9, 8 and 9 of 10
/// pairs; docs/PERFORMANCE.md, twelfth round). A copy out of a peer's
/// input stays cached below the streaming size (not measured streamed).
fn final_copy(src: Span, dst: Span, own_input: bool) -> bool {
    dst.buf == OUTPUT && (matches!(src.buf, SHARED | SCRATCH) || (own_input && src.buf == INPUT))
}

/// Start a copy that does not stream: kept in the cache up to
/// `keep_up_to` bytes (an eighth of the cache, where the call's buffers
/// fit it), else as the engine decides (the host engine streams from
/// [`kernels::copy::STREAM_MIN`]). Streamed, the 4 MiB own block of a
/// 2-rank all_gather of 8 MiB went to memory where the next call wanted
/// it from the 32 MiB cache: kept, the ring's call took 520-600 µs
/// against 690-760, and a 2-rank out-of-place broadcast of 4 MiB 250-300
/// against 300-400. Larger copies lost kept (the broadcast root's 6 MiB:
/// 390 µs against 300 streamed, the call 1.25x) or drew level (the 5
/// MiB block of a 10 MiB all_gather), though all these calls fit the
/// cache alike (alternating runs, docs/PERFORMANCE.md, sixteenth round).
fn copy_into(
    compute: &mut dyn Compute,
    keep_up_to: usize,
    dst: Region,
    src: Region,
) -> Result<Pending> {
    match dst.len.min(src.len) <= keep_up_to {
        true => compute.copy_kept(dst, src),
        false => compute.copy(dst, src),
    }
}

/// Whether the buffers of a call on the ranks that share this rank's
/// last-level cache (`cache`) together outgrow it: the next call then
/// finds none of the output cached anyway (4 ranks, 1 MiB out of place: 8
/// MiB of inputs and outputs in an 8 MiB cache). Streaming the output
/// there took 0.50-0.84 of the time of the copy-in all_reduce, all_to_all
/// and broadcast of 1-2 MiB on 2 and 4 ranks; below the cache it cost up
/// to 1.35 (in place). Until the fifteenth round outputs streamed from 4
/// MiB whatever the cache, which streamed in-place calls whose output had
/// just been read into a 32 MiB cache: cached, 2-rank copy-in all_reduces
/// of 4 and 8 MiB took 0.45-0.55x the time, the 4-rank 4 MiB one 0.7-0.8x
/// and the 4-rank 4 MiB all_to_all 0.5x (docs/PERFORMANCE.md, fifteenth
/// round). Without a known cache, phased calls stream outputs from
/// [`kernels::copy::STREAM_MIN`].
fn outgrows_cache(input: &Region, output: &Region, cache: SharedCache) -> bool {
    // In place one buffer lies in the other (an all_gather's input in its
    // output, a reduce_scatter's output in its input): count what they
    // span together once.
    let (i, o) = (input.ptr() as usize, output.ptr() as usize);
    let (i_end, o_end) = (i + input.len, o + output.len);
    let bytes = match i < o_end && o < i_end {
        true => i_end.max(o_end) - i.min(o),
        false => input.len + output.len,
    };
    bytes.saturating_mul(cache.ranks) >= cache.bytes
}

/// The call's direct-access context; a direct step without one is a bug.
fn direct_ctx<'a, 'b>(cx: &'b CallCtx<'a>) -> Result<&'b DirectCtx<'a>> {
    cx.direct.as_ref().ok_or_else(|| {
        Error::Protocol(format!(
            "schedule of {} has a direct-access step but the call has no direct access (internal error)",
            cx.during
        ))
    })
}

/// What an idle call waits for besides its channels.
struct Waits<'w> {
    /// A `Sync` waiting for this peer to reach this phase.
    sync: Option<(usize, u32)>,
    /// Local work of an asynchronous engine in flight.
    compute: bool,
    /// One-sided reads in flight (step, peer, ticket).
    remote: &'w [(u32, usize, u64)],
}

/// Sleep (see [`crate::wait`]) until a needed fd is ready, a notice
/// arrives, abort, the deadline, or the root gone too long; waiting on a
/// `Sync`, for one slice at most (a phase counter wakes no fd).
#[allow(clippy::too_many_arguments)]
fn wait(
    chans: &[Chan],
    done: &[bool],
    sched: &Schedule,
    links: &mut [Option<Box<dyn Link>>],
    pollfds: &mut Vec<libc::pollfd>,
    compute_fd: Option<RawFd>,
    cx: &mut CallCtx<'_>,
    sleep: &Sleep,
    waits: Waits<'_>,
) -> Result<()> {
    let ready = |i: u32| {
        sched.steps[i as usize]
            .deps
            .iter()
            .all(|d| done[*d as usize])
    };
    // What each channel waits for now: (read, write).
    let wants = |c: &Chan| {
        (
            c.r_head < c.recvs.len() && ready(c.recvs[c.r_head]),
            c.s_head < c.sends.len() && ready(c.sends[c.s_head]),
        )
    };
    // Links with one-sided reads pending wake stream 0's fd. (A peer is
    // listed once per read: arming twice is harmless.)
    let reading = |k: usize| waits.remote[..k].iter().all(|r| r.1 != waits.remote[k].1);
    // Let transports that wake pollers themselves ask for a wake-up first.
    let mut became_ready = false;
    for c in chans {
        let (r, w) = wants(c);
        if r || w {
            became_ready |= links[c.peer].as_mut().unwrap().arm(c.stream, r, w);
        }
    }
    for k in (0..waits.remote.len()).filter(|k| reading(*k)) {
        became_ready |= links[waits.remote[k].1]
            .as_mut()
            .unwrap()
            .arm(0, true, false);
    }
    if became_ready {
        return Ok(());
    }
    pollfds.clear();
    for c in chans {
        let (r, w) = wants(c);
        if r || w {
            let link = links[c.peer].as_ref().unwrap();
            pollfds.push(libc::pollfd {
                fd: link.fd(c.stream),
                events: link.poll_events(c.stream, r, w),
                revents: 0,
            });
        }
    }
    for k in (0..waits.remote.len()).filter(|k| reading(*k)) {
        let link = links[waits.remote[k].1].as_ref().unwrap();
        pollfds.push(libc::pollfd {
            fd: link.fd(0),
            events: link.poll_events(0, true, false),
            revents: 0,
        });
    }
    if waits.compute {
        if let Some(fd) = compute_fd {
            pollfds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
    }
    if pollfds.is_empty() {
        if let Some((peer, target)) = waits.sync {
            return sync_sleep(cx, sleep, peer, target);
        }
        if waits.compute {
            return Ok(()); // an engine without a completion fd: poll it again
        }
        return Err(Error::Protocol(format!(
            "schedule of {} cannot make progress (internal error)",
            cx.during
        )));
    }
    // The peers it sleeps on (each once), for the flight recorder and the
    // trace (whose slice ends when this function returns).
    let waited = chans.iter().enumerate().filter_map(|(i, c)| {
        let (r, w) = wants(c);
        let first = !chans[..i].iter().any(|o| {
            o.peer == c.peer && {
                let (r, w) = wants(o);
                r || w
            }
        });
        ((r || w) && first).then_some(c.peer)
    });
    let mut slice = WaitSlice::new(cx.trace);
    cx.sleeps_on(
        waited
            .chain(waits.remote.iter().map(|r| r.1))
            .inspect(|p| slice.on(*p)),
    );
    pollfds.push(libc::pollfd {
        fd: cx.control.fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    pollfds.push(libc::pollfd {
        fd: cx.abort_fd,
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        let mut limit = match sleep.look(cx.aborted, cx.control.is_gone()) {
            Ok(limit) => limit,
            Err(stop) => {
                // Described only now: waits are frequent, timeouts are not.
                return Err(cx.stopped(stop, |_| {
                    let mut waiting_for = Vec::new();
                    for c in chans {
                        let (r, w) = wants(c);
                        if w {
                            waiting_for.push(format!(
                                "rank {} to take data (stream {})",
                                c.peer, c.stream
                            ));
                        }
                        if r {
                            waiting_for
                                .push(format!("data from rank {} (stream {})", c.peer, c.stream));
                        }
                    }
                    for k in (0..waits.remote.len()).filter(|k| reading(*k)) {
                        let peer = waits.remote[k].1;
                        waiting_for.push(format!("a one-sided read of rank {peer}'s memory"));
                    }
                    let waits_on = chans
                        .iter()
                        .find(|c| wants(c) != (false, false))
                        .map(|c| c.peer)
                        .or(waits.remote.first().map(|r| r.1));
                    (waiting_for.join(", "), waits_on)
                }));
            }
        };
        if waits.sync.is_some() {
            limit = limit.min(direct::SLEEP_SLICE);
        }
        if crate::sys::poll(pollfds, limit) < 0 {
            continue; // EINTR
        }
        let nf = pollfds.len();
        if pollfds[nf - 1].revents != 0 {
            return Err(cx.stopped(Stop::Aborted, |_| (String::new(), None)));
        }
        if pollfds[nf - 2].revents != 0 {
            match cx.control.poll() {
                Some(ControlEvent::Notice(n)) => return Err(cx.notice_error(n)),
                Some(ControlEvent::RootGone) => {
                    // No more notices will come; the data links still tell.
                    pollfds[nf - 2].fd = -1;
                    tracing::info!(
                        "oxccl: lost the connection to the rendezvous root during {}; the call goes on while data moves",
                        cx.during
                    );
                }
                // Only a monitored barrier waits for releases.
                Some(ControlEvent::Released(_)) | None => {}
            }
        }
        // A `Sync` also waits on a phase counter: look at it again.
        if pollfds[..nf - 2].iter().any(|p| p.revents != 0) || waits.sync.is_some() {
            return Ok(());
        }
    }
}

/// A trace's slice of one sleep: from its creation until it is dropped,
/// naming the peers slept on (nothing without a trace).
struct WaitSlice<'a> {
    trace: Option<&'a crate::trace::Tracer>,
    start: u64,
    peers: [u32; 4],
    total: u32,
}

impl<'a> WaitSlice<'a> {
    fn new(trace: Option<&'a crate::trace::Tracer>) -> WaitSlice<'a> {
        WaitSlice {
            trace,
            start: trace.map_or(0, |t| t.now()),
            peers: [0; 4],
            total: 0,
        }
    }

    fn on(&mut self, peer: usize) {
        if let Some(p) = self.peers.get_mut(self.total as usize) {
            *p = peer as u32;
        }
        self.total += 1;
    }
}

impl Drop for WaitSlice<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.trace {
            let named = (self.total as usize).min(4);
            t.wait(self.start, &self.peers[..named], self.total);
        }
    }
}

/// One slice of waiting for `peer` to reach phase `target` (after the
/// looks every sleep makes), then whether a notice came and whether the
/// peer's process still exists.
fn sync_sleep(cx: &mut CallCtx<'_>, sleep: &Sleep, peer: usize, target: u32) -> Result<()> {
    if let Err(stop) = sleep.look(cx.aborted, cx.control.is_gone()) {
        return Err(cx.stopped(stop, |cx| {
            (
                format!("rank {peer} to reach phase {target} of {}", cx.during),
                Some(peer),
            )
        }));
    }
    cx.sleeps_on([peer]);
    let mut slice = WaitSlice::new(cx.trace);
    slice.on(peer);
    direct::sleep_on(direct_ctx(cx)?, peer, target)?;
    cx.after_slice(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::PeerInfo;

    #[test]
    fn outputs_stay_cached_while_the_host_ranks_buffers_fit_its_cache() {
        let cache = |ranks, mib: usize| SharedCache {
            bytes: mib << 20,
            ranks,
        };
        let mut out = vec![0u8; 1 << 20];
        let input = vec![0u8; 1 << 20];
        let (i, o) = (Region::host(&input), Region::host_mut(&mut out));
        // Out of place, 4 ranks: 8 MiB of inputs and outputs.
        assert!(outgrows_cache(&i, &o, cache(4, 8)));
        assert!(!outgrows_cache(&i, &o, cache(4, 16)));
        assert!(!outgrows_cache(&i, &o, cache(3, 8)));
        // In place (the input a segment of the output, as an all_gather's,
        // or all of it): the bytes count once.
        let seg = o.sub(256 << 10, 256 << 10);
        assert!(!outgrows_cache(&seg, &o, cache(4, 8)));
        assert!(!outgrows_cache(&o, &o, cache(4, 8)));
        assert!(outgrows_cache(&o, &o, cache(8, 8)));
        // A reduce_scatter's output in its input: 1 MiB a rank, not 1.25.
        assert!(!outgrows_cache(&o, &seg, cache(7, 8)));
        assert!(outgrows_cache(&o, &seg, cache(8, 8)));
    }

    #[test]
    fn the_shared_cache_is_the_least_of_the_ranks_on_this_host() {
        let peer = |rank, host_id, llc: Option<usize>| PeerInfo {
            rank,
            hostname: String::new(),
            host_id,
            pid: 0,
            addrs: Vec::new(),
            rescue: None,
            hosts_root: false,
            cpus: Vec::new(),
            llc,
        };
        let peers = [
            peer(0, 7, Some(32 << 20)),
            peer(1, 9, Some(1 << 20)),
            peer(2, 7, None),
            peer(3, 7, Some(16 << 20)),
        ];
        let shared = |bytes, ranks| Some(SharedCache { bytes, ranks });
        assert_eq!(SharedCache::of(&peers, 0), shared(16 << 20, 3));
        assert_eq!(SharedCache::of(&peers, 1), shared(1 << 20, 1));
        let unknown = [peer(0, 7, None), peer(1, 7, None)];
        assert_eq!(SharedCache::of(&unknown, 1), None);
        assert_eq!(SharedCache::of(&peers, 4), None);
    }

    #[test]
    fn only_copies_into_the_output_that_nothing_reads_back_are_final() {
        let span = |buf| Span::new(buf, 0, 64);
        // Out of staging or scratch into the output: final.
        for src in [SHARED, SCRATCH] {
            assert!(final_copy(span(src), span(OUTPUT), false));
            assert!(final_copy(span(src), span(OUTPUT), true));
        }
        // The own input into the output: only a local copy whose output
        // peers do not read (an all_to_all's own block, not a registered
        // broadcast root's output, nor a copy out of a peer's input).
        assert!(final_copy(span(INPUT), span(OUTPUT), true));
        assert!(!final_copy(span(INPUT), span(OUTPUT), false));
        // Into staging, scratch or the input: read again, never final.
        for dst in [SHARED, SCRATCH, INPUT] {
            for src in [INPUT, OUTPUT, SHARED, SCRATCH] {
                assert!(!final_copy(span(src), span(dst), true));
            }
        }
        assert!(!final_copy(span(OUTPUT), span(OUTPUT), true));
    }
}
