//! The transport itself: device choice ([`probe`]), the per-communicator
//! endpoint (setup listener, registration cache) and the pairwise setup
//! that turns an authenticated socket into an [`RdmaLink`].

use crate::device;
use crate::direct::RdmaDirect;
use crate::exchange::{self, QpEndpoint};
use crate::link::{self, Parts, RdmaLink, Slots};
use crate::regcache::{InsertError, RegCache};
use crate::verbs::{Context, Cq, Mr, PathInfo, Pd, Qp, QpSettings};
use comm_core::door::Door;
use comm_core::handshake::{self, Hello, Purpose};
use comm_core::transport::{DirectAccess, Endpoint, Link, Registry, SetupCtx, Transport};
use comm_core::wire;
use comm_core::{Error, Region, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DOOR_TIMEOUT: Duration = Duration::from_secs(10);
/// Slots per receive ring (NCCL also pipelines 8 steps per buffer).
const SLOTS: u32 = 8;

/// Whether this host has a usable RDMA device: the transport for it, or
/// `None` (no device, or none passes `OXCCL_IB_HCA`).
pub fn probe() -> Result<Option<RdmaTransport>> {
    Ok(device::choose()?.map(|c| RdmaTransport {
        dev: Arc::new(Device {
            name: c.ctx.name.clone(),
            ctx: Arc::new(c.ctx),
            settings: c.settings,
            lid: c.lid,
            gid: c.gid,
        }),
    }))
}

struct Device {
    name: String,
    ctx: Arc<Context>,
    settings: QpSettings,
    lid: u16,
    gid: [u8; 16],
}

/// The RDMA transport over one device port (see [`probe`]).
#[derive(Clone)]
pub struct RdmaTransport {
    dev: Arc<Device>,
}

impl RdmaTransport {
    /// The device name (`mlx5_0`, `rxe0`).
    pub fn device(&self) -> &str {
        &self.dev.name
    }

    /// Start one communicator's endpoint: protection domain, registration
    /// cache, setup listener and its accept thread.
    fn listen_endpoint(&self, ctx: &SetupCtx) -> Result<RdmaEndpoint> {
        let pd = Pd::new(self.dev.ctx.clone())
            .map_err(|e| Error::System(format!("RDMA device {}: {e}", self.dev.name)))?;
        let setup = Arc::new(Setup {
            ctx: ctx.clone(),
            dev: self.dev.clone(),
            pd,
            cache: Arc::new(RegCache::default()),
            // A quarter of a pipeline chunk per slot: a chunk spans several
            // slots, so its writes overlap the peer's reads.
            // (Before the ranks meet: the configured chunk or the default,
            // which is what they agree on over RDMA.)
            slot_bytes: (ctx.config.chunk() / 4).clamp(16 << 10, 4 << 20) as u32,
        });
        let bind = || {
            TcpListener::bind(SocketAddr::new(ctx.bind_addr, 0))
                .map_err(|e| Error::Bootstrap(format!("rdma setup listener: {e}")))
        };
        let port = |l: &TcpListener| l.local_addr().ok().map(|a| a.port());
        let listener = comm_core::transport::net::bind_clear_of(ctx.reserved_port, bind, port)?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Bootstrap(e.to_string()))?;
        let (tx, rx) = channel();
        let setup2 = setup.clone();
        let door = Door::open(
            "oxccl-rdma",
            listener.as_raw_fd(),
            move || listener.accept(),
            move |(s, from): (TcpStream, SocketAddr), _permit| match admit(s, &setup2) {
                Ok(link) => {
                    let _ = tx.send(link);
                }
                Err(e) => tracing::warn!(
                    "oxccl rdma: rank {} rejected a connection from {from}: {e}",
                    setup2.ctx.rank
                ),
            },
        )?;
        Ok(RdmaEndpoint {
            local,
            setup,
            incoming: rx,
            door,
        })
    }

    /// Two linked ends in this process over the device, through the
    /// regular setup on 127.0.0.1: for tests and benchmarks that drive
    /// links by hand.
    pub fn loopback_pair(&self, config: comm_core::Config) -> Result<LoopbackPair> {
        let secret = comm_core::handshake::Secret::random()?;
        let ctx = |rank| SetupCtx {
            comm_id: 0x6c6f6f70,
            secret,
            rank,
            nranks: 2,
            config: config.clone(),
            bind_addr: std::net::Ipv4Addr::LOCALHOST.into(),
            reserved_port: None,
        };
        let (c0, c1) = (ctx(0), ctx(1));
        let deadline = Instant::now() + Duration::from_secs(30);
        let e0 = self.listen_endpoint(&c0)?;
        let e1 = self.listen_endpoint(&c1)?;
        let addr0 = e0.local;
        let registry = e0.registry().expect("rdma endpoints have a registry");
        let direct = e1.direct().expect("rdma endpoints have direct access");
        let dialer = std::thread::spawn(move || {
            let s = dial(&c1, 0, addr0, deadline)?;
            connect_pair(&e1.setup, 0, s)
        });
        let (peer, link) = e0
            .incoming
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| Error::Bootstrap("loopback RDMA pair: rank 1 did not connect".into()))?;
        debug_assert_eq!(peer, 1);
        let l1 = dialer
            .join()
            .map_err(|_| Error::Bootstrap("loopback RDMA pair: dialer panicked".into()))??;
        Ok(LoopbackPair {
            links: (link, l1),
            registry,
            direct,
        })
    }
}

/// Two linked ends of one process (see [`RdmaTransport::loopback_pair`]).
pub struct LoopbackPair {
    /// Rank 0's link to rank 1, and rank 1's to rank 0.
    pub links: (RdmaLink, RdmaLink),
    /// Rank 0's registry: memory its link sends from zero-copy, or reads
    /// into one-sided.
    pub registry: Arc<dyn Registry>,
    /// Rank 1's direct access: memory it exports, which rank 0 reads.
    pub direct: Arc<dyn DirectAccess>,
}

/// What each pair's setup needs (shared with the accept thread).
struct Setup {
    ctx: SetupCtx,
    dev: Arc<Device>,
    pd: Arc<Pd>,
    cache: Arc<RegCache<Mr>>,
    slot_bytes: u32,
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn listen(&self, ctx: &SetupCtx) -> Result<Box<dyn Endpoint>> {
        Ok(Box::new(self.listen_endpoint(ctx)?))
    }
}

type Incoming = (usize, RdmaLink);

/// Accept side: check the handshake, then connect the pair.
fn admit(s: TcpStream, setup: &Setup) -> Result<Incoming> {
    let _ = s.set_nonblocking(false);
    // The handshake within one deadline, however slowly bytes come.
    let mut a = comm_core::door::Admission::new(s);
    let hello = handshake::server(&mut a, &setup.ctx.secret, setup.ctx.comm_id, |h: &Hello| {
        h.check_link(Purpose::Rdma, &setup.ctx)
    })?;
    let s = a.into_inner();
    s.set_read_timeout(Some(DOOR_TIMEOUT)).ok();
    s.set_write_timeout(Some(DOOR_TIMEOUT)).ok();
    let peer = hello.from as usize;
    Ok((peer, connect_pair(setup, peer, s)?))
}

struct RdmaEndpoint {
    local: SocketAddr,
    setup: Arc<Setup>,
    incoming: Receiver<Incoming>,
    door: Door,
}

impl Endpoint for RdmaEndpoint {
    fn address(&self) -> Vec<u8> {
        self.local.to_string().into_bytes()
    }

    fn connect(
        &mut self,
        ctx: &SetupCtx,
        peers: &[(usize, Vec<u8>)],
        deadline: Instant,
    ) -> Result<Vec<(usize, Box<dyn Link>)>> {
        let setup = self.setup.clone();
        let links = comm_core::door::connect_pairwise(
            ctx,
            peers,
            deadline,
            "RDMA",
            |peer, addr| {
                let addr: SocketAddr = std::str::from_utf8(addr)
                    .ok()
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| {
                        Error::Protocol(format!("rank {peer} published an unreadable RDMA address"))
                    })?;
                connect_pair(&setup, peer, dial(ctx, peer, addr, deadline)?)
            },
            &self.incoming,
        )?;
        self.door.close();
        Ok(links
            .into_iter()
            .map(|(p, l)| (p, Box::new(l) as Box<dyn Link>))
            .collect())
    }

    fn registry(&self) -> Option<Arc<dyn Registry>> {
        Some(Arc::new(CacheRegistry {
            pd: self.setup.pd.clone(),
            cache: self.setup.cache.clone(),
            device: self.setup.dev.name.clone(),
        }))
    }

    fn direct(&self) -> Option<Arc<dyn DirectAccess>> {
        Some(Arc::new(RdmaDirect {
            pd: self.setup.pd.clone(),
            cache: self.setup.cache.clone(),
            device: self.setup.dev.name.clone(),
        }))
    }
}

/// The endpoint's registration cache as `comm-core` sees it.
struct CacheRegistry {
    pd: Arc<Pd>,
    cache: Arc<RegCache<Mr>>,
    device: String,
}

impl Registry for CacheRegistry {
    fn register(&self, region: &Region) -> Result<()> {
        if !region.space.is_host() {
            return Err(Error::Unsupported(format!(
                "registering {} with RDMA device {}: device memory (GPUDirect) is not supported yet",
                region.space, self.device
            )));
        }
        let (addr, len) = (region.addr, region.len);
        // SAFETY: comm-core registers only memory it owns (a SharedBuffer's
        // mapping) and unregisters it before unmapping it.
        let r = self.cache.insert(addr, len, || unsafe {
            Mr::register(&self.pd, addr as *mut u8, len, false)
        });
        r.map_err(|e| match e {
            InsertError::Overlap => Error::invalid(format!(
                "registering {len} bytes at {addr:#x}: the range partly overlaps memory \
                 registered before (register whole buffers, each once)"
            )),
            InsertError::Register(e) => Error::System(format!(
                "registering {len} bytes with RDMA device {}: {e} (check `ulimit -l`)",
                self.device
            )),
        })
    }

    fn unregister(&self, region: &Region) {
        self.cache.remove(region.addr, region.len);
    }
}

/// Connect side: reach the peer's setup port and prove the secret.
fn dial(ctx: &SetupCtx, peer: usize, addr: SocketAddr, deadline: Instant) -> Result<TcpStream> {
    let mut s = comm_core::door::dial_until(deadline, |left| {
        TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5)))
    })
    .map_err(|e| {
        Error::Bootstrap(format!(
            "could not reach rank {peer}'s RDMA setup port at {addr}: {e}"
        ))
    })?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.clamp(Duration::from_millis(1), DOOR_TIMEOUT)))
        .ok();
    s.set_write_timeout(Some(left.clamp(Duration::from_millis(1), DOOR_TIMEOUT)))
        .ok();
    let hello = Hello::new(
        Purpose::Rdma,
        ctx.comm_id,
        ctx.rank,
        peer as u32,
        ctx.nranks,
        0,
    )?;
    handshake::client(&mut s, &ctx.secret, &hello)
        .map_err(|e| Error::Bootstrap(format!("rank {peer} refused our RDMA connection: {e}")))?;
    Ok(s)
}

/// Registered, zeroed memory of `len` bytes.
fn slots(pd: &Arc<Pd>, len: usize) -> std::io::Result<Slots> {
    let mut mem = vec![0u8; len].into_boxed_slice();
    // SAFETY: `Slots` keeps the memory alive longer than the region (field
    // order), and the link keeps both until its QP is destroyed.
    let mr = unsafe { Mr::register(pd, mem.as_mut_ptr(), len, false)? };
    Ok(Slots { mr, mem })
}

/// Both sides, over an authenticated setup socket: create the QP and ring,
/// swap endpoints, bring the QP up, and confirm readiness.
fn connect_pair(setup: &Setup, peer: usize, mut s: TcpStream) -> Result<RdmaLink> {
    let terr = |what: &str, e: std::io::Error| Error::Transport {
        peer,
        world_peer: peer,
        detail: format!("RDMA setup ({what}) on {}: {e}", setup.dev.name),
    };
    let slot_bytes = setup.slot_bytes;
    // Messages use `sq_cap` send slots; one-sided reads up to READ_DEPTH more.
    let sq_cap = 2 * SLOTS as usize + 4;
    let sq = (sq_cap + link::READ_DEPTH) as u32;
    let rq = 2 * SLOTS + 4;
    let cq = Cq::new(&setup.dev.ctx, (sq + rq + 8) as i32).map_err(|e| terr("CQ", e))?;
    let mut qp = Qp::new(&setup.pd, &cq, sq, rq).map_err(|e| terr("QP", e))?;
    let ring =
        slots(&setup.pd, SLOTS as usize * slot_bytes as usize).map_err(|e| terr("ring", e))?;
    let mut psn = [0u8; 4];
    psn.copy_from_slice(&comm_core::handshake::Secret::random()?.0[..4]);
    let psn = u32::from_le_bytes(psn) & 0xff_ffff;
    let mine = QpEndpoint {
        path: PathInfo {
            qpn: qp.qpn(),
            psn,
            lid: setup.dev.lid,
            gid: setup.dev.gid,
        },
        ring_addr: ring.mem.as_ptr() as u64,
        rkey: ring.mr.rkey(),
        slots: SLOTS,
        slot_bytes,
    };
    wire::write_frame(&mut s, &mine.encode()).map_err(|e| terr("sending our endpoint", e))?;
    let theirs = wire::read_frame(&mut s, exchange::LEN)?
        .ok_or_else(|| Error::Bootstrap(format!("rank {peer} closed the RDMA setup connection")))?;
    let theirs = QpEndpoint::decode(&theirs)?;
    let bounce = slots(
        &setup.pd,
        theirs.slots as usize * theirs.slot_bytes as usize,
    )
    .map_err(|e| terr("bounce buffers", e))?;
    qp.connect(&setup.dev.settings, psn, &theirs.path)
        .map_err(|e| terr("connecting the queue pair", e))?;
    // Receives go up before the peer may write (it waits for our byte).
    for _ in 0..rq {
        qp.post_recv(link::WR_RECV)
            .map_err(|e| terr("posting receives", e))?;
    }
    s.write_all(&[1]).map_err(|e| terr("ready", e))?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
        .map_err(|e| terr("waiting for the peer's queue pair", e))?;
    RdmaLink::new(Parts {
        peer,
        qp,
        cq,
        ring,
        ring_slots: SLOTS,
        ring_slot_bytes: slot_bytes,
        bounce,
        remote: theirs,
        sq_cap,
        sock: s,
        cache: setup.cache.clone(),
    })
    .map_err(|e| terr("link", e))
}
