//! CUDA IPC as the core's `DirectAccess` (see the crate docs).

use crate::IpcHandle;
use comm_core::algorithms::Access;
use comm_core::mem::{DeviceKind, MemorySpace, Region};
use comm_core::transport::{DirectAccess, Mapped, PeerMemory};
use comm_core::{Error, Result};
use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;

/// Direct access to device memory of this host's ranks through CUDA IPC,
/// for the device of `ctx`.
pub struct CudaIpc {
    ctx: Arc<CudaContext>,
    ordinal: u32,
}

impl CudaIpc {
    pub fn new(ctx: Arc<CudaContext>) -> CudaIpc {
        let ordinal = ctx.ordinal() as u32;
        CudaIpc { ctx, ordinal }
    }

    fn space(&self) -> MemorySpace {
        MemorySpace::Device {
            kind: DeviceKind::Cuda,
            ordinal: self.ordinal,
        }
    }

    fn fail(&self, what: String, e: result::DriverError) -> Error {
        Error::Device {
            device: format!("CUDA device {}", self.ordinal),
            detail: format!("{what}: {e}"),
        }
    }

    /// This device's PCI bus id, NUL-padded.
    fn bus_id(&self) -> Result<[u8; 16]> {
        let mut id = [0u8; 16];
        // SAFETY: writes at most 15 characters and a NUL into `id`.
        unsafe { sys::cuDeviceGetPCIBusId(id.as_mut_ptr() as *mut _, 15, self.ctx.cu_device()) }
            .result()
            .map_err(|e| self.fail("reading its PCI bus id".into(), e))?;
        Ok(id)
    }

    /// Whether this device reads and writes the memory of the device
    /// `bus_id` names: the same device, or a peer `cuDeviceCanAccessPeer`
    /// allows. `Err` says why not (not visible here, no peer access).
    fn reaches(&self, peer: usize, h: &IpcHandle) -> Result<()> {
        let unreachable = |why: String| Error::Transport {
            peer,
            world_peer: peer,
            detail: format!(
                "rank {peer}'s GPU {} {why} from this rank's GPU {}",
                h.bus_id(),
                self.ordinal
            ),
        };
        let mut c_id = h.bus_id;
        c_id[15] = 0;
        let mut theirs: sys::CUdevice = 0;
        // SAFETY: `c_id` is NUL-terminated; the driver writes one CUdevice.
        unsafe { sys::cuDeviceGetByPCIBusId(&mut theirs, c_id.as_ptr() as *const _) }
            .result()
            .map_err(|e| unreachable(format!("is not visible ({e})")))?;
        let mine = self.ctx.cu_device();
        if theirs == mine {
            return Ok(());
        }
        let mut can = 0;
        // SAFETY: two valid devices; the driver writes one int.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, mine, theirs) }
            .result()
            .map_err(|e| self.fail("asking for peer access".into(), e))?;
        match can {
            0 => Err(unreachable(
                "has no peer access (cuDeviceCanAccessPeer)".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// Memory this rank allocated and exported; freed when dropped.
struct Owned {
    ctx: Arc<CudaContext>,
    region: Region,
}

impl Mapped for Owned {
    fn region(&self) -> Region {
        self.region
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_sync` in `export`; the collectives
        // that used it have completed (buffers live past their calls).
        let _ = unsafe { result::free_sync(self.region.addr as u64) };
    }
}

/// A peer's allocation opened here; closed when dropped (`None`: the
/// peer is this process, whose address is used as is).
struct Opened {
    ctx: Option<Arc<CudaContext>>,
    region: Region,
}

impl Mapped for Opened {
    fn region(&self) -> Region {
        self.region
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(ctx) = &self.ctx {
            let _ = ctx.bind_to_thread();
            // SAFETY: opened by cuIpcOpenMemHandle in `import`.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.region.addr as u64) };
        }
    }
}

// SAFETY: regions are descriptions of device memory; the handles are
// only used to free or close it once, in Drop.
unsafe impl Send for Owned {}
unsafe impl Sync for Owned {}
unsafe impl Send for Opened {}
unsafe impl Sync for Opened {}

impl DirectAccess for CudaIpc {
    fn access(&self) -> Access {
        Access::Mapped
    }

    fn export(&self, len: usize) -> Result<(Box<dyn Mapped>, Vec<u8>)> {
        let len = len.max(1);
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.fail("binding its context".into(), e))?;
        // SAFETY: a fresh allocation of `len` bytes in this context.
        let ptr = unsafe { result::malloc_sync(len) }
            .map_err(|e| self.fail(format!("allocating {len} bytes to share"), e))?;
        let owned = Owned {
            ctx: self.ctx.clone(),
            region: Region {
                space: self.space(),
                addr: ptr as usize,
                len,
            },
        };
        // Zeroed, as every shared buffer starts.
        // SAFETY: `ptr` holds `len` bytes.
        unsafe { sys::cuMemsetD8_v2(ptr, 0, len) }
            .result()
            .map_err(|e| self.fail("zeroing shared memory".into(), e))?;
        let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: `ptr` is the base of a cuMemAlloc allocation.
        unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), ptr) }
            .result()
            .map_err(|e| self.fail("exporting shared memory (cuIpcGetMemHandle)".into(), e))?;
        // SAFETY: initialised by the driver above.
        let h = unsafe { h.assume_init() };
        let mut driver = [0u8; 64];
        for (d, c) in driver.iter_mut().zip(h.reserved.iter()) {
            *d = *c as u8;
        }
        let handle = IpcHandle {
            pid: std::process::id(),
            ordinal: self.ordinal,
            bus_id: self.bus_id()?,
            addr: ptr,
            len: len as u64,
            driver,
        };
        Ok((Box::new(owned), handle.encode()))
    }

    fn import(&self, peer: usize, handle: &[u8], len: usize) -> Result<PeerMemory> {
        let Some(h) = IpcHandle::decode(handle) else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent a CUDA IPC handle that does not decode ({} bytes)",
                handle.len()
            )));
        };
        if h.len < len.max(1) as u64 {
            return Err(Error::Protocol(format!(
                "rank {peer} exported {} bytes of device memory where {len} were agreed",
                h.len
            )));
        }
        let region = |addr: u64| Region {
            space: self.space(),
            addr: addr as usize,
            len,
        };
        if h.pid == std::process::id() {
            // Ranks in one process: the address is valid here as it is
            // (one address space; the device's context or peer access).
            return Ok(PeerMemory::Mapped(Box::new(Opened {
                ctx: None,
                region: region(h.addr),
            })));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.fail("binding its context".into(), e))?;
        // Another GPU without peer access: refused here, so that every
        // rank agrees to stage this buffer's collectives instead.
        self.reaches(peer, &h)?;
        let mut driver = sys::CUipcMemHandle { reserved: [0; 64] };
        for (d, b) in driver.reserved.iter_mut().zip(h.driver) {
            *d = b as _;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a handle made by cuIpcGetMemHandle in another process.
        let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, driver, flags) };
        r.result().map_err(|e| Error::Transport {
            peer,
            world_peer: peer,
            detail: format!(
                "cannot open rank {peer}'s device memory (cuIpcOpenMemHandle, its device {} from device {}): {e}",
                h.ordinal, self.ordinal
            ),
        })?;
        Ok(PeerMemory::Mapped(Box::new(Opened {
            ctx: Some(self.ctx.clone()),
            region: region(ptr),
        })))
    }
}
