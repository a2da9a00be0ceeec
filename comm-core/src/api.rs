//! The calls users make: typed (`&[T]`), untyped (bytes + [`DataType`], for
//! bindings) and asynchronous (owned `Vec<T>` in, [`Work`] out). Arguments
//! are checked here, before anything is sent: a bad call returns
//! `Error::InvalidArgument` and leaves the communicator usable.
//!
//! Buffer conventions follow NCCL: `count` for all_gather is what each rank
//! contributes, for reduce_scatter what each rank receives. In-place
//! all_gather expects this rank's part at `buf[rank*count..]`; in-place
//! reduce_scatter leaves the result there.

use crate::call::{Fingerprint, Kind};
use crate::comm::{Communicator, Inner, State};
use crate::error::{Error, Result};
use crate::executor::BufSpec;
use crate::types::{as_bytes, as_bytes_mut, DataType, Element, ReduceOp};
use crate::work::Work;
use algorithms::{CollSpec, P2pStep};

/// One operation of a point-to-point group (see [`Communicator::group`]).
pub enum P2p<'a, T> {
    /// Send the slice to the peer.
    Send(&'a [T], usize),
    /// Receive into the slice from the peer.
    Recv(&'a mut [T], usize),
}

/// A collective as the argument checker and the scheduler see it.
#[derive(Clone, Copy, Debug)]
struct Coll {
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
}

fn check_bytes(what: &str, b: &[u8], dtype: DataType) -> Result<usize> {
    let es = dtype.size();
    if !b.len().is_multiple_of(es) {
        return Err(Error::invalid(format!(
            "{what} has {} bytes, not a multiple of {dtype}'s {es}",
            b.len()
        )));
    }
    if !(b.as_ptr() as usize).is_multiple_of(es) {
        return Err(Error::invalid(format!(
            "{what} is not aligned to {es} bytes for {dtype}"
        )));
    }
    Ok(b.len() / es)
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
    run_coll(inner, st, &c, None, BufSpec::EMPTY)
}

fn run_coll(
    inner: &Inner,
    st: &mut State,
    c: &Coll,
    send: Option<BufSpec>,
    recv: BufSpec,
) -> Result<()> {
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
        direct: false,
    };
    let sched = st.schedule(&spec, inner.config.algo.as_deref(), &inner.tuning())?;
    let input = send.unwrap_or(recv);
    inner.execute(st, c.fingerprint(), &sched, &[input, recv], None)
}

impl Communicator {
    /// Validate lengths (in elements) and return the NCCL-style count.
    fn check(&self, kind: Kind, send: Option<usize>, recv: usize, root: usize) -> Result<usize> {
        let (n, me) = (self.nranks(), self.rank());
        if matches!(kind, Kind::Broadcast | Kind::Reduce) && root >= n {
            return Err(Error::invalid(format!(
                "root {root} is not a rank of this {n}-rank communicator"
            )));
        }
        let len_err = |m: String| Err(Error::invalid(format!("{}: {m}", kind.name())));
        let same = |s: usize| match s == recv {
            true => Ok(recv),
            false => len_err(format!(
                "send has {s} elements, recv {recv}; they must match"
            )),
        };
        let per_rank = |len: usize| match len.is_multiple_of(n) {
            true => Ok(len / n),
            false => len_err(format!("{len} elements are not divisible by {n} ranks")),
        };
        match kind {
            Kind::AllReduce | Kind::Barrier => send.map_or(Ok(recv), same),
            Kind::AllGather => match send {
                Some(s) if s * n != recv => len_err(format!(
                    "recv must hold nranks x send = {} elements, has {recv}",
                    s * n
                )),
                Some(s) => Ok(s),
                None => per_rank(recv),
            },
            Kind::ReduceScatter => match send {
                Some(s) if s != recv * n => len_err(format!(
                    "send must hold nranks x recv = {} elements, has {s}",
                    recv * n
                )),
                Some(_) => Ok(recv),
                None => per_rank(recv),
            },
            Kind::AllToAll => send.map_or(Ok(recv), same).and_then(per_rank),
            Kind::Broadcast => match send {
                Some(s) if me == root && s != recv => len_err(format!(
                    "at the root, send has {s} elements and recv {recv}; they must match"
                )),
                _ => Ok(recv),
            },
            Kind::Reduce => match send {
                Some(s) if me == root && s != recv => len_err(format!(
                    "at the root, recv must hold {s} elements, has {recv}"
                )),
                Some(s) => Ok(s),
                None => Ok(recv),
            },
            Kind::P2p => Ok(recv),
        }
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
        let s_elems = send
            .map(|s| check_bytes("send buffer", s, dtype))
            .transpose()?;
        let r_elems = check_bytes("recv buffer", recv, dtype)?;
        let count = self.check(kind, s_elems, r_elems, root)?;
        let c = Coll {
            kind,
            dtype,
            op,
            root,
            count,
            in_place: send.is_none(),
        };
        // In-place all_gather reads this rank's part of the buffer.
        let send_spec = match (kind, send) {
            (_, Some(s)) => Some(BufSpec::read_only(s)),
            (Kind::AllGather, None) => {
                let es = dtype.size();
                Some(BufSpec {
                    ptr: recv[self.rank() * count * es..].as_mut_ptr(),
                    bytes: count * es,
                })
            }
            (Kind::ReduceScatter, None) => Some(BufSpec::writable(recv)),
            _ => None,
        };
        let recv_spec = match (kind, send) {
            (Kind::ReduceScatter, None) => {
                let es = dtype.size();
                BufSpec {
                    ptr: recv[self.rank() * count * es..].as_mut_ptr(),
                    bytes: count * es,
                }
            }
            _ => BufSpec::writable(recv),
        };
        self.run(|inner, st| run_coll(inner, st, &c, send_spec, recv_spec))
    }

    // ------------------------------------------------------------ typed --

    /// `recv = op over ranks of send` (`ncclAllReduce`).
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective_bytes(
            Kind::AllReduce,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            T::DTYPE,
            op,
            0,
        )
    }
    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective_bytes(Kind::AllReduce, None, as_bytes_mut(buf), T::DTYPE, op, 0)
    }
    /// `recv[k*len..] = send of rank k` (`recv.len() == nranks * send.len()`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.collective_bytes(
            Kind::AllGather,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }
    /// In-place all-gather: this rank's part is already at `buf[rank*len..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.collective_bytes(
            Kind::AllGather,
            None,
            as_bytes_mut(buf),
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }
    /// `recv = op over ranks of send[rank*len..]` (`send.len() == nranks * recv.len()`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.collective_bytes(
            Kind::ReduceScatter,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            T::DTYPE,
            op,
            0,
        )
    }
    /// In-place reduce-scatter: the result lands at `buf[rank*len..(rank+1)*len]`;
    /// the rest of `buf` is left as it was.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective_bytes(
            Kind::ReduceScatter,
            None,
            as_bytes_mut(buf),
            T::DTYPE,
            op,
            0,
        )
    }
    /// `recv = send of root` (`send` is read only at the root; pass `&[]` elsewhere).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.collective_bytes(
            Kind::Broadcast,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            T::DTYPE,
            ReduceOp::Sum,
            root,
        )
    }
    /// In-place broadcast (`ncclBcast`).
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.collective_bytes(
            Kind::Broadcast,
            None,
            as_bytes_mut(buf),
            T::DTYPE,
            ReduceOp::Sum,
            root,
        )
    }
    /// At the root, `recv = op over ranks of send`; `recv` is ignored elsewhere (pass `&mut []`).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective_bytes(
            Kind::Reduce,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            T::DTYPE,
            op,
            root,
        )
    }
    /// In-place reduce: the root's buffer gets the result, others are untouched.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective_bytes(Kind::Reduce, None, as_bytes_mut(buf), T::DTYPE, op, root)
    }
    /// `recv[k*c..]` of this rank = `send[rank*c..]` of rank k, with `c = len / nranks`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.collective_bytes(
            Kind::AllToAll,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }
    /// In-place all-to-all.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.collective_bytes(
            Kind::AllToAll,
            None,
            as_bytes_mut(buf),
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }
    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.run(run_barrier)
    }

    // ------------------------------------------------- point-to-point --

    /// Send `buf` to `peer` (blocks until handed to the transport).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.group(vec![P2p::Send(buf, peer)])
    }
    /// Receive exactly `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.group(vec![P2p::Recv(buf, peer)])
    }
    /// Send to one peer and receive from another at the same time (never
    /// deadlocks when both sides call it with each other).
    pub fn send_recv<T: Element>(
        &self,
        send: &[T],
        to: usize,
        recv: &mut [T],
        from: usize,
    ) -> Result<()> {
        self.group(vec![P2p::Send(send, to), P2p::Recv(recv, from)])
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
        self.group(vec![P2p::Send(buf, to), P2p::Recv(&mut incoming, from)])?;
        buf.copy_from_slice(&incoming);
        Ok(())
    }

    /// Run several sends and receives together (`ncclGroupStart/End`
    /// around send/recv): they progress concurrently, so any pattern that
    /// is matched on both sides completes. Operations with the same peer
    /// are matched in order. Sends to and receives from this rank itself are
    /// matched in order and copied.
    pub fn group<T: Element>(&self, ops: Vec<P2p<'_, T>>) -> Result<()> {
        let n = self.nranks();
        let mut specs: Vec<BufSpec> = vec![BufSpec::EMPTY; 2];
        let mut steps = Vec::new();
        let mut self_sends: Vec<&[T]> = Vec::new();
        let mut self_recvs: Vec<*mut [T]> = Vec::new();
        for op in ops {
            let peer = match &op {
                P2p::Send(_, p) | P2p::Recv(_, p) => *p,
            };
            if peer >= n {
                return Err(Error::invalid(format!(
                    "peer {peer} is not a rank of this {n}-rank communicator"
                )));
            }
            match op {
                P2p::Send(b, p) if p == self.rank() => self_sends.push(b),
                P2p::Recv(b, p) if p == self.rank() => self_recvs.push(b as *mut [T]),
                P2p::Send(b, p) => {
                    steps.push(P2pStep::Send {
                        peer: p,
                        buf: specs.len() as u16,
                        len: b.len(),
                    });
                    specs.push(BufSpec::read_only(as_bytes(b)));
                }
                P2p::Recv(b, p) => {
                    steps.push(P2pStep::Recv {
                        peer: p,
                        buf: specs.len() as u16,
                        len: b.len(),
                    });
                    specs.push(BufSpec::writable(as_bytes_mut(b)));
                }
            }
        }
        if specs.len() > u16::MAX as usize - 1 {
            return Err(Error::invalid("too many operations in one group"));
        }
        if self_sends.len() != self_recvs.len() {
            return Err(Error::invalid(format!(
                "group has {} sends to this rank itself but {} receives from it",
                self_sends.len(),
                self_recvs.len()
            )));
        }
        for (s, r) in self_sends.iter().zip(&self_recvs) {
            let rl = r.len();
            if s.len() != rl {
                return Err(Error::invalid(format!(
                    "self send of {} elements matched with a receive of {rl}",
                    s.len()
                )));
            }
        }
        let dtype = T::DTYPE;
        self.run(move |inner, st| {
            for (s, r) in self_sends.iter().zip(&self_recvs) {
                // SAFETY: distinct caller borrows (a & and a &mut cannot alias).
                unsafe { (**r).copy_from_slice(s) };
            }
            if steps.is_empty() {
                return Ok(());
            }
            let sched = algorithms::p2p(&steps, inner.chunk_elems(dtype));
            let per_step = inner.p2p_numbers(st, &steps, &sched, dtype);
            let fp = Fingerprint::new(Kind::P2p, dtype, 0);
            inner.execute(st, fp, &sched, &specs, Some(per_step))
        })
    }

    // ------------------------------------------------------------ async --

    fn coll_async<T: Element>(
        &self,
        kind: Kind,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Work<Vec<T>> {
        let count = match self.check(kind, None, buf.len(), root) {
            Ok(c) => c,
            Err(e) => return self.inner.worker.submit(move || Err(e)),
        };
        let rank = self.rank();
        let c = Coll {
            kind,
            dtype: T::DTYPE,
            op,
            root,
            count,
            in_place: true,
        };
        self.submit(move |inner, st| {
            {
                let es = T::DTYPE.size();
                let bytes = as_bytes_mut(&mut buf);
                let (send, recv) = match kind {
                    Kind::AllGather => (
                        Some(BufSpec {
                            ptr: bytes[rank * count * es..].as_mut_ptr(),
                            bytes: count * es,
                        }),
                        BufSpec::writable(bytes),
                    ),
                    Kind::ReduceScatter => (
                        Some(BufSpec::writable(bytes)),
                        BufSpec {
                            ptr: bytes[rank * count * es..].as_mut_ptr(),
                            bytes: count * es,
                        },
                    ),
                    _ => (None, BufSpec::writable(bytes)),
                };
                run_coll(inner, st, &c, send, recv)?;
            }
            if kind == Kind::ReduceScatter {
                buf.drain(..rank * count);
                buf.truncate(count);
            }
            Ok(buf)
        })
    }

    /// Async in-place all-reduce of an owned buffer.
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.coll_async(Kind::AllReduce, buf, op, 0)
    }
    /// Async all-gather: returns `nranks * send.len()` elements.
    pub fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Work<Vec<T>> {
        let mut buf = vec![T::default(); send.len() * self.nranks()];
        buf[self.rank() * send.len()..(self.rank() + 1) * send.len()].copy_from_slice(&send);
        self.coll_async(Kind::AllGather, buf, ReduceOp::Sum, 0)
    }
    /// Async reduce-scatter: returns this rank's `send.len() / nranks` elements.
    pub fn reduce_scatter_async<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.coll_async(Kind::ReduceScatter, send, op, 0)
    }
    /// Async in-place broadcast.
    pub fn broadcast_async<T: Element>(&self, buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        self.coll_async(Kind::Broadcast, buf, ReduceOp::Sum, root)
    }
    /// Async in-place reduce (the root's buffer gets the result).
    pub fn reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp, root: usize) -> Work<Vec<T>> {
        self.coll_async(Kind::Reduce, buf, op, root)
    }
    /// Async in-place all-to-all.
    pub fn all_to_all_async<T: Element>(&self, buf: Vec<T>) -> Work<Vec<T>> {
        self.coll_async(Kind::AllToAll, buf, ReduceOp::Sum, 0)
    }
    /// Async barrier.
    pub fn barrier_async(&self) -> Work<()> {
        self.submit(run_barrier)
    }
    /// Async send of an owned buffer (returned when sent).
    pub fn send_async<T: Element>(&self, buf: Vec<T>, peer: usize) -> Work<Vec<T>> {
        self.p2p_async(buf, peer, true)
    }
    /// Async receive into an owned buffer (returned when filled).
    pub fn recv_async<T: Element>(&self, buf: Vec<T>, peer: usize) -> Work<Vec<T>> {
        self.p2p_async(buf, peer, false)
    }

    fn p2p_async<T: Element>(&self, mut buf: Vec<T>, peer: usize, is_send: bool) -> Work<Vec<T>> {
        let n = self.nranks();
        if peer >= n || peer == self.rank() {
            let e = Error::invalid(format!(
                "async point-to-point peer {peer} must be another rank of 0..{n}"
            ));
            return self.inner.worker.submit(move || Err(e));
        }
        let dtype = T::DTYPE;
        self.submit(move |inner, st| {
            let len = buf.len();
            let bytes = as_bytes_mut(&mut buf);
            let spec = BufSpec::writable(bytes);
            let step = if is_send {
                P2pStep::Send { peer, buf: 2, len }
            } else {
                P2pStep::Recv { peer, buf: 2, len }
            };
            let sched = algorithms::p2p(&[step], inner.chunk_elems(dtype));
            let per_step = inner.p2p_numbers(st, &[step], &sched, dtype);
            let dummy = BufSpec::EMPTY;
            inner.execute(
                st,
                Fingerprint::new(Kind::P2p, dtype, 0),
                &sched,
                &[dummy, dummy, spec],
                Some(per_step),
            )?;
            Ok(buf)
        })
    }
}
