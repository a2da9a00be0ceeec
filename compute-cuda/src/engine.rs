//! The engine: one CUDA context and one stream of its own per device.
//!
//! Every piece of work is enqueued on the engine's stream and followed by
//! an event from a pool; [`Compute::poll`] queries the events oldest first
//! (work on one stream completes in order, so a completed event completes
//! every earlier piece). Nothing blocks a CPU thread: when the executor
//! has nothing else to do it asks for the completion fd, and only then a
//! host function is enqueued that writes the engine's eventfd once the
//! work so far has run — a wake-up for the slow case, off the path of the
//! work that completes while the executor is still polling.
//!
//! Copies use the copy engines (`cuMemcpy*Async`, device to device and
//! between host and device); reductions and the division of `Avg` launch
//! oxccl's kernels, compiled by NVRTC for this device's architecture at
//! first use of each element type (see `kernels::cuda`).

use crate::held::any_stream_held;
use crate::modules::Modules;
use comm_core::compute::{Compute, Pending};
use comm_core::mem::{DeviceKind, MemorySpace, Region};
use comm_core::{DataType, Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaStream};
use kernels::cuda::{self as k, DeviceOp, Dtype, Kernel, ReduceArgs, MAX_SOURCES};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// The CUDA compute engine of one device (see the module docs).
pub struct CudaCompute {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: u32,
    multiprocessors: u32,
    modules: Arc<Modules>,
    functions: HashMap<Kernel, CudaFunction>,
    /// Work started and not yet seen complete, oldest first, each with
    /// the event recorded after it.
    inflight: VecDeque<(u64, CudaEvent)>,
    spare: Vec<CudaEvent>,
    issued: u64,
    completed: u64,
    /// The last piece of work a wake-up was enqueued after.
    armed: u64,
    /// The eventfd the wake-up host function writes; boxed so its address,
    /// handed to the driver, stays put.
    wake: Box<RawFd>,
    _wake_fd: OwnedFd,
    workspace: DeviceMemory,
    /// Where reductions of more than `MAX_SOURCES` sources whose output is
    /// one of their later sources are combined first.
    temp: DeviceMemory,
    staging: PinnedMemory,
    /// Staging that outgrew `staging` while a stream was held (see
    /// `crate::held`): plain host memory, which needs no CUDA call.
    pageable: Vec<u64>,
}

/// Pinned staging made with the engine: the ring's slots at the default
/// chunk (4 slots of 1 MiB each way), so queued calls at the default
/// settings stage through pinned memory from their first call.
const INITIAL_STAGING: usize = 8 << 20;

impl CudaCompute {
    /// The engine of device `ordinal`, on its primary context. Fails with
    /// `Error::Unsupported` naming what is missing when the driver, NVRTC
    /// or the device is not there (probed first: cudarc would panic).
    pub fn new(ordinal: usize) -> Result<CudaCompute> {
        crate::probe()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_NO_DEVICE | sys::CUresult::CUDA_ERROR_INVALID_DEVICE => {
                Error::Unsupported(format!("no CUDA device {ordinal}: {e}"))
            }
            _ => device_error(ordinal as u32, "creating its context", e),
        })?;
        CudaCompute::with_context(ctx)
    }

    /// The engine on an existing context (a framework's).
    pub fn with_context(ctx: Arc<CudaContext>) -> Result<CudaCompute> {
        crate::probe()?;
        let ordinal = ctx.ordinal() as u32;
        let fail = |what: &str, e| device_error(ordinal, what, e);
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| fail("reading its compute capability", e))?;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| fail("reading its multiprocessor count", e))?;
        let stream = ctx.new_stream().map_err(|e| fail("creating a stream", e))?;
        // SAFETY: eventfd(2) with valid flags; the fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::System(format!(
                "eventfd for CUDA completions: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: a fresh fd nobody else owns.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Stream-ordered device memory never waits for the device; a
        // device without memory pools falls back to `cuMemAlloc`.
        let pools = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            .map_err(|e| fail("reading whether it has memory pools", e))?
            != 0;
        let arch = (major * 10 + minor) as u32;
        let mut staging = PinnedMemory::default();
        staging.at_least(INITIAL_STAGING, ordinal)?;
        Ok(CudaCompute {
            modules: Arc::new(Modules::new(ctx.clone(), arch, ordinal)),
            ctx,
            stream,
            ordinal,
            multiprocessors: multiprocessors.max(1) as u32,
            functions: HashMap::new(),
            inflight: VecDeque::new(),
            spare: Vec::new(),
            issued: 0,
            completed: 0,
            armed: 0,
            wake: Box::new(wake_fd.as_raw_fd()),
            _wake_fd: wake_fd,
            workspace: DeviceMemory::new(pools),
            temp: DeviceMemory::new(pools),
            staging,
            pageable: Vec::new(),
        })
    }

    /// The stream the engine's work runs on: a caller orders its own
    /// streams with it through events (see `crate::Stream`).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The kernels this engine runs, for loading ahead of a queued call.
    pub fn modules(&self) -> &Arc<Modules> {
        &self.modules
    }

    /// The memory space of this engine's device.
    pub fn space(&self) -> MemorySpace {
        MemorySpace::Device {
            kind: DeviceKind::Cuda,
            ordinal: self.ordinal,
        }
    }

    fn fail(&self, what: &str, e: result::DriverError) -> Error {
        device_error(self.ordinal, what, e)
    }

    fn bind(&self) -> Result<()> {
        // A call may run on any thread (async calls on the worker).
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.fail("binding its context to this thread", e))
    }

    fn check(&self, what: &str, r: &Region, host_ok: bool) -> Result<()> {
        if self.reaches(r.space) || (host_ok && r.space.is_host()) {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "the CUDA engine of device {} cannot {what} {} ({} bytes)",
            self.ordinal, r.space, r.len
        )))
    }

    /// Record the end of the work just enqueued; its ticket.
    fn issued(&mut self) -> Result<Pending> {
        let ev = match self.spare.pop() {
            Some(e) => e,
            None => self
                .ctx
                .new_event(None)
                .map_err(|e| self.fail("creating an event", e))?,
        };
        ev.record(&self.stream)
            .map_err(|e| self.fail("recording an event", e))?;
        self.issued += 1;
        self.inflight.push_back((self.issued, ev));
        Ok(Pending(self.issued))
    }

    /// The kernel `kernel`, loading its element type's module at first use.
    fn function(&mut self, kernel: Kernel, dtype: Dtype) -> Result<&CudaFunction> {
        if !self.functions.contains_key(&kernel) {
            let f = self
                .modules
                .load(dtype)?
                .load_function(&kernel.name())
                .map_err(|e| self.fail(&format!("finding kernel {}", kernel.name()), e))?;
            self.functions.insert(kernel, f);
        }
        Ok(&self.functions[&kernel])
    }

    /// Launch one kernel on `args` (at most `MAX_SOURCES` sources).
    fn launch(&mut self, dtype: Dtype, op: DeviceOp, args: ReduceArgs) -> Result<()> {
        let (kernel, mut args) = args.kernel(dtype, op);
        let elem = match kernel {
            Kernel::Copy => 1,
            Kernel::Reduce(d, _) => d.size(),
        };
        let (grid, block) = k::launch_dims(args.count, elem, self.multiprocessors);
        let stream = self.stream.cu_stream();
        let f = self.function(kernel, dtype)?.cu_function();
        let mut params = [&mut args as *mut ReduceArgs as *mut c_void];
        // SAFETY: `f` takes one `OxArgs` by value, which `ReduceArgs`
        // mirrors (152 bytes, same layout); the addresses in it are device
        // memory of this context the caller lends until the work completes.
        unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, stream, &mut params) }
            .map_err(|e| self.fail(&format!("launching {}", kernel.name()), e))
    }

    /// `dst = srcs[0] op .. op srcs[n-1]` for any number of sources, left
    /// to right: groups of `MAX_SOURCES`, each after the first starting
    /// from the running result (the same fold as one n-way pass).
    fn reduce_all(
        &mut self,
        dtype: Dtype,
        op: DeviceOp,
        dst: u64,
        srcs: &[u64],
        count: u64,
    ) -> Result<()> {
        let mut group = [0u64; MAX_SOURCES];
        let first = srcs.len().min(MAX_SOURCES);
        self.launch(dtype, op, args(dst, &srcs[..first], count, self.ordinal)?)?;
        let mut at = first;
        while at < srcs.len() {
            let take = (srcs.len() - at).min(MAX_SOURCES - 1);
            group[0] = dst;
            group[1..=take].copy_from_slice(&srcs[at..at + take]);
            self.launch(dtype, op, args(dst, &group[..=take], count, self.ordinal)?)?;
            at += take;
        }
        Ok(())
    }
}

fn args(dst: u64, srcs: &[u64], count: u64, ordinal: u32) -> Result<ReduceArgs> {
    ReduceArgs::new(dst, srcs, count, 1).map_err(|e| Error::Device {
        device: format!("CUDA device {ordinal}"),
        detail: e.to_string(),
    })
}

/// The device kernels' element type for `dtype`.
pub fn device_dtype(dtype: DataType) -> Dtype {
    match dtype {
        DataType::I8 => Dtype::I8,
        DataType::U8 => Dtype::U8,
        DataType::I32 => Dtype::I32,
        DataType::U32 => Dtype::U32,
        DataType::I64 => Dtype::I64,
        DataType::U64 => Dtype::U64,
        DataType::F16 => Dtype::F16,
        DataType::Bf16 => Dtype::Bf16,
        DataType::F32 => Dtype::F32,
        DataType::F64 => Dtype::F64,
    }
}

pub(crate) fn device_error(ordinal: u32, what: &str, e: result::DriverError) -> Error {
    Error::Device {
        device: format!("CUDA device {ordinal}"),
        detail: format!("{what}: {e}"),
    }
}

/// The wake-up the driver runs on its own thread once the work enqueued
/// before it has completed: one write to the engine's eventfd.
unsafe extern "C" fn wake(arg: *mut c_void) {
    // SAFETY: `arg` is the engine's boxed fd, alive until the engine has
    // synchronised its stream (in `Drop`), after every wake-up ran.
    let fd = unsafe { *(arg as *const RawFd) };
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd. A full counter
    // (EAGAIN) already means "readable", which is all a wake-up is for.
    unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
}

impl Compute for CudaCompute {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn reaches(&self, space: MemorySpace) -> bool {
        // Its device's memory, registered or not (peers' memory opened
        // through CUDA IPC is in this device's space too).
        space.device() == Some((DeviceKind::Cuda, self.ordinal))
    }

    fn copy(&mut self, dst: Region, src: Region) -> Result<Pending> {
        self.check("write", &dst, true)?;
        self.check("read", &src, true)?;
        let n = dst.len.min(src.len);
        if n == 0 || dst.addr == src.addr {
            return Ok(Pending::DONE);
        }
        let (d, s) = (dst.addr, src.addr);
        if d < s + n && s < d + n && !(dst.space.is_host() && src.space.is_host()) {
            return Err(Error::Unsupported(format!(
                "a copy between overlapping device ranges ({n} bytes at {s:#x} to {d:#x})"
            )));
        }
        self.bind()?;
        let stream = self.stream.cu_stream();
        // SAFETY (each copy): both regions hold `n` bytes that the caller
        // lends until this work completes (it polls before touching them);
        // device addresses belong to this context; host memory is the
        // caller's (pageable or the engine's pinned staging).
        let r = unsafe {
            match (dst.space.is_host(), src.space.is_host()) {
                (false, false) => result::memcpy_dtod_async(d as u64, s as u64, n, stream),
                (false, true) => result::memcpy_htod_async(
                    d as u64,
                    std::slice::from_raw_parts(s as *const u8, n),
                    stream,
                ),
                (true, false) => result::memcpy_dtoh_async(
                    std::slice::from_raw_parts_mut(d as *mut u8, n),
                    s as u64,
                    stream,
                ),
                (true, true) => {
                    std::ptr::copy(s as *const u8, d as *mut u8, n);
                    return Ok(Pending::DONE);
                }
            }
        };
        r.map_err(|e| self.fail(&format!("copying {n} bytes"), e))?;
        self.issued()
    }

    fn reduce(
        &mut self,
        dtype: DataType,
        op: kernels::Op,
        dst: Region,
        srcs: &[Region],
    ) -> Result<Pending> {
        self.check("write", &dst, false)?;
        for s in srcs {
            self.check("read", s, false)?;
        }
        let count = (dst.len / dtype.size()) as u64;
        if count == 0 || srcs.is_empty() {
            return Ok(Pending::DONE);
        }
        self.bind()?;
        let (d, op) = (device_dtype(dtype), DeviceOp::from(op));
        let mut addrs = [0u64; 64];
        if srcs.len() > addrs.len() {
            return Err(Error::Unsupported(format!(
                "a device reduction of {} sources (at most {})",
                srcs.len(),
                addrs.len()
            )));
        }
        for (a, s) in addrs.iter_mut().zip(srcs) {
            *a = s.addr as u64;
        }
        let addrs = &addrs[..srcs.len()];
        // The output among the later sources would be overwritten by the
        // first group before being read: combine into a temporary first.
        let late_alias = addrs
            .iter()
            .skip(MAX_SOURCES)
            .any(|a| *a == dst.addr as u64);
        if late_alias {
            let tmp = self.temp.at_least(dst.len, &self.stream, self.ordinal)?;
            self.reduce_all(d, op, tmp, addrs, count)?;
            // SAFETY: `tmp` and `dst` are device memory of this context
            // holding `dst.len` bytes; they do not overlap.
            unsafe {
                result::memcpy_dtod_async(dst.addr as u64, tmp, dst.len, self.stream.cu_stream())
            }
            .map_err(|e| self.fail("copying a reduction out of the temporary", e))?;
        } else {
            self.reduce_all(d, op, dst.addr as u64, addrs, count)?;
        }
        self.issued()
    }

    fn divide(&mut self, dtype: DataType, dst: Region, divisor: usize) -> Result<Pending> {
        self.check("write", &dst, false)?;
        let count = (dst.len / dtype.size()) as u64;
        if count == 0 || divisor == 1 {
            return Ok(Pending::DONE);
        }
        let divisor = u32::try_from(divisor)
            .map_err(|_| Error::invalid(format!("an average over {divisor} ranks")))?;
        self.bind()?;
        let a = dst.addr as u64;
        let args = ReduceArgs::new(a, &[a], count, divisor).map_err(|e| Error::Device {
            device: format!("CUDA device {}", self.ordinal),
            detail: e.to_string(),
        })?;
        self.launch(device_dtype(dtype), DeviceOp::Sum, args)?;
        self.issued()
    }

    fn poll(&mut self, work: Pending) -> Result<bool> {
        while work.0 > self.completed {
            let Some((seq, ev)) = self.inflight.front() else {
                break;
            };
            let seq = *seq;
            match ev.try_is_complete() {
                Ok(true) => {
                    let (_, ev) = self.inflight.pop_front().unwrap();
                    self.spare.push(ev);
                    self.completed = seq;
                }
                Ok(false) => return Ok(false),
                Err(e) => return Err(self.fail("running its work", e)),
            }
        }
        Ok(work.0 <= self.completed)
    }

    fn completion_fd(&mut self) -> Result<Option<RawFd>> {
        // Stale wake-ups first, so the fd is readable only for new ones.
        let mut buf = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from a nonblocking eventfd.
        unsafe { libc::read(*self.wake, &mut buf as *mut u64 as *mut c_void, 8) };
        if self.armed < self.issued {
            self.bind()?;
            let arg = &*self.wake as *const RawFd as *mut c_void;
            // SAFETY: `wake` only writes to the eventfd whose number `arg`
            // points at; the box lives until Drop synchronised the stream.
            unsafe { result::stream::launch_host_function(self.stream.cu_stream(), wake, arg) }
                .map_err(|e| self.fail("enqueueing a completion wake-up", e))?;
            self.armed = self.issued;
        }
        Ok(Some(*self.wake))
    }

    fn fence(&mut self) -> Result<Pending> {
        self.bind()?;
        self.issued()
    }

    fn quiesce(&mut self) -> Result<()> {
        self.bind()?;
        self.stream
            .synchronize()
            .map_err(|e| self.fail("finishing its work", e))?;
        self.completed = self.issued;
        for (_, ev) in self.inflight.drain(..) {
            self.spare.push(ev);
        }
        Ok(())
    }

    fn workspace(&mut self, bytes: usize) -> Result<Option<Region>> {
        let space = self.space();
        let addr = self.workspace.at_least(bytes, &self.stream, self.ordinal)?;
        Ok(Some(Region {
            space,
            addr: addr as usize,
            len: bytes,
        }))
    }

    fn staging(&mut self, bytes: usize) -> Result<Option<Region>> {
        if self.staging.len < bytes.max(1) && any_stream_held() {
            // Pinning more could wait for a held stream (see `held`):
            // plain memory, whose copies the driver stages itself.
            if self.pageable.len() * 8 < bytes {
                self.pageable.resize(bytes.div_ceil(8), 0);
            }
            return Ok(Some(Region {
                space: MemorySpace::Host,
                addr: self.pageable.as_mut_ptr() as usize,
                len: bytes,
            }));
        }
        let addr = self.staging.at_least(bytes, self.ordinal)?;
        Ok(Some(Region {
            space: MemorySpace::Host,
            addr,
            len: bytes,
        }))
    }
}

impl Drop for CudaCompute {
    fn drop(&mut self) {
        // Every wake-up and every piece of work has run before the memory
        // and the fd they use go.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        self.workspace.free(&self.stream);
        self.temp.free(&self.stream);
        self.staging.free();
        let _ = self.stream.synchronize();
    }
}

/// Device memory the engine owns, grown on demand, kept between calls.
///
/// Stream-ordered where the device has memory pools: allocated and freed
/// on the engine's stream, after the work that used the old block, and
/// never waiting for the device (a caller's stream may be held at a
/// queued call's gate until this very call is over; see `crate::held`).
/// Otherwise `cuMemAlloc`, and the outgrown block is retired rather than
/// freed (`cuMemFree` waits for the device) until the engine goes; growth
/// is by powers of two, so the retired blocks together are smaller than
/// the live one.
struct DeviceMemory {
    pools: bool,
    ptr: u64,
    len: usize,
    retired: Vec<u64>,
}

impl DeviceMemory {
    fn new(pools: bool) -> DeviceMemory {
        DeviceMemory {
            pools,
            ptr: 0,
            len: 0,
            retired: Vec::new(),
        }
    }

    /// At least `bytes` (at least one byte allocated, so the address is
    /// real), usable by work enqueued on `stream` from now on.
    fn at_least(&mut self, bytes: usize, stream: &CudaStream, ordinal: u32) -> Result<u64> {
        if self.len < bytes.max(1) {
            let want = bytes.max(1).next_power_of_two();
            let failed = |e| device_error(ordinal, &format!("allocating {want} bytes"), e);
            let s = stream.cu_stream();
            if self.pools {
                if self.len > 0 {
                    // SAFETY: allocated on this stream by `malloc_async`;
                    // work that used it was enqueued before this free.
                    unsafe { result::free_async(self.ptr, s) }.map_err(failed)?;
                    self.len = 0;
                }
                // SAFETY: a stream-ordered allocation of `want` bytes.
                self.ptr = unsafe { result::malloc_async(s, want) }.map_err(failed)?;
            } else {
                // SAFETY: an allocation of `want` bytes in the current context.
                let ptr = unsafe { result::malloc_sync(want) }.map_err(failed)?;
                if self.len > 0 {
                    self.retired.push(self.ptr);
                }
                self.ptr = ptr;
            }
            self.len = want;
        }
        Ok(self.ptr)
    }

    /// Free everything (the engine's stream has finished its work).
    fn free(&mut self, stream: &CudaStream) {
        if self.len > 0 {
            if self.pools {
                // SAFETY: allocated on this stream by `malloc_async`.
                let _ = unsafe { result::free_async(self.ptr, stream.cu_stream()) };
            } else {
                self.retired.push(self.ptr);
            }
            self.len = 0;
        }
        for p in self.retired.drain(..) {
            // SAFETY: allocated by `malloc_sync`, no work in flight uses it.
            let _ = unsafe { result::free_sync(p) };
        }
    }
}

/// Pinned host memory (page-locked: the copy engines move it without a
/// bounce), grown on demand like [`DeviceMemory`] (outgrown blocks retired,
/// never freed while the engine runs).
#[derive(Default)]
struct PinnedMemory {
    ptr: usize,
    len: usize,
    retired: Vec<usize>,
}

impl PinnedMemory {
    fn at_least(&mut self, bytes: usize, ordinal: u32) -> Result<usize> {
        if self.len < bytes.max(1) {
            let want = bytes.max(1).next_power_of_two();
            // SAFETY: a page-locked host allocation of `want` bytes.
            let p = unsafe { result::malloc_host(want, 0) }.map_err(|e| {
                device_error(ordinal, &format!("pinning {want} bytes of host memory"), e)
            })?;
            if self.len > 0 {
                self.retired.push(self.ptr);
            }
            (self.ptr, self.len) = (p as usize, want);
        }
        Ok(self.ptr)
    }

    /// Free everything (the engine's stream has finished its work).
    fn free(&mut self) {
        if self.len > 0 {
            self.retired.push(self.ptr);
            self.len = 0;
        }
        for p in self.retired.drain(..) {
            // SAFETY: allocated by `malloc_host`, no work in flight uses it.
            let _ = unsafe { result::free_host(p as *mut c_void) };
        }
    }
}
