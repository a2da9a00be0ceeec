//! Point-to-point operations and groups.
//!
//! Every send and receive (blocking, async, or in a [`Group`]) becomes a
//! [`P2pOp`], checked here and posted to the communicator's point-to-point
//! lane (`lane.rs`): its own links and thread, so sends and receives never
//! wait behind collectives or other calls, and operations posted together
//! or apart progress together: any set of sends and receives that is
//! matched on both sides completes, whatever order each side posted them
//! in. Operations of different element types mix freely; each message
//! carries its operation's fingerprint (type, count, peer, and its position
//! among the operations between the two ranks in that direction), so a
//! receive that does not match the send is a mismatch naming both.
//!
//! A [`Group`] (`ncclGroupStart/End`) collects any mix of sends, receives
//! and collectives: its sends and receives are posted at once and progress
//! while its collectives run, in the order given, as one call in issue
//! order; every rank must give its collectives in the same order, as
//! outside a group. The group returns when all of it is done.

use crate::api::Coll;
use crate::call::{Fingerprint, Kind};
use crate::comm::{Communicator, Inner, State};
use crate::error::{Error, Result};
use crate::lane::{LaneOp, Then};
use crate::mem::{Buffer, BufferMut, Region};
use crate::types::{DataType, Element, ReduceOp};
use crate::work::{Completer, Work};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One send or receive: `region` holds `dtype` elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct P2pOp {
    pub send: bool,
    pub region: Region,
    pub peer: usize,
    pub dtype: DataType,
}

impl P2pOp {
    /// Check the peer and the buffer; its element count.
    fn check(&self, nranks: usize) -> Result<usize> {
        if self.peer >= nranks {
            return Err(Error::invalid(format!(
                "peer {} is not a rank of this {nranks}-rank communicator",
                self.peer
            )));
        }
        if !self.region.space.is_host() {
            return Err(Error::Unsupported(format!(
                "send and receive on {:?} memory: the point-to-point lane moves host memory only",
                self.region.space
            )));
        }
        let what = if self.send {
            "send buffer"
        } else {
            "recv buffer"
        };
        crate::api::elems(what, &self.region, self.dtype)
    }
}

/// A checked batch of point-to-point operations, ready to post.
#[derive(Debug, Default)]
pub(crate) struct P2pBatch {
    /// The operations with other ranks.
    ops: Vec<LaneOp>,
    /// Sends to this rank itself, matched in order with its receives from
    /// itself: (destination, source).
    self_copies: Vec<(Region, Region)>,
}

impl P2pBatch {
    /// Check `ops` for a communicator of `nranks` (nothing is sent when
    /// this fails).
    pub(crate) fn new(me: usize, nranks: usize, ops: &[P2pOp]) -> Result<P2pBatch> {
        let mut b = P2pBatch::default();
        let (mut self_sends, mut self_recvs) = (Vec::new(), Vec::new());
        for op in ops {
            let count = op.check(nranks)?;
            if op.peer == me {
                if op.send {
                    &mut self_sends
                } else {
                    &mut self_recvs
                }
                .push((*op, count));
                continue;
            }
            b.ops.push(LaneOp {
                send: op.send,
                peer: op.peer,
                region: op.region,
                fp: Fingerprint::new(Kind::P2p, op.dtype, count).with_root(op.peer),
            });
        }
        if self_sends.len() != self_recvs.len() {
            return Err(Error::invalid(format!(
                "group has {} sends to this rank itself but {} receives from it",
                self_sends.len(),
                self_recvs.len()
            )));
        }
        for ((s, sn), (r, rn)) in self_sends.iter().zip(&self_recvs) {
            if s.region.len != r.region.len {
                return Err(Error::invalid(format!(
                    "a send to this rank itself of {sn} {} elements is matched with a receive of {rn} {}",
                    s.dtype, r.dtype
                )));
            }
            b.self_copies.push((r.region, s.region));
        }
        Ok(b)
    }
}

impl Communicator {
    /// Post a checked batch to the lane (self-copies done at once); `then`
    /// runs when every operation finished. `driven`: this thread drives the
    /// lane next (see `Lane::post`).
    pub(crate) fn post_p2p(&self, b: &P2pBatch, driven: bool, then: Then) {
        for (dst, src) in &b.self_copies {
            // SAFETY: checked host regions of equal length, valid for the
            // call (borrowed or owned by it); a receive and a send of one
            // group cannot overlap (one is borrowed mutably).
            unsafe { kernels::copy::copy(dst.addr as *mut u8, src.addr as *const u8, dst.len) };
        }
        self.inner
            .lane
            .post(&self.inner, &b.ops, self.timeout(), driven, then);
    }

    /// Post a batch and wait for it (the blocking calls).
    pub(crate) fn p2p_blocking(&self, call: &'static str, ops: &[P2pOp]) -> Result<()> {
        self.check_deadline()?;
        let batch = P2pBatch::new(self.rank(), self.nranks(), ops)?;
        let (work, done) = Work::pending(call);
        self.post_p2p(&batch, true, Box::new(move |r| done.complete(r)));
        self.inner.lane.drive(&self.inner, || work.is_done());
        work.wait()
    }

    /// Post one operation on an owned buffer; the buffer comes back from
    /// the `Work`. (The buffer is boxed before its region is taken, so it
    /// does not move while the lane uses it.)
    pub(crate) fn p2p_owned<B: Send + 'static>(
        &self,
        call: &'static str,
        buf: B,
        op: impl FnOnce(&mut B) -> P2pOp,
    ) -> Work<B> {
        let owned = Owned::new(buf);
        // SAFETY: `owned` is this call's own allocation; nothing else uses
        // it until `take` below.
        let op = op(unsafe { owned.get() });
        let checked = self
            .check_deadline()
            .and_then(|_| P2pBatch::new(self.rank(), self.nranks(), &[op]));
        let batch = match checked {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: nothing posted uses it.
                drop(unsafe { owned.take() });
                return Work::done(call, Err(e));
            }
        };
        let (work, done) = Work::pending(call);
        self.post_p2p(
            &batch,
            false,
            Box::new(move |r| {
                // SAFETY: the lane finished with the memory.
                let buf = unsafe { owned.take() };
                done.complete(r.map(|_| buf));
            }),
        );
        work
    }
}

/// An owned value at a fixed heap address, used through raw pointers by
/// the lane while a call runs, then taken back.
struct Owned<B>(*mut B);

// SAFETY: only a pointer to a `B: Send`, used by one party at a time.
unsafe impl<B: Send> Send for Owned<B> {}
// SAFETY: shared only to be taken once (`Join`).
unsafe impl<B: Send> Sync for Owned<B> {}

impl<B> Owned<B> {
    fn new(b: B) -> Owned<B> {
        Owned(Box::into_raw(Box::new(b)))
    }

    /// # Safety
    /// No other reference to the value may be alive, nor be made before the
    /// returned one ends.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self) -> &mut B {
        &mut *self.0
    }

    /// # Safety
    /// Once, after everything that used the value finished.
    unsafe fn take(&self) -> B {
        *Box::from_raw(self.0)
    }
}

/// A group under construction: see the module docs and
/// [`Communicator::group`]. Each method checks its arguments at once and
/// returns `InvalidArgument` naming what was wrong; nothing runs until the
/// group's closure returns `Ok`.
pub struct Group<'a> {
    comm: &'a Communicator,
    p2p: Vec<P2pOp>,
    colls: Vec<(Coll, Option<Region>, Region)>,
    /// The buffers are borrowed for as long as the group exists.
    _bufs: PhantomData<&'a mut [u8]>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("point_to_point", &self.p2p.len())
            .field("collectives", &self.colls.len())
            .finish()
    }
}

impl<'a> Group<'a> {
    fn new(comm: &'a Communicator) -> Group<'a> {
        Group {
            comm,
            p2p: Vec::new(),
            colls: Vec::new(),
            _bufs: PhantomData,
        }
    }

    /// Check the point-to-point part; the group ready to run.
    fn finish(self) -> Result<Ready> {
        Ok(Ready {
            batch: P2pBatch::new(self.comm.rank(), self.comm.nranks(), &self.p2p)?,
            colls: self.colls,
        })
    }

    fn p2p(&mut self, send: bool, region: Region, peer: usize, dtype: DataType) -> Result<()> {
        let op = P2pOp {
            send,
            region,
            peer,
            dtype,
        };
        // Checked now so the error points at this operation (the pairing
        // of self-sends with self-receives once the group is complete).
        op.check(self.comm.nranks())?;
        self.p2p.push(op);
        Ok(())
    }

    fn coll(
        &mut self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let planned = self.comm.plan(kind, send, recv, dtype, op, root)?;
        self.colls.push(planned);
        Ok(())
    }

    /// Send `region` (`dtype` elements) to `peer` (`send`), or receive
    /// into it from `peer`: the untyped form for bindings (the C ABI).
    ///
    /// # Safety
    /// `region` must hold whole, aligned `dtype` elements and stay valid
    /// until the group has completed; nothing else may write it meanwhile
    /// (nor read it, for a receive).
    pub unsafe fn p2p_region(
        &mut self,
        send: bool,
        region: Region,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        self.p2p(send, region, peer, dtype)
    }
    /// Collective `kind` on regions in the group (untyped; conventions of
    /// [`Communicator::collective_regions`]).
    ///
    /// # Safety
    /// As [`Communicator::collective_regions`], until the group has
    /// completed.
    pub unsafe fn collective_regions(
        &mut self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.coll(kind, send, recv, dtype, op, root)
    }

    /// Send `buf` to `peer`.
    pub fn send<T: Element, B: Buffer<T> + ?Sized>(
        &mut self,
        buf: &'a B,
        peer: usize,
    ) -> Result<()> {
        self.p2p(true, buf.region(), peer, T::DTYPE)
    }
    /// Receive exactly `buf`'s length from `peer`.
    pub fn recv<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &'a mut B,
        peer: usize,
    ) -> Result<()> {
        self.p2p(false, buf.region_mut(), peer, T::DTYPE)
    }
    /// [`Communicator::all_reduce`] in the group.
    pub fn all_reduce<T, S, R>(&mut self, send: &'a S, recv: &'a mut R, op: ReduceOp) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.coll(Kind::AllReduce, Some(s), r, T::DTYPE, op, 0)
    }
    /// [`Communicator::all_reduce_in_place`] in the group.
    pub fn all_reduce_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &'a mut B,
        op: ReduceOp,
    ) -> Result<()> {
        self.coll(Kind::AllReduce, None, buf.region_mut(), T::DTYPE, op, 0)
    }
    /// [`Communicator::all_gather`] in the group.
    pub fn all_gather<T, S, R>(&mut self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.coll(Kind::AllGather, Some(s), r, T::DTYPE, ReduceOp::Sum, 0)
    }
    /// [`Communicator::reduce_scatter`] in the group.
    pub fn reduce_scatter<T, S, R>(
        &mut self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.coll(Kind::ReduceScatter, Some(s), r, T::DTYPE, op, 0)
    }
    /// [`Communicator::broadcast_in_place`] in the group.
    pub fn broadcast_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &'a mut B,
        root: usize,
    ) -> Result<()> {
        self.coll(
            Kind::Broadcast,
            None,
            buf.region_mut(),
            T::DTYPE,
            ReduceOp::Sum,
            root,
        )
    }
    /// [`Communicator::reduce_in_place`] in the group.
    pub fn reduce_in_place<T: Element, B: BufferMut<T> + ?Sized>(
        &mut self,
        buf: &'a mut B,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.coll(Kind::Reduce, None, buf.region_mut(), T::DTYPE, op, root)
    }
    /// [`Communicator::all_to_all`] in the group.
    pub fn all_to_all<T, S, R>(&mut self, send: &'a S, recv: &'a mut R) -> Result<()>
    where
        T: Element,
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (s, r) = (send.region(), recv.region_mut());
        self.coll(Kind::AllToAll, Some(s), r, T::DTYPE, ReduceOp::Sum, 0)
    }
}

/// A complete, checked group.
struct Ready {
    batch: P2pBatch,
    colls: Vec<(Coll, Option<Region>, Region)>,
}

impl Ready {
    fn run_colls(&self, inner: &Inner, st: &mut State) -> Result<()> {
        for (c, send, recv) in &self.colls {
            crate::api::run_coll(inner, st, c, *send, *recv)?;
        }
        Ok(())
    }
}

/// The parts of an async group (its sends and receives, its collectives)
/// finishing in any order; the last one gives the buffers back.
struct Join<B> {
    left: AtomicUsize,
    err: Mutex<Option<Error>>,
    done: Mutex<Option<Completer<B>>>,
    bufs: Owned<B>,
}

impl<B> Join<B> {
    fn part_done(&self, r: Result<()>) {
        if let Err(e) = r {
            self.err.lock().unwrap().get_or_insert(e);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: every part that used the buffers finished.
            let bufs = unsafe { self.bufs.take() };
            let r = self.err.lock().unwrap().take().map_or(Ok(bufs), Err);
            if let Some(done) = self.done.lock().unwrap().take() {
                done.complete(r);
            }
        }
    }
}

/// A part of a `Join` that reports once, even if dropped unrun.
struct Part<B>(Option<Arc<Join<B>>>);

impl<B> Part<B> {
    fn done(mut self, r: Result<()>) {
        if let Some(j) = self.0.take() {
            j.part_done(r);
        }
    }
}

impl<B> Drop for Part<B> {
    fn drop(&mut self) {
        if let Some(j) = self.0.take() {
            j.part_done(Err(Error::Aborted {
                by: None,
                world_by: None,
            }));
        }
    }
}

impl Communicator {
    /// Run any mix of sends, receives and collectives, of any element
    /// types, together (`ncclGroupStart` ... `ncclGroupEnd`): the closure
    /// adds operations to the [`Group`]; when it returns `Ok`, the group's
    /// sends and receives are posted, all at once (so two ranks that both
    /// send before they receive complete), its collectives run in the order
    /// given while they progress, and the call returns when all of it is
    /// done. If the closure (or an argument check) fails, nothing runs and
    /// the communicator stays usable.
    ///
    /// ```no_run
    /// # fn f(comm: &comm_core::Communicator) -> comm_core::Result<()> {
    /// # use comm_core::{bf16, ReduceOp};
    /// let header = [4u32, 1024];
    /// let payload = vec![bf16::ZERO; 4096];
    /// let mut grads = vec![0f32; 1024];
    /// comm.group(|g| {
    ///     g.send(&header, 1)?;
    ///     g.send(&payload, 1)?;
    ///     g.all_reduce_in_place(&mut grads, ReduceOp::Sum)
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn group<'a>(&'a self, f: impl FnOnce(&mut Group<'a>) -> Result<()>) -> Result<()> {
        self.check_deadline()?;
        let mut g = Group::new(self);
        f(&mut g)?;
        let ready = g.finish()?;
        let (p2p, done) = Work::pending("group");
        // With collectives to run meanwhile, the lane's thread moves them.
        let driven = ready.colls.is_empty();
        self.post_p2p(&ready.batch, driven, Box::new(move |r| done.complete(r)));
        let colls = match ready.colls.is_empty() {
            true => Ok(()),
            false => self.run(|inner, st| ready.run_colls(inner, st)),
        };
        // The buffers are borrowed until the sends and receives finished
        // too (on an error, the lane fails them promptly).
        self.inner.lane.drive(&self.inner, || p2p.is_done());
        let p2p = p2p.wait();
        colls.and(p2p)
    }

    /// The async form of [`Communicator::group`]: `bufs` (any owned value
    /// holding the buffers, e.g. a tuple of `Vec`s) is kept at a fixed
    /// place while `f` adds operations on it; the sends and receives are
    /// posted at once, the collectives run in issue order with the other
    /// calls, and [`Work::wait`] gives `bufs` back when all of it is done.
    /// Argument errors come from `wait`.
    pub fn group_async<B, F>(&self, bufs: B, f: F) -> Work<B>
    where
        B: Send + 'static,
        F: for<'g> FnOnce(&mut Group<'g>, &'g mut B) -> Result<()>,
    {
        let owned = Owned::new(bufs);
        let ready = {
            let mut g = Group::new(self);
            // SAFETY: `owned` is this call's own allocation; the borrow
            // ends with this block, before anything else uses it.
            self.check_deadline()
                .and_then(|_| f(&mut g, unsafe { owned.get() }))
                .and_then(|_| g.finish())
        };
        let ready = match ready {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: nothing was posted.
                drop(unsafe { owned.take() });
                return Work::done("group", Err(e));
            }
        };
        let (work, done) = Work::pending("group");
        let has_colls = !ready.colls.is_empty();
        let join = Arc::new(Join {
            left: AtomicUsize::new(1 + has_colls as usize),
            err: Mutex::new(None),
            done: Mutex::new(Some(done)),
            bufs: owned,
        });
        let p2p = Part(Some(join.clone()));
        self.post_p2p(&ready.batch, false, Box::new(move |r| p2p.done(r)));
        if has_colls {
            let part = Part(Some(join));
            let colls = ready.colls;
            // Its result reaches the caller through the join.
            drop(self.submit("group", move |inner, st| {
                let r = Ready {
                    batch: P2pBatch::default(),
                    colls,
                }
                .run_colls(inner, st);
                // The communicator is failed before the caller hears of it
                // (as a plain call's is), so whoever polls `async_error`
                // once `wait` returned sees the failure too.
                // (Its links are closed when this closure returns.)
                if let Err(e) = &r {
                    if !e.is_local() {
                        inner.fail(e.clone().in_world(&inner.world, &inner.peers));
                    }
                }
                part.done(r.clone());
                r
            }));
        }
        work
    }
}
