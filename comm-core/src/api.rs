//! The calls users make. Every collective takes buffers through the
//! [`Buffer`] / [`BufferMut`] traits (slices, `Vec`s, boxed slices, arrays,
//! [`SharedBuffer`](crate::SharedBuffer)s, user storage); one untyped entry
//! takes bytes + [`DataType`] for bindings; async calls take owned buffers
//! and give them back from [`Work`]. Arguments are checked here, before
//! anything is sent: a bad call returns `Error::InvalidArgument` (memory no
//! engine can reach: `Error::Unsupported`) and leaves the communicator
//! usable.
//!
//! Buffer conventions follow NCCL: `count` for all_gather is what each rank
//! contributes, for reduce_scatter what each rank receives. In-place
//! all_gather expects this rank's part at `buf[rank*count..]`; in-place
//! reduce_scatter leaves the result there.

use crate::call::{Fingerprint, Kind};
use crate::comm::{Communicator, Inner, State};
use crate::error::{Error, Result};
use crate::executor::small::{HostSpan, SmallArgs};
use crate::group::P2pOp;
use crate::mem::{Buffer, BufferMut, MemorySpace, Region};
use crate::types::{DataType, Element, ReduceOp};
use crate::work::Work;
use algorithms::CollSpec;

/// A collective as the argument checker and the planner see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Coll {
    kind: Kind,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    /// The NCCL-style count (see module docs).
    count: usize,
    in_place: bool,
}

impl Coll {
    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::new(self.kind, self.dtype, self.count)
            .with_op(self.op)
            .with_root(self.root)
    }

    /// The call as the small-message path sees it.
    fn small(&self) -> crate::executor::small::SmallCall {
        crate::executor::small::SmallCall {
            kind: self.kind,
            root: self.root,
            bytes: self.count * self.dtype.size(),
            avg: self.op == ReduceOp::Avg,
        }
    }

    /// The executor's (input, output) for the caller's buffers (`send:
    /// None`: in place): in place, all_gather's input is the output's
    /// segment `rank` and reduce_scatter's output the input's (`sub`:
    /// the bytes at an offset of a buffer; regions, or the small path's
    /// plain spans).
    #[inline(always)]
    fn buffers<B: Copy>(
        &self,
        rank: usize,
        send: Option<B>,
        recv: B,
        sub: impl Fn(B, usize, usize) -> B,
    ) -> (Option<B>, B) {
        let bytes = self.count * self.dtype.size();
        let mine = || sub(recv, rank * bytes, bytes);
        match (self.kind, send) {
            (_, Some(s)) => (Some(s), recv),
            (Kind::AllGather, None) => (Some(mine()), recv),
            (Kind::ReduceScatter, None) => (Some(recv), mine()),
            _ => (None, recv),
        }
    }
}

/// Elements of `dtype` in `r`, checking size and alignment.
#[inline(always)]
pub(crate) fn elems(what: &str, r: &Region, dtype: DataType) -> Result<usize> {
    whole(r.addr, r.len, dtype.size()).ok_or_else(|| not_whole(what, r, dtype))
}

/// Elements of `es` bytes in the `len` bytes at `addr`, if they are whole
/// and aligned.
#[inline(always)]
fn whole(addr: usize, len: usize, es: usize) -> Option<usize> {
    (len.is_multiple_of(es) && addr.is_multiple_of(es)).then_some(len / es)
}

/// Why `r` holds no whole number of aligned `dtype` elements.
#[cold]
#[inline(never)]
fn not_whole(what: &str, r: &Region, dtype: DataType) -> Error {
    let es = dtype.size();
    match r.len.is_multiple_of(es) {
        false => Error::invalid(format!(
            "{what} has {} bytes, not a multiple of {dtype}'s {es}",
            r.len
        )),
        true => Error::invalid(format!("{what} is not aligned to {es} bytes for {dtype}")),
    }
}

fn run_barrier(inner: &Inner, st: &mut State) -> Result<()> {
    let c = Coll {
        kind: Kind::Barrier,
        dtype: DataType::U8,
        op: ReduceOp::Sum,
        root: 0,
        count: 0,
        in_place: true,
    };
    run_coll(inner, st, &c, None, Region::EMPTY)
}

/// Plan and run one collective: the registry picks the algorithm for the
/// call's spec (direct access when every buffer is registered and mapped
/// by every peer), the executor runs its schedule.
/// A callback that runs exactly once: with the outcome, or, if dropped
/// unrun, with the error that the call never ran.
struct Finally(Option<AfterCall>);

/// What runs once a queued call is over (see
/// [`Communicator::collective_regions_async`]).
pub type AfterCall = Box<dyn FnOnce(&Result<()>) + Send>;
/// What runs on the worker just before a queued call.
pub type BeforeCall = Box<dyn FnOnce() -> Result<()> + Send>;

impl Finally {
    fn finish(mut self, r: &Result<()>) {
        if let Some(f) = self.0.take() {
            f(r)
        }
    }
}

impl Drop for Finally {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(&Err(Error::Aborted {
                by: None,
                world_by: None,
            }))
        }
    }
}

pub(crate) fn run_coll(
    inner: &Inner,
    st: &mut State,
    c: &Coll,
    send: Option<Region>,
    recv: Region,
) -> Result<()> {
    let input = send.unwrap_or(recv);
    // Small calls among ranks of one host skip the schedule: every rank
    // decides alike, from the call and the agreed settings (host memory
    // aside: a rank passing device memory takes the general path, and a
    // peer passing host memory then reports a mismatch). Registered
    // buffers are named as a direct call names them, so ranks passing
    // different ones disagree here too.
    let small = c.small();
    if st.small.is_some()
        && input.space.is_host()
        && recv.space.is_host()
        && crate::executor::small::eligible(&small, inner.nranks, inner.config.algo.is_some())
    {
        // Plain memory (nearly every small call) names no buffer and
        // needs no look at the registrations.
        let plain = |r: &Region| r.space == MemorySpace::Host;
        let ids = match plain(&input) && plain(&recv) {
            true => 0,
            false => small_ids(inner, st, c, send, recv),
        };
        let args = SmallArgs {
            call: small,
            ids,
            input: HostSpan::of(&input),
            output: HostSpan::of(&recv),
        };
        return inner.execute_small(st, c.fingerprint(), &args);
    }
    let direct = direct_access(inner, st, c, send, recv);
    let passed = || {
        [send, Some(recv)]
            .into_iter()
            .flatten()
            .filter(|r| !(r.space == MemorySpace::Host && r.len == 0))
    };
    // Links move host bytes: a call on memory the CPU cannot touch sends
    // and receives through host staging slots (direct calls never do).
    let staged =
        direct.is_none() && (inner.config.stage_always || passed().any(|r| !r.space.is_host()));
    // Plain host buffers of ranks that map each other's shared memory may
    // run copy-in schedules.
    let mapped = st.staging.is_some() && direct.is_none() && !staged;
    let shared = match mapped {
        true => crate::executor::shared_bytes(inner.nranks, st.copyin_memory) / c.dtype.size(),
        false => 0,
    };
    // And may copy from each other's (host memory, where the kernel lets
    // them).
    let plain_reads = mapped && st.plain_reads.is_some();
    let spec = CollSpec {
        kind: c.kind,
        rank: inner.rank,
        nranks: inner.nranks,
        count: c.count,
        root: c.root,
        avg: c.op == ReduceOp::Avg,
        in_place: c.in_place,
        chunk: inner.chunk_elems(c.dtype),
        elem_size: c.dtype.size(),
        direct,
        layout: inner.layout,
        shared,
        plain_reads,
    };
    let tuning = inner.tuning(st.single_copy_pays);
    let plan = st.schedule(&spec, staged, inner.config.algo.as_deref(), &tuning)?;
    inner.last_algorithm.store(
        plan.index.wrapping_add(1),
        std::sync::atomic::Ordering::Relaxed,
    );
    let bufs = [input, recv];
    inner.execute(st, c.fingerprint(), &plan.sched, &bufs, plan.direct)
}

/// Direct access when every buffer the call passes is registered and
/// mapped by every peer (an empty plain slice, like a non-root's `&[]`,
/// does not count; at least one buffer must be registered). A reduce's
/// output is the root's alone, which no peer reads: its input decides.
fn direct_access(
    inner: &Inner,
    st: &State,
    c: &Coll,
    send: Option<Region>,
    recv: Region,
) -> Option<crate::algorithms::Access> {
    let output = (c.kind != Kind::Reduce || send.is_none()).then_some(recv);
    let agreed = || {
        [send, output]
            .into_iter()
            .flatten()
            .filter(|r| !(r.space == MemorySpace::Host && r.len == 0))
    };
    inner
        .direct
        .as_ref()
        .filter(|_| agreed().next().is_some() && agreed().all(|r| st.is_direct(inner, &r)))
        .map(|d| d.access())
}

/// The registered buffers a small call names, as a direct call names
/// them (input id, output id; 0 unless the call could run direct).
fn small_ids(inner: &Inner, st: &State, c: &Coll, send: Option<Region>, recv: Region) -> u64 {
    if direct_access(inner, st, c, send, recv).is_none() {
        return 0;
    }
    let id = |r: &Region| {
        r.space
            .registration()
            .filter(|(comm, _)| *comm == inner.comm_id)
            .map_or(0, |(_, id)| id)
    };
    // (A reduce's output is the root's alone: not agreed on.)
    let output = match c.kind {
        Kind::Reduce => 0,
        _ => id(&recv),
    };
    id(&send.unwrap_or(recv)) << 32 | output & 0xffff_ffff
}

/// Which rule a call's buffer lengths break (made into an `Error` only
/// when a call fails, so that the check stays in registers).
#[derive(Clone, Copy, Debug)]
enum BadLength {
    Root,
    SendRecvDiffer,
    GatherRecv,
    ScatterSend,
    Indivisible(usize),
    RootSendRecvDiffer,
    RootRecv,
}

/// The NCCL-style count of a call whose buffers hold `send` and `recv`
/// elements (see the module docs), on rank `me` of `n`.
#[inline(always)]
fn count_of(
    kind: Kind,
    n: usize,
    me: usize,
    send: Option<usize>,
    recv: usize,
    root: usize,
) -> std::result::Result<usize, BadLength> {
    if matches!(kind, Kind::Broadcast | Kind::Reduce) && root >= n {
        return Err(BadLength::Root);
    }
    let same = |s: usize| match s == recv {
        true => Ok(recv),
        false => Err(BadLength::SendRecvDiffer),
    };
    let per_rank = |len: usize| match len.is_multiple_of(n) {
        true => Ok(len / n),
        false => Err(BadLength::Indivisible(len)),
    };
    match kind {
        Kind::AllReduce | Kind::Barrier => send.map_or(Ok(recv), same),
        Kind::AllGather => match send {
            Some(s) if s * n != recv => Err(BadLength::GatherRecv),
            Some(s) => Ok(s),
            None => per_rank(recv),
        },
        Kind::ReduceScatter => match send {
            Some(s) if s != recv * n => Err(BadLength::ScatterSend),
            Some(_) => Ok(recv),
            None => per_rank(recv),
        },
        Kind::AllToAll => send.map_or(Ok(recv), same).and_then(per_rank),
        Kind::Broadcast => match send {
            Some(s) if me == root && s != recv => Err(BadLength::RootSendRecvDiffer),
            _ => Ok(recv),
        },
        Kind::Reduce => match send {
            Some(s) if me == root && s != recv => Err(BadLength::RootRecv),
            Some(s) => Ok(s),
            None => Ok(recv),
        },
        Kind::P2p => Ok(recv),
    }
}

impl BadLength {
    /// The error a call with these lengths gets.
    #[cold]
    #[inline(never)]
    fn error(self, kind: Kind, n: usize, send: Option<usize>, recv: usize, root: usize) -> Error {
        let s = send.unwrap_or(0);
        let m = match self {
            BadLength::Root => {
                return Error::invalid(format!(
                    "root {root} is not a rank of this {n}-rank communicator"
                ))
            }
            BadLength::SendRecvDiffer => {
                format!("send has {s} elements, recv {recv}; they must match")
            }
            BadLength::GatherRecv => format!(
                "recv must hold nranks x send = {} elements, has {recv}",
                s * n
            ),
            BadLength::ScatterSend => format!(
                "send must hold nranks x recv = {} elements, has {s}",
                recv * n
            ),
            BadLength::Indivisible(len) => {
                format!("{len} elements are not divisible by {n} ranks")
            }
            BadLength::RootSendRecvDiffer => {
                format!("at the root, send has {s} elements and recv {recv}; they must match")
            }
            BadLength::RootRecv => format!("at the root, recv must hold {s} elements, has {recv}"),
        };
        Error::invalid(format!("{}: {m}", kind.name()))
    }
}

impl Communicator {
    /// The call, if buffers of `send` and `recv` elements fit its kind
    /// (see [`count_of`]).
    #[inline(always)]
    fn coll(
        &self,
        kind: Kind,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        send: Option<usize>,
        recv: usize,
    ) -> std::result::Result<Coll, BadLength> {
        let count = count_of(kind, self.nranks(), self.rank(), send, recv, root)?;
        Ok(Coll {
            kind,
            dtype,
            op,
            root,
            count,
            in_place: send.is_none(),
        })
    }

    /// Check a collective on regions and turn it into the executor's
    /// (input, output): in place, all_gather's input is the output's
    /// segment `rank` and reduce_scatter's output the input's.
    #[inline(always)]
    pub(crate) fn plan(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(Coll, Option<Region>, Region)> {
        let s_elems = send
            .as_ref()
            .map(|s| elems("send buffer", s, dtype))
            .transpose()?;
        let r_elems = elems("recv buffer", &recv, dtype)?;
        let c = self
            .coll(kind, dtype, op, root, s_elems, r_elems)
            .map_err(|bad| bad.error(kind, self.nranks(), s_elems, r_elems, root))?;
        let (send, recv) = c.buffers(self.rank(), send, recv, |r, off, len| r.sub(off, len));
        Ok((c, send, recv))
    }

    /// A call on plain host memory that takes the small-message path, as
    /// that path runs it, if its arguments are right (`None` otherwise:
    /// the general entry checks them again and says what is wrong). The
    /// same checks as [`plan`](Self::plan), on plain words rather than
    /// regions and without its `Result`s: a small call is bound by the
    /// instructions it runs (docs/PERFORMANCE.md, twenty-third round).
    #[inline(always)]
    fn small_plain(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Option<(Fingerprint, SmallArgs)> {
        let plain = |r: &Region| (r.space == MemorySpace::Host).then(|| HostSpan::of(r));
        let recv = plain(&recv)?;
        let send = match &send {
            Some(s) => Some(plain(s)?),
            None => None,
        };
        let es = dtype.size();
        let s_elems = match send {
            Some(s) => Some(whole(s.addr, s.len, es)?),
            None => None,
        };
        let r_elems = whole(recv.addr, recv.len, es)?;
        let c = self.coll(kind, dtype, op, root, s_elems, r_elems).ok()?;
        let call = c.small();
        let forced = self.inner.config.algo.is_some();
        if !crate::executor::small::eligible(&call, self.nranks(), forced) {
            return None;
        }
        let (input, output) = c.buffers(self.rank(), send, recv, HostSpan::sub);
        let args = SmallArgs {
            call,
            // Plain memory names no registered buffer.
            ids: 0,
            input: input.unwrap_or(output),
            output,
        };
        Some((c.fingerprint(), args))
    }

    /// Run collective `kind` on regions (`send: None`: in place on `recv`).
    fn collective(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        // Small calls on plain memory, once this host's small pages are
        // there, take the lean entry: the same checks, then the small path.
        if self
            .inner
            .small_ready
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            if let Some((fp, args)) = self.small_plain(kind, send, recv, dtype, op, root) {
                return self.run(|inner, st| inner.execute_small(st, fp, &args));
            }
        }
        let (c, send, recv) = self.plan(kind, send, recv, dtype, op, root)?;
        self.run(|inner, st| run_coll(inner, st, &c, send, recv))
    }

    /// The untyped entry for bindings: run collective `kind` on byte
    /// buffers holding `dtype` elements (aligned for it). `send: None` means
    /// in place on `recv`; `op` and `root` are ignored where they do not
    /// apply. Buffer sizes follow the typed methods of the same kind.
    pub fn collective_bytes(
        &self,
        kind: Kind,
        send: Option<&[u8]>,
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(
            kind,
            send.map(Region::host),
            Region::host_mut(recv),
            dtype,
            op,
            root,
        )
    }

    /// The untyped entry on regions (for bindings whose memory is not a
    /// Rust slice, e.g. a tensor's storage or, later, device memory).
    ///
    /// # Safety
    /// `recv` (and `send`) must describe memory that holds whole, aligned
    /// `dtype` elements, stays valid for the whole call, and that nothing
    /// else touches meanwhile (`send` may be read by others).
    pub unsafe fn collective_regions(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(kind, send, recv, dtype, op, root)
    }

    /// Queue collective `kind` on regions and return at once; the call
    /// runs in issue order on the communicator's worker: `before` first
    /// (e.g. make a device engine wait for the caller's stream), then the
    /// collective. `after` is called exactly once with the outcome when the
    /// call is over — also when it never runs (bad arguments, an earlier
    /// failure of the communicator, a worker that cannot start): whoever
    /// waits on the call outside oxccl (a device stream blocked on a flag)
    /// is always released.
    ///
    /// # Safety
    /// As [`collective_regions`](Self::collective_regions), and the memory
    /// must stay valid, untouched by anything else, until `after` runs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn collective_regions_async(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        before: BeforeCall,
        after: AfterCall,
    ) -> Work<()> {
        let after = Finally(Some(after));
        if let Err(e) = self.plan(kind, send, recv, dtype, op, root) {
            let r = Err(e);
            after.finish(&r);
            return Work::done(kind.name(), r);
        }
        let me = self.clone_handle();
        self.submit(kind.name(), move |inner, st| {
            let r = before().and_then(|()| {
                let (c, s, r) = me.plan(kind, send, recv, dtype, op, root)?;
                run_coll(inner, st, &c, s, r)
            });
            after.finish(&r);
            r
        })
    }

    fn typed<T: Element>(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(kind, send, recv, T::DTYPE, op, root)
    }

    // ------------------------------------------------------------ typed --

    /// `recv = op over ranks of send` (`ncclAllReduce`).
    pub fn all_reduce<T, S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        self.typed::<T>(
            Kind::AllReduce,
            Some(send.region()),
            recv.region_mut(),
            op,
            0,
        )
    }
    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.typed::<T>(Kind::AllReduce, None, buf.region_mut(), op, 0)
    }
    /// `recv[k*len..] = send of rank k` (`recv.len() == nranks * send.len()`).
    pub fn all_gather<T, S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.typed::<T>(Kind::AllGather, Some(s), r, ReduceOp::Sum, 0)
    }
    /// In-place all-gather: this rank's part is already at `buf[rank*len..]`.
    pub fn all_gather_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
    ) -> Result<()> {
        self.typed::<T>(Kind::AllGather, None, buf.region_mut(), ReduceOp::Sum, 0)
    }
    /// `recv = op over ranks of send[rank*len..]` (`send.len() == nranks * recv.len()`).
    pub fn reduce_scatter<T, S, R>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.typed::<T>(Kind::ReduceScatter, Some(s), r, op, 0)
    }
    /// In-place reduce-scatter: the result lands at `buf[rank*len..(rank+1)*len]`;
    /// the rest of `buf` is left as it was.
    pub fn reduce_scatter_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.typed::<T>(Kind::ReduceScatter, None, buf.region_mut(), op, 0)
    }
    /// `recv = send of root` (`send` is read only at the root; pass `&[]` elsewhere).
    pub fn broadcast<T, S, R>(&self, send: &S, recv: &mut R, root: usize) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.typed::<T>(Kind::Broadcast, Some(s), r, ReduceOp::Sum, root)
    }
    /// In-place broadcast (`ncclBcast`).
    pub fn broadcast_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
        root: usize,
    ) -> Result<()> {
        self.typed::<T>(Kind::Broadcast, None, buf.region_mut(), ReduceOp::Sum, root)
    }
    /// At the root, `recv = op over ranks of send`; `recv` is ignored elsewhere (pass `&mut []`).
    pub fn reduce<T, S, R>(&self, send: &S, recv: &mut R, op: ReduceOp, root: usize) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.typed::<T>(Kind::Reduce, Some(s), r, op, root)
    }
    /// In-place reduce: the root's buffer gets the result, others are untouched.
    pub fn reduce_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.typed::<T>(Kind::Reduce, None, buf.region_mut(), op, root)
    }
    /// `recv[k*c..]` of this rank = `send[rank*c..]` of rank k, with `c = len / nranks`.
    pub fn all_to_all<T, S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.typed::<T>(Kind::AllToAll, Some(s), r, ReduceOp::Sum, 0)
    }
    /// In-place all-to-all.
    pub fn all_to_all_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
    ) -> Result<()> {
        self.typed::<T>(Kind::AllToAll, None, buf.region_mut(), ReduceOp::Sum, 0)
    }
    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.run(run_barrier)
    }

    // ------------------------------------------------- point-to-point --

    /// Send `buf` to `peer` (blocks until handed to the transport).
    pub fn send<T: Element, B: Buffer<T> + ?Sized>(&self, buf: &B, peer: usize) -> Result<()> {
        self.p2p_blocking(
            "send",
            &[P2pOp {
                send: true,
                region: buf.region(),
                peer,
                dtype: T::DTYPE,
            }],
        )
    }
    /// Receive exactly `buf.len()` elements from `peer`.
    pub fn recv<T: Element, B: BufferMut<T> + ?Sized>(
        &self,
        buf: &mut B,
        peer: usize,
    ) -> Result<()> {
        self.p2p_blocking(
            "recv",
            &[P2pOp {
                send: false,
                region: buf.region_mut(),
                peer,
                dtype: T::DTYPE,
            }],
        )
    }
    /// Send to one peer and receive from another at the same time (never
    /// deadlocks when both sides call it with each other).
    pub fn send_recv<T, S, R>(&self, send: &S, to: usize, recv: &mut R, from: usize) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        self.p2p_blocking(
            "send_recv",
            &[
                P2pOp {
                    send: true,
                    region: send.region(),
                    peer: to,
                    dtype: T::DTYPE,
                },
                P2pOp {
                    send: false,
                    region: recv.region_mut(),
                    peer: from,
                    dtype: T::DTYPE,
                },
            ],
        )
    }

    /// Send `buf` to `to` and replace its contents with what `from` sends
    /// (`MPI_Sendrecv_replace`): the incoming data is staged, then copied.
    pub fn send_recv_replace<T: Element>(
        &self,
        buf: &mut [T],
        to: usize,
        from: usize,
    ) -> Result<()> {
        let mut incoming = vec![T::default(); buf.len()];
        self.send_recv(buf, to, &mut incoming, from)?;
        buf.copy_from_slice(&incoming);
        Ok(())
    }

    // ------------------------------------------------------------ async --

    /// Queue an in-place collective on an owned buffer; the buffer comes
    /// back from [`Work::wait`]. Its region is taken on the worker, after
    /// the move, so any owned [`BufferMut`] works.
    fn coll_async<T, B>(&self, kind: Kind, mut buf: B, op: ReduceOp, root: usize) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        // Checked here too, so a bad call fails without taking a ticket;
        // the worker plans again on the moved buffer's region.
        let plan = self.plan(kind, None, buf.region_mut(), T::DTYPE, op, root);
        if let Err(e) = plan {
            return Work::done(kind.name(), Err(e));
        }
        let me = self.clone_handle();
        self.submit(kind.name(), move |inner, st| {
            let (c, send, recv) = me.plan(kind, None, buf.region_mut(), T::DTYPE, op, root)?;
            run_coll(inner, st, &c, send, recv)?;
            Ok(buf)
        })
    }

    /// Queue an out-of-place collective on owned buffers, both given back.
    fn coll_async2<T, S, R>(&self, kind: Kind, send: S, mut recv: R, op: ReduceOp) -> Work<(S, R)>
    where
        T: Element,
        S: Buffer<T> + Send + 'static,
        R: BufferMut<T> + Send + 'static,
    {
        let plan = self.plan(
            kind,
            Some(send.region()),
            recv.region_mut(),
            T::DTYPE,
            op,
            0,
        );
        if let Err(e) = plan {
            return Work::done(kind.name(), Err(e));
        }
        let me = self.clone_handle();
        self.submit(kind.name(), move |inner, st| {
            let (s, r) = (send.region(), recv.region_mut());
            let (c, s, r) = me.plan(kind, Some(s), r, T::DTYPE, op, 0)?;
            run_coll(inner, st, &c, s, r)?;
            Ok((send, recv))
        })
    }

    /// Async in-place all-reduce of an owned buffer.
    pub fn all_reduce_async<T, B>(&self, buf: B, op: ReduceOp) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.coll_async(Kind::AllReduce, buf, op, 0)
    }
    /// Async all-gather into `recv` (`nranks * send.len()` elements);
    /// both buffers come back.
    pub fn all_gather_async<T, S, R>(&self, send: S, recv: R) -> Work<(S, R)>
    where
        T: Element,
        S: Buffer<T> + Send + 'static,
        R: BufferMut<T> + Send + 'static,
    {
        self.coll_async2(Kind::AllGather, send, recv, ReduceOp::Sum)
    }
    /// Async in-place all-gather (this rank's part at `buf[rank*len..]`).
    pub fn all_gather_in_place_async<T, B>(&self, buf: B) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.coll_async(Kind::AllGather, buf, ReduceOp::Sum, 0)
    }
    /// Async reduce-scatter of `send` (`nranks * recv.len()` elements) into
    /// `recv`; both buffers come back.
    pub fn reduce_scatter_async<T, S, R>(&self, send: S, recv: R, op: ReduceOp) -> Work<(S, R)>
    where
        T: Element,
        S: Buffer<T> + Send + 'static,
        R: BufferMut<T> + Send + 'static,
    {
        self.coll_async2(Kind::ReduceScatter, send, recv, op)
    }
    /// Async in-place reduce-scatter (the result at `buf[rank*len..]`).
    pub fn reduce_scatter_in_place_async<T, B>(&self, buf: B, op: ReduceOp) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.coll_async(Kind::ReduceScatter, buf, op, 0)
    }
    /// Async in-place broadcast.
    pub fn broadcast_async<T, B>(&self, buf: B, root: usize) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.coll_async(Kind::Broadcast, buf, ReduceOp::Sum, root)
    }
    /// Async in-place reduce (the root's buffer gets the result).
    pub fn reduce_async<T, B>(&self, buf: B, op: ReduceOp, root: usize) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.coll_async(Kind::Reduce, buf, op, root)
    }
    /// Async in-place all-to-all.
    pub fn all_to_all_async<T, B>(&self, buf: B) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.coll_async(Kind::AllToAll, buf, ReduceOp::Sum, 0)
    }
    /// Async barrier.
    pub fn barrier_async(&self) -> Work<()> {
        self.submit("barrier", run_barrier)
    }
    /// Async send of an owned buffer (returned when sent).
    pub fn send_async<T, B>(&self, buf: B, peer: usize) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.p2p_async(buf, peer, true)
    }
    /// Async receive into an owned buffer (returned when filled).
    pub fn recv_async<T, B>(&self, buf: B, peer: usize) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        self.p2p_async(buf, peer, false)
    }

    fn p2p_async<T, B>(&self, buf: B, peer: usize, is_send: bool) -> Work<B>
    where
        T: Element,
        B: BufferMut<T> + Send + 'static,
    {
        let call = if is_send { "send" } else { "recv" };
        if peer == self.rank() {
            let e = Error::invalid(format!(
                "async point-to-point peer {peer} is this rank itself (use a group to copy to itself)"
            ));
            return Work::done(call, Err(e));
        }
        self.p2p_owned(call, buf, |b| P2pOp {
            send: is_send,
            region: b.region_mut(),
            peer,
            dtype: T::DTYPE,
        })
    }
}
