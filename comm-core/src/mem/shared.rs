//! Registered memory: [`SharedBuffer`]s, which every rank reaches directly
//! (mapped on one host, read one-sided over RDMA, so the `direct`
//! algorithm reads peers' buffers where they lie), and
//! [`MemoryRegistration`]s of user memory with transports that send
//! straight from memory (RDMA).
//!
//! [`Communicator::alloc_shared`] is collective. Each rank exports fresh
//! memory through the direct access of the transport serving its peers
//! (shared memory: an anonymous memfd; RDMA: memory registered for remote
//! reads), ranks all_gather (length, whether they can share, handle), and
//! when every rank can, each imports every peer's allocation. With mapped
//! access the first such allocation also shares one flag page per rank for
//! the `Sync` phases. A `SharedBuffer` is then just a buffer: passed to any
//! collective, the planner sees its space
//! ([`MemorySpace::HostRegistered`]) and picks the `direct` algorithm when
//! every buffer of the call is shared; otherwise (transports mixed, a
//! transport without direct access, memory that could not be exported) it
//! is ordinary memory, registered with RDMA for zero-copy sends.

use super::{Buffer, MemorySpace, Region};
use crate::algorithms::Access;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::exec::{SyncFlags, FLAG_PAGE};
use crate::transport::{DirectAccess, Mapped, PeerMemory, Registration};
use crate::types::Element;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

const PAGE: usize = 4096;
/// Largest direct-access handle a transport may produce (bytes; a CUDA
/// IPC handle is 64 of its own).
pub(crate) const HANDLE_MAX: usize = 128;
/// Bytes per rank in the allocation exchange: length, can-share flag,
/// handle length and handle, flag-page handle length and handle.
const RECORD: usize = 8 + 1 + 2 * (1 + HANDLE_MAX);

/// One allocation as every rank's process maps it.
pub(crate) struct SharedMaps {
    /// Same on every rank for the same allocation.
    pub(crate) id: u64,
    pub(crate) own: Box<dyn Mapped>,
    /// Every peer's memory of this allocation as this rank reaches it (by
    /// rank; None for self, and for everyone when not `zero_copy`).
    pub(crate) peers: Vec<Option<PeerMemory>>,
    /// Whether every rank mapped every other's (direct steps possible).
    pub(crate) zero_copy: bool,
}

/// A buffer of `T` in registered memory (see the module docs).
pub struct SharedBuffer<T: Element> {
    /// Registrations with transports that send straight from memory (RDMA);
    /// dropped, and so unregistered, before the memory is unmapped.
    _registered: Vec<Registration>,
    maps: Arc<SharedMaps>,
    comm_id: u64,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .field("comm", &format_args!("{:#x}", self.comm_id))
            .field("zero_copy", &self.maps.zero_copy)
            .finish()
    }
}

impl<T: Element> SharedBuffer<T> {
    /// Whether collectives on this buffer read peers' memory directly.
    pub fn is_zero_copy(&self) -> bool {
        self.maps.zero_copy
    }

    pub(crate) fn region_of(&self) -> Region {
        Region {
            space: MemorySpace::HostRegistered {
                comm: self.comm_id,
                id: self.maps.id,
            },
            addr: self.maps.own.region().addr,
            len: self.len * std::mem::size_of::<T>(),
        }
    }
}

impl<T: Element> Deref for SharedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds at least `len` elements of T, page
        // aligned, zeroed at creation (a valid value of every Element).
        unsafe { std::slice::from_raw_parts(self.maps.own.region().ptr() as *const T, self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` excludes other local borrows,
        // and peers touch it only inside a collective this rank takes part in.
        unsafe { std::slice::from_raw_parts_mut(self.maps.own.region().ptr() as *mut T, self.len) }
    }
}

/// Plain memory of this process (a buffer no peer maps).
fn local_memory(len: usize) -> Result<Box<dyn Mapped>> {
    let m = super::MemfdMemory::create(len)
        .map_err(|e| Error::System(format!("a {len}-byte shared buffer (memfd, mmap): {e}")))?;
    Ok(Box::new(m))
}

/// User memory registered with the communicator's transports for
/// zero-copy sends (see [`Communicator::register_memory`]); unregistered
/// when dropped.
#[must_use = "the memory is unregistered when this is dropped"]
#[derive(Debug)]
pub struct MemoryRegistration {
    _regs: Vec<Registration>,
}

impl MemoryRegistration {
    /// Whether some transport registered the memory (false when none can
    /// send straight from memory, e.g. without RDMA: then this is a no-op).
    pub fn is_active(&self) -> bool {
        !self._regs.is_empty()
    }
}

/// Append a length-prefixed handle to an exchange record.
pub(crate) fn put_handle(rec: &mut Vec<u8>, h: &[u8]) -> Result<()> {
    if h.len() > HANDLE_MAX {
        return Err(Error::System(format!(
            "a direct-access handle of {} bytes exceeds {HANDLE_MAX}",
            h.len()
        )));
    }
    rec.push(h.len() as u8);
    rec.extend_from_slice(h);
    rec.resize(rec.len() + HANDLE_MAX - h.len(), 0);
    Ok(())
}

/// The handle at `at` of a peer's record (total: bad lengths are errors).
pub(crate) fn get_handle(rec: &[u8], at: usize, peer: usize) -> Result<&[u8]> {
    let n = rec[at] as usize;
    if n > HANDLE_MAX {
        return Err(Error::Protocol(format!(
            "rank {peer} sent a direct-access handle of {n} bytes"
        )));
    }
    Ok(&rec[at + 1..at + 1 + n])
}

impl Communicator {
    /// Register `buf` with the transports that can send straight from user
    /// memory (RDMA, like `ncclCommRegister`): large sends from it then go
    /// zero-copy instead of through bounce buffers. Local (not collective),
    /// and a no-op on transports without such a path. Registering the same
    /// buffer again only counts a reference.
    ///
    /// # Safety
    /// `buf`'s memory must stay allocated, and must not be freed and reused
    /// for something else, until the returned registration is dropped: the
    /// device keeps the *pages* it pinned now, so data written into a
    /// reallocation at the same address would not be what it sends.
    /// (`alloc_shared` buffers are registered safely by construction.)
    pub unsafe fn register_memory<T: Element, B: Buffer<T> + ?Sized>(
        &self,
        buf: &B,
    ) -> Result<MemoryRegistration> {
        let region = buf.region();
        if region.len == 0 {
            return Ok(MemoryRegistration { _regs: Vec::new() });
        }
        let regs = self
            .inner
            .registries
            .iter()
            .map(|r| Registration::new(r.clone(), region))
            .collect::<Result<Vec<_>>>()?;
        Ok(MemoryRegistration { _regs: regs })
    }

    /// Allocate `len` zeroed elements every rank of this host can read
    /// directly (collective: every rank calls it, in the same order, with
    /// the same `len`). Pass it to any collective: when every buffer of a
    /// call is such a buffer and every peer's memory can be mapped (one
    /// host, shared memory), the call moves no messages and copies nothing
    /// through intermediate buffers; otherwise it is ordinary memory.
    pub fn alloc_shared<T: Element>(&self, len: usize) -> Result<SharedBuffer<T>> {
        let bytes = (len * std::mem::size_of::<T>())
            .max(1)
            .next_multiple_of(PAGE);
        let (maps, registered) = self.alloc_maps(len, bytes, self.inner.direct.clone())?;
        Ok(SharedBuffer {
            _registered: registered,
            maps,
            comm_id: self.id(),
            len,
            _t: PhantomData,
        })
    }

    /// Allocate `len` zeroed elements of device memory through `device`
    /// (a device's direct access, e.g. CUDA IPC), which every rank of this
    /// host reaches directly when all can (collective, as
    /// [`alloc_shared`](Self::alloc_shared)). Calls whose buffers are all
    /// such buffers run the `direct` algorithm on the device engine, the
    /// phases through this host's shared flag pages; otherwise they are
    /// device memory like any other (staged).
    pub fn alloc_shared_device<T: Element>(
        &self,
        len: usize,
        device: Arc<dyn DirectAccess>,
    ) -> Result<DeviceSharedBuffer<T>> {
        let bytes = (len * std::mem::size_of::<T>())
            .max(1)
            .next_multiple_of(256);
        let (maps, _) = self.alloc_maps(len, bytes, Some(device))?;
        let Some((kind, ordinal)) = maps.own.region().space.device() else {
            return Err(Error::invalid(
                "alloc_shared_device: the direct access given exports host memory",
            ));
        };
        Ok(DeviceSharedBuffer {
            space: MemorySpace::DeviceRegistered {
                kind,
                ordinal,
                comm: self.id(),
                id: maps.id,
            },
            maps,
            len,
            _t: PhantomData,
        })
    }

    /// The collective part of both: export `bytes` through `direct` (or
    /// allocate plain host memory without), exchange handles, import every
    /// peer's when every rank could export, share the phase flag pages.
    fn alloc_maps(
        &self,
        len: usize,
        bytes: usize,
        direct: Option<Arc<dyn DirectAccess>>,
    ) -> Result<(Arc<SharedMaps>, Vec<Registration>)> {
        let (me, n) = (self.rank(), self.nranks());
        // Phases go through the host's direct access (mapped flag pages),
        // whatever memory the data is in.
        let host = self.inner.direct.clone();
        let id = self.run(|_, st| {
            st.shared_allocs += 1;
            Ok(st.shared_allocs)
        })?;
        // Phase flags are pages every rank maps; one-sided access has its
        // phases as messages.
        let mapped = |d: &Option<Arc<dyn DirectAccess>>| {
            d.as_ref().is_some_and(|d| d.access() == Access::Mapped)
        };
        let need_flags = mapped(&direct) && self.run(|_, st| Ok(st.flags.is_none()))?;
        // Device memory without mapped host flags cannot run direct phases.
        let phases_ok = !mapped(&direct) || mapped(&host);
        // Export (or, without direct access, just allocate) our memory.
        // Memory the transport cannot export (RDMA: `ulimit -l`) is still a
        // buffer, just not one peers reach.
        let (own, handle, can_share) = match direct.as_ref().map(|d| d.export(bytes)) {
            Some(Ok((m, h))) => (m, h, phases_ok),
            Some(Err(e)) => {
                tracing::warn!(
                    "oxccl: alloc_shared: {e}; collectives on this buffer exchange messages"
                );
                (local_memory(bytes)?, Vec::new(), false)
            }
            None => (local_memory(bytes)?, Vec::new(), false),
        };
        let (flag_own, flag_handle) = match (&host, need_flags && phases_ok) {
            (Some(d), true) => {
                let (m, h) = d.export(FLAG_PAGE)?;
                (Some(m), h)
            }
            _ => (None, Vec::new()),
        };
        let mut rec = Vec::with_capacity(RECORD);
        rec.extend_from_slice(&(len as u64).to_le_bytes());
        rec.push(u8::from(can_share));
        put_handle(&mut rec, &handle)?;
        put_handle(&mut rec, &flag_handle)?;
        let mut all = vec![0u8; RECORD * n];
        self.all_gather(&rec, &mut all)?;
        let record = |k: usize| &all[k * RECORD..(k + 1) * RECORD];
        for k in 0..n {
            let theirs = u64::from_le_bytes(record(k)[..8].try_into().unwrap());
            if theirs != len as u64 {
                return Err(Error::invalid(format!(
                    "alloc_shared: rank {k} asked for {theirs} elements, this rank for {len}; every rank must allocate the same size in the same order"
                )));
            }
        }
        let mut zero_copy = n > 1 && (0..n).all(|k| record(k)[8] == 1);
        let mut peers: Vec<Option<PeerMemory>> = (0..n).map(|_| None).collect();
        let mut flag_peers: Vec<Option<Box<dyn Mapped>>> = (0..n).map(|_| None).collect();
        if let (true, Some(d)) = (zero_copy, &direct) {
            // A peer's memory this rank cannot map (GPUs without peer
            // access, ranks of different users) leaves the buffer to
            // messages on every rank alike: whether all mapped is agreed.
            let mapped_all = (|| -> Result<()> {
                for k in (0..n).filter(|k| *k != me) {
                    peers[k] = Some(d.import(k, get_handle(record(k), 9, k)?, bytes)?);
                    if let (true, Some(h)) = (need_flags, &host) {
                        let handle = get_handle(record(k), 10 + HANDLE_MAX, k)?;
                        flag_peers[k] = match h.import(k, handle, FLAG_PAGE)? {
                            PeerMemory::Mapped(m) => Some(m),
                            PeerMemory::Remote(_) => {
                                return Err(Error::Protocol(format!(
                                    "rank {k}'s phase flags are not mappable though its memory is"
                                )))
                            }
                        };
                    }
                }
                Ok(())
            })();
            let mut oks = vec![0u8; n];
            self.all_gather(&[u8::from(mapped_all.is_ok())], &mut oks)?;
            if let Some(k) = oks.iter().position(|ok| *ok == 0) {
                match &mapped_all {
                    Err(e) => tracing::warn!(
                        "oxccl: alloc_shared: {e}; collectives on this buffer exchange messages"
                    ),
                    Ok(()) => tracing::warn!(
                        "oxccl: alloc_shared: rank {k} cannot map its peers' memory; collectives on this buffer exchange messages"
                    ),
                }
                zero_copy = false;
                peers.iter_mut().for_each(|p| *p = None);
                flag_peers.iter_mut().for_each(|p| *p = None);
            }
        }
        // For zero-copy sends to other hosts (RDMA). Optional: memory that
        // cannot be registered (e.g. `ulimit -l`) still works through bounce
        // buffers.
        let mut registered = Vec::new();
        if !zero_copy && own.region().space.is_host() {
            for r in &self.inner.registries {
                match Registration::new(r.clone(), own.region()) {
                    Ok(reg) => registered.push(reg),
                    Err(e) => tracing::warn!(
                        "oxccl: alloc_shared: {e}; this buffer is sent through bounce buffers"
                    ),
                }
            }
        }
        let maps = Arc::new(SharedMaps {
            id,
            own,
            peers,
            zero_copy,
        });
        let weak = Arc::downgrade(&maps);
        self.run(move |_, st| {
            st.shared.retain(|(_, w)| w.strong_count() > 0);
            st.shared.push((id, weak));
            if let (true, Some(f)) = (zero_copy, flag_own) {
                st.flags = Some(SyncFlags::new(f, flag_peers));
            }
            Ok(())
        })?;
        if zero_copy {
            // Nobody may close its fds before every peer has opened them.
            self.barrier()?;
        }
        Ok((maps, registered))
    }
}

/// A buffer of `T` in device memory registered with a communicator (see
/// [`Communicator::alloc_shared_device`]). Not readable from the CPU: the
/// device address is [`device_ptr`](Self::device_ptr); collectives take it
/// as a buffer like any other.
pub struct DeviceSharedBuffer<T: Element> {
    maps: Arc<SharedMaps>,
    space: MemorySpace,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceSharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSharedBuffer")
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .field("space", &self.space)
            .field("zero_copy", &self.maps.zero_copy)
            .finish()
    }
}

impl<T: Element> DeviceSharedBuffer<T> {
    /// Whether collectives on this buffer read peers' memory directly.
    pub fn is_zero_copy(&self) -> bool {
        self.maps.zero_copy
    }
    /// The device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.maps.own.region().addr as u64
    }
    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn region_of(&self) -> Region {
        Region {
            space: self.space,
            addr: self.maps.own.region().addr,
            len: self.len * std::mem::size_of::<T>(),
        }
    }
}

// SAFETY: the allocation holds `len` elements of T (zeroed at creation,
// then written only by collectives and the owner's device work), aligned
// to 256 bytes; peers touch it only inside collectives this rank is in.
unsafe impl<T: Element> Buffer<T> for DeviceSharedBuffer<T> {
    fn region(&self) -> Region {
        self.region_of()
    }
}

// SAFETY: as above; `&mut self` excludes other uses through this handle.
unsafe impl<T: Element> super::BufferMut<T> for DeviceSharedBuffer<T> {
    fn region_mut(&mut self) -> Region {
        self.region_of()
    }
}
