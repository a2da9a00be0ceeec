//! `compute-cuda`: oxccl's CUDA compute engine ([`CudaCompute`], the
//! `cuda` feature), an implementation of the core's `Compute` trait for
//! the memory of one device: copies on the copy engines, reductions by
//! oxccl's NVRTC-compiled kernels, all on a stream of its own, completion
//! seen through events and, when the executor would sleep, an eventfd
//! written by a host function. It only computes: what to compute and when
//! is the schedule's business, moving bytes between ranks the links'.
//!
//! Nothing CUDA is needed to build or to run without a GPU: the driver and
//! NVRTC are loaded at run time, and [`probe`] turns their absence into
//! `Error::Unsupported` before cudarc (which would panic) is touched.

#[cfg(feature = "cuda")]
mod engine;
mod held;
#[cfg(feature = "cuda")]
mod modules;

#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub use engine::{device_dtype, CudaCompute};
pub use held::{any_stream_held, HeldStream};
#[cfg(feature = "cuda")]
pub use modules::Modules;

use comm_core::{Error, Result};

/// Whether CUDA work can start here: this build has the engine, the driver
/// (`libcuda.so.1`) and NVRTC load. `Error::Unsupported` naming what is
/// missing otherwise.
pub fn probe() -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        let missing = |e: kernels::cuda::CudaError| Error::Unsupported(e.to_string());
        kernels::cuda::driver_present().map_err(missing)?;
        kernels::cuda::nvrtc_present().map_err(missing)?;
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    Err(Error::Unsupported(
        "this build of oxccl has no CUDA support (build with the `cuda` feature)".into(),
    ))
}
