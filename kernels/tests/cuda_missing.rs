//! NVRTC named by `OXCCL_NVRTC` but not there: every entry point is a
//! `CudaError::Missing` naming the variable and the path, never cudarc's
//! panic. (A test binary of its own: the probe runs once per process.)
#![cfg(feature = "cuda")]

use kernels::cuda::{self, CudaError};

#[test]
fn a_missing_nvrtc_is_an_error_naming_what_is_missing() {
    std::env::set_var("OXCCL_NVRTC", "/nonexistent/libnvrtc.so.13");
    for r in [
        cuda::nvrtc_present().map(|_| String::new()),
        cuda::ptx(90).map(|p| p.to_string()),
        cuda::compile(cuda::SOURCE, 80),
    ] {
        match r {
            Err(CudaError::Missing(why)) => {
                assert!(
                    why.contains("OXCCL_NVRTC=/nonexistent/libnvrtc.so.13"),
                    "{why}"
                )
            }
            other => panic!("expected Missing, got {other:?}"),
        }
    }
}
