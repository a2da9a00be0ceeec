//! The device-side API of recent releases (`nccl_device.h`): device
//! communicators, teams, load/store-accessible (LSA) pointers, GIN and CFT
//! resources. Kernels written against it run on GPUs and reach peers'
//! memory directly; oxccl's calls on host memory have no such kernels, so
//! everything that would hand out device resources answers
//! `ncclInvalidUsage`. What is plain arithmetic on the communicator's
//! shape is answered truthfully: its properties (no device API, no
//! multimem, no GIN) and its teams — the world, and LSA teams of one rank
//! (no rank can load or store into another's memory here), so the rail
//! team is the world.

use crate::comm::{get, handle, made, ncclComm_t};
use crate::export;
use crate::result::{run, Failure};
use std::ffi::{c_int, c_uint, c_void};

/// Why device resources are refused.
const NO_DEVICE_API: &str = "the device-side API (device communicators, LSA/GIN/CFT \
    resources) needs GPU kernels that reach peers' memory; oxccl's libnccl runs calls \
    on host memory and offers none";

/// NCCL's `ncclTeam_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// NCCL's `ncclCommProperties_t`.
#[repr(C)]
pub struct ncclCommProperties_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub rank: c_int,
    pub nRanks: c_int,
    pub cudaDev: c_int,
    pub nvmlDev: c_int,
    pub deviceApiSupport: bool,
    pub multimemSupport: bool,
    pub ginType: c_int,
    pub nLsaTeams: c_int,
    pub hostRmaSupport: bool,
    pub railedGinType: c_int,
    pub commHash: u64,
    pub ginMinStride: c_int,
    pub ginConnectionType: c_int,
    pub ginSupport: [bool; 64],
    pub devCommRuntimeVersionSize: usize,
    pub cftSupport: bool,
    pub cftMulticastSupport: bool,
    pub cftCountedSupport: bool,
}

export! {
    /// `ncclCommQueryProperties`: rank, size, the host as device (-1), and
    /// no device-side support of any kind. Only the fields within the
    /// caller's `size` are written.
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm: ncclComm_t, props: *mut ncclCommProperties_t) {
        run("ncclCommQueryProperties", || {
            // SAFETY: the caller's contract.
            let c = made(unsafe { handle(comm) }?)?;
            // SAFETY: NULL or the caller's struct (header at least).
            let Some(p) = (unsafe { props.as_mut() }) else {
                return Err(Failure::invalid("props is NULL"));
            };
            if p.magic != crate::config::NCCL_API_MAGIC {
                return Err(Failure::invalid(
                    "props is not initialized with NCCL_COMM_PROPERTIES_INITIALIZER",
                ));
            }
            let mine = ncclCommProperties_t {
                size: p.size,
                magic: p.magic,
                version: p.version,
                rank: c.rank() as c_int,
                nRanks: c.nranks() as c_int,
                cudaDev: crate::comm::CUDA_CPU_DEVICE_ID,
                nvmlDev: -1,
                deviceApiSupport: false,
                multimemSupport: false,
                ginType: 0,
                nLsaTeams: c.nranks() as c_int,
                hostRmaSupport: false,
                railedGinType: 0,
                commHash: c.id(),
                ginMinStride: 0,
                ginConnectionType: 0,
                ginSupport: [false; 64],
                devCommRuntimeVersionSize: 0,
                cftSupport: false,
                cftMulticastSupport: false,
                cftCountedSupport: false,
            };
            let n = p.size.min(std::mem::size_of::<ncclCommProperties_t>());
            // SAFETY: the caller's struct has `size` bytes; `mine` has at
            // least `n`.
            unsafe {
                std::ptr::copy_nonoverlapping(&mine as *const _ as *const u8, props as *mut u8, n)
            };
            Ok(())
        })
    }
}

/// The world team of `comm` (one of a single rank when `comm` cannot
/// answer; the last error says why).
///
/// # Safety
/// `comm` is NULL or from this library, not destroyed.
unsafe fn world(comm: ncclComm_t) -> ncclTeam_t {
    let mut t = ncclTeam_t {
        nRanks: 1,
        rank: 0,
        stride: 1,
    };
    run("ncclTeamWorld", || {
        // SAFETY: the caller's contract.
        let c = unsafe { get(comm) }?;
        t = ncclTeam_t {
            nRanks: c.nranks() as c_int,
            rank: c.rank() as c_int,
            stride: 1,
        };
        Ok(())
    });
    t
}

/// An LSA team: this rank alone.
const ALONE: ncclTeam_t = ncclTeam_t {
    nRanks: 1,
    rank: 0,
    stride: 1,
};

macro_rules! team {
    ($(#[$m:meta])* fn $name:ident / $alias:ident ($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> ncclTeam_t $body

        #[doc = concat!("`", stringify!($name), "` (NCCL's profiling alias).")]
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> ncclTeam_t {
            $name($($arg),*)
        }
    };
}

team! {
    /// `ncclTeamWorld`: every rank of `comm`.
    fn ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) {
        // SAFETY: the caller's contract.
        unsafe { world(comm) }
    }
}

team! {
    /// `ncclTeamLsa`: the ranks whose memory this rank can load and store
    /// — itself only.
    fn ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) {
        let _ = comm;
        ALONE
    }
}

team! {
    /// `ncclTeamCft`: as the LSA team (no collective fabric here).
    fn ncclTeamCft / pncclTeamCft(comm: ncclComm_t, mode: c_int) {
        let _ = (comm, mode);
        ALONE
    }
}

team! {
    /// `ncclTeamCftMultimem`: as the LSA team (no multimem here).
    fn ncclTeamCftMultimem / pncclTeamCftMultimem(comm: ncclComm_t) {
        let _ = comm;
        ALONE
    }
}

team! {
    /// `ncclTeamRail`: the ranks with this rank's LSA index — all of them,
    /// LSA teams being single ranks.
    fn ncclTeamRail / pncclTeamRail(comm: ncclComm_t) {
        // SAFETY: the caller's contract.
        unsafe { world(comm) }
    }
}

/// `ncclTeamRankToWorld`: rank `rank` of `team` in `comm`'s numbering.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRankToWorld(
    comm: ncclComm_t,
    team: ncclTeam_t,
    rank: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let me = unsafe { world(comm) }.rank;
    me + (rank - team.rank) * team.stride
}

/// `ncclTeamRankToWorld` (NCCL's profiling alias).
#[no_mangle]
pub unsafe extern "C" fn pncclTeamRankToWorld(
    comm: ncclComm_t,
    team: ncclTeam_t,
    rank: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { ncclTeamRankToWorld(comm, team, rank) }
}

/// `ncclTeamRankToLsa`: rank `rank` of `team` in this rank's LSA team
/// (0 for this rank, -1 for every other: none is load/store reachable).
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRankToLsa(
    comm: ncclComm_t,
    team: ncclTeam_t,
    rank: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let me = unsafe { world(comm) }.rank;
    // SAFETY: the caller's contract.
    match unsafe { ncclTeamRankToWorld(comm, team, rank) } == me {
        true => 0,
        false => -1,
    }
}

/// `ncclTeamRankToLsa` (NCCL's profiling alias).
#[no_mangle]
pub unsafe extern "C" fn pncclTeamRankToLsa(
    comm: ncclComm_t,
    team: ncclTeam_t,
    rank: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { ncclTeamRankToLsa(comm, team, rank) }
}

/// `ncclLLA2ACalcSlots`: slots an LL all-to-all of the device API needs;
/// there is none here: -1 (and the last error says why).
#[no_mangle]
pub extern "C" fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    let _ = (maxElts, maxEltSize);
    run("ncclLLA2ACalcSlots", || Err(Failure::usage(NO_DEVICE_API)));
    -1
}

/// `ncclLLA2ACalcSlots` (NCCL's profiling alias).
#[no_mangle]
pub extern "C" fn pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    ncclLLA2ACalcSlots(maxElts, maxEltSize)
}

/// Entry points that hand out device resources: all refused, whatever
/// their arguments (taken as pointers and integers of their C types).
macro_rules! refused {
    ($($name:ident / $alias:ident ($($arg:ident: $ty:ty),*);)*) => {$(
        export! {
            #[doc = concat!("`", stringify!($name), "`: refused (no device-side API here).")]
            fn $name / $alias($($arg: $ty),*) {
                let _ = ($($arg,)*);
                run(stringify!($name), || Err(Failure::usage(NO_DEVICE_API)))
            }
        }
    )*};
}

refused! {
    ncclDevCommCreate / pncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void, outDevComm: *mut c_void);
    ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void);
    ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(window: *mut c_void, offset: usize, outPtr: *mut *mut c_void);
    ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(window: *mut c_void, offset: usize, multimem: *mut c_void, outPtr: *mut *mut c_void);
    ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(window: *mut c_void, offset: usize, lsaRank: c_int, outPtr: *mut *mut c_void);
    ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(window: *mut c_void, offset: usize, peer: c_int, outPtr: *mut *mut c_void);
    ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(window: *mut c_void, offset: usize, leId: *mut c_void, leOffset: *mut usize);
    ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(window: *mut c_void, offset: usize, peerCft: c_int, cftTeam: ncclTeam_t, leId: *mut c_void, leOffset: *mut usize);
    ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(window: *mut c_void, offset: usize, peerWorld: c_int, leId: *mut c_void, leOffset: *mut usize);
    ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void);
    ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(comm: ncclComm_t, team: ncclTeam_t, nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void);
    ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(nBlocks: c_int, nSlots: c_int, outHandle: *mut c_void, outReq: *mut c_void);
    ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(nBlocks: c_int, sizeLog2: c_int, outHandle: *mut c_void, outReq: *mut c_void);
    ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(peers: ncclTeam_t, nBlocks: c_int, sizeLog2: c_int, outHandle: *mut c_void, outReq: *mut c_void);
}
