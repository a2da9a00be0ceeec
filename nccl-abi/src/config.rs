//! `ncclConfig_t` (a communicator's) and `ncclCollConfig_t` (one call's).
//!
//! Both are versioned, append-only structs: `size` says how much of the
//! struct the program knows (a program built against an older `nccl.h`
//! passes a shorter one), `magic` that `NCCL_CONFIG_INITIALIZER` /
//! `NCCL_COLLCONFIG_INITIALIZER` filled it. Fields past `size` read as
//! unset.
//!
//! What oxccl honours: `blocking` (0: non-blocking creation, polled with
//! `ncclCommGetAsyncError`), `netName` (`Socket`, or `IB` in a build with
//! RDMA), `commName` (in messages). The CTA, NVLS, CGA, graph, RMA and CFT
//! fields size GPU kernels and device resources: calls on host memory have
//! none, so any value is accepted and has no effect. `splitShare` /
//! `shrinkShare` ask to share resources with the parent: accepted (oxccl
//! communicators share none). Per call: `algSelection` can only be left
//! automatic (see [`CollConfig`]); `launchCompletionEvent` needs CUDA.

use crate::result::Failure;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// `NCCL_API_MAGIC`.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const UNDEF_INT: c_int = c_int::MIN;

/// NCCL's `ncclConfig_t` (`ncclConfig_v23100`, as 2.32 has it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

/// NCCL's `ncclCollConfig_t` (`ncclCollConfig_v23200`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut c_void,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
    pub launchCompletionEvent: *mut c_void,
}

/// What a communicator's configuration asks of oxccl.
#[derive(Clone, Debug, Default)]
pub struct CommConfig {
    /// `blocking = 0`: creation returns at once (`ncclInProgress`).
    pub nonblocking: bool,
    /// `commName`, for messages.
    pub name: Option<String>,
}

/// Read `size` bytes of a versioned struct over a default whose every
/// field is unset.
///
/// # Safety
/// `p` points to at least `size` readable bytes (its `size` field says so).
unsafe fn read_versioned<T: Copy>(p: *const T, unset: T, what: &str) -> Result<T, Failure> {
    // SAFETY: every such struct starts with `size_t size; unsigned magic`;
    // the caller's contract covers those 12 bytes.
    let (size, magic) = unsafe {
        (
            (p as *const usize).read_unaligned(),
            (p as *const u8)
                .add(std::mem::size_of::<usize>())
                .cast::<c_uint>()
                .read_unaligned(),
        )
    };
    if magic != NCCL_API_MAGIC {
        return Err(Failure::invalid(format!(
            "{what}: magic is {magic:#x}, not NCCL_API_MAGIC: initialize it with \
             its NCCL_*_INITIALIZER"
        )));
    }
    let header = std::mem::size_of::<usize>() + 2 * std::mem::size_of::<c_uint>();
    if size < header {
        return Err(Failure::invalid(format!(
            "{what}: size {size} is smaller than its header"
        )));
    }
    let mut out = unset;
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `n` bytes are readable at `p` (the caller's contract) and
    // fit in `out`; T is plain data (integers and raw pointers).
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, &mut out as *mut T as *mut u8, n) };
    Ok(out)
}

/// A C string field, or `None` when NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text(p: *const c_char, what: &str) -> Result<Option<String>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// A communicator's configuration (NULL: the defaults).
///
/// # Safety
/// `config` is NULL or points to an `ncclConfig_t` of its `size`.
pub unsafe fn comm_config(config: *const ncclConfig_t) -> Result<CommConfig, Failure> {
    if config.is_null() {
        return Ok(CommConfig::default());
    }
    let unset = ncclConfig_t {
        size: 0,
        magic: 0,
        version: 0,
        blocking: UNDEF_INT,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
        graphUsageMode: UNDEF_INT,
        numRmaCtx: UNDEF_INT,
        maxP2pPeers: UNDEF_INT,
        graphStreamOrdering: UNDEF_INT,
        launchOrderImplicit: UNDEF_INT,
        numRmaSig: UNDEF_INT,
        rmaEagerInit: UNDEF_INT,
        hostCftMode: UNDEF_INT,
        nvlsHostMode: UNDEF_INT,
    };
    // SAFETY: the caller's contract.
    let c = unsafe { read_versioned(config, unset, "config (ncclConfig_t)") }?;
    let nonblocking = match c.blocking {
        UNDEF_INT | 1 => false,
        0 => true,
        b => {
            return Err(Failure::invalid(format!(
                "config->blocking = {b}: expected 0 or 1"
            )))
        }
    };
    // SAFETY: the caller's contract: NULL or a C string.
    match unsafe { text(c.netName, "config->netName") }?.as_deref() {
        None | Some("Socket") => {}
        Some("IB") if cfg!(feature = "rdma") => {}
        Some("IB") => {
            return Err(Failure::usage(
                "config->netName = \"IB\": this libnccl was built without RDMA \
                 (build nccl-abi with --features rdma)",
            ))
        }
        Some(other) => {
            return Err(Failure::invalid(format!(
                "config->netName = {other:?}: oxccl's networks are \"Socket\" and \"IB\""
            )))
        }
    }
    Ok(CommConfig {
        nonblocking,
        // SAFETY: the caller's contract: NULL or a C string.
        name: unsafe { text(c.commName, "config->commName") }?,
    })
}

/// What one call's configuration asks of oxccl: nothing it can do
/// differently, so this only checks it. An `algSelection` cannot be
/// honoured per call (oxccl's algorithm is chosen per communicator:
/// `OXCCL_ALGO` / `NCCL_ALGO`): with `forceAlgSelection` (the default) it
/// is an error, without it the automatic choice stands, as NCCL's
/// fallback. `ext` is vendors' options: none is oxccl's, so all are
/// ignored (as NVIDIA's NCCL ignores them all).
///
/// # Safety
/// `config` is NULL or points to an `ncclCollConfig_t` of its `size`.
pub unsafe fn check_coll_config(config: *const ncclCollConfig_t) -> Result<(), Failure> {
    if config.is_null() {
        return Ok(());
    }
    let unset = ncclCollConfig_t {
        size: 0,
        magic: 0,
        version: 0,
        ext: std::ptr::null_mut(),
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        cgaClusterSize: UNDEF_INT,
        algSelection: std::ptr::null(),
        forceAlgSelection: 1,
        CTAPolicy: UNDEF_INT,
        userProfilerTag: 0,
        launchCompletionEvent: std::ptr::null_mut(),
    };
    // SAFETY: the caller's contract.
    let c = unsafe { read_versioned(config, unset, "config (ncclCollConfig_t)") }?;
    // SAFETY: the caller's contract: NULL or a C string.
    let alg = unsafe { text(c.algSelection, "config->algSelection") }?;
    if let Some(a) = alg.filter(|a| !a.is_empty() && !a.eq_ignore_ascii_case("undef")) {
        if c.forceAlgSelection != 0 {
            return Err(Failure::usage(format!(
                "config->algSelection = {a:?} with forceAlgSelection: oxccl chooses the \
                 algorithm per communicator (OXCCL_ALGO or NCCL_ALGO), not per call"
            )));
        }
    }
    if !c.launchCompletionEvent.is_null() {
        return Err(Failure::usage(
            "config->launchCompletionEvent: calls on host memory launch no kernel to \
             record a CUDA event after",
        ));
    }
    Ok(())
}
