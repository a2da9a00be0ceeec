//! CUDA reduction kernels (the `cuda` feature): their source, the
//! argument block they take, how a launch is sized, and their compilation
//! with NVRTC — at first use, for the device's architecture, cached in
//! memory and in a folder keyed by source hash, NVRTC version and
//! architecture.
//!
//! The kernels (`reduce.cu`) cover every [`Dtype`] × [`DeviceOp`] for up
//! to [`MAX_SOURCES`] sources, with 16-byte vector loads and grid-stride
//! loops; their semantics are the host kernels' (see the file's header).
//! This module only compiles: loading the PTX into a context and launching
//! it on a stream belongs to the CUDA compute engine, which builds a
//! [`ReduceArgs`] per launch and sizes it with [`launch_dims`].
//!
//! Nothing CUDA is needed to build. NVRTC is loaded at run time; cudarc
//! panics when it cannot find the library, so [`nvrtc_present`] probes it
//! first (honouring `OXCCL_NVRTC`, a path) and every entry point returns
//! [`CudaError::Missing`] instead.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The kernels' source (self-contained: NVRTC needs no include path).
pub const SOURCE: &str = include_str!("reduce.cu");

/// Most sources one launch combines (`OX_MAX_SOURCES` in the source).
pub const MAX_SOURCES: usize = 8;

/// Threads per block of every launch (the kernels' `__launch_bounds__`).
pub const BLOCK: u32 = 512;

/// The architectures CI compiles every kernel for (Ampere, Hopper,
/// Blackwell): a kernel that does not compile for one of them fails CI.
pub const CI_ARCHS: [u32; 3] = [80, 90, 100];

/// An element type of the device kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    Bf16,
    F32,
    F64,
    /// fp8 E4M3 ("FN": no infinities, largest 448).
    F8E4M3,
    /// fp8 E5M2 (IEEE-like, largest finite 57344).
    F8E5M2,
}

impl Dtype {
    pub const ALL: [Dtype; 12] = [
        Dtype::I8,
        Dtype::U8,
        Dtype::I32,
        Dtype::U32,
        Dtype::I64,
        Dtype::U64,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
    ];

    /// The name in kernel names (`ox_reduce_<name>_<op>`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::U32 => "u32",
            Dtype::I64 => "i64",
            Dtype::U64 => "u64",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::F8E4M3 => "f8e4m3",
            Dtype::F8E5M2 => "f8e5m2",
        }
    }

    /// Its place in [`Dtype::ALL`] (`OX_ONLY_DTYPE` in the source).
    pub fn index(self) -> usize {
        Dtype::ALL.iter().position(|d| *d == self).unwrap()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }
}

/// A reduction as the device kernels see it. `Avg` is `Sum` with a
/// divisor ([`ReduceArgs::divisor`]); `PreMulSum` (NCCL's
/// `ncclRedOpCreatePreMulSum`) sums each source times its own scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceOp {
    Sum,
    Prod,
    Min,
    Max,
    PreMulSum,
}

impl DeviceOp {
    pub const ALL: [DeviceOp; 5] = [
        DeviceOp::Sum,
        DeviceOp::Prod,
        DeviceOp::Min,
        DeviceOp::Max,
        DeviceOp::PreMulSum,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DeviceOp::Sum => "sum",
            DeviceOp::Prod => "prod",
            DeviceOp::Min => "min",
            DeviceOp::Max => "max",
            DeviceOp::PreMulSum => "premulsum",
        }
    }
}

impl From<crate::Op> for DeviceOp {
    fn from(op: crate::Op) -> DeviceOp {
        match op {
            crate::Op::Sum => DeviceOp::Sum,
            crate::Op::Prod => DeviceOp::Prod,
            crate::Op::Min => DeviceOp::Min,
            crate::Op::Max => DeviceOp::Max,
        }
    }
}

/// The kernel that reduces `dtype` with `op`.
pub fn kernel_name(dtype: Dtype, op: DeviceOp) -> String {
    format!("ox_reduce_{}_{}", dtype.name(), op.name())
}

/// The byte-copy kernel (one source, nothing to apply).
pub const COPY_KERNEL: &str = "ox_copy";

/// Which kernel a launch needs: a value an engine can keep its loaded
/// functions under, so choosing one per call allocates nothing (names,
/// [`Kernel::name`], are for loading the module once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Copy,
    Reduce(Dtype, DeviceOp),
}

impl Kernel {
    /// The kernel's name in the PTX.
    pub fn name(self) -> String {
        match self {
            Kernel::Copy => COPY_KERNEL.to_string(),
            Kernel::Reduce(d, op) => kernel_name(d, op),
        }
    }
}

/// Every kernel the source defines.
pub fn kernel_names() -> Vec<String> {
    let mut v = vec![COPY_KERNEL.to_string()];
    for d in Dtype::ALL {
        for op in DeviceOp::ALL {
            v.push(kernel_name(d, op));
        }
    }
    v
}

/// The kernels' argument, passed by value (`OxArgs` in `reduce.cu`: the
/// same layout, 152 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReduceArgs {
    /// Device addresses of the sources; unused entries are 0.
    pub src: [u64; MAX_SOURCES],
    /// May equal a source (in place: every element is read before it is
    /// written, by the same thread).
    pub dst: u64,
    /// Elements (bytes for [`COPY_KERNEL`]).
    pub count: u64,
    pub nsrc: u32,
    /// `Avg`: divide by this after the sum; 1: no division.
    pub divisor: u32,
    /// `PreMulSum`: each source's factor, as the element type's bits.
    pub scalar: [u64; MAX_SOURCES],
}

impl ReduceArgs {
    /// Arguments for `dst = op(srcs..)` over `count` elements; `divisor`
    /// 1 unless averaging. Checks what the kernels cannot.
    pub fn new(dst: u64, srcs: &[u64], count: u64, divisor: u32) -> Result<ReduceArgs, CudaError> {
        if srcs.is_empty() || srcs.len() > MAX_SOURCES {
            return Err(CudaError::Invalid(format!(
                "a device reduction takes 1 to {MAX_SOURCES} sources, not {}",
                srcs.len()
            )));
        }
        if divisor == 0 {
            return Err(CudaError::Invalid("an average over zero ranks".into()));
        }
        let mut a = ReduceArgs {
            dst,
            count,
            nsrc: srcs.len() as u32,
            divisor,
            ..ReduceArgs::default()
        };
        a.src[..srcs.len()].copy_from_slice(srcs);
        Ok(a)
    }

    /// The same with `PreMulSum` factors, one per source, as element bits.
    pub fn with_scalars(mut self, scalars: &[u64]) -> Result<ReduceArgs, CudaError> {
        if scalars.len() != self.nsrc as usize {
            return Err(CudaError::Invalid(format!(
                "{} PreMulSum factors for {} sources",
                scalars.len(),
                self.nsrc
            )));
        }
        self.scalar[..scalars.len()].copy_from_slice(scalars);
        Ok(self)
    }

    /// The kernel these arguments need with `op`: the byte copy when there
    /// is one source and nothing to apply (`count` is then taken in bytes).
    pub fn kernel(&self, dtype: Dtype, op: DeviceOp) -> (Kernel, ReduceArgs) {
        if self.nsrc == 1 && self.divisor == 1 && op != DeviceOp::PreMulSum {
            let bytes = ReduceArgs {
                count: self.count * dtype.size() as u64,
                ..*self
            };
            return (Kernel::Copy, bytes);
        }
        (Kernel::Reduce(dtype, op), *self)
    }
}

/// Grid and block for `count` elements of `elem_size` bytes on a device
/// with `multiprocessors` SMs: one thread per 16-byte vector, at most 4
/// blocks per SM (the grid-stride loop covers the rest), at least one.
pub fn launch_dims(count: u64, elem_size: usize, multiprocessors: u32) -> (u32, u32) {
    let vectors = count.div_ceil((16 / elem_size.max(1)) as u64).max(1);
    let blocks = vectors.div_ceil(BLOCK as u64);
    let cap = (multiprocessors.max(1) as u64) * 4;
    (blocks.min(cap).max(1) as u32, BLOCK)
}

/// Why the CUDA kernels cannot be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaError {
    /// A CUDA library is not there (NVRTC, the driver): what, and how to
    /// provide it.
    Missing(String),
    /// NVRTC rejected the source for this architecture; its log.
    Compile { arch: u32, log: String },
    /// Arguments the kernels cannot take.
    Invalid(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Missing(what) => write!(f, "{what}"),
            CudaError::Compile { arch, log } => {
                write!(
                    f,
                    "NVRTC could not compile oxccl's kernels for compute_{arch}: {log}"
                )
            }
            CudaError::Invalid(what) => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for CudaError {}

/// Whether NVRTC can be loaded; the reason when not. Probed once. With
/// `OXCCL_NVRTC` set, that file is loaded (and made visible to cudarc,
/// which then finds it by its soname); otherwise the loader's search path
/// must hold `libnvrtc.so.*`.
pub fn nvrtc_present() -> Result<(), CudaError> {
    static PROBE: OnceLock<Result<(), CudaError>> = OnceLock::new();
    PROBE.get_or_init(probe_nvrtc).clone()
}

fn probe_nvrtc() -> Result<(), CudaError> {
    if let Some(path) = std::env::var_os("OXCCL_NVRTC") {
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
            .map_err(|_| CudaError::Missing("OXCCL_NVRTC holds a NUL byte".into()))?;
        // SAFETY: `c` is a valid C string; loading a library runs its
        // initialisers, which is what loading NVRTC means. The handle is
        // kept for the process's life (never closed).
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a valid C string or null.
            let why = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    "unknown error".to_string()
                } else {
                    std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            return Err(CudaError::Missing(format!(
                "OXCCL_NVRTC={}: cannot load it: {why}",
                path.to_string_lossy()
            )));
        }
    }
    // SAFETY: only tries to load the library by its candidate names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::Missing(
            "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit's NVRTC or the \
             `nvidia-cuda-nvrtc` wheel, and point LD_LIBRARY_PATH at its lib folder or \
             OXCCL_NVRTC at libnvrtc.so.*"
                .into(),
        ))
    }
}

/// Whether the CUDA driver (`libcuda.so.1`) can be loaded; the reason when
/// not. cudarc panics on first use without it, so every CUDA path asks
/// this first. Probed once.
pub fn driver_present() -> Result<(), CudaError> {
    static PROBE: OnceLock<Result<(), CudaError>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to load the library by its candidate names.
            if unsafe { cudarc::driver::sys::is_culib_present() } {
                Ok(())
            } else {
                Err(CudaError::Missing(
                    "the CUDA driver (libcuda.so.1) was not found: this host has no NVIDIA driver, \
                     or the loader's search path does not reach it"
                        .into(),
                ))
            }
        })
        .clone()
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32), CudaError> {
    nvrtc_present()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (probed above); the out-pointers are valid.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Missing(format!("nvrtcVersion failed: {r:?}")));
    }
    Ok((major as u32, minor as u32))
}

/// The options every kernel is compiled with: no fused multiply-adds
/// (PreMulSum must round its product, as the host does); IEEE division
/// and no flushing of subnormals are NVRTC's defaults, stated anyway.
fn options(arch: u32, only: Option<Dtype>) -> Vec<String> {
    let mut v = vec![
        format!("--gpu-architecture=compute_{arch}"),
        "--fmad=false".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--std=c++17".into(),
    ];
    if let Some(d) = only {
        v.push(format!("-DOX_ONLY_DTYPE={}", d.index()));
    }
    v
}

/// The PTX of every kernel for `compute_<arch>` (e.g. 90 for sm_90),
/// compiled at first use and cached in memory and in [`cache_dir`].
pub fn ptx(arch: u32) -> Result<Arc<str>, CudaError> {
    compile_cached(SOURCE, arch, None, cache_dir().as_deref())
}

/// The PTX of `dtype`'s kernels and the copy kernel only (what one call
/// needs; a fraction of [`ptx`]'s compile time), cached the same way.
pub fn ptx_for(dtype: Dtype, arch: u32) -> Result<Arc<str>, CudaError> {
    compile_cached(SOURCE, arch, Some(dtype), cache_dir().as_deref())
}

/// Where compiled kernels are kept: `OXCCL_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/oxccl`, else `~/.cache/oxccl`; none without a home.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |n| {
        std::env::var_os(n)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("OXCCL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|p| p.join("oxccl")))
        .or_else(|| var("HOME").map(|p| p.join(".cache").join("oxccl")))
}

/// 64-bit FNV-1a: a hash that stays the same across builds and Rust
/// versions (the cache's file names depend on it).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter() {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `src` compiled for `compute_<arch>`, from the memory cache, else from
/// `dir`'s cache file, else by NVRTC (then written to `dir`; a cache that
/// cannot be written only costs the next process a compile).
pub fn compile_cached(
    src: &str,
    arch: u32,
    only: Option<Dtype>,
    dir: Option<&Path>,
) -> Result<Arc<str>, CudaError> {
    static MEMORY: OnceLock<Mutex<PtxCache>> = OnceLock::new();
    let key = cache_key(src, arch, only)?;
    let memory = MEMORY.get_or_init(Default::default);
    if let Some(p) = memory.lock().unwrap().get(&(key, arch)) {
        return Ok(p.clone());
    }
    let file = dir.map(|d| d.join(cache_file_name(key, arch)));
    let cached = file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .filter(|p| p.contains(".entry"));
    let ptx: Arc<str> = match cached {
        Some(p) => p.into(),
        None => {
            let p = compile_with(src, arch, only)?;
            if let (Some(d), Some(f)) = (dir, &file) {
                let tmp = d.join(format!(
                    ".oxccl-kernels-{key:016x}-{}.tmp",
                    std::process::id()
                ));
                let written = std::fs::create_dir_all(d)
                    .and_then(|_| std::fs::write(&tmp, p.as_bytes()))
                    .and_then(|_| std::fs::rename(&tmp, f));
                if written.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            p.into()
        }
    };
    memory.lock().unwrap().insert((key, arch), ptx.clone());
    Ok(ptx)
}

/// Compiled PTX by (cache key, architecture).
type PtxCache = HashMap<(u64, u32), Arc<str>>;

/// What a compile depends on: the source, the options (the architecture
/// among them) and NVRTC's version.
fn cache_key(src: &str, arch: u32, only: Option<Dtype>) -> Result<u64, CudaError> {
    let (major, minor) = nvrtc_version()?;
    let opts = options(arch, only).join(" ");
    let version = format!("{major}.{minor}");
    Ok(fnv1a(&[
        src.as_bytes(),
        opts.as_bytes(),
        version.as_bytes(),
    ]))
}

fn cache_file_name(key: u64, arch: u32) -> String {
    format!("oxccl-kernels-{key:016x}-compute_{arch}.ptx")
}

/// The name of `src`'s cache file for `compute_<arch>` (in [`cache_dir`]).
pub fn cache_file(src: &str, arch: u32) -> Result<String, CudaError> {
    Ok(cache_file_name(cache_key(src, arch, None)?, arch))
}

/// `src` compiled by NVRTC for `compute_<arch>`, uncached.
pub fn compile(src: &str, arch: u32) -> Result<String, CudaError> {
    compile_with(src, arch, None)
}

fn compile_with(src: &str, arch: u32, only: Option<Dtype>) -> Result<String, CudaError> {
    nvrtc_present()?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: options(arch, only),
        name: Some("oxccl_reduce.cu".into()),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(src, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(CudaError::Compile {
            arch,
            log: log.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(CudaError::Compile {
            arch,
            log: format!("{e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<ReduceArgs>(), 152);
        assert_eq!(std::mem::offset_of!(ReduceArgs, dst), 64);
        assert_eq!(std::mem::offset_of!(ReduceArgs, count), 72);
        assert_eq!(std::mem::offset_of!(ReduceArgs, nsrc), 80);
        assert_eq!(std::mem::offset_of!(ReduceArgs, divisor), 84);
        assert_eq!(std::mem::offset_of!(ReduceArgs, scalar), 88);
    }

    #[test]
    fn arguments_are_checked_and_one_plain_source_is_a_byte_copy() {
        assert!(matches!(
            ReduceArgs::new(0, &[], 4, 1),
            Err(CudaError::Invalid(_))
        ));
        assert!(matches!(
            ReduceArgs::new(0, &[1; 9], 4, 1),
            Err(CudaError::Invalid(_))
        ));
        assert!(matches!(
            ReduceArgs::new(0, &[1], 4, 0),
            Err(CudaError::Invalid(_))
        ));
        let a = ReduceArgs::new(8, &[16], 10, 1).unwrap();
        let (k, b) = a.kernel(Dtype::F32, DeviceOp::Sum);
        assert_eq!((k, b.count), (Kernel::Copy, 40));
        assert_eq!(k.name(), COPY_KERNEL);
        let (k, _) = a.kernel(Dtype::F32, DeviceOp::PreMulSum);
        assert_eq!(k.name(), "ox_reduce_f32_premulsum");
        let a = ReduceArgs::new(8, &[16, 24], 10, 2).unwrap();
        assert_eq!(
            a.kernel(Dtype::Bf16, DeviceOp::Sum).0.name(),
            "ox_reduce_bf16_sum"
        );
        assert!(a.with_scalars(&[1]).is_err());
        assert_eq!(a.with_scalars(&[1, 2]).unwrap().scalar[..3], [1, 2, 0]);
    }

    #[test]
    fn every_kernel_name_is_in_the_source() {
        let names = kernel_names();
        assert_eq!(names.len(), 1 + 12 * 5);
        for t in Dtype::ALL {
            assert!(SOURCE.contains(&format!("OX_KERNELS({}, {})", kernel_type(t), t.name())));
        }
    }

    #[test]
    fn each_dtype_s_guard_in_the_source_has_its_index() {
        for t in Dtype::ALL {
            let guarded = format!(
                "#if OX_WANT({})\nOX_KERNELS({}, {})",
                t.index(),
                kernel_type(t),
                t.name()
            );
            assert!(SOURCE.contains(&guarded), "{guarded}");
        }
    }

    fn kernel_type(t: Dtype) -> &'static str {
        match t {
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::F8E4M3 => "E4M3",
            Dtype::F8E5M2 => "E5M2",
        }
    }

    #[test]
    fn launches_cover_every_vector_and_stay_bounded() {
        assert_eq!(launch_dims(0, 4, 132), (1, BLOCK));
        assert_eq!(launch_dims(4 * 512, 4, 132), (1, BLOCK));
        assert_eq!(launch_dims(4 * 512 + 1, 4, 132), (2, BLOCK));
        assert_eq!(launch_dims(1 << 30, 2, 132), (528, BLOCK));
        assert_eq!(launch_dims(100, 1, 0), (1, BLOCK));
    }

    #[test]
    fn the_cache_key_is_stable() {
        // FNV-1a of known input: the cache's file names must not change
        // between builds.
        // Computed apart from this code (FNV-1a of "a", then the part
        // separator 0xff): a changed hash renames every cache file.
        const PINNED_A: u64 = 0x089b_c907_b544_c769;
        assert_eq!(fnv1a(&[b"a"]), PINNED_A);
        assert_ne!(fnv1a(&[b"ab", b""]), fnv1a(&[b"a", b"b"]));
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
