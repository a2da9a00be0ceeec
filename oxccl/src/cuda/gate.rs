//! A gate a device stream waits at until the host opens it: one 32-bit
//! word of pinned host memory mapped into the device, on which
//! `cuStreamWaitValue32` holds the stream until the word reaches a value.
//! This is how a queued collective keeps the caller's stream from running
//! past it without any kernel spinning on the GPU: the host opens the gate
//! when the collective is over, successful or not, so a stream can never
//! be left waiting by a failure.

use compute_cuda::cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::{Error, Result};

/// Whether the driver exports the stream-wait entry point
/// (`cuStreamWaitValue32_v2`, CUDA 11.7 on, usable without driver
/// options). Probed, because cudarc panics on a missing symbol.
fn wait_entry() -> Result<()> {
    // SAFETY: looks a symbol up in the already loaded driver library.
    let has = unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(b"cuStreamWaitValue32_v2\0")
            .is_ok()
    };
    match has {
        true => Ok(()),
        false => Err(Error::Unsupported(
            "this CUDA driver has no cuStreamWaitValue32_v2 (CUDA 11.7 or later): queued collectives cannot hold a stream"
                .into(),
        )),
    }
}

/// A host-opened gate for device streams (see the module docs): what
/// queued collectives hold the caller's stream with, usable on its own to
/// keep a stream from running until the host says so.
pub struct StreamGate {
    ctx: Arc<CudaContext>,
    /// The word, in pinned host memory.
    host: *mut u32,
    /// The same word as the device sees it.
    device: sys::CUdeviceptr,
    /// The last value handed out.
    issued: AtomicU32,
    /// An event recorded on the last stream held, after its wait: the word
    /// is not freed before that stream has passed it.
    last: Mutex<Option<CudaEvent>>,
    /// Held across "hold, then queue the call" so that values are opened
    /// in the order they were handed out.
    pub(crate) order: Mutex<()>,
}

impl std::fmt::Debug for StreamGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamGate")
            .field("issued", &self.issued.load(Ordering::Relaxed))
            .finish()
    }
}

// SAFETY: the word is written by the host with volatile stores and read
// by the device; everything else is behind atomics or a mutex.
unsafe impl Send for StreamGate {}
unsafe impl Sync for StreamGate {}

fn fail(what: &str, e: result::DriverError) -> Error {
    Error::Device {
        device: "CUDA".into(),
        detail: format!("{what}: {e}"),
    }
}

impl StreamGate {
    /// A gate in `ctx`; `Error::Unsupported` when the driver cannot hold
    /// streams on host memory.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<StreamGate> {
        wait_entry()?;
        ctx.bind_to_thread()
            .map_err(|e| fail("binding the context", e))?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a pinned, device-mapped allocation of one word.
        let host = unsafe { result::malloc_host(4, flags) }
            .map_err(|e| fail("pinning the stream gate", e))? as *mut u32;
        // SAFETY: `host` is valid for 4 bytes; zero = nothing opened yet.
        unsafe { host.write_volatile(0) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut _, 0) };
        if let Err(e) = r.result() {
            // SAFETY: allocated above, unused.
            let _ = unsafe { result::free_host(host as *mut _) };
            return Err(fail("mapping the stream gate", e));
        }
        Ok(StreamGate {
            ctx: ctx.clone(),
            host,
            device,
            issued: AtomicU32::new(0),
            last: Mutex::new(None),
            order: Mutex::new(()),
        })
    }

    /// Hold `stream` (a stream of this context) at the gate: the work the
    /// caller enqueues after this runs once [`open`](Self::open) has been
    /// called with the returned value or a later one.
    pub fn hold(&self, stream: &CudaStream) -> Result<u32> {
        let value = self.issued.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let geq = sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: `device` maps the live word; the stream is the caller's,
        // of this context. GEQ compares cyclically, so wrapping is fine.
        let r = unsafe { sys::cuStreamWaitValue32_v2(stream.cu_stream(), self.device, value, geq) };
        r.result()
            .map_err(|e| fail("holding the caller's stream", e))?;
        let ev = stream
            .record_event(None)
            .map_err(|e| fail("recording the caller's stream", e))?;
        *self.last.lock().unwrap() = Some(ev);
        Ok(value)
    }

    /// Let streams held for `value` (and earlier values) go on. Open in
    /// the order values were handed out (queued calls end in issue order).
    pub fn open(&self, value: u32) {
        fence(Ordering::SeqCst);
        // SAFETY: the pinned word lives as long as the gate.
        unsafe { self.host.write_volatile(value) };
        fence(Ordering::SeqCst);
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        // Every held stream has passed the word before it goes (the last
        // hold's event completes after its wait did).
        let _ = self.ctx.bind_to_thread();
        if let Some(ev) = self.last.lock().unwrap().take() {
            let _ = ev.synchronize();
        }
        // SAFETY: allocated by cuMemHostAlloc; no stream waits on it now.
        let _ = unsafe { result::free_host(self.host as *mut _) };
    }
}
