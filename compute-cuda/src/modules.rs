//! oxccl's kernels loaded into one context: one module per element type,
//! compiled by NVRTC (or read from the cache folder) and loaded at first
//! use. Shared between the engine and the handle that queues calls: a
//! queued call loads its element type's module before it holds the
//! caller's stream (loading may wait for the whole device; see `held`).

use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaModule};
use kernels::cuda::{self as k, Dtype};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The loaded modules of one context (see the module docs).
pub struct Modules {
    ctx: Arc<CudaContext>,
    /// `compute_<arch>` the kernels are compiled for (e.g. 90).
    arch: u32,
    ordinal: u32,
    loaded: Mutex<HashMap<Dtype, Arc<CudaModule>>>,
}

impl Modules {
    pub(crate) fn new(ctx: Arc<CudaContext>, arch: u32, ordinal: u32) -> Modules {
        Modules {
            ctx,
            arch,
            ordinal,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// The module of `dtype`'s kernels, loading it at first use.
    pub fn load(&self, dtype: Dtype) -> Result<Arc<CudaModule>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = loaded.get(&dtype) {
            return Ok(m.clone());
        }
        let device = || format!("CUDA device {}", self.ordinal);
        let ptx = k::ptx_for(dtype, self.arch).map_err(|e| match e {
            k::CudaError::Missing(m) => Error::Unsupported(m),
            other => Error::Device {
                device: device(),
                detail: other.to_string(),
            },
        })?;
        let m = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.to_string()))
            .map_err(|e| Error::Device {
                device: device(),
                detail: format!("loading oxccl's kernels: {e}"),
            })?;
        loaded.insert(dtype, m.clone());
        Ok(m)
    }
}
