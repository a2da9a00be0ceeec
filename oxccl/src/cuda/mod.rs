//! Collectives on CUDA device memory (the `cuda` feature).
//!
//! [`Cuda::attach`] adds a CUDA compute engine for one device to a
//! communicator; its methods then take device buffers — cudarc's
//! `CudaSlice`, `CudaView`, `CudaViewMut`, or raw device addresses for
//! other frameworks ([`Cuda::collective_raw`]) — and the stream the caller
//! orders its work on:
//!
//! - the collective starts after the work enqueued on that stream before
//!   the call (the engine's stream waits on an event recorded there; the
//!   CPU does not wait for it);
//! - the typed methods return when the collective has completed, so work
//!   the caller enqueues on any stream afterwards sees the result;
//! - [`Cuda::enqueue_raw`] returns at once, as NCCL does: the collective
//!   runs on the communicator's worker, and the caller's stream is held at
//!   a [`StreamGate`] until it is over, so work enqueued on that stream
//!   afterwards sees the result (and the stream is released on failure
//!   too: the failure is in the returned `Work` and in
//!   `Communicator::async_error`).
//!
//! Between ranks the data travels through pinned host staging slots over
//! the communicator's links (shared memory on a host, TCP or RDMA between
//! hosts), copied by the device's copy engines and reduced by oxccl's
//! kernels on the device; several ranks may share one GPU.

mod gate;

use crate::{
    Buffer, BufferMut, Communicator, DataType, DeviceSharedBuffer, Element, Error, Kind, ReduceOp,
    Region, Result, Work,
};
use compute_cuda::cudarc::driver::{sys, CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::{Arc, OnceLock};

pub use compute_cuda::{cudarc, probe, CudaCompute};
pub use gate::StreamGate;

/// A communicator's CUDA engine for one device, and the collectives on
/// that device's memory (see the module docs).
#[derive(Clone)]
pub struct Cuda<'c> {
    comm: &'c Communicator,
    ctx: Arc<CudaContext>,
    /// The engine's stream (the engine itself lives in the communicator).
    engine: Arc<CudaStream>,
    /// The engine's kernels: a queued call loads its element type's
    /// before it holds the caller's stream (see `compute_cuda::held`).
    modules: Arc<compute_cuda::Modules>,
    /// The gate queued calls hold their callers' streams at (made at the
    /// first queued call).
    gate: OnceLock<Arc<StreamGate>>,
}

impl std::fmt::Debug for Cuda<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("rank", &self.comm.rank())
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

impl<'c> Cuda<'c> {
    /// Add an engine for device `ordinal` (its primary context) to `comm`.
    /// `Error::Unsupported` names what is missing on a machine without the
    /// driver, NVRTC or that device.
    pub fn attach(comm: &'c Communicator, ordinal: usize) -> Result<Cuda<'c>> {
        Cuda::with_engine(comm, CudaCompute::new(ordinal)?)
    }

    /// The same on a context the program already has.
    pub fn attach_context(comm: &'c Communicator, ctx: Arc<CudaContext>) -> Result<Cuda<'c>> {
        Cuda::with_engine(comm, CudaCompute::with_context(ctx)?)
    }

    fn with_engine(comm: &'c Communicator, engine: CudaCompute) -> Result<Cuda<'c>> {
        let (ctx, stream) = (engine.context().clone(), engine.stream().clone());
        let modules = engine.modules().clone();
        comm.add_compute(Box::new(engine))?;
        Ok(Cuda {
            comm,
            ctx,
            engine: stream,
            modules,
            gate: OnceLock::new(),
        })
    }

    /// Allocate `len` zeroed elements of this device's memory that every
    /// rank of this host reaches directly (CUDA IPC; collective: every rank
    /// calls it in the same order with the same `len`). Collectives whose
    /// buffers are all such buffers read peers' memory where it lies (over
    /// NVLink, PCIe peer access, or on the one GPU ranks share) with the
    /// `direct` algorithm, no host staging; otherwise they are device
    /// memory like any other.
    pub fn alloc_shared<T: Element>(&self, len: usize) -> Result<DeviceSharedBuffer<T>> {
        let ipc = Arc::new(transport_nvlink::CudaIpc::new(self.ctx.clone()));
        self.comm.alloc_shared_device(len, ipc)
    }

    /// Collective `kind` on any buffers of this device (a
    /// [`DeviceSharedBuffer`], or a framework's storage implementing the
    /// buffer traits with device regions), ordered after `stream` and
    /// complete when it returns; `send: None` is in place.
    pub fn collective<T: Element, S: Buffer<T> + ?Sized, R: BufferMut<T> + ?Sized>(
        &self,
        kind: Kind,
        send: Option<&S>,
        recv: &mut R,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let s = send.map(|s| s.region());
        let r = recv.region_mut();
        self.run(kind, s, r, T::DTYPE, op, root, stream)
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The communicator.
    pub fn communicator(&self) -> &'c Communicator {
        self.comm
    }

    fn space(&self) -> crate::MemorySpace {
        crate::MemorySpace::Device {
            kind: crate::DeviceKind::Cuda,
            ordinal: self.ctx.ordinal() as u32,
        }
    }

    fn region(&self, ptr: sys::CUdeviceptr, bytes: usize) -> Region {
        Region {
            space: self.space(),
            addr: ptr as usize,
            len: bytes,
        }
    }

    /// Make the engine's next work wait for what `stream` holds now.
    fn after(&self, stream: &CudaStream) -> Result<()> {
        let fail = |what: &str, e: cudarc::driver::DriverError| Error::Device {
            device: format!("CUDA device {}", self.ctx.ordinal()),
            detail: format!("{what}: {e}"),
        };
        let ev = stream
            .record_event(None)
            .map_err(|e| fail("recording the caller's stream", e))?;
        self.engine
            .wait(&ev)
            .map_err(|e| fail("ordering after the caller's stream", e))
    }

    /// Run collective `kind` on device regions, ordered after `stream`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        kind: Kind,
        send: Option<Region>,
        recv: Region,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.after(stream)?;
        // SAFETY: the regions come from device buffers borrowed (and, for
        // `recv`, borrowed mutably) for this whole call by the caller, of
        // whole `dtype` elements (cudarc slices are typed and aligned).
        unsafe {
            self.comm
                .collective_regions(kind, send, recv, dtype, op, root)
        }
    }

    /// `recv = op over ranks of send` (`ncclAllReduce`).
    pub fn all_reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let bytes = |n: usize| n * std::mem::size_of::<T>();
        let (s, _rs) = send.device_ptr(stream);
        let sn = bytes(send.len());
        let rn = bytes(recv.len());
        let (r, _rr) = recv.device_ptr_mut(stream);
        let (s, r) = (self.region(s, sn), self.region(r, rn));
        self.run(Kind::AllReduce, Some(s), r, T::DTYPE, op, 0, stream)
    }

    /// In-place all_reduce.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = buf.len() * std::mem::size_of::<T>();
        let (p, _g) = buf.device_ptr_mut(stream);
        let r = self.region(p, n);
        self.run(Kind::AllReduce, None, r, T::DTYPE, op, 0, stream)
    }

    /// `recv = concatenation over ranks of send` (`ncclAllGather`).
    pub fn all_gather<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<()> {
        self.two(Kind::AllGather, send, recv, ReduceOp::Sum, 0, stream)
    }

    /// `recv = segment rank of op over ranks of send` (`ncclReduceScatter`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        self.two(Kind::ReduceScatter, send, recv, op, 0, stream)
    }

    /// `recv = send of root` (`ncclBroadcast`; `send` is read at the root).
    pub fn broadcast<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.two(Kind::Broadcast, send, recv, ReduceOp::Sum, root, stream)
    }

    /// At the root `recv = op over ranks of send` (`ncclReduce`).
    pub fn reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.two(Kind::Reduce, send, recv, op, root, stream)
    }

    /// `count` elements to and from every rank (`ncclAlltoAll`).
    pub fn all_to_all<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        stream: &CudaStream,
    ) -> Result<()> {
        self.two(Kind::AllToAll, send, recv, ReduceOp::Sum, 0, stream)
    }

    fn two<T: Element>(
        &self,
        kind: Kind,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let (sn, rn) = (send.len() * es, recv.len() * es);
        let (s, _rs) = send.device_ptr(stream);
        let (r, _rr) = recv.device_ptr_mut(stream);
        let (s, r) = (self.region(s, sn), self.region(r, rn));
        self.run(kind, Some(s), r, T::DTYPE, op, root, stream)
    }

    /// Queue collective `kind` on raw device addresses of this device after
    /// the work on `stream`, and return at once (NCCL's semantics): work
    /// enqueued on `stream` after this call runs once the collective is
    /// over. Sizes follow the typed methods. The returned `Work` says how
    /// it went; a failed collective still releases `stream` (its results
    /// are then undefined; the error is also `async_error`).
    ///
    /// # Safety
    /// As [`collective_raw`](Self::collective_raw), and the memory must
    /// stay valid and untouched by others until the returned `Work` is
    /// done (or `stream` has passed the call).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn enqueue_raw(
        &self,
        kind: Kind,
        send: Option<(u64, usize)>,
        recv: (u64, usize),
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<Work<()>> {
        let gate = match self.gate.get() {
            Some(g) => g.clone(),
            None => {
                let g = Arc::new(StreamGate::new(&self.ctx)?);
                self.gate.get_or_init(|| g).clone()
            }
        };
        let fail = |what: &str, e: cudarc::driver::DriverError| Error::Device {
            device: format!("CUDA device {}", self.ctx.ordinal()),
            detail: format!("{what}: {e}"),
        };
        // Nothing that runs the call may wait for the whole device while
        // the caller's stream is held: what could (loading the kernels) is
        // done now, and the engine avoids the rest while the stream counts
        // as held (see `compute_cuda::held`).
        self.modules.load(compute_cuda::device_dtype(dtype))?;
        // Hold and queue under one lock: values open in hand-out order.
        let _order = gate.order.lock().unwrap();
        let ready = stream
            .record_event(None)
            .map_err(|e| fail("recording the caller's stream", e))?;
        let held = compute_cuda::HeldStream::new();
        let value = gate.hold(stream)?;
        let engine = self.engine.clone();
        let ordinal = self.ctx.ordinal();
        let before = Box::new(move || {
            engine.wait(&ready).map_err(|e| Error::Device {
                device: format!("CUDA device {ordinal}"),
                detail: format!("ordering after the caller's stream: {e}"),
            })
        });
        let g = gate.clone();
        let after = Box::new(move |_: &Result<()>| {
            g.open(value);
            drop(held);
        });
        let (send, recv) = (
            send.map(|(p, n)| self.region(p, n)),
            self.region(recv.0, recv.1),
        );
        // SAFETY: the caller keeps the memory valid until the work is done.
        Ok(unsafe {
            self.comm
                .collective_regions_async(kind, send, recv, dtype, op, root, before, after)
        })
    }

    /// Collective `kind` on raw device addresses of this device (another
    /// framework's tensors): `recv_bytes` at `recv`, `send` (address and
    /// bytes; `None` for in place) holding whole `dtype` elements, ordered
    /// after the work on `stream` (a `CUstream` of this context; null is
    /// the legacy default stream). Sizes follow the typed methods.
    ///
    /// # Safety
    /// The addresses must be device memory of this device, valid for the
    /// whole call, aligned for `dtype`, that nothing else touches meanwhile
    /// (`send` may be read by others); `stream` must belong to this
    /// context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn collective_raw(
        &self,
        kind: Kind,
        send: Option<(u64, usize)>,
        recv: (u64, usize),
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's stream of this context, alive for the call
        // (the wrapper does not destroy it).
        let s = unsafe { self.ctx.wrap_borrowed_stream(stream) };
        let send = send.map(|(p, n)| self.region(p, n));
        self.run(kind, send, self.region(recv.0, recv.1), dtype, op, root, &s)
    }
}
