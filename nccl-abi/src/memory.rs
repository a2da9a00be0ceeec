//! Where a call's buffers are, and what its stream means.
//!
//! Without the `cuda` feature every buffer is host memory and only the
//! NULL stream fits: the call completes before it returns, so there is
//! nothing to order on a stream, and a stream given is refused rather
//! than ignored.
//!
//! With the `cuda` feature (built everywhere; the CUDA driver is looked
//! for at run time, never needed to build or to run on host memory):
//! - a buffer the driver calls device memory is device memory (of the
//!   device it says); a call's buffers are all on the host or all on one
//!   device;
//! - a collective on device memory outside a group is queued after the
//!   work on its stream and returns at once, as NCCL's: work the program
//!   queues on that stream afterwards sees the result (the communicator
//!   gets a CUDA engine for that device at its first such call);
//! - calls in a group that touch device memory, send/recv, gather and
//!   scatter on device memory wait for their streams first and complete
//!   before `ncclGroupEnd` (or the call) returns: correct for every
//!   program, not overlapped with later work;
//! - host memory with a stream: the stream is waited for first (a copy
//!   into the buffer queued there has landed), then the call runs and
//!   completes before it returns.
//!
//! What only a GPU can show (the device path end to end, nccl-tests) runs
//! in `scripts/gpu-check`.

use crate::result::Failure;
use oxccl::MemorySpace;
use std::ffi::c_void;

/// CUDA's `cudaStream_t` (the driver's `CUstream`).
pub type cudaStream_t = *mut c_void;

/// The memory space of the buffer at `ptr` (NULL: host).
pub(crate) fn space_of(ptr: *const c_void) -> Result<MemorySpace, Failure> {
    #[cfg(feature = "cuda")]
    {
        cuda::space_of(ptr)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ptr;
        Ok(MemorySpace::Host)
    }
}

/// Check `stream` for a call whose memory is host memory or not.
pub(crate) fn check_stream(stream: cudaStream_t) -> Result<(), Failure> {
    if cfg!(feature = "cuda") || stream.is_null() {
        return Ok(());
    }
    Err(Failure::usage(
        "a stream was given: this build of oxccl's libnccl takes host memory with a \
         NULL stream only (build nccl-abi with --features cuda for streams and device memory)",
    ))
}

/// Wait until the work queued on `stream` so far is done (NULL: nothing).
pub(crate) fn wait_stream(stream: cudaStream_t) -> Result<(), Failure> {
    #[cfg(feature = "cuda")]
    if !stream.is_null() {
        return cuda::synchronize(stream);
    }
    let _ = stream;
    Ok(())
}

/// `len` bytes from `src` to `dst` in `space` (they may overlap on the
/// host).
///
/// # Safety
/// Both are valid for `len` bytes of `space`.
pub(crate) unsafe fn copy(
    space: MemorySpace,
    dst: usize,
    src: usize,
    len: usize,
) -> Result<(), Failure> {
    match space {
        // SAFETY: the caller's contract.
        MemorySpace::Host => unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) },
        #[cfg(feature = "cuda")]
        // SAFETY: the caller's contract.
        _ => unsafe { cuda::copy(dst, src, len) }?,
        #[cfg(not(feature = "cuda"))]
        other => {
            return Err(Failure::usage(format!(
                "a copy in {other:?} needs the cuda feature"
            )))
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    //! The CUDA driver calls behind [`super`]; each only after
    //! `oxccl::cuda::probe` found the driver (cudarc would panic without
    //! it).

    use crate::result::{ncclUnhandledCudaError, Failure};
    use oxccl::cuda::cudarc::driver::{sys, CudaContext};
    use oxccl::cuda::Cuda;
    use oxccl::{Communicator, DeviceKind, MemorySpace, Work};
    use std::ffi::c_void;
    use std::sync::{Arc, Mutex, OnceLock};

    /// Whether the driver is there (looked for once).
    fn driver() -> bool {
        static THERE: OnceLock<bool> = OnceLock::new();
        *THERE.get_or_init(|| oxccl::cuda::probe().is_ok())
    }

    fn check(what: &str, rc: sys::CUresult) -> Result<(), Failure> {
        match rc {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(Failure::new(
                ncclUnhandledCudaError,
                format!("{what}: {e:?}"),
            )),
        }
    }

    pub(crate) fn space_of(ptr: *const c_void) -> Result<MemorySpace, Failure> {
        if ptr.is_null() || !driver() {
            return Ok(MemorySpace::Host);
        }
        let mut kind: u32 = 0;
        // SAFETY: the driver is loaded; the attribute is a 32-bit value
        // written to `kind`; any address may be asked about.
        let rc = unsafe {
            sys::cuPointerGetAttribute(
                &mut kind as *mut u32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr as sys::CUdeviceptr,
            )
        };
        // Memory CUDA does not know (plain malloc) is host memory.
        if rc != sys::CUresult::CUDA_SUCCESS
            || kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
        {
            return Ok(MemorySpace::Host);
        }
        let mut ordinal: i32 = 0;
        // SAFETY: as above, for the device ordinal (an int).
        check("cuPointerGetAttribute(DEVICE_ORDINAL)", unsafe {
            sys::cuPointerGetAttribute(
                &mut ordinal as *mut i32 as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr as sys::CUdeviceptr,
            )
        })?;
        Ok(MemorySpace::Device {
            kind: DeviceKind::Cuda,
            ordinal: ordinal as u32,
        })
    }

    pub(crate) fn synchronize(stream: *mut c_void) -> Result<(), Failure> {
        if !driver() {
            return Err(Failure::usage(
                "a stream was given, but there is no CUDA driver",
            ));
        }
        // SAFETY: the program's stream, alive during the call.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream as sys::CUstream)
        })
    }

    pub(crate) unsafe fn copy(dst: usize, src: usize, len: usize) -> Result<(), Failure> {
        // SAFETY: the caller's contract (unified addressing: any spaces).
        check("cuMemcpy", unsafe {
            sys::cuMemcpy(dst as sys::CUdeviceptr, src as sys::CUdeviceptr, len)
        })
    }

    /// A communicator's CUDA engine (one device) and its queued calls.
    pub(crate) struct Engine {
        pub(crate) cuda: Cuda<'static>,
        ordinal: u32,
        queued: Mutex<Vec<Work<()>>>,
    }

    impl Engine {
        /// An engine for device `ordinal` on `comm`.
        ///
        /// # Safety
        /// `comm` outlives the engine (both live in one handle, the engine
        /// dropped first).
        pub(crate) unsafe fn attach(comm: &Communicator, ordinal: u32) -> Result<Engine, Failure> {
            // SAFETY: the caller's contract.
            let comm: &'static Communicator = unsafe { &*(comm as *const Communicator) };
            let ctx = CudaContext::new(ordinal as usize).map_err(|e| {
                Failure::new(
                    ncclUnhandledCudaError,
                    format!("CUDA device {ordinal}: {e}"),
                )
            })?;
            let cuda = Cuda::attach_context(comm, ctx)?;
            Ok(Engine {
                cuda,
                ordinal,
                queued: Mutex::new(Vec::new()),
            })
        }

        pub(crate) fn ordinal(&self) -> u32 {
            self.ordinal
        }

        /// Keep `w` until it is done (its failure also poisons the
        /// communicator: `ncclCommGetAsyncError` reports it).
        pub(crate) fn keep(&self, w: Work<()>) {
            let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
            q.retain(|w| !w.is_done());
            q.push(w);
        }

        /// Wait for every queued call; the first failure.
        pub(crate) fn drain(&self) -> Result<(), Failure> {
            let q = std::mem::take(&mut *self.queued.lock().unwrap_or_else(|p| p.into_inner()));
            let mut first = None;
            for w in q {
                if let Err(e) = w.wait() {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), |e| Err(e.into()))
        }
    }

    /// The stream as cudarc's, borrowed.
    ///
    /// # Safety
    /// `stream` is NULL or a stream of `ctx`, alive during the call.
    pub(crate) unsafe fn borrowed(
        ctx: &Arc<CudaContext>,
        stream: *mut c_void,
    ) -> Arc<oxccl::cuda::cudarc::driver::CudaStream> {
        // SAFETY: the caller's contract.
        unsafe { ctx.wrap_borrowed_stream(stream as sys::CUstream) }
    }
}
