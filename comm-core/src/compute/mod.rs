//! Compute engines: the local work of a schedule (copies, n-way
//! reductions, the division of `Avg`), on memory of the spaces an engine
//! reaches. Work is *started* and completes later; the executor waits for it
//! in the same `poll(2)` as for its links, through the engine's completion
//! fd. The host engine runs the SIMD kernels synchronously, so its work is
//! complete when started and it has no fd. A CUDA engine (a stream, events,
//! a host callback writing an eventfd) implements the same trait; schedules
//! and the executor do not change.
//!
//! Engines only compute: they never communicate and never decide what to
//! compute (that is the schedule's job).

mod host;

/// The host reduction without an engine, for host memory by construction.
pub(crate) use host::reduce_host;
pub use host::HostCompute;
/// The reductions an engine computes (`Avg` arrives as `Sum` + `divide`).
pub use kernels::Op;

use crate::error::Result;
use crate::mem::{MemorySpace, Region};
use crate::types::DataType;
use std::os::fd::RawFd;

/// Work an engine started; [`Compute::poll`] says when it completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending(pub u64);

impl Pending {
    /// Work that completed before it was returned.
    pub const DONE: Pending = Pending(0);
}

/// An engine for local work. Regions are in bytes; reductions act on
/// `dst.len / dtype.size()` elements.
pub trait Compute: Send {
    /// Name for messages (`host`, `cuda:0`).
    fn name(&self) -> &'static str;
    /// Whether it can read and write memory in `space`.
    fn reaches(&self, space: MemorySpace) -> bool;
    /// Start `dst = src` (same length; they may overlap).
    fn copy(&mut self, dst: Region, src: Region) -> Result<Pending>;
    /// [`Compute::copy`] into a large call's final output, which nobody
    /// reads soon: a host engine may write it past the cache.
    fn copy_final(&mut self, dst: Region, src: Region) -> Result<Pending> {
        self.copy(dst, src)
    }
    /// [`Compute::copy`] into memory known to stay cached (what the ranks
    /// sharing the cache touch in the call fits it): a host engine keeps
    /// it there whatever its size, where [`Compute::copy`] streams large
    /// copies.
    fn copy_kept(&mut self, dst: Region, src: Region) -> Result<Pending> {
        self.copy(dst, src)
    }
    /// Start `dst = srcs[0] op srcs[1] op ..`, combined in that order (so
    /// every rank computing the same combination gets the same bits). `dst`
    /// may be one of the sources; sources may not overlap `dst` otherwise.
    fn reduce(
        &mut self,
        dtype: DataType,
        op: kernels::Op,
        dst: Region,
        srcs: &[Region],
    ) -> Result<Pending>;
    /// Start `dsts[k] = srcs[0] op srcs[1] op ..` for every `k`, in that
    /// order (the bits of [`Compute::reduce`]). A destination may be a
    /// source exactly (in place), never overlap one otherwise. The first
    /// `streamed` destinations are a large call's final outputs, which
    /// nobody reads soon. An engine whose work completes in order may do it
    /// as a reduction into the first destination and copies from it (this
    /// default).
    fn reduce_fanout(
        &mut self,
        dtype: DataType,
        op: kernels::Op,
        dsts: &[Region],
        srcs: &[Region],
        streamed: usize,
    ) -> Result<Pending> {
        let _ = streamed;
        reduce_then_copy(self, dtype, op, dsts, srcs)
    }
    /// Start `dst /= divisor` (the end of `Avg`).
    fn divide(&mut self, dtype: DataType, dst: Region, divisor: usize) -> Result<Pending>;
    /// Whether `work` completed; its failure is returned here.
    fn poll(&mut self, work: Pending) -> Result<bool>;
    /// Wait until all started work has completed (a call that ends early,
    /// on an error, must not return while the engine still touches the
    /// caller's memory). An engine's work never waits for peers, so this
    /// ends.
    fn quiesce(&mut self) -> Result<()> {
        Ok(())
    }
    /// A ticket that completes once all work started so far, and what the
    /// engine itself waits for, has completed (a device engine's stream may
    /// wait for a caller's stream); polled like any work, so the waiter
    /// keeps its deadline.
    fn fence(&mut self) -> Result<Pending> {
        Ok(Pending::DONE)
    }
    /// Called before the executor sleeps with work of this engine in
    /// flight: an fd that becomes readable once the work started so far
    /// may have completed (an engine may arrange that wake-up only now,
    /// keeping it off the path of work that completes while polled, and
    /// clear stale wake-ups first: the executor polls the work once more
    /// after this call before it sleeps); `None` when every piece of work
    /// completes before it is returned.
    fn completion_fd(&mut self) -> Result<Option<RawFd>> {
        Ok(None)
    }
    /// At least `bytes` of this engine's own memory for a call's scratch,
    /// kept and reused between calls; `None`: host memory of the caller's
    /// will do (the host engine).
    fn workspace(&mut self, bytes: usize) -> Result<Option<Region>> {
        let _ = bytes;
        Ok(None)
    }
    /// At least `bytes` of host memory that messages of a staged call pass
    /// through, the kind this engine copies to and from fastest (pinned,
    /// for a device); `None`: plain host memory will do.
    fn staging(&mut self, bytes: usize) -> Result<Option<Region>> {
        let _ = bytes;
        Ok(None)
    }
}

/// [`Compute::reduce_fanout`] as a reduction into the first destination
/// and copies from it (in-order engines; the host's beyond its stack).
pub(crate) fn reduce_then_copy<C: Compute + ?Sized>(
    engine: &mut C,
    dtype: DataType,
    op: kernels::Op,
    dsts: &[Region],
    srcs: &[Region],
) -> Result<Pending> {
    let mut last = engine.reduce(dtype, op, dsts[0], srcs)?;
    for d in &dsts[1..] {
        last = engine.copy(*d, dsts[0])?;
    }
    Ok(last)
}
