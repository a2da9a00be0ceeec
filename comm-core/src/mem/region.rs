//! Memory spaces and regions.

/// Kinds of accelerator memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cuda,
}

/// Where memory lives, which decides who can touch it: the CPU (host
/// spaces), a device's engines, or peers through direct access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// Ordinary memory of this process.
    Host,
    /// Host memory registered with communicator `comm` as allocation `id`
    /// (the same id on every rank): peers on this host map it, transports
    /// may send from it without copies.
    HostRegistered { comm: u64, id: u64 },
    /// Memory of device `ordinal`.
    Device { kind: DeviceKind, ordinal: u32 },
    /// Memory of device `ordinal` registered with communicator `comm` as
    /// allocation `id`: peers of this host reach it directly (CUDA IPC).
    DeviceRegistered {
        kind: DeviceKind,
        ordinal: u32,
        comm: u64,
        id: u64,
    },
}

impl MemorySpace {
    /// Whether the CPU can load and store it.
    pub fn is_host(self) -> bool {
        !matches!(
            self,
            MemorySpace::Device { .. } | MemorySpace::DeviceRegistered { .. }
        )
    }

    /// The device it lives on (`None` for host memory).
    pub fn device(self) -> Option<(DeviceKind, u32)> {
        match self {
            MemorySpace::Device { kind, ordinal }
            | MemorySpace::DeviceRegistered { kind, ordinal, .. } => Some((kind, ordinal)),
            _ => None,
        }
    }

    /// The registration (communicator, allocation), when registered.
    pub fn registration(self) -> Option<(u64, u64)> {
        match self {
            MemorySpace::HostRegistered { comm, id }
            | MemorySpace::DeviceRegistered { comm, id, .. } => Some((comm, id)),
            _ => None,
        }
    }
}

impl std::fmt::Display for MemorySpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemorySpace::Host => write!(f, "host memory"),
            MemorySpace::HostRegistered { id, .. } => write!(f, "registered host memory #{id}"),
            MemorySpace::Device { kind, ordinal } => write!(f, "{kind:?} device {ordinal} memory"),
            MemorySpace::DeviceRegistered {
                kind, ordinal, id, ..
            } => write!(f, "registered {kind:?} device {ordinal} memory #{id}"),
        }
    }
}

/// `len` bytes at `addr` in `space`: a description, not a borrow. Whoever
/// builds one from a borrow keeps the borrow alive while it is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub space: MemorySpace,
    pub addr: usize,
    pub len: usize,
}

impl Region {
    /// No memory (barriers, unused buffer slots): an aligned address, 0 bytes.
    pub const EMPTY: Region = Region {
        space: MemorySpace::Host,
        addr: 64,
        len: 0,
    };

    /// Host bytes, to be read.
    pub fn host(b: &[u8]) -> Region {
        Region {
            space: MemorySpace::Host,
            addr: b.as_ptr() as usize,
            len: b.len(),
        }
    }

    /// Host bytes, to be written.
    pub fn host_mut(b: &mut [u8]) -> Region {
        Region {
            space: MemorySpace::Host,
            addr: b.as_mut_ptr() as usize,
            len: b.len(),
        }
    }

    /// The `len` bytes at `off` of this region (panics outside it: callers
    /// check spans against buffer sizes first).
    pub fn sub(&self, off: usize, len: usize) -> Region {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "{len} bytes at {off} exceed a region of {}",
            self.len
        );
        Region {
            space: self.space,
            addr: self.addr + off,
            len,
        }
    }

    /// The start as a pointer (meaningful to the engine of its space).
    pub fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}
