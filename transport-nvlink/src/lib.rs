//! `transport-nvlink`: direct access to peers' device memory on one host,
//! through CUDA IPC. A rank exports device memory it allocated itself
//! (`cuMemAlloc`: memory from cudarc's stream-ordered pool cannot be
//! exported this way) with `cuIpcGetMemHandle`; peers open the 64-byte
//! handle with `cuIpcOpenMemHandle` and read it where it lies — over
//! NVLink or PCIe peer access between GPUs, or directly when ranks share
//! one GPU (ranks that are threads of one process use the address as it
//! is: IPC handles cannot be opened by the process that made them).
//!
//! It is an implementation of the core's `DirectAccess` of the mapped
//! kind: with it, `Communicator::alloc_shared_device` gives buffers on
//! which the `direct` schedules run, their `ReduceFrom` and `CopyFrom`
//! steps executed by the CUDA compute engine over peers' memory, their
//! `Sync` phases through the host's shared flag pages. Data never passes
//! through the host. This crate only maps memory: it moves no bytes.
//!
//! Ranks on different GPUs map each other's memory only where
//! `cuDeviceCanAccessPeer` allows (NVLink, or PCIe peer access); where it
//! does not, the import fails and the core agrees on every rank to run the
//! buffer's collectives through staging instead.
//!
//! The handle ([`IpcHandle`], 112 bytes) is (magic, pid, device ordinal,
//! the device's PCI bus id, address, length, the driver's 64 bytes),
//! decoded totally.

#[cfg(feature = "cuda")]
mod ipc;
#[cfg(feature = "cuda")]
pub use ipc::CudaIpc;

/// The bytes a rank sends for one exported allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    /// The exporting process (the same process maps the address as is).
    pub pid: u32,
    /// Its device.
    pub ordinal: u32,
    /// Its device's PCI bus id (`cuDeviceGetPCIBusId`, NUL-padded): how a
    /// peer whose device numbering differs finds that device.
    pub bus_id: [u8; 16],
    /// The allocation's address in the exporting process.
    pub addr: u64,
    /// Bytes exported.
    pub len: u64,
    /// The driver's `CUipcMemHandle`.
    pub driver: [u8; 64],
}

const MAGIC: &[u8; 8] = b"oxccl-ip";

/// Encoded length of a handle.
pub const HANDLE_LEN: usize = 8 + 4 + 4 + 16 + 8 + 8 + 64;

impl IpcHandle {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HANDLE_LEN);
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.ordinal.to_le_bytes());
        v.extend_from_slice(&self.bus_id);
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&self.driver);
        v
    }

    /// The handle in `b`, or `None` for anything that is not one.
    pub fn decode(b: &[u8]) -> Option<IpcHandle> {
        if b.len() != HANDLE_LEN || &b[..8] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let h = IpcHandle {
            pid: u32_at(8),
            ordinal: u32_at(12),
            bus_id: b[16..32].try_into().unwrap(),
            addr: u64_at(32),
            len: u64_at(40),
            driver: b[48..112].try_into().unwrap(),
        };
        (h.pid != 0 && h.addr != 0 && h.len != 0).then_some(h)
    }

    /// The bus id as text (up to its first NUL).
    pub fn bus_id(&self) -> &str {
        let end = self.bus_id.iter().position(|b| *b == 0).unwrap_or(16);
        std::str::from_utf8(&self.bus_id[..end]).unwrap_or("?")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_anything_else_is_refused() {
        let h = IpcHandle {
            pid: 42,
            ordinal: 3,
            bus_id: *b"0000:00:06.0\0\0\0\0",
            addr: 0x7f00_0000_1000,
            len: 1 << 20,
            driver: [7; 64],
        };
        let b = h.encode();
        assert_eq!(b.len(), HANDLE_LEN);
        assert_eq!(IpcHandle::decode(&b), Some(h));
        assert_eq!(h.bus_id(), "0000:00:06.0");
        // Every truncation, extension and single-byte change of the magic
        // or of a field that may not be zero is refused.
        for n in 0..b.len() {
            assert_eq!(IpcHandle::decode(&b[..n]), None, "{n} bytes");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(IpcHandle::decode(&longer), None);
        for i in 0..8 {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert_eq!(IpcHandle::decode(&bad), None, "magic byte {i}");
        }
        for (at, n) in [(8, 4), (32, 8), (40, 8)] {
            let mut zero = b.clone();
            zero[at..at + n].fill(0);
            assert_eq!(IpcHandle::decode(&zero), None, "zero field at {at}");
        }
    }
}
