//! What a transport must provide. A transport connects this rank to its
//! peers and moves bytes; it never knows which collective runs.
//!
//! Setup has two phases so addresses can travel through the rendezvous
//! root: [`Transport::listen`] returns an [`Endpoint`] whose
//! [`Endpoint::address`] every rank publishes, then [`Endpoint::connect`]
//! builds one [`Link`] per peer from everyone's addresses. The endpoint
//! lives as long as the communicator (it may keep rejecting strangers).
//!
//! A [`Link`] is a *message link*: a few ordered, full-duplex byte streams
//! to one peer, driven without blocking (the executor multiplexes every
//! link of a call on one thread and waits with `poll(2)` on their fds).

pub mod door;
pub mod net;

use crate::algorithms::Access;
use crate::config::Config;
use crate::error::Result;
use crate::handshake::Secret;
use crate::mem::{MemorySpace, Region};
use std::io::{IoSlice, IoSliceMut};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

/// What a transport needs to know to set up links of one communicator.
#[derive(Clone, Debug)]
pub struct SetupCtx {
    pub comm_id: u64,
    pub secret: Secret,
    pub rank: usize,
    pub nranks: usize,
    pub config: Config,
    /// Local address chosen by `OXCCL_SOCKET_IFNAME` rules.
    pub bind_addr: IpAddr,
    /// The rendezvous root's port when another process hosts it: no
    /// listener of this rank may take it (see [`net::bind_clear_of`]).
    pub reserved_port: Option<u16>,
}

/// A way to reach peers (TCP, shared memory, RDMA, ...).
pub trait Transport: Send + Sync {
    /// Short name (`tcp`), as `OXCCL_TRANSPORT` spells it.
    fn name(&self) -> &'static str;
    /// Start accepting connections for one communicator.
    fn listen(&self, ctx: &SetupCtx) -> Result<Box<dyn Endpoint>>;
}

/// One rank's side of a transport for one communicator.
pub trait Endpoint: Send {
    /// The bytes peers need to reach this endpoint (published at bootstrap).
    fn address(&self) -> Vec<u8>;
    /// Connect to every peer in `peers` (rank, its published address) and
    /// return one link per peer, in any order, by the deadline.
    fn connect(
        &mut self,
        ctx: &SetupCtx,
        peers: &[(usize, Vec<u8>)],
        deadline: Instant,
    ) -> Result<Vec<(usize, Box<dyn Link>)>>;
    /// The endpoint's memory registry, when its links can send straight
    /// from registered memory (RDMA). Default: none.
    fn registry(&self) -> Option<Arc<dyn Registry>> {
        None
    }
    /// Direct access to the memory of the peers this endpoint links, when
    /// its links can reach it (shared memory maps it; RDMA reads it
    /// one-sided; CUDA IPC next). Default: none.
    fn direct(&self) -> Option<Arc<dyn DirectAccess>> {
        None
    }
}

/// Memory mapped into this process for direct access: this rank's own
/// exported memory, or a peer's imported into it. Unmapped when dropped.
pub trait Mapped: Send + Sync {
    /// Where it is mapped here.
    fn region(&self) -> Region;
}

/// A transport's ability to let ranks reach each other's memory, so that
/// schedules read peers' buffers directly
/// ([`crate::schedule::Action::ReduceFrom`], `CopyFrom`, `Sync`) instead
/// of exchanging messages. Two kinds ([`Access`]):
/// - *mapped*: a peer's memory is mapped here and read with loads (shared
///   memory, with memfds; CUDA IPC would use `cuIpcGetMemHandle` /
///   `cuIpcOpenMemHandle`, regions in a device space reached by a device
///   compute engine);
/// - *one-sided*: a peer's memory is read through the link to it
///   ([`Link::one_sided`]), asynchronously (RDMA READ).
pub trait DirectAccess: Send + Sync {
    /// How imported memory is reached (what schedules may assume).
    fn access(&self) -> Access;
    /// Allocate `len` zeroed bytes peers can reach, and the handle (a few
    /// bytes, sent to every peer) they import it with.
    fn export(&self, len: usize) -> Result<(Box<dyn Mapped>, Vec<u8>)>;
    /// Import the `len` bytes rank `peer` exported with `handle`. A handle
    /// that does not decode, or describes less than `len` bytes, is
    /// `Error::Protocol`; memory that cannot be mapped is
    /// `Error::Transport` naming the peer.
    fn import(&self, peer: usize, handle: &[u8], len: usize) -> Result<PeerMemory>;
}

/// A peer's exported memory as this rank reaches it.
pub enum PeerMemory {
    /// Mapped into this process.
    Mapped(Box<dyn Mapped>),
    /// Read through the link to the peer ([`OneSided`]).
    Remote(RemoteMemory),
}

/// Where a span of a peer's exported memory lies in the peer's process,
/// with the key its link needs to reach it (an RDMA rkey).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteMemory {
    pub addr: u64,
    pub len: usize,
    pub key: u32,
}

impl RemoteMemory {
    /// Bytes `[off, off+len)` of this memory (`None` past its end).
    pub fn sub(&self, off: usize, len: usize) -> Option<RemoteMemory> {
        (off.checked_add(len)? <= self.len).then_some(RemoteMemory {
            addr: self.addr + off as u64,
            len,
            key: self.key,
        })
    }
}

/// One-sided reads of the memory the peer exported, through a link that
/// can do them (RDMA READ). Reads complete in the order they were started.
pub trait OneSided {
    /// Start copying `remote` (`local.len` bytes) into `local`, memory of
    /// this rank registered with the link's transport. Returns the read's
    /// ticket: it is complete once [`OneSided::reads_completed`] exceeds it.
    ///
    /// # Safety
    /// `local` must stay allocated, and nothing may read or write it, until
    /// the read completed or the link was closed.
    unsafe fn start_read(&mut self, local: Region, remote: RemoteMemory) -> std::io::Result<u64>;
    /// Make progress; every ticket below the returned one has completed.
    /// A failed read fails the link (errors as for [`Link::read`]).
    fn reads_completed(&mut self) -> std::io::Result<u64>;
}

/// Memory a transport may read directly (zero-copy) while it stays
/// registered. Registering the same range twice needs two unregisters.
/// `comm-core` registers the memory of [`crate::SharedBuffer`]s (it knows
/// their lifetime) and unregisters it when the buffer is dropped.
pub trait Registry: Send + Sync {
    /// Make `region` usable for zero-copy transfers. A space the transport
    /// cannot register (device memory without GPUDirect) is
    /// `Error::Unsupported`.
    fn register(&self, region: &Region) -> Result<()>;
    /// Undo one [`Registry::register`] of exactly this region.
    fn unregister(&self, region: &Region);
}

/// A registered region, unregistered on drop.
pub struct Registration {
    registry: Arc<dyn Registry>,
    region: Region,
}

impl Registration {
    /// Register `region` with `registry`.
    pub fn new(registry: Arc<dyn Registry>, region: Region) -> Result<Registration> {
        registry.register(&region)?;
        Ok(Registration { registry, region })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.unregister(&self.region);
    }
}

/// Ordered, full-duplex, non-blocking byte streams to one peer.
pub trait Link: Send {
    /// Whether the link can move bytes to and from memory in `space`
    /// (default: host memory only; a GPUDirect link would add device
    /// spaces).
    fn reaches(&self, space: MemorySpace) -> bool {
        space.is_host()
    }
    /// Number of independent streams (at least 1).
    fn streams(&self) -> usize;
    /// Write some of `bufs` to `stream`; `ErrorKind::WouldBlock` when full.
    fn write(&mut self, stream: usize, bufs: &[IoSlice<'_>]) -> std::io::Result<usize>;
    /// Read into `bufs` from `stream`; `Ok(0)` is end of stream (the peer
    /// closed), `ErrorKind::WouldBlock` when nothing is there yet.
    fn read(&mut self, stream: usize, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize>;
    /// One-sided reads of the peer's exported memory, when the link can do
    /// them (see [`DirectAccess`]). Default: none. A link that has them
    /// wakes [`Link::fd`] of stream 0 when a read completes.
    fn one_sided(&mut self) -> Option<&mut dyn OneSided> {
        None
    }
    /// The fd that becomes readable/writable for `stream`.
    fn fd(&self, stream: usize) -> RawFd;
    /// The `poll(2)` events to wait for on [`Link::fd`] when the executor
    /// needs to read and/or write `stream` (by default POLLIN/POLLOUT).
    fn poll_events(&self, stream: usize, read: bool, write: bool) -> i16 {
        let _ = stream;
        (if read { libc::POLLIN } else { 0 }) | (if write { libc::POLLOUT } else { 0 })
    }
    /// Called right before the executor sleeps in `poll(2)` waiting to read
    /// and/or write `stream`: a transport that signals readiness itself (shared
    /// memory) announces here that it wants a wake-up. Returns true when the
    /// stream became ready meanwhile (then the executor retries instead of
    /// sleeping). Sockets need nothing: the kernel wakes pollers.
    fn arm(&mut self, stream: usize, read: bool, write: bool) -> bool {
        let _ = (stream, read, write);
        false
    }
    /// Whether [`Link::write`] copies into memory the peer's core reads
    /// next (a shared-memory ring), so that the executor's gauge of
    /// hand-offs between cores (`exec/handoff.rs`) times this link's copies
    /// and may have its writes stream past the cache
    /// ([`Link::stream_writes`]). Default: no (a socket, RDMA).
    fn copies_through_memory(&self) -> bool {
        false
    }
    /// Write large pieces with non-temporal stores (`true`) or through
    /// the cache (`false`, the default) from the next write on: the peer
    /// reads the same bytes either way. Called only where
    /// [`Link::copies_through_memory`].
    fn stream_writes(&mut self, streamed: bool) {
        let _ = streamed;
    }
    /// Close every stream (both directions); later calls fail.
    fn close(&mut self);
}

/// What a rank tells the others about itself at bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: usize,
    /// Host name, for messages.
    pub hostname: String,
    /// Identifies the host (same value = same machine: shared memory works).
    pub host_id: u64,
    pub pid: u32,
    /// One published address per transport of the communicator's set.
    pub addrs: Vec<Vec<u8>>,
    /// Where this rank would host the root of a communicator shrunk from
    /// this one, were it the lowest surviving rank (`Communicator::shrink`).
    pub rescue: Option<std::net::SocketAddr>,
    /// This rank's process hosts the communicator's root (rank 0 under
    /// `OXCCL_ROOT`): when the root goes silent, this rank is why.
    pub hosts_root: bool,
    /// The CPUs this rank may run on ([`crate::sys::affinity`]: bit `k` of
    /// the mask is CPU `k`); empty when unknown. Its host's ranks decide
    /// from them whether they share cores ([`crate::wait::oversubscribed`]).
    pub cpus: Vec<u8>,
    /// The size of this rank's last-level cache
    /// ([`crate::sys::last_level_cache`]); `None` when unknown. The ranks
    /// size their pipelining chunk from the least
    /// ([`crate::config::automatic_chunk`]).
    pub llc: Option<usize>,
}

/// Chooses, for one peer, which transport of the set serves it.
pub type Chooser = dyn Fn(&Config, &PeerInfo, &PeerInfo) -> Result<usize> + Send + Sync;

/// The transports a communicator may use and the rule that picks one per
/// peer. The facade builds this; `comm-core` knows no concrete transport.
#[derive(Clone)]
pub struct Transports {
    pub list: Vec<Arc<dyn Transport>>,
    pub choose: Arc<Chooser>,
}

impl std::fmt::Debug for PeerMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerMemory::Mapped(m) => f.debug_tuple("Mapped").field(&m.region()).finish(),
            PeerMemory::Remote(r) => f.debug_tuple("Remote").field(r).finish(),
        }
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("region", &self.region)
            .finish()
    }
}

impl std::fmt::Debug for Transports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.list.iter().map(|t| t.name()).collect();
        f.debug_struct("Transports").field("list", &names).finish()
    }
}

impl Transports {
    /// A set with one transport used for every peer.
    pub fn single(t: Arc<dyn Transport>) -> Transports {
        Transports {
            list: vec![t],
            choose: Arc::new(|_, _, _| Ok(0)),
        }
    }
}
