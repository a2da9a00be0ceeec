//! The CUDA kernels on a GPU: NVRTC's PTX for the device's architecture,
//! loaded by the driver, launched on device memory, through the same
//! matrix as `cuda_host.rs` (every dtype × op × sources × alignments ×
//! launch shapes against the host kernels and the fp8 reference).
//!
//! Needs a CUDA driver, a device and NVRTC; without them the tests say so
//! and pass, unless `OXCCL_REQUIRE_GPU=1` (`scripts/gpu-check`), where
//! their absence fails them. No mock: on a machine without a GPU nothing
//! here runs.
#![cfg(feature = "cuda")]

mod common;
use common::{Args, Runner};
use cudarc::driver::{
    CudaContext, CudaModule, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use kernels::cuda;
use std::sync::Arc;

/// `Args` as a kernel parameter (passed by value; plain data).
#[repr(transparent)]
struct Param(Args);
// SAFETY: a plain `repr(C)` struct of integers, the kernels' `OxArgs`.
unsafe impl DeviceRepr for Param {}

struct Gpu {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
}

fn gpu() -> Option<Gpu> {
    let required = std::env::var("OXCCL_REQUIRE_GPU").as_deref() == Ok("1");
    let skip = |why: String| {
        assert!(!required, "OXCCL_REQUIRE_GPU=1 but {why}");
        eprintln!("skipped: {why}");
        None
    };
    if let Err(e) = cuda::driver_present() {
        return skip(e.to_string());
    }
    if let Err(e) = cuda::nvrtc_present() {
        return skip(e.to_string());
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => return skip(format!("no CUDA device 0: {e}")),
    };
    let (major, minor) = ctx.compute_capability().unwrap();
    let arch = (major * 10 + minor) as u32;
    let ptx = cuda::ptx(arch).unwrap_or_else(|e| panic!("{e}"));
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(ptx.to_string()))
        .unwrap_or_else(|e| panic!("the driver rejected the PTX for sm_{arch}: {e}"));
    eprintln!("device 0: sm_{arch}, {} KiB of PTX", ptx.len() >> 10);
    Some(Gpu {
        stream: ctx.default_stream(),
        module,
    })
}

impl Runner for Gpu {
    fn reduce(
        &self,
        kernel: &str,
        elem: usize,
        srcs: &[Vec<u8>],
        count: usize,
        offset: usize,
        divisor: u32,
        scalars: &[u64],
        launch: (u32, u32),
    ) -> Vec<u8> {
        let s = &self.stream;
        let pad = offset * elem;
        let bytes = count * elem;
        let with_pad = |d: &[u8]| {
            let mut v = vec![0u8; pad + bytes.max(1)];
            v[pad..pad + bytes].copy_from_slice(d);
            v
        };
        // Device allocations are 256-byte aligned: `pad` misaligns them.
        let ins: Vec<_> = srcs
            .iter()
            .map(|d| s.clone_htod(&with_pad(d)).unwrap())
            .collect();
        let out = s.clone_htod(&vec![0u8; pad + bytes.max(1)]).unwrap();
        let mut a = Args {
            count: count as u64,
            nsrc: srcs.len() as u32,
            divisor,
            ..Args::default()
        };
        let mut guards = Vec::new();
        for (i, d) in ins.iter().enumerate() {
            let (p, g) = d.device_ptr(s);
            guards.push(g);
            a.src[i] = p + pad as u64;
            a.scalar[i] = scalars.get(i).copied().unwrap_or(0);
        }
        let (p, g) = out.device_ptr(s);
        guards.push(g);
        a.dst = p + pad as u64;
        let f = self.module.load_function(kernel).unwrap();
        let param = Param(a);
        let cfg = LaunchConfig {
            grid_dim: (launch.0, 1, 1),
            block_dim: (launch.1.min(cuda::BLOCK), 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads `nsrc` sources and writes `dst`, each
        // `count` elements inside the allocations above, which outlive
        // the launch (we synchronise below before dropping them).
        unsafe { s.launch_builder(&f).arg(&param).launch(cfg) }.unwrap();
        drop(guards);
        s.synchronize().unwrap();
        s.clone_dtoh(&out).unwrap()[pad..pad + bytes].to_vec()
    }
}

#[test]
fn on_a_gpu_every_dtype_and_op_matches_the_host_kernels() {
    let Some(g) = gpu() else { return };
    common::all_matrices(&g);
    common::fp8_pairs(&g);
    common::halves_round_trip(&g);
    common::copies(&g);
}
