//! Point-to-point operations and groups.
//!
//! Every send and receive (blocking, async, or in a [`Group`]) becomes a
//! [`P2pOp`]; a batch of them runs as one `algorithms::p2p` schedule, so
//! they progress together: any set of sends and receives that is matched
//! on both sides completes, whatever order each side posted them in.
//! Schedules move bytes: operations of different element types share a
//! batch, and each message still carries its operation's own fingerprint
//! (type, count, peer, and its position among the operations between the
//! two ranks in that direction), so a receive that does not match the send
//! is a mismatch naming both.
//!
//! A [`Group`] (`ncclGroupStart/End`) collects any mix of sends, receives
//! and collectives. It runs its point-to-point operations first, all
//! together, then its collectives in the order given; every rank must give
//! its collectives in the same order, as outside a group.

use crate::api::Coll;
use crate::call::{Fingerprint, Kind};
use crate::comm::{Communicator, Inner, State};
use crate::error::{Error, Result};
use crate::mem::{Buffer, BufferMut, Region};
use crate::types::{DataType, Element, ReduceOp};
use crate::work::Work;
use algorithms::P2pStep;
use std::marker::PhantomData;

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
        let what = if self.send {
            "send buffer"
        } else {
            "recv buffer"
        };
        crate::api::elems(what, &self.region, self.dtype)
    }
}

/// A checked batch of point-to-point operations, ready to run.
#[derive(Debug, Default)]
pub(crate) struct P2pBatch {
    /// Steps in bytes; `buf` indexes `regions` (0 and 1 unused).
    steps: Vec<P2pStep>,
    regions: Vec<Region>,
    /// Per step: its operation's fingerprint (type, count, peer).
    fps: Vec<Fingerprint>,
    /// Sends to this rank itself, matched in order with its receives from
    /// itself: (destination, source).
    self_copies: Vec<(Region, Region)>,
}

impl P2pBatch {
    /// Check `ops` for a communicator of `nranks` (nothing is sent when
    /// this fails).
    pub(crate) fn new(me: usize, nranks: usize, ops: &[P2pOp]) -> Result<P2pBatch> {
        let mut b = P2pBatch {
            regions: vec![Region::EMPTY; 2],
            ..P2pBatch::default()
        };
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
            if b.regions.len() >= u16::MAX as usize {
                return Err(Error::invalid("too many operations in one group"));
            }
            let (peer, buf, len) = (op.peer, b.regions.len() as u16, op.region.len);
            b.steps.push(match op.send {
                true => P2pStep::Send { peer, buf, len },
                false => P2pStep::Recv { peer, buf, len },
            });
            b.regions.push(op.region);
            b.fps
                .push(Fingerprint::new(Kind::P2p, op.dtype, count).with_root(peer));
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

    fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.self_copies.is_empty()
    }
}

/// Run a checked batch (one call in issue order).
pub(crate) fn run_p2p(inner: &Inner, st: &mut State, b: &P2pBatch) -> Result<()> {
    for (dst, src) in &b.self_copies {
        inner.local_copy(st, *dst, *src)?;
    }
    if b.steps.is_empty() {
        return Ok(());
    }
    // Chunks in bytes, a multiple of every element size, so that the two
    // sides of an operation cut it alike whatever else shares the batch.
    let chunk = (inner.config.chunk_bytes & !7).max(8);
    let sched = algorithms::p2p(&b.steps, chunk);
    let per_step = st.p2p_numbers(&b.steps, &b.fps, chunk);
    debug_assert_eq!(per_step.len(), sched.steps.len());
    let fp = Fingerprint::new(Kind::P2p, DataType::U8, 0);
    inner.execute(st, fp, &sched, &b.regions, Some(per_step), false)
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
    fn run(&self, inner: &Inner, st: &mut State) -> Result<()> {
        if !self.batch.is_empty() {
            run_p2p(inner, st, &self.batch)?;
        }
        for (c, send, recv) in &self.colls {
            crate::api::run_coll(inner, st, c, *send, *recv)?;
        }
        Ok(())
    }
}

impl Communicator {
    /// Run any mix of sends, receives and collectives, of any element
    /// types, together (`ncclGroupStart` ... `ncclGroupEnd`): the closure
    /// adds operations to the [`Group`]; when it returns `Ok`, the group's
    /// sends and receives run first, all together (so two ranks that both
    /// send before they receive complete), then its collectives in the
    /// order given. If the closure (or an argument check) fails, nothing
    /// runs and the communicator stays usable.
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
        let mut g = Group::new(self);
        f(&mut g)?;
        let ready = g.finish()?;
        self.run(move |inner, st| ready.run(inner, st))
    }

    /// The async form of [`Communicator::group`]: `bufs` (any owned value
    /// holding the buffers, e.g. a tuple of `Vec`s) moves to the
    /// communicator's worker, where `f` adds operations on them; the group
    /// runs in issue order with the other calls, and [`Work::wait`] gives
    /// `bufs` back. Argument errors come from `wait`.
    pub fn group_async<B, F>(&self, bufs: B, f: F) -> Work<B>
    where
        B: Send + 'static,
        F: for<'g> FnOnce(&mut Group<'g>, &'g mut B) -> Result<()> + Send + 'static,
    {
        let me = self.clone_handle();
        self.submit("group", move |inner, st| {
            let mut bufs = bufs;
            let ready = {
                let mut g = Group::new(&me);
                f(&mut g, &mut bufs)?;
                g.finish()?
            };
            ready.run(inner, st)?;
            Ok(bufs)
        })
    }
}
