//! The CUDA kernels' logic, checked on the CPU: `src/cuda/reduce.cu` is
//! built for the host with g++ and a small shim (`tests/cuda_shim/`: a
//! launch runs every thread of every block in turn, valid for kernels
//! without shared memory or barriers) and run through the matrix of
//! `common/` — every dtype × op × 1, 2, 3, 8 sources × aligned and
//! misaligned buffers (vector and scalar paths) × several grid shapes —
//! against the host kernels (`reduce_n` + `div_assign`, baseline ISA) and,
//! for fp8 and PreMulSum, a reference written there.
//!
//! What only a device can prove is not claimed here: that NVRTC's PTX runs
//! (`cuda_device.rs`, on a GPU; `cuda_nvrtc.rs` only compiles it), the f16
//! conversions on a device (there the hardware's `cvt` instructions, here
//! the written-out ones), 16-byte loads from device memory, and speed.

mod common;
use common::{Args, Runner};
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

type Launch = unsafe extern "C" fn(*const c_void, *const Args, u32, u32);

/// The kernel source built for the host, loaded.
struct Shim {
    handle: *mut c_void,
    launch: Launch,
}
// SAFETY: the library is loaded once and only read afterwards.
unsafe impl Send for Shim {}
unsafe impl Sync for Shim {}

fn shim() -> &'static Shim {
    static SHIM: OnceLock<Shim> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let out = std::env::temp_dir().join(format!("oxccl-cuda-host-{}.so", std::process::id()));
        let st = std::process::Command::new("g++")
            .args([
                "-O2",
                "-std=c++17",
                "-shared",
                "-fPIC",
                "-Wall",
                "-Werror",
                "-Wno-unknown-pragmas",
            ])
            .arg("-I")
            .arg(dir.join("tests/cuda_shim"))
            .arg("-I")
            .arg(dir.join("src/cuda"))
            .arg(dir.join("tests/cuda_shim/driver.cc"))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("g++ (the host build of the CUDA kernels needs it)");
        assert!(
            st.success(),
            "g++ could not build src/cuda/reduce.cu for the host"
        );
        let path = CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: loading the library just built; its launcher is looked up
        // by name with the type the driver declares.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!handle.is_null(), "dlopen of the host kernels failed");
            let sym = libc::dlsym(handle, c"ox_host_launch".as_ptr());
            assert!(!sym.is_null());
            let _ = std::fs::remove_file(&out);
            Shim {
                handle,
                launch: std::mem::transmute::<*mut c_void, Launch>(sym),
            }
        }
    })
}

/// 16-byte aligned host memory holding `bytes` at `offset` bytes in.
struct Aligned {
    buf: Vec<u128>,
    offset: usize,
}

impl Aligned {
    fn new(bytes: usize, offset: usize) -> Aligned {
        Aligned {
            buf: vec![0u128; (bytes + offset).div_ceil(16) + 1],
            offset,
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        // SAFETY: `offset` bytes in stays inside the allocation.
        unsafe { (self.buf.as_mut_ptr() as *mut u8).add(self.offset) }
    }
}

struct Host;

impl Runner for Host {
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
        let bytes = count * elem;
        let mut ins: Vec<Aligned> = srcs
            .iter()
            .map(|_| Aligned::new(bytes, offset * elem))
            .collect();
        let mut out = Aligned::new(bytes, offset * elem);
        let mut a = Args {
            count: count as u64,
            nsrc: srcs.len() as u32,
            divisor,
            ..Args::default()
        };
        for (i, (s, data)) in ins.iter_mut().zip(srcs).enumerate() {
            // SAFETY: the buffer holds `bytes` at its offset.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.ptr(), bytes) };
            a.src[i] = s.ptr() as u64;
            a.scalar[i] = scalars.get(i).copied().unwrap_or(0);
        }
        a.dst = out.ptr() as u64;
        let s = shim();
        let c = CString::new(kernel).unwrap();
        // SAFETY: the kernel reads `nsrc` sources and writes `dst`, each of
        // `count` elements, all allocated above.
        unsafe {
            let k = libc::dlsym(s.handle, c.as_ptr());
            assert!(!k.is_null(), "no kernel {kernel}");
            (s.launch)(k, &a, launch.0, launch.1);
            std::slice::from_raw_parts(out.ptr(), bytes).to_vec()
        }
    }
}

#[test]
fn every_dtype_and_op_matches_the_host_kernels() {
    common::all_matrices(&Host);
}

#[test]
fn fp8_every_pair_of_codes() {
    common::fp8_pairs(&Host);
}

#[test]
fn halves_every_value_round_trips_and_sums_round_to_nearest_even() {
    common::halves_round_trip(&Host);
}

#[test]
fn the_copy_kernel_copies_bytes() {
    common::copies(&Host);
}
