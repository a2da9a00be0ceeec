//! The seven collectives as the benchmark sees them: buffer sizes for a
//! byte size, the bus-bandwidth factor, how to run each out of place and
//! in place, and how to check the result exactly.

use oxccl::selftest::{data, expected, value, TestElem};
use oxccl::{Communicator, ReduceOp, Result};

/// A benchmarked collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

/// Buffer geometry for one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Bytes in the size column (nccl-tests' convention for the collective).
    pub bytes: usize,
    /// Elements in the count column.
    pub count: usize,
    pub send_len: usize,
    pub recv_len: usize,
    /// Per-rank element count for the segmented collectives.
    pub per_rank: usize,
}

impl Coll {
    /// The program name (`all_reduce_perf`).
    pub fn program(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce_perf",
            Coll::AllGather => "all_gather_perf",
            Coll::ReduceScatter => "reduce_scatter_perf",
            Coll::Broadcast => "broadcast_perf",
            Coll::Reduce => "reduce_perf",
            Coll::AllToAll => "alltoall_perf",
            Coll::SendRecv => "sendrecv_perf",
        }
    }

    /// Whether the reduction operator applies.
    pub fn has_op(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether a root applies.
    pub fn has_root(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// busbw = factor × algbw, as nccl-tests defines it.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }

    /// Buffers for a requested size: segmented collectives round down to a
    /// multiple of the rank count (the size column shows what ran).
    pub fn shape(self, bytes: usize, elem: usize, n: usize) -> Shape {
        let count = bytes / elem;
        match self {
            Coll::AllGather => {
                let c = count / n;
                Shape {
                    bytes: c * n * elem,
                    count: c * n,
                    send_len: c,
                    recv_len: c * n,
                    per_rank: c,
                }
            }
            Coll::ReduceScatter => {
                let c = count / n;
                Shape {
                    bytes: c * n * elem,
                    count: c * n,
                    send_len: c * n,
                    recv_len: c,
                    per_rank: c,
                }
            }
            Coll::AllToAll => {
                let c = count / n;
                Shape {
                    bytes: c * n * elem,
                    count: c * n,
                    send_len: c * n,
                    recv_len: c * n,
                    per_rank: c,
                }
            }
            _ => Shape {
                bytes: count * elem,
                count,
                send_len: count,
                recv_len: count,
                per_rank: count,
            },
        }
    }
}

/// Buffers of one (collective, dtype, size) run on one rank.
pub struct Buffers<T> {
    pub send: Vec<T>,
    pub recv: Vec<T>,
}

/// Operator whose data a non-reducing collective uses.
const DATA_OP: ReduceOp = ReduceOp::Sum;

impl Coll {
    fn data_op(self, op: ReduceOp) -> ReduceOp {
        if self.has_op() {
            op
        } else {
            DATA_OP
        }
    }

    /// Fresh buffers holding this rank's input; for in-place runs the input
    /// is placed where the in-place call expects it.
    pub fn buffers<T: TestElem>(
        self,
        s: &Shape,
        comm: &Communicator,
        op: ReduceOp,
        in_place: bool,
    ) -> Buffers<T> {
        let (r, op) = (comm.rank(), self.data_op(op));
        let send: Vec<T> = data(op, r, 0, s.send_len);
        let mut recv = vec![T::default(); s.recv_len];
        if in_place {
            match self {
                Coll::AllGather => {
                    recv[r * s.per_rank..(r + 1) * s.per_rank].copy_from_slice(&send)
                }
                _ if s.send_len == s.recv_len => recv.copy_from_slice(&send),
                _ => {}
            }
        }
        Buffers { send, recv }
    }

    /// Run once. In place, the result is in `recv` (reduce_scatter: in `send`,
    /// at this rank's segment).
    pub fn run<T: TestElem>(
        self,
        comm: &Communicator,
        b: &mut Buffers<T>,
        op: ReduceOp,
        root: usize,
        in_place: bool,
    ) -> Result<()> {
        // The ring neighbours, for send/recv only (two divisions: not part
        // of every other call's time).
        let ring = || {
            let n = comm.nranks();
            ((comm.rank() + 1) % n, (comm.rank() + n - 1) % n)
        };
        match (self, in_place) {
            (Coll::AllReduce, false) => comm.all_reduce(&b.send, &mut b.recv, op),
            (Coll::AllReduce, true) => comm.all_reduce_in_place(&mut b.recv, op),
            (Coll::AllGather, false) => comm.all_gather(&b.send, &mut b.recv),
            (Coll::AllGather, true) => comm.all_gather_in_place(&mut b.recv),
            (Coll::ReduceScatter, false) => comm.reduce_scatter(&b.send, &mut b.recv, op),
            (Coll::ReduceScatter, true) => comm.reduce_scatter_in_place(&mut b.send, op),
            (Coll::Broadcast, false) => comm.broadcast(&b.send, &mut b.recv, root),
            (Coll::Broadcast, true) => comm.broadcast_in_place(&mut b.recv, root),
            (Coll::Reduce, false) => comm.reduce(&b.send, &mut b.recv, op, root),
            (Coll::Reduce, true) => comm.reduce_in_place(&mut b.recv, op, root),
            (Coll::AllToAll, false) => comm.all_to_all(&b.send, &mut b.recv),
            (Coll::AllToAll, true) => comm.all_to_all_in_place(&mut b.recv),
            (Coll::SendRecv, false) => {
                let (next, prev) = ring();
                comm.send_recv(&b.send, next, &mut b.recv, prev)
            }
            (Coll::SendRecv, true) => {
                let (next, prev) = ring();
                comm.send_recv_replace(&mut b.recv, next, prev)
            }
        }
    }

    /// Count wrong elements of this rank's result after one `run` on fresh
    /// buffers. Every element is compared exactly.
    pub fn wrong<T: TestElem>(
        self,
        comm: &Communicator,
        s: &Shape,
        b: &Buffers<T>,
        op: ReduceOp,
        root: usize,
        in_place: bool,
    ) -> u64 {
        let (r, n) = (comm.rank(), comm.nranks());
        let dop = self.data_op(op);
        let c = s.per_rank;
        let count = |got: &[T], want: &dyn Fn(usize) -> T| {
            got.iter()
                .enumerate()
                .filter(|(i, g)| !T::same(**g, want(*i)))
                .count() as u64
        };
        let v = |rank: usize, i: usize| T::from_i(value(dop, rank, i));
        match self {
            Coll::AllReduce => count(&b.recv, &|i| expected(op, n, i)),
            Coll::AllGather => count(&b.recv, &|i| v(i / c, i % c)),
            Coll::ReduceScatter if in_place => {
                count(&b.send[r * c..(r + 1) * c], &|i| expected(op, n, r * c + i))
            }
            Coll::ReduceScatter => count(&b.recv, &|i| expected(op, n, r * c + i)),
            Coll::Broadcast => count(&b.recv, &|i| v(root, i)),
            Coll::Reduce if r == root => count(&b.recv, &|i| expected(op, n, i)),
            Coll::Reduce if in_place => count(&b.recv, &|i| v(r, i)), // non-roots keep their input
            Coll::Reduce => 0,
            Coll::AllToAll => count(&b.recv, &|i| v(i / c, r * c + i % c)),
            Coll::SendRecv => count(&b.recv, &|i| v((r + n - 1) % n, i)),
        }
    }

    /// Flip one element of the result this rank checks (debug: proves the
    /// checker can fail).
    pub fn corrupt<T: TestElem>(
        self,
        comm: &Communicator,
        s: &Shape,
        b: &mut Buffers<T>,
        in_place: bool,
    ) {
        let r = comm.rank();
        let target = match self {
            Coll::ReduceScatter if in_place => b.send.get_mut(r * s.per_rank),
            _ => b.recv.first_mut(),
        };
        if let Some(x) = target {
            *x = T::from_i(if T::same(*x, T::from_i(99)) { 98 } else { 99 });
        }
    }
}
