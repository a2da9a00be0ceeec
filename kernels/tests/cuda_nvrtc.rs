//! The CUDA kernels compiled by NVRTC for every architecture CI names
//! (sm_80, sm_90, sm_100), so a kernel that does not compile fails CI.
//! Needs NVRTC at run time (the `nvidia-cuda-nvrtc` wheel is enough; see
//! `OXCCL_NVRTC`); without it the tests say so and pass, unless
//! `OXCCL_REQUIRE_NVRTC=1` (CI), where its absence fails them.
//!
//! This proves the source compiles to PTX; it does not run it (no device
//! here): `cuda_host.rs` checks the kernels' logic on the CPU, and
//! `scripts/gpu-check` runs them on a GPU.
#![cfg(feature = "cuda")]

use kernels::cuda::{self, CudaError};

fn nvrtc() -> bool {
    match cuda::nvrtc_present() {
        Ok(()) => true,
        Err(e) if std::env::var("OXCCL_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("OXCCL_REQUIRE_NVRTC=1 but NVRTC is missing: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

#[test]
fn every_kernel_compiles_for_every_ci_architecture() {
    if !nvrtc() {
        return;
    }
    let (major, minor) = cuda::nvrtc_version().unwrap();
    for arch in cuda::CI_ARCHS {
        let t = std::time::Instant::now();
        let ptx = cuda::compile(cuda::SOURCE, arch).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ptx.contains(&format!(".target sm_{arch}")),
            "compute_{arch}: no target line"
        );
        for name in cuda::kernel_names() {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "compute_{arch}: no kernel {name}"
            );
        }
        eprintln!(
            "NVRTC {major}.{minor}: {} kernels for compute_{arch} in {:.1} s ({} KiB of PTX)",
            cuda::kernel_names().len(),
            t.elapsed().as_secs_f64(),
            ptx.len() >> 10
        );
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_nvrtc_s_log() {
    if !nvrtc() {
        return;
    }
    let broken = format!(
        "{}\nOX_GLOBAL ox_broken(OxArgs a) {{ no_such_function(a); }}\n",
        cuda::SOURCE
    );
    match cuda::compile(&broken, 90) {
        Err(CudaError::Compile { arch: 90, log }) => {
            assert!(log.contains("no_such_function"), "{log}")
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn compiled_kernels_are_kept_in_the_cache_folder_and_read_back() {
    if !nvrtc() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("oxccl-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A source of its own, so no other test's compile sits in the memory cache.
    let src = format!("{}\n// cache test\n", cuda::SOURCE);
    let first = cuda::compile_cached(&src, 80, None, Some(&dir)).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("oxccl-kernels-") && name.ends_with("-compute_80.ptx"),
        "{name}"
    );
    assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), *first);
    // A cache file is read back instead of compiling: plant one for a
    // source nothing compiled yet and see it returned.
    let other = format!("{}\n// planted\n", cuda::SOURCE);
    let planted = "// planted PTX\n.entry ox_copy(\n";
    std::fs::write(dir.join(cuda::cache_file(&other, 90).unwrap()), planted).unwrap();
    assert_eq!(
        &*cuda::compile_cached(&other, 90, None, Some(&dir)).unwrap(),
        planted
    );
    // A file that is not PTX is compiled over.
    let third = format!("{}\n// damaged\n", cuda::SOURCE);
    let f = dir.join(cuda::cache_file(&third, 90).unwrap());
    std::fs::write(&f, "garbage").unwrap();
    let ptx = cuda::compile_cached(&third, 90, None, Some(&dir)).unwrap();
    assert!(ptx.contains(".entry ox_copy("));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), *ptx);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_dtype_s_kernels_compile_alone_and_faster() {
    if !nvrtc() {
        return;
    }
    let t = std::time::Instant::now();
    let all = cuda::compile(cuda::SOURCE, 90).unwrap();
    let whole = t.elapsed();
    let t = std::time::Instant::now();
    let one = cuda::ptx_for(cuda::Dtype::Bf16, 90).unwrap();
    let single = t.elapsed();
    for op in cuda::DeviceOp::ALL {
        assert!(one.contains(&format!(
            ".entry {}(",
            cuda::kernel_name(cuda::Dtype::Bf16, op)
        )));
        assert!(!one.contains(&format!(
            ".entry {}(",
            cuda::kernel_name(cuda::Dtype::F32, op)
        )));
    }
    assert!(one.contains(".entry ox_copy("));
    assert!(one.len() * 4 < all.len());
    eprintln!("compute_90: every kernel in {whole:.1?}, bf16's alone in {single:.1?}");
}

/// Without the CUDA driver (this machine has none), asking for it is an
/// error naming what is missing, not cudarc's panic.
#[test]
fn a_missing_driver_is_an_error_not_a_panic() {
    match cuda::driver_present() {
        Ok(()) => eprintln!("this host has a CUDA driver"),
        Err(CudaError::Missing(why)) => assert!(why.contains("libcuda"), "{why}"),
        Err(e) => panic!("{e}"),
    }
}
