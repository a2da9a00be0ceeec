//! The matrix on registered buffers (`alloc_shared`): every collective the
//! `direct` algorithm runs (all_reduce, all_gather, reduce_scatter,
//! broadcast, reduce, all_to_all), every dtype and op, in and out of place, each
//! element exact, and the algorithm that ran checked: `direct` when the
//! buffers are reachable by every peer (shared memory mapped, RDMA read
//! one-sided) and the call large enough for it, the message algorithms
//! otherwise.

use super::{data, err, expected, first_diff, value, TestElem};
use crate::{bf16, f16, Communicator, ReduceOp, SharedBuffer};

/// Which calls on registered buffers must run `direct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectFrom {
    /// None: the transport does not reach peers' memory.
    Never,
    /// Calls whose NCCL-style count is at least this many bytes (0: all;
    /// one-sided access leaves small calls to the message algorithms).
    Bytes(usize),
}

impl DirectFrom {
    fn reachable(self) -> bool {
        self != DirectFrom::Never
    }
    fn direct<T>(self, count: usize) -> bool {
        matches!(self, DirectFrom::Bytes(b) if count * std::mem::size_of::<T>() >= b)
    }
}

/// Check everything above on `comm`, expecting `want_direct` (every rank's
/// buffers agree).
pub fn run_registered(
    comm: &Communicator,
    want_direct: DirectFrom,
    big: usize,
) -> Result<(), String> {
    let n = comm.nranks();
    let k = Check {
        c: comm,
        want: want_direct,
    };
    let counts = [0, 1, 7, n - 1, n + 1, big];
    all_reduce::<i8>(&k, &counts)?;
    all_reduce::<u8>(&k, &counts)?;
    all_reduce::<i32>(&k, &counts)?;
    all_reduce::<u32>(&k, &counts)?;
    all_reduce::<i64>(&k, &counts)?;
    all_reduce::<u64>(&k, &counts)?;
    all_reduce::<f16>(&k, &counts)?;
    all_reduce::<bf16>(&k, &counts)?;
    all_reduce::<f32>(&k, &counts)?;
    all_reduce::<f64>(&k, &counts)?;
    let small = [0, 1, 7, big / 4 + 1];
    others::<i8>(&k, &small)?;
    others::<u32>(&k, &small)?;
    others::<bf16>(&k, &small)?;
    others::<f16>(&k, &small)?;
    others::<f32>(&k, &small)?;
    others::<i64>(&k, &small)?;
    comm.barrier().map_err(err)
}

/// One rank's side of the checks: the communicator and what it expects.
struct Check<'a> {
    c: &'a Communicator,
    want: DirectFrom,
}

impl Check<'_> {
    /// A registered buffer holding `v`.
    fn filled<T: TestElem>(&self, v: &[T]) -> Result<SharedBuffer<T>, String> {
        let mut b = self.c.alloc_shared::<T>(v.len()).map_err(err)?;
        b.copy_from_slice(v);
        Ok(b)
    }

    /// A zeroed registered buffer of `len` elements.
    fn zeroed<T: TestElem>(&self, len: usize) -> Result<SharedBuffer<T>, String> {
        self.c.alloc_shared::<T>(len).map_err(err)
    }

    /// After a call of `count` elements into `got`: the buffer was
    /// reachable as expected, `direct` ran exactly when it should, and
    /// every element is as `want` says.
    fn after<T: TestElem>(
        &self,
        got: &SharedBuffer<T>,
        count: usize,
        want: impl Fn(usize) -> T,
        what: &str,
    ) -> Result<(), String> {
        let (shared, expected) = (got.is_zero_copy(), self.want);
        expect(shared == expected.reachable(), || {
            format!("{what}: registered buffer reachable by peers: {shared}, expected {expected:?}")
        })?;
        // The small-message path reads peers' mapped memory as `direct`
        // does (small all_reduces among the ranks of one host).
        let alg = self.c.last_algorithm();
        let direct = matches!(alg, Some("direct" | "small"));
        expect(direct == expected.direct::<T>(count), || {
            format!("{what}: ran {alg:?}, expected direct from {expected:?}")
        })?;
        match first_diff(got, want) {
            Some(d) => Err(format!("{what}: {d}")),
            None => Ok(()),
        }
    }
}

fn expect(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn all_reduce<T: TestElem>(k: &Check, counts: &[usize]) -> Result<(), String> {
    let (r, n) = (k.c.rank(), k.c.nranks());
    for &count in counts {
        for op in ReduceOp::ALL {
            let what = format!("rank {r}: {} all_reduce {op} count {count}", T::DTYPE);
            let input: Vec<T> = data(op, r, 0, count);
            let want = |i: usize| expected(op, n, i);
            let mut buf = k.filled(&input)?;
            k.c.all_reduce_in_place(&mut buf, op).map_err(err)?;
            k.after(&buf, count, want, &format!("{what}, in place"))?;
            let send = k.filled(&input)?;
            let mut recv = k.zeroed::<T>(count)?;
            k.c.all_reduce(&send, &mut recv, op).map_err(err)?;
            k.after(&recv, count, want, &format!("{what}, out of place"))?;
            expect(send[..] == input[..], || {
                format!("{what}: the send buffer changed")
            })?;
        }
    }
    Ok(())
}

fn others<T: TestElem>(k: &Check, counts: &[usize]) -> Result<(), String> {
    let (r, n) = (k.c.rank(), k.c.nranks());
    for &count in counts {
        let what = |s: &str| format!("rank {r}: {} {s} count {count}", T::DTYPE);
        let mine = data::<T>(ReduceOp::Sum, r, 0, count);
        for root in [0, n - 1] {
            let w = what(&format!("broadcast root {root}"));
            let want = |i: usize| T::from_i(value(ReduceOp::Sum, root, i));
            let mut b = k.filled(&mine)?;
            k.c.broadcast_in_place(&mut b, root).map_err(err)?;
            k.after(&b, count, want, &format!("{w}, in place"))?;
            // Out of place: the root's input lands in every output.
            let src = k.filled(&mine)?;
            let mut out = k.zeroed::<T>(count)?;
            k.c.broadcast(&src, &mut out, root).map_err(err)?;
            k.after(&out, count, want, &format!("{w}, out of place"))?;
        }
        // all_gather, in place: this rank's part at rank * count.
        let w = what("all_gather");
        let want = |i: usize| T::from_i(value(ReduceOp::Sum, i / count, i % count));
        let mut b = k.zeroed::<T>(n * count)?;
        b[r * count..(r + 1) * count].copy_from_slice(&mine);
        k.c.all_gather_in_place(&mut b).map_err(err)?;
        k.after(&b, count, want, &format!("{w}, in place"))?;
        let src = k.filled(&mine)?;
        let mut out = k.zeroed::<T>(n * count)?;
        k.c.all_gather(&src, &mut out).map_err(err)?;
        k.after(&out, count, want, &format!("{w}, out of place"))?;
        // reduce_scatter for every op, in and out of place.
        for op in ReduceOp::ALL {
            let w = what(&format!("reduce_scatter {op}"));
            let full: Vec<T> = data(op, r, 0, n * count);
            let mut b = k.filled(&full)?;
            k.c.reduce_scatter_in_place(&mut b, op).map_err(err)?;
            // Outside its segment the buffer is left as it was.
            let want = |i: usize| {
                if i / count.max(1) == r && count > 0 {
                    expected(op, n, i)
                } else {
                    full[i]
                }
            };
            k.after(&b, count, want, &format!("{w}, in place"))?;
            let src = k.filled(&full)?;
            let mut out = k.zeroed::<T>(count)?;
            k.c.reduce_scatter(&src, &mut out, op).map_err(err)?;
            let want = |i: usize| expected(op, n, r * count + i);
            k.after(&out, count, want, &format!("{w}, out of place"))?;
        }
        // reduce for every op and two roots, in and out of place; out of
        // place a non-root passes no output (the root's alone is agreed
        // on), and its input must come back unchanged.
        for op in ReduceOp::ALL {
            for root in [0, n - 1] {
                let w = what(&format!("reduce {op} root {root}"));
                let mine: Vec<T> = data(op, r, 0, count);
                let want = |i: usize| match r == root {
                    true => expected(op, n, i),
                    false => mine[i],
                };
                let mut b = k.filled(&mine)?;
                k.c.reduce_in_place(&mut b, op, root).map_err(err)?;
                k.after(&b, count, want, &format!("{w}, in place"))?;
                // (Registering is collective: every rank allocates.)
                let src = k.filled(&mine)?;
                let mut out = k.zeroed::<T>(count)?;
                if r == root {
                    k.c.reduce(&src, &mut out, op, root).map_err(err)?;
                    k.after(&out, count, want, &format!("{w}, out of place"))?;
                } else {
                    k.c.reduce(&src, &mut Vec::<T>::new(), op, root)
                        .map_err(err)?;
                    k.after(&src, count, |i| mine[i], &format!("{w}, out of place"))?;
                }
            }
        }
        // all_to_all, in and out of place: segment k of the output is rank
        // k's input segment `r`.
        let w = what("all_to_all");
        let full: Vec<T> = data(ReduceOp::Sum, r, 0, n * count);
        let want = |i: usize| T::from_i(value(ReduceOp::Sum, i / count, r * count + i % count));
        let mut b = k.filled(&full)?;
        k.c.all_to_all_in_place(&mut b).map_err(err)?;
        k.after(&b, count, want, &format!("{w}, in place"))?;
        let src = k.filled(&full)?;
        let mut out = k.zeroed::<T>(n * count)?;
        k.c.all_to_all(&src, &mut out).map_err(err)?;
        k.after(&out, count, want, &format!("{w}, out of place"))?;
    }
    Ok(())
}
