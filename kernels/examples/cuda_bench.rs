//! Device reduction kernels against the device's copy rate (the `cuda`
//! feature, a GPU): `cargo run --release -p kernels --features cuda
//! --example cuda_bench -- [MiB...]`. For each size, the copy rate of
//! `cuMemcpyDtoD` and of the `ox_copy` kernel (bytes read + written per
//! second), then 2-source sums (and a few other ops) of the main dtypes
//! in the same unit (2 × size read, 1 × size written), each the median
//! of 20 timed launches after 3 warm-ups, timed with CUDA events.
//! Prints one line per measurement; `scripts/gpu-check` keeps them.

use cudarc::driver::{CudaContext, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use kernels::cuda::{self, DeviceOp, Dtype, ReduceArgs};

#[repr(transparent)]
struct Param(ReduceArgs);
// SAFETY: a plain `repr(C)` struct of integers, the kernels' `OxArgs`.
unsafe impl DeviceRepr for Param {}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    cuda::driver_present()?;
    cuda::nvrtc_present()?;
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes in MiB"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![256, 1024]
    } else {
        sizes
    };
    let ctx = CudaContext::new(0)?;
    let (major, minor) = ctx.compute_capability()?;
    let arch = (major * 10 + minor) as u32;
    let sms = ctx.attribute(
        cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )? as u32;
    let t = std::time::Instant::now();
    let ptx = cuda::ptx(arch)?;
    println!(
        "# sm_{arch}, {sms} SMs; kernels ready in {:.2} s (compile or cache)",
        t.elapsed().as_secs_f64()
    );
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx.to_string()))?;
    let s = ctx.default_stream();
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    for mib in sizes {
        let bytes = mib << 20;
        let a = s.alloc_zeros::<u8>(bytes)?;
        let b = s.alloc_zeros::<u8>(bytes)?;
        let mut d = s.alloc_zeros::<u8>(bytes)?;
        let time = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
            for _ in 0..3 {
                f()?;
            }
            let mut ms = Vec::new();
            for _ in 0..20 {
                let e0 = s.record_event(timing)?;
                f()?;
                let e1 = s.record_event(timing)?;
                e1.synchronize()?;
                ms.push(e0.elapsed_ms(&e1)? as f64);
            }
            Ok(median(ms))
        };
        let ms = time(&mut || Ok(s.memcpy_dtod(&a, &mut d)?))?;
        println!(
            "copy memcpy_dtod {mib} MiB: {:.3} ms, {:.0} GB/s read+write",
            ms,
            2.0 * bytes as f64 / ms / 1e6
        );
        let (pa, _ga) = a.device_ptr(&s);
        let (pb, _gb) = b.device_ptr(&s);
        let (pd, _gd) = d.device_ptr(&s);
        let launch = |name: &str,
                      args: ReduceArgs,
                      elem: usize|
         -> Result<f64, Box<dyn std::error::Error>> {
            let f = module.load_function(name)?;
            let (grid, block) = cuda::launch_dims(args.count, elem, sms);
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            let p = Param(args);
            // SAFETY: the sources and destination are `bytes` long device
            // allocations alive for the whole benchmark.
            time(&mut || {
                unsafe { s.launch_builder(&f).arg(&p).launch(cfg) }?;
                Ok(())
            })
        };
        let copy = ReduceArgs::new(pd, &[pa], bytes as u64, 1)?;
        let ms = launch(cuda::COPY_KERNEL, copy, 1)?;
        println!(
            "copy ox_copy {mib} MiB: {:.3} ms, {:.0} GB/s read+write",
            ms,
            2.0 * bytes as f64 / ms / 1e6
        );
        let cases = [
            (Dtype::F32, DeviceOp::Sum),
            (Dtype::Bf16, DeviceOp::Sum),
            (Dtype::F16, DeviceOp::Sum),
            (Dtype::F64, DeviceOp::Sum),
            (Dtype::I32, DeviceOp::Sum),
            (Dtype::F8E4M3, DeviceOp::Sum),
            (Dtype::F32, DeviceOp::Max),
            (Dtype::Bf16, DeviceOp::PreMulSum),
        ];
        for (dt, op) in cases {
            let n = (bytes / dt.size()) as u64;
            let mut args = ReduceArgs::new(pd, &[pa, pb], n, 1)?;
            if op == DeviceOp::PreMulSum {
                args = args.with_scalars(&[0x3f80, 0x3f80])?; // bf16 1.0
            }
            let ms = launch(&cuda::kernel_name(dt, op), args, dt.size())?;
            println!(
                "reduce {} {} 2 sources {mib} MiB: {:.3} ms, {:.0} GB/s read+write",
                dt.name(),
                op.name(),
                ms,
                3.0 * bytes as f64 / ms / 1e6
            );
        }
        // Eight distinct sources (the same one eight times would be read
        // once from memory and seven times from the caches).
        let more = (0..6)
            .map(|_| s.alloc_zeros::<u8>(bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let mut srcs = vec![pa, pb];
        for m in &more {
            srcs.push(m.device_ptr(&s).0);
        }
        let n = (bytes / 4) as u64;
        let ms = launch(
            &cuda::kernel_name(Dtype::F32, DeviceOp::Sum),
            ReduceArgs::new(pd, &srcs, n, 1)?,
            4,
        )?;
        println!(
            "reduce f32 sum 8 sources {mib} MiB: {:.3} ms, {:.0} GB/s read+write",
            ms,
            9.0 * bytes as f64 / ms / 1e6
        );
    }
    Ok(())
}
