//! The matrix on registered buffers (`alloc_shared`): every collective the
//! `direct` algorithm runs, every dtype and op, in and out of place, each
//! element exact, and the algorithm that ran checked: `direct` when the
//! buffers are reachable by every peer (shared memory mapped, RDMA read
//! one-sided) and the call large enough for it, the message algorithms
//! otherwise.

use super::{data, err, expected, first_diff, value, TestElem};
use crate::{bf16, f16, Communicator, ReduceOp};

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
    let counts = [0, 1, 7, n - 1, n + 1, big];
    all_reduce::<i8>(comm, want_direct, &counts)?;
    all_reduce::<u8>(comm, want_direct, &counts)?;
    all_reduce::<i32>(comm, want_direct, &counts)?;
    all_reduce::<u32>(comm, want_direct, &counts)?;
    all_reduce::<i64>(comm, want_direct, &counts)?;
    all_reduce::<u64>(comm, want_direct, &counts)?;
    all_reduce::<f16>(comm, want_direct, &counts)?;
    all_reduce::<bf16>(comm, want_direct, &counts)?;
    all_reduce::<f32>(comm, want_direct, &counts)?;
    all_reduce::<f64>(comm, want_direct, &counts)?;
    let small = [0, 1, 7, big / 4 + 1];
    others::<i8>(comm, want_direct, &small)?;
    others::<u32>(comm, want_direct, &small)?;
    others::<bf16>(comm, want_direct, &small)?;
    others::<f16>(comm, want_direct, &small)?;
    others::<f32>(comm, want_direct, &small)?;
    others::<i64>(comm, want_direct, &small)?;
    comm.barrier().map_err(err)
}

/// Every element of `got` as `want` says, or an error naming the first
/// that is not.
fn exact<T: TestElem>(got: &[T], want: impl Fn(usize) -> T, what: &str) -> Result<(), String> {
    match first_diff(got, want) {
        Some(d) => Err(format!("{what}: {d}")),
        None => Ok(()),
    }
}

fn expect(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// The buffer is reachable as expected and a call of `count` elements of
/// `T` ran `direct` exactly when it should.
fn ran_as_expected<T>(
    c: &Communicator,
    shared: bool,
    want: DirectFrom,
    count: usize,
    what: &str,
) -> Result<(), String> {
    expect(shared == want.reachable(), || {
        format!("{what}: registered buffer reachable by peers: {shared}, expected {want:?}")
    })?;
    let alg = c.last_algorithm();
    expect((alg == Some("direct")) == want.direct::<T>(count), || {
        format!("{what}: ran {alg:?}, expected direct from {want:?}")
    })
}

fn all_reduce<T: TestElem>(
    c: &Communicator,
    want_direct: DirectFrom,
    counts: &[usize],
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    for &count in counts {
        for op in ReduceOp::ALL {
            let what = format!("rank {r}: {} all_reduce {op} count {count}", T::DTYPE);
            let input: Vec<T> = data(op, r, 0, count);
            let mut buf = c.alloc_shared::<T>(count).map_err(err)?;
            buf.copy_from_slice(&input);
            c.all_reduce_in_place(&mut buf, op).map_err(err)?;
            ran_as_expected::<T>(c, buf.is_zero_copy(), want_direct, count, &what)?;
            exact(&buf, |i| expected(op, n, i), &format!("{what}, in place"))?;
            let mut send = c.alloc_shared::<T>(count).map_err(err)?;
            send.copy_from_slice(&input);
            let mut recv = c.alloc_shared::<T>(count).map_err(err)?;
            c.all_reduce(&send, &mut recv, op).map_err(err)?;
            ran_as_expected::<T>(c, recv.is_zero_copy(), want_direct, count, &what)?;
            exact(
                &recv,
                |i| expected(op, n, i),
                &format!("{what}, out of place"),
            )?;
            expect(send[..] == input[..], || {
                format!("{what}: the send buffer changed")
            })?;
        }
    }
    Ok(())
}

fn others<T: TestElem>(
    c: &Communicator,
    want_direct: DirectFrom,
    counts: &[usize],
) -> Result<(), String> {
    let (r, n) = (c.rank(), c.nranks());
    for &count in counts {
        let what = |k: &str| format!("rank {r}: {} {k} count {count}", T::DTYPE);
        for root in [0, n - 1] {
            let w = what(&format!("broadcast root {root}"));
            let mut b = c.alloc_shared::<T>(count).map_err(err)?;
            b.copy_from_slice(&data::<T>(ReduceOp::Sum, r, 0, count));
            c.broadcast_in_place(&mut b, root).map_err(err)?;
            ran_as_expected::<T>(c, b.is_zero_copy(), want_direct, count, &w)?;
            let want = |i: usize| T::from_i(value(ReduceOp::Sum, root, i));
            exact(&b, want, &w)?;
            // Out of place: the root's input lands in every output.
            let mut src = c.alloc_shared::<T>(count).map_err(err)?;
            src.copy_from_slice(&data::<T>(ReduceOp::Sum, r, 0, count));
            let mut out = c.alloc_shared::<T>(count).map_err(err)?;
            c.broadcast(&src, &mut out, root).map_err(err)?;
            ran_as_expected::<T>(c, out.is_zero_copy(), want_direct, count, &w)?;
            exact(&out, want, &format!("{w}, out of place"))?;
        }
        // all_gather, in place: this rank's part at rank * count.
        let w = what("all_gather");
        let mine = data::<T>(ReduceOp::Sum, r, 0, count);
        let mut b = c.alloc_shared::<T>(n * count).map_err(err)?;
        b[r * count..(r + 1) * count].copy_from_slice(&mine);
        c.all_gather_in_place(&mut b).map_err(err)?;
        ran_as_expected::<T>(c, b.is_zero_copy(), want_direct, count, &w)?;
        let want = |i: usize| T::from_i(value(ReduceOp::Sum, i / count, i % count));
        exact(&b, want, &format!("{w}, in place"))?;
        let mut src = c.alloc_shared::<T>(count).map_err(err)?;
        src.copy_from_slice(&mine);
        let mut out = c.alloc_shared::<T>(n * count).map_err(err)?;
        c.all_gather(&src, &mut out).map_err(err)?;
        ran_as_expected::<T>(c, out.is_zero_copy(), want_direct, count, &w)?;
        exact(&out, want, &format!("{w}, out of place"))?;
        // reduce_scatter for every op, in and out of place.
        for op in ReduceOp::ALL {
            let w = what(&format!("reduce_scatter {op}"));
            let full: Vec<T> = data(op, r, 0, n * count);
            let mut b = c.alloc_shared::<T>(n * count).map_err(err)?;
            b.copy_from_slice(&full);
            c.reduce_scatter_in_place(&mut b, op).map_err(err)?;
            ran_as_expected::<T>(c, b.is_zero_copy(), want_direct, count, &w)?;
            // Outside its segment the buffer is left as it was.
            let want = |i: usize| {
                if i / count.max(1) == r && count > 0 {
                    expected(op, n, i)
                } else {
                    full[i]
                }
            };
            exact(&b, want, &format!("{w}, in place"))?;
            let mut src = c.alloc_shared::<T>(n * count).map_err(err)?;
            src.copy_from_slice(&full);
            let mut out = c.alloc_shared::<T>(count).map_err(err)?;
            c.reduce_scatter(&src, &mut out, op).map_err(err)?;
            ran_as_expected::<T>(c, out.is_zero_copy(), want_direct, count, &w)?;
            let want = |i: usize| expected(op, n, r * count + i);
            exact(&out, want, &format!("{w}, out of place"))?;
        }
    }
    Ok(())
}
