//! The communicator: a group of ranks that run collectives together.
//!
//! Ordering: every call takes a *ticket* when it is issued (blocking or
//! async) and runs when the ticket's turn comes, so calls execute in issue
//! order whichever thread runs them. Blocking calls run on the caller's
//! thread; async calls run on the communicator's worker thread.
//!
//! Failure: the first error of a call *poisons* the communicator: the cause
//! is kept and returned by every later call, the links are closed and the
//! other ranks are told through the root, so they fail fast with the same
//! cause instead of waiting for a timeout.

use crate::bootstrap::{self, Control, ControlSender};
use crate::call::Fingerprint;
use crate::config::{Config, CrossMemory};
use crate::control::failure;
use crate::control::notice::Notice;
use crate::cross_memory;
use crate::error::{Error, Result};
use crate::executor::{self, CallCtx, DirectCtx, Net, PlainReads, SyncFlags};
use crate::handshake::Secret;
use crate::id::UniqueId;
use crate::lane::Lane;
use crate::mem::shared::SharedMaps;
use crate::mem::Region;
use crate::schedule::Action;
use crate::schedule::Schedule;
use crate::sys::{CallClock, Stamp};
use crate::transport::net;
use crate::transport::{PeerInfo, SetupCtx, Transports};
use crate::turns::{NoTurn, Ticket, Turn, Turns};
use crate::types::DataType;
use crate::work::{Work, Worker};
use algorithms::{CollSpec, Tuning};
use std::mem::ManuallyDrop;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a call looks at the control connection before it starts
/// (see `Inner::notice_before`).
const CONTROL_LOOK_EVERY: Duration = Duration::from_millis(1);

/// A group of `nranks` processes (or threads) that communicate.
/// `Send + Sync`: calls may come from any thread; they run in issue order.
pub struct Communicator {
    /// Dropped in `Drop`, under the lane's gate.
    pub(crate) inner: ManuallyDrop<Arc<Inner>>,
    /// The deadline of this handle's calls, when it overrides the
    /// configured timeout ([`Communicator::with_timeout`]).
    timeout: Option<Duration>,
}

pub(crate) struct Inner {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) comm_id: u64,
    pub(crate) config: Config,
    pub(crate) peers: Vec<PeerInfo>,
    /// The job's number of each rank (`world[rank]`): the identity on a
    /// communicator made by `init`, the parent's numbers on one made by
    /// `split`. Errors name both.
    pub(crate) world: Vec<usize>,
    /// The job's secret (a shrunk communicator's is derived from it).
    secret: Secret,
    /// Bound at init; hosts the root of the communicator `shrink` makes,
    /// when this rank is the lowest survivor (once).
    rescue: Mutex<Option<std::net::TcpListener>>,
    /// More ranks of this communicator on this host than it has cores.
    pub(crate) oversubscribed: bool,
    /// How the ranks spread over hosts (for hierarchical algorithms).
    pub(crate) layout: Option<crate::algorithms::Layout>,
    /// The least last-level cache any rank reported (the copy-in
    /// thresholds that follow the cache, `Tuning::host_cache`).
    host_cache: Option<usize>,
    /// This rank's host cache and how many ranks share it (whether a
    /// call's output stays cached).
    shared_cache: Option<executor::SharedCache>,
    transports: Transports,
    /// The call state, one call at a time in issue order (its tickets are
    /// the calls' order: see [`crate::turns`]).
    state: Turns<State>,
    pub(crate) sender: Mutex<ControlSender>,
    poison: Mutex<Option<Error>>,
    /// Set once `poison` holds an error: a call checks it without a lock.
    poisoned: AtomicBool,
    pub(crate) aborted: AtomicBool,
    abort_fd: OwnedFd,
    /// The algorithm of the last collective that ran (its name).
    /// (Its position in `algorithms::REGISTRY` plus one; 0: none yet.)
    pub(crate) last_algorithm: AtomicUsize,
    /// Set once `State::small` holds this host's small pages (at creation,
    /// never unset): a small call on plain memory checks it before it
    /// takes its turn, and so builds only what that path needs.
    pub(crate) small_ready: AtomicBool,
    /// The last calls, always on (see `crate::flight`).
    pub(crate) flight: Arc<crate::flight::FlightRecorder>,
    /// The timeline trace, with `OXCCL_TRACE` (see `crate::trace`).
    pub(crate) tracer: Option<Arc<crate::trace::Tracer>>,
    pub(crate) worker: Worker,
    /// Sends and receives: links and a thread of their own.
    pub(crate) lane: Lane,
    _endpoints: Mutex<Vec<Box<dyn crate::transport::Endpoint>>>,
    /// The root, when this process hosts it: a failure here waits for the
    /// root to relay the first cause before the caller may exit.
    hosted_root: Option<Arc<bootstrap::RootWatch>>,
    /// The endpoints' memory registries (zero-copy sends from
    /// `SharedBuffer`s on transports that have one: RDMA).
    pub(crate) registries: Vec<Arc<dyn crate::transport::Registry>>,
    /// Direct access to every peer's memory, when one transport serves all
    /// peers and can map their memory (shared memory on one host).
    pub(crate) direct: Option<Arc<dyn crate::transport::DirectAccess>>,
}

pub(crate) struct State {
    net: Net,
    pub(crate) control: Control,
    /// Sequence number of the next collective.
    pub(crate) seq: u64,
    /// Number of the next monitored barrier.
    monitored: u64,
    /// The running call's own deadline, when its handle sets one.
    call_timeout: Option<Duration>,
    /// When the call about to run was issued, for a queued one (its
    /// closure waited on the worker); the flight recorder's `issued`.
    issued: Option<Stamp>,
    /// Shared flag pages of this host's ranks (at creation when all ranks
    /// share one host, else at the first `alloc_shared`).
    pub(crate) flags: Option<SyncFlags>,
    /// Every rank's shared memory of copy-in schedules, when all ranks
    /// share this host.
    pub(crate) staging: Option<SharedMaps>,
    /// Bytes of that memory, over all ranks, that copy-in schedules use:
    /// agreed when it was mapped (every rank builds the same schedule).
    pub(crate) copyin_memory: usize,
    /// Every rank's process id, when ranks copy from each other's plain
    /// buffers through the kernel (cross-memory attach): agreed when the
    /// host pages were mapped.
    pub(crate) plain_reads: Option<Vec<u32>>,
    /// Whether those copies pay here, so that calls prefer them at the
    /// single copy's sizes: agreed with `plain_reads` ([`crate::cross_memory`]).
    pub(crate) single_copy_pays: bool,
    /// Every rank's small page, when all ranks share this host
    /// ([`executor::small`]).
    pub(crate) small: Option<executor::small::SmallPages>,
    /// Shared buffers allocated so far (their ids).
    pub(crate) shared_allocs: u64,
    /// Registered buffers by id, for direct steps to find peers' memory.
    pub(crate) shared: Vec<(u64, std::sync::Weak<SharedMaps>)>,
    /// `Sync` phases passed so far (the counter every rank's flag follows).
    pub(crate) sync_phase: u32,
    /// When the control connection was last read between calls.
    control_checked: Stamp,
    /// Where a call's start is read ([`CallClock`]: no pipeline wait).
    clock: CallClock,
    /// Recently used schedules by call shape, most recent last.
    schedules: Vec<((CollSpec, bool), Planned)>,
    /// Chooses algorithms by predicted time, with a cost model
    /// (`OXCCL_TUNER_PROFILE`); without one the registry's rules do.
    tuner: Option<crate::tune::Tuner>,
}

/// Schedules kept per communicator.
const SCHEDULE_CACHE: usize = 16;

/// How long a failing rank that hosts the root waits for the root to relay
/// the first cause (it takes milliseconds; bounded for a stuck peer socket).
const RELAY_WAIT: Duration = Duration::from_secs(2);

/// A call's plan: the algorithm (its position in `algorithms::REGISTRY`),
/// its schedule, and whether it reaches peers' memory directly (then every
/// rank's registered buffers must agree, and are checked).
#[derive(Clone)]
pub(crate) struct Planned {
    pub index: usize,
    pub sched: Arc<Schedule>,
    pub direct: bool,
}

impl State {
    /// The plan of the algorithm chosen for `spec` (`forced` by name, or by
    /// the registry's rules), from the cache when the same call shape ran
    /// recently (the latency of small calls).
    pub(crate) fn schedule(
        &mut self,
        spec: &CollSpec,
        staged: bool,
        forced: Option<&str>,
        tuning: &Tuning,
    ) -> Result<Planned> {
        let key = (*spec, staged);
        // Most recent last; a repeated call (the common case) finds itself
        // there and moves nothing.
        if let Some(i) = self.schedules.iter().rposition(|(k, _)| *k == key) {
            if i + 1 < self.schedules.len() {
                let hit = self.schedules.remove(i);
                self.schedules.push(hit);
            }
        } else {
            // The tuner chooses the chunk too; the cache keeps the caller's.
            let (alg, chunk) = match self.tuner.as_mut() {
                Some(t) => t.choose(spec, forced, tuning),
                None => algorithms::choose(spec, forced, tuning).map(|a| (a, spec.chunk)),
            }
            .ok_or_else(|| Error::invalid(format!("no algorithm runs {}", spec.kind.name())))?;
            let spec = &CollSpec { chunk, ..*spec };
            if self.schedules.len() == SCHEDULE_CACHE {
                self.schedules.remove(0);
            }
            let index = algorithms::REGISTRY
                .iter()
                .position(|a| a.name() == alg.name())
                .unwrap_or(usize::MAX);
            // Direct: the algorithm runs this spec only because it is direct.
            let direct = spec.direct.is_some()
                && !alg.supports(&CollSpec {
                    direct: None,
                    ..*spec
                });
            let sched = match staged {
                true => algorithms::staged(&alg.build(spec)),
                false => alg.build(spec),
            };
            // Plain buffers peers read: the same.
            let plain_reads = spec.plain_reads
                && !alg.supports(&CollSpec {
                    plain_reads: false,
                    ..*spec
                });
            let planned = Planned {
                index,
                // Shared memory and peers' plain buffers are reached, and
                // phased, as direct steps are.
                direct: direct || sched.shared > 0 || plain_reads,
                sched: Arc::new(sched),
            };
            self.schedules.push((key, planned));
        }
        Ok(self.schedules.last().unwrap().1.clone())
    }
}

impl State {
    /// The registered buffer of communicator `comm_id` that `r` lies in.
    fn registered(&self, comm_id: u64, r: &Region) -> Option<Arc<SharedMaps>> {
        match r.space.registration() {
            Some((comm, id)) if comm == comm_id => self
                .shared
                .iter()
                .find(|(i, _)| *i == id)
                .and_then(|(_, w)| w.upgrade()),
            _ => None,
        }
    }

    /// Whether `r` is a registered buffer of this communicator that every
    /// peer has mapped (so direct steps may use it).
    pub(crate) fn is_direct(&self, inner: &Inner, r: &Region) -> bool {
        self.registered(inner.comm_id, r)
            .is_some_and(|m| m.zero_copy)
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("id", &format_args!("{:#x}", self.inner.comm_id))
            .field("rank", &self.inner.rank)
            .field("nranks", &self.inner.nranks)
            .field("world_rank", &self.world_rank())
            .field("error", &self.error())
            .finish()
    }
}

/// Stable identity of this host: host name, the kernel's boot id and the
/// network namespace (processes in different namespaces are treated as
/// different hosts, as they cannot share abstract sockets).
/// `host_id` (`OXCCL_HOSTID`) overrides it.
pub fn host_identity(host_id: Option<&str>) -> (String, u64) {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most len bytes into the buffer.
    unsafe { libc::gethostname(name.as_mut_ptr() as *mut libc::c_char, name.len()) };
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    let host = String::from_utf8_lossy(&name[..end]).into_owned();
    let id_text = match host_id {
        Some(v) if !v.is_empty() => v.to_string(),
        _ => {
            let boot =
                std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
            // `net:[4026531840]`: abstract sockets (the shm transport's
            // doors) do not cross network namespaces.
            let netns = std::fs::read_link("/proc/self/ns/net")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{host}|{}|{netns}", boot.trim())
        }
    };
    let id = u64::from_le_bytes(Secret::derive(&id_text).0[..8].try_into().unwrap());
    (host, id)
}

/// Set into the communicator id of the point-to-point lane's links.
const LANE_ID: u64 = 0x7032_705f_6c61_6e65; // "p2p_lane"

/// Connect `endpoints` (one per transport of the set) to every peer whose
/// transport `assigned` names, reading the peer's address at `offset + t`
/// of its published addresses; one link per peer (`None` for this rank).
fn connect_all(
    endpoints: &mut [Box<dyn crate::transport::Endpoint>],
    ctx: &SetupCtx,
    peers: &[PeerInfo],
    assigned: &[usize],
    offset: usize,
    transports: &Transports,
    deadline: Instant,
) -> Result<Vec<Option<Box<dyn crate::transport::Link>>>> {
    let mut links: Vec<Option<Box<dyn crate::transport::Link>>> =
        (0..peers.len()).map(|_| None).collect();
    for (t, ep) in endpoints.iter_mut().enumerate() {
        let mut mine = Vec::new();
        for p in peers.iter().filter(|p| assigned[p.rank] == t) {
            let addr = p.addrs.get(offset + t).cloned().ok_or_else(|| {
                Error::Bootstrap(format!(
                    "rank {} published no address for transport {}",
                    p.rank,
                    transports.list[t].name()
                ))
            })?;
            mine.push((p.rank, addr));
        }
        // Called even with no peers: the endpoint learns setup is over
        // (and from then on rejects every connection).
        for (peer, link) in ep.connect(ctx, &mine, deadline)? {
            links[peer] = Some(link);
        }
    }
    if let Some(missing) = (0..peers.len()).find(|p| *p != ctx.rank && links[*p].is_none()) {
        return Err(Error::Bootstrap(format!(
            "no transport produced a link to rank {missing}"
        )));
    }
    Ok(links)
}

fn eventfd() -> Result<OwnedFd> {
    crate::sys::eventfd().map_err(|e| Error::System(format!("eventfd: {e}")))
}

impl Communicator {
    /// Join communicator `id` as `rank` of `nranks` using `transports`
    /// (`ncclCommInitRank`). Blocks until every rank has joined and links
    /// are up, or `config.timeout` passes.
    pub fn init_with(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: Config,
        transports: Transports,
    ) -> Result<Communicator> {
        Self::init_in(id, rank, nranks, config, transports, (0..nranks).collect())
    }

    /// `init_with` for a communicator whose rank `r` is rank `world[r]` of
    /// the job.
    fn init_in(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        mut config: Config,
        transports: Transports,
        world: Vec<usize>,
    ) -> Result<Communicator> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid(format!("rank {rank} is not in 0..{nranks}")));
        }
        if nranks > bootstrap::MAX_RANKS {
            return Err(Error::invalid(format!(
                "{nranks} ranks exceed the limit of {}",
                bootstrap::MAX_RANKS
            )));
        }
        config.validate()?;
        // Every OXCCL_* variable set is checked, whether this config came
        // from the environment or not: transports and kernels read some
        // of them directly.
        crate::config::vars::check_env()?;
        let deadline = crate::config::value::deadline_after(config.timeout);
        let bind_addr = if id.root().ip().is_loopback() && config.socket_ifname.is_none() {
            // A root on loopback means a single-host job: stay on loopback.
            id.root().ip()
        } else {
            net::pick_address(config.socket_ifname.as_deref())?
        };
        let mut ctx = SetupCtx {
            comm_id: id.comm_id(),
            secret: *id.secret(),
            rank,
            nranks,
            config: config.clone(),
            bind_addr,
            reserved_port: id.hosted_root().is_none().then(|| id.root().port()),
        };
        let mut endpoints = Vec::new();
        for t in &transports.list {
            endpoints.push(t.listen(&ctx)?);
        }
        // The point-to-point lane's endpoints: a communicator id of their
        // own, so a lane link and a collectives' link cannot be mixed up.
        let mut lane_ctx = SetupCtx {
            comm_id: ctx.comm_id ^ LANE_ID,
            ..ctx.clone()
        };
        let mut lane_endpoints = Vec::new();
        for t in &transports.list {
            lane_endpoints.push(t.listen(&lane_ctx)?);
        }
        let (hostname, host_id) = host_identity(config.host_id.as_deref());
        // Bound now so every rank knows where a shrunk communicator's root
        // would be, even if this communicator's own root is gone by then.
        let rescue = net::bind_clear_of(
            ctx.reserved_port,
            || {
                std::net::TcpListener::bind((bind_addr, 0))
                    .map_err(|e| Error::Bootstrap(format!("cannot listen on {bind_addr}: {e}")))
            },
            |l| l.local_addr().ok().map(|a| a.port()),
        )?;
        let me = PeerInfo {
            rank,
            hostname,
            host_id,
            pid: std::process::id(),
            addrs: endpoints
                .iter()
                .chain(&lane_endpoints)
                .map(|e| e.address())
                .collect(),
            rescue: rescue.local_addr().ok(),
            hosts_root: id.hosted_root().is_some(),
            cpus: crate::sys::affinity(),
            llc: crate::sys::last_level_cache(),
        };
        let (control, peers) = bootstrap::rendezvous(
            id.root(),
            id.secret(),
            &me,
            nranks,
            &config.agreement(),
            crate::config::value::deadline_after(config.connect_timeout),
            deadline,
        )
        .inspect_err(|_| {
            // Hosting the root (rank 0 under OXCCL_ROOT): let it tell the
            // others why setup failed before this process may exit.
            if let Some(w) = id.hosted_root() {
                w.wait_setup_failure_told(bootstrap::LATE_REJECT_WINDOW);
            }
        })?;
        // The transport of each peer (by the set's rule), then the links:
        // the collectives' and, on endpoints of their own, the
        // point-to-point lane's.
        let mut assigned = vec![usize::MAX; nranks];
        for p in peers.iter().filter(|p| p.rank != rank) {
            assigned[p.rank] = (transports.choose)(&config, &me, p)?;
        }
        let k = transports.list.len();
        let mut per_transport = Vec::new();
        // The one endpoint serving every peer, if there is one (direct
        // access needs it).
        let mut served_by: Option<usize> = None;
        let mut mixed = false;
        for t in 0..k {
            let count = assigned.iter().filter(|a| **a == t).count();
            if count > 0 {
                mixed |= served_by.is_some();
                served_by = Some(t);
                per_transport.push(format!("{}:{count}", transports.list[t].name()));
            }
        }
        let served_by = served_by.filter(|_| !mixed && nranks > 1);
        // The pipelining chunk, unless configured: every rank derives the
        // same from the peer table and the agreed transport rule, before
        // the links that size their rings by it are made.
        if config.chunk_bytes.is_none() {
            let mapped = served_by
                .and_then(|t| endpoints[t].direct())
                .is_some_and(|d| d.access() == crate::algorithms::Access::Mapped);
            config.chunk_bytes = Some(match mapped {
                true => {
                    crate::config::automatic_chunk(&peers.iter().map(|p| p.llc).collect::<Vec<_>>())
                }
                false => crate::config::DEFAULT_CHUNK_BYTES,
            });
            ctx.config.chunk_bytes = config.chunk_bytes;
            lane_ctx.config.chunk_bytes = config.chunk_bytes;
        }
        // Both sets connect at once (the lane's on a helper thread): the
        // lane costs init little more than its own setup's latency.
        let (links, lane_links) = std::thread::scope(|s| {
            let lane = s.spawn(|| {
                connect_all(
                    &mut lane_endpoints,
                    &lane_ctx,
                    &peers,
                    &assigned,
                    k,
                    &transports,
                    deadline,
                )
            });
            let links = connect_all(
                &mut endpoints,
                &ctx,
                &peers,
                &assigned,
                0,
                &transports,
                deadline,
            );
            let lane = lane.join().unwrap_or_else(|_| {
                Err(Error::Bootstrap(
                    "connecting the point-to-point lane panicked".into(),
                ))
            });
            (links, lane)
        });
        let (links, lane_links) = (links?, lane_links?);
        let direct = served_by.and_then(|t| endpoints[t].direct());
        let mut net = Net::new(links);
        if let (Some(d), Some(t)) = (&direct, served_by) {
            // One-sided reads of peers' buffers may land in scratch memory.
            if d.access() == crate::algorithms::Access::OneSided {
                if let Some(r) = endpoints[t].registry() {
                    net.set_scratch_registry(r);
                }
            }
        }
        let sender = control.sender()?;
        let masks: Vec<&[u8]> = peers
            .iter()
            .filter(|p| p.host_id == me.host_id)
            .map(|p| p.cpus.as_slice())
            .collect();
        let available = std::thread::available_parallelism().map_or(1, |c| c.get());
        let oversubscribed = crate::wait::oversubscribed(&masks, &me.cpus, available);
        let lane = Lane::new(rank, lane_links, config.spin, oversubscribed)?;
        let tuner = match &config.tuner {
            Some(model) => {
                let hosts: Vec<u64> = peers.iter().map(|p| p.host_id).collect();
                Some(
                    crate::tune::Tuner::new(model.clone(), &hosts)
                        .map_err(|e| Error::Config(format!("OXCCL_TUNER_PROFILE: {e}")))?,
                )
            }
            None => None,
        };
        let layout = crate::algorithms::Layout::of_hosts(
            &peers.iter().map(|p| p.host_id).collect::<Vec<_>>(),
        );
        let host_cache = peers.iter().filter_map(|p| p.llc).min();
        let shared_cache = executor::SharedCache::of(&peers, rank);
        tracing::info!(
            rank,
            nranks,
            comm = format!("{:#x}", id.comm_id()),
            links = per_transport.join(" "),
            "oxccl communicator ready"
        );
        let flight = Arc::new(crate::flight::FlightRecorder::new(config.flight_calls));
        let tracer = config
            .trace_dir
            .clone()
            .map(|d| Arc::new(crate::trace::Tracer::new(d, config.trace_max_events)));
        crate::flight::register(
            crate::flight::Dumper {
                comm: id.comm_id(),
                rank,
                nranks,
                world_rank: world[rank],
                host: peers[rank].hostname.clone(),
            },
            &flight,
        );
        let comm = Communicator {
            inner: ManuallyDrop::new(Arc::new(Inner {
                rank,
                nranks,
                comm_id: id.comm_id(),
                config,
                peers,
                world,
                secret: *id.secret(),
                rescue: Mutex::new(Some(rescue)),
                oversubscribed,
                layout,
                host_cache,
                shared_cache,
                transports,
                state: Turns::new(State {
                    net,
                    control,
                    control_checked: Stamp::now(),
                    clock: CallClock::new(),
                    flags: None,
                    staging: None,
                    copyin_memory: 0,
                    plain_reads: None,
                    single_copy_pays: false,
                    small: None,
                    shared_allocs: 0,
                    shared: Vec::new(),
                    sync_phase: 0,
                    schedules: Vec::new(),
                    tuner,
                    seq: 0,
                    monitored: 0,
                    call_timeout: None,
                    issued: None,
                }),
                sender: Mutex::new(sender),
                poison: Mutex::new(None),
                poisoned: AtomicBool::new(false),
                aborted: AtomicBool::new(false),
                abort_fd: eventfd()?,
                last_algorithm: AtomicUsize::new(0),
                small_ready: AtomicBool::new(false),
                flight,
                tracer,
                worker: Worker::default(),
                registries: endpoints.iter().filter_map(|e| e.registry()).collect(),
                direct,
                lane,
                _endpoints: Mutex::new(endpoints.into_iter().chain(lane_endpoints).collect()),
                hosted_root: id.hosted_root().cloned(),
            })),
            timeout: None,
        };
        comm.share_host_pages()?;
        if let Some(t) = &comm.inner.tracer {
            // Init's own exchanges are not the user's calls.
            t.forget();
            crate::trace::align_clocks(&comm, t)?;
        }
        Ok(comm)
    }

    /// Map every rank's host pages when all ranks share this host (the
    /// host's direct access maps memory): the small page of the
    /// small-message path ([`executor::small`]), the phase flags of direct
    /// steps, and the shared memory of copy-in schedules
    /// ([`crate::algorithms::copyin`]). Collective; nothing to do otherwise.
    fn share_host_pages(&self) -> Result<()> {
        let Some(d) = self
            .inner
            .direct
            .clone()
            .filter(|d| d.access() == crate::algorithms::Access::Mapped)
        else {
            return Ok(());
        };
        // A rank that finishes these exchanges first may start its first
        // call and fail it (a mismatch) while this rank still waits for
        // the last message of the barrier: that failure belongs to this
        // rank's first call, not to its init (CI: mismatch_matrix_shm).
        self.inner.state_now()?.control.hold_notices(true);
        let mapped = self.map_host_pages(d);
        let mut st = self.inner.state_now()?;
        st.control.hold_notices(false);
        match mapped {
            // Anything held is reported by the first call's first poll.
            Ok(()) => Ok(()),
            // A peer that announced its failure and left: its words are
            // the cause, the closed links only the consequence.
            Err(e) => match st.control.take_held() {
                Some(n) => {
                    let during = "init (sharing host pages)";
                    Err(
                        failure::notice_to_error(n, self.rank(), &self.inner.peers, during, during)
                            .in_world(&self.inner.world, &self.inner.peers),
                    )
                }
                None => Err(e),
            },
        }
    }

    /// [`Communicator::share_host_pages`] over `d`.
    fn map_host_pages(&self, d: Arc<dyn crate::transport::DirectAccess>) -> Result<()> {
        let (me, n) = (self.rank(), self.nranks());
        // (small page, flag page, shared memory), in this order everywhere.
        let sizes = [
            executor::small::PAGE,
            executor::FLAG_PAGE,
            executor::SHARED_BYTES,
        ];
        let mut own = Vec::with_capacity(sizes.len());
        let mut rec = Vec::with_capacity(PAGES_RECORD);
        for len in sizes {
            let (m, handle) = d.export(len)?;
            crate::mem::shared::put_handle(&mut rec, &handle)?;
            own.push(m);
        }
        // The copy-in's share of the shared memory, as this rank would
        // choose it: the schedule depends on it, so ranks take the least.
        let copyin = self
            .inner
            .config
            .copyin_memory
            .unwrap_or_else(|| executor::copyin_memory(crate::sys::last_level_cache()));
        rec.extend_from_slice(&(copyin as u64).to_le_bytes());
        // Where peers may probe cross-memory reads: this rank's flag page
        // in its own process (0: it does not want its buffers read).
        let probe_at = match self.inner.config.cross_memory {
            CrossMemory::Off => 0,
            CrossMemory::Auto | CrossMemory::On => own[1].region().addr as u64,
        };
        rec.extend_from_slice(&probe_at.to_le_bytes());
        let mut all = vec![0u8; PAGES_RECORD * n];
        self.all_gather(&rec, &mut all)?;
        let mut peers: Vec<Vec<Option<Box<dyn crate::transport::Mapped>>>> = sizes
            .iter()
            .map(|_| (0..n).map(|_| None).collect())
            .collect();
        // Every record holds a choice, this rank's included.
        let copyin = all
            .chunks_exact(PAGES_RECORD)
            .map(|rec| usize::try_from(record_word(rec, COPYIN_WORD)).unwrap_or(usize::MAX))
            .fold(copyin, usize::min)
            .max(executor::COPYIN_MIN);
        for k in (0..n).filter(|k| *k != me) {
            let rec = &all[k * PAGES_RECORD..(k + 1) * PAGES_RECORD];
            for (i, len) in sizes.into_iter().enumerate() {
                let h = crate::mem::shared::get_handle(rec, i * HANDLE_RECORD, k)?;
                peers[i][k] = match d.import(k, h, len)? {
                    crate::transport::PeerMemory::Mapped(m) => Some(m),
                    crate::transport::PeerMemory::Remote(_) => {
                        return Err(Error::Protocol(format!(
                            "rank {k}'s host pages are not mappable though direct access maps memory"
                        )))
                    }
                };
            }
        }
        // Cross-memory reads: this rank can make them if it wants to and
        // reads 8 bytes of every peer's flag page (same user, and Yama's
        // ptrace_scope or a container's seccomp filter allowing it; the
        // library never widens who may read this process). Every
        // rank must agree (the schedules differ), so the verdicts are
        // gathered: this exchange is also the barrier that keeps anyone
        // from closing its fds before every peer has opened them.
        let reads_ok = probe_at != 0
            && (0..n).filter(|k| *k != me).all(|k| {
                let at = record_word(&all[k * PAGES_RECORD..(k + 1) * PAGES_RECORD], PROBE_WORD);
                let mut word = [0u8; 8];
                // SAFETY: `word` is 8 writable bytes of this frame.
                at != 0
                    && unsafe {
                        crate::sys::read_process(self.inner.peers[k].pid, at, word.as_mut_ptr(), 8)
                    }
                    .is_ok()
            });
        // With the verdict goes how fast this rank found the kernel's
        // copy (timed only where it can read its peers): whether the
        // single copy is preferred follows from the same list everywhere.
        let forced = self.inner.config.cross_memory == CrossMemory::On;
        let mut verdicts = vec![0u8; n];
        self.all_gather(&[cross_memory::verdict(reads_ok, forced)], &mut verdicts)?;
        let plain_reads = cross_memory::reads_allowed(&verdicts)
            .then(|| self.inner.peers.iter().map(|p| p.pid).collect());
        let single_copy_pays = cross_memory::single_copy_pays(&verdicts);
        if plain_reads.is_some() {
            tracing::debug!(
                rank = me,
                shares = ?verdicts,
                single_copy_pays,
                "oxccl: the kernel's copy against memcpy (per cent; 255 forced)"
            );
        }
        let (shared_own, flag_own, small_own) = (own.pop(), own.pop(), own.pop());
        let (shared_peers, flag_peers, small_peers) = (peers.pop(), peers.pop(), peers.pop());
        let shared = SharedMaps {
            id: 0,
            own: shared_own.expect("three pages"),
            peers: shared_peers
                .expect("three pages")
                .into_iter()
                .map(|m| m.map(crate::transport::PeerMemory::Mapped))
                .collect(),
            zero_copy: true,
        };
        // The program's first collective is #0 (in messages, as before):
        // every rank made the same two calls, none is in flight, and the
        // pages hold nothing yet (they come into use only now).
        let inner_flight = self.inner.flight.clone();
        self.run(move |inner, st| {
            st.small = Some(executor::small::SmallPages::new(
                small_own.expect("three pages"),
                small_peers.expect("three pages"),
            ));
            inner.small_ready.store(true, Ordering::Relaxed);
            st.flags = Some(SyncFlags::new(
                flag_own.expect("three pages"),
                flag_peers.expect("three pages"),
            ));
            st.staging = Some(shared);
            st.copyin_memory = copyin;
            st.plain_reads = plain_reads;
            st.single_copy_pays = single_copy_pays;
            st.seq = 0;
            inner_flight.forget();
            Ok(())
        })
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.inner.nranks
    }

    /// Whether this rank's host has fewer cores than ranks, counted over
    /// the CPUs the host's ranks may run on when the communicator was made
    /// (their affinity masks, and this process's CPU quota): then waits
    /// yield the core at once rather than spin (`OXCCL_SPIN_US`).
    pub fn shares_cores(&self) -> bool {
        self.inner.oversubscribed
    }

    /// Number of ranks (the name cudarc and torch use).
    pub fn world_size(&self) -> usize {
        self.inner.nranks
    }

    /// This rank's number in the job (the communicator this one was split
    /// from, transitively; equal to [`Communicator::rank`] on a communicator
    /// made by `init`).
    pub fn world_rank(&self) -> usize {
        self.inner.world[self.inner.rank]
    }

    /// The job's number of every rank of this communicator, by rank.
    pub fn world_ranks(&self) -> &[usize] {
        &self.inner.world
    }

    /// The communicator id (same on every rank).
    pub fn id(&self) -> u64 {
        self.inner.comm_id
    }

    /// The configuration in effect: the one given, with the chunk the
    /// ranks agreed on where `chunk_bytes` was left unset.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// What every rank reported at bootstrap (host, pid, ...), by rank.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.inner.peers
    }

    /// The algorithm that ran the last collective of this communicator
    /// (`ring`, `oneshot`, `direct`, ...; see `algorithms::REGISTRY`), or
    /// `None` before the first one.
    pub fn last_algorithm(&self) -> Option<&'static str> {
        match self.inner.last_algorithm.load(Ordering::Relaxed) {
            0 => None,
            i => Some(algorithm_name(i)),
        }
    }

    /// The last calls of this communicator, oldest first (at most
    /// `Config::flight_calls`; see `crate::flight`): what each was, its
    /// algorithm, when it was issued, started and ended, how it ended and,
    /// for one still running, which peers it waits for.
    pub fn recent_calls(&self) -> Vec<crate::flight::CallRecord> {
        self.inner.flight.recent()
    }

    /// Write this rank's timeline trace now (with `OXCCL_TRACE`; it is
    /// also written when the communicator goes and when a call fails).
    pub fn flush_trace(&self) {
        self.inner.flush_trace();
    }

    /// The events of this rank's timeline trace so far, oldest first
    /// (empty without `OXCCL_TRACE`).
    pub fn trace_events(&self) -> Vec<crate::trace::Event> {
        self.inner
            .tracer
            .as_ref()
            .map_or_else(Vec::new, |t| t.events())
    }

    /// Write this communicator's flight recorder into `dir` now (as a
    /// failed call does into `OXCCL_FLIGHT_DIR`); the file's path.
    pub fn dump_recent_calls(
        &self,
        dir: &std::path::Path,
        reason: &str,
    ) -> Result<std::path::PathBuf> {
        self.inner.dump_flight(dir, reason)
    }

    /// The error that poisoned this communicator, if any.
    pub fn error(&self) -> Option<Error> {
        self.inner.poison.lock().unwrap().clone()
    }

    /// Whether the job is failing, without making a call
    /// (`ncclCommGetAsyncError`): the error that poisoned this
    /// communicator, or the failure another rank announced since the last
    /// call (a lost rank, a mismatch, an abort), which then poisons it.
    /// For a watchdog thread: it never blocks behind a running call (that
    /// call will see the announcement itself). Errors are in this
    /// communicator's numbering and the job's, like every error.
    pub fn async_error(&self) -> Option<Error> {
        if let Some(e) = self.error() {
            return Some(e);
        }
        let mut st = self.inner.state.try_turn()?;
        let Some(bootstrap::ControlEvent::Notice(n)) = st.control.poll() else {
            return None;
        };
        let between = match st.seq {
            0 => "the time before the first collective".to_string(),
            s => format!("the time after collective #{}", s - 1),
        };
        let e = failure::notice_to_error(n, self.inner.rank, &self.inner.peers, &between, &between)
            .in_world(&self.inner.world, &self.inner.peers);
        st.net.close_all();
        drop(st);
        self.inner.set_poison(e.clone());
        Some(e)
    }

    /// Stop everything: every waiting call of this communicator (on any
    /// thread) returns `Error::Aborted` promptly, later calls fail, and the
    /// other ranks are told. Safe to call from any thread, any number of times.
    pub fn abort(&self) {
        self.inner.abort();
    }

    /// Create sub-communicators (`ncclCommSplit`): ranks passing the same
    /// `color` form one, ordered by `key` then by parent rank. Collective
    /// over the parent: every rank calls `split`, [`Communicator::split_out`]
    /// or [`Communicator::split_maybe`]. Errors on the new communicator
    /// name its ranks and their numbers in the job ([`Communicator::world_ranks`]).
    pub fn split(&self, color: u32, key: i64) -> Result<Communicator> {
        self.split_maybe(Some(color), key)?
            .ok_or_else(|| Error::Protocol("split produced no communicator for a colour".into()))
    }

    /// Take part in a split without joining any of the new communicators
    /// (`NCCL_SPLIT_NOCOLOR`).
    pub fn split_out(&self) -> Result<()> {
        self.split_maybe(None, 0).map(|_| ())
    }

    /// [`Communicator::split`] when whether this rank joins is computed:
    /// `None` opts out and returns `Ok(None)`.
    pub fn split_maybe(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let n = self.nranks();
        let mine = [
            color.map_or(u64::MAX, u64::from),
            key as u64,
            self.rank() as u64,
        ];
        let mut all = vec![0u64; 3 * n];
        self.all_gather(&mine, &mut all)?;
        let Some(color) = color else {
            // Still take part in the id exchange below.
            let mut ids = vec![0u8; ID_RECORD * n];
            self.all_gather(&[0u8; ID_RECORD], &mut ids)?;
            return Ok(None);
        };
        let mut members: Vec<(i64, usize)> = (0..n)
            .filter(|r| all[3 * r] == u64::from(color))
            .map(|r| (all[3 * r + 1] as i64, r))
            .collect();
        members.sort();
        let new_rank = members.iter().position(|m| m.1 == self.rank()).unwrap();
        let leader = members[0].1;
        let mut record = [0u8; ID_RECORD];
        if new_rank == 0 {
            let addr = std::net::SocketAddr::new(
                if self.inner.peers.is_empty() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    self.local_ip()
                },
                0,
            );
            let id = UniqueId::serve(addr, Secret::random()?, self.inner.config.timeout)?;
            let text = id.to_string();
            record[..text.len()].copy_from_slice(text.as_bytes());
        }
        let mut ids = vec![0u8; ID_RECORD * n];
        let split_result = self.all_gather(&record, &mut ids);
        split_result?;
        let rec = &ids[leader * ID_RECORD..(leader + 1) * ID_RECORD];
        let end = rec.iter().position(|b| *b == 0).unwrap_or(ID_RECORD);
        let text = std::str::from_utf8(&rec[..end])
            .map_err(|_| Error::Protocol("split: bad id record".into()))?;
        let id: UniqueId = text.parse()?;
        let world = members.iter().map(|m| self.inner.world[m.1]).collect();
        Communicator::init_in(
            &id,
            new_rank,
            members.len(),
            self.inner.config.clone(),
            self.inner.transports.clone(),
            world,
        )
        .map(Some)
    }

    /// After ranks died (or must be left out), build a communicator of the
    /// others without restarting the job (`ncclCommShrink`): every
    /// survivor calls it with the same `excluded` ranks (in any order) and
    /// gets a communicator of `nranks - excluded.len()` ranks, numbered in
    /// the old order, whose [`world_ranks`](Communicator::world_ranks) keep
    /// the job's numbers. Works on a failed communicator (after `PeerLost`
    /// the blamed rank is the one to exclude) and needs nothing of it but
    /// the peer table: the lowest survivor hosts the new root on a port it
    /// bound at init, so it works even when the old root died. Survivors
    /// that disagree on `excluded` get a `Bootstrap` or `Handshake` error,
    /// not a wrong communicator; this one is left as it was (drop it).
    pub fn shrink(&self, excluded: &[usize]) -> Result<Communicator> {
        let (n, me) = (self.nranks(), self.rank());
        let mut dead = excluded.to_vec();
        dead.sort_unstable();
        dead.dedup();
        if let Some(r) = dead.iter().find(|r| **r >= n) {
            return Err(Error::invalid(format!(
                "shrink: rank {r} is not a rank of this {n}-rank communicator"
            )));
        }
        if dead.contains(&me) {
            return Err(Error::invalid(format!(
                "shrink: this rank ({me}) is in the list of ranks to exclude"
            )));
        }
        let survivors: Vec<usize> = (0..n).filter(|r| !dead.contains(r)).collect();
        let new_rank = survivors.iter().position(|r| *r == me).unwrap();
        let leader = survivors[0];
        let root = self.inner.peers[leader].rescue.ok_or_else(|| {
            Error::Bootstrap(format!(
                "rank {leader} published no address to host a shrunk communicator"
            ))
        })?;
        // Every survivor derives the same secret from the old one and the
        // excluded set: disagreeing survivors cannot join each other.
        let hex: String = self
            .inner
            .secret
            .0
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let secret = Secret::derive(&format!("{hex}|shrink|{dead:?}"));
        let mut hosted = None;
        if me == leader {
            let listener = self.inner.rescue.lock().unwrap().take().ok_or_else(|| {
                Error::invalid(
                    "shrink: this communicator was already shrunk once; shrink the new one",
                )
            })?;
            let watch = Arc::new(bootstrap::RootWatch::default());
            bootstrap::spawn_root(listener, secret, self.inner.config.timeout, watch.clone())?;
            hosted = Some(watch);
        }
        let world = survivors.iter().map(|r| self.inner.world[*r]).collect();
        let id = match hosted {
            Some(w) => UniqueId::hosting(root, secret, w),
            None => UniqueId::from_parts(root, secret),
        };
        Communicator::init_in(
            &id,
            new_rank,
            survivors.len(),
            self.inner.config.clone(),
            self.inner.transports.clone(),
            world,
        )
    }

    fn local_ip(&self) -> std::net::IpAddr {
        net::pick_address(self.inner.config.socket_ifname.as_deref())
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// Another handle on this communicator (for work queued on the worker).
    pub(crate) fn clone_handle(&self) -> Communicator {
        Communicator {
            inner: self.inner.clone(),
            timeout: self.timeout,
        }
    }

    /// A handle on this communicator whose calls each have `timeout` as
    /// their deadline instead of the configured one (`OXCCL_TIMEOUT`):
    /// `comm.with_timeout(Duration::from_secs(5)).all_reduce(..)`. The
    /// deadline runs from when the call starts (after the calls issued
    /// before it); when it passes, the call fails with `Timeout` naming the
    /// rank it waited for, and the communicator fails on every rank, as for
    /// the configured timeout. Handles are cheap; they share everything.
    pub fn with_timeout(&self, timeout: Duration) -> Communicator {
        Communicator {
            inner: self.inner.clone(),
            timeout: Some(timeout),
        }
    }

    /// The deadline of this handle's calls.
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(self.inner.config.timeout)
    }

    /// Wait until every rank has called `monitored_barrier`, or report
    /// every rank that did not arrive within `timeout` of the first one
    /// (`Error::Absent`, the same on every rank that arrived; ranks that
    /// arrive later get it from their next call). The root of the
    /// communicator counts the arrivals, so no rank's wait depends on
    /// another's links (torch's `monitored_barrier`). Slower than
    /// [`barrier`](Communicator::barrier): for diagnosis and start-up, not
    /// for every step.
    pub fn monitored_barrier(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::invalid(
                "monitored_barrier: the time to wait for the others must be above zero",
            ));
        }
        self.run(move |inner, st| inner.monitored_barrier(st, timeout))
    }

    /// A handle made by `with_timeout(0)` cannot run anything: every call
    /// would fail the communicator at once.
    pub(crate) fn check_deadline(&self) -> Result<()> {
        match self.timeout {
            Some(t) if t.is_zero() => Err(Error::invalid(
                "with_timeout(0): a call's deadline must be above zero",
            )),
            _ => Ok(()),
        }
    }

    /// Add a compute engine for memory the host engine cannot reach (a
    /// CUDA engine for one device: oxccl's `cuda` feature). A call runs on
    /// the first engine that reaches all its buffers, the host engine
    /// first; it waits for the calls issued before.
    pub fn add_compute(&self, engine: Box<dyn crate::compute::Compute>) -> Result<()> {
        self.run(move |_, st| {
            st.net.add_engine(engine);
            Ok(())
        })
    }

    /// Run `f` as the next call in issue order (blocking, this thread).
    pub(crate) fn run<R>(&self, f: impl FnOnce(&Inner, &mut State) -> Result<R>) -> Result<R> {
        self.check_deadline()?;
        let ticket = self.inner.state.ticket();
        self.inner.run_ticket(ticket, self.timeout, None, f)
    }

    /// Queue `f` on the worker thread; it runs in issue order.
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        call: &'static str,
        f: impl FnOnce(&Inner, &mut State) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        if let Err(e) = self.check_deadline() {
            return Work::done(call, Err(e));
        }
        let ticket = self.inner.state.ticket();
        let inner = Arc::clone(&self.inner);
        let timeout = self.timeout;
        let issued = Some(Stamp::now());
        self.inner
            .worker
            .submit(call, move || inner.run_ticket(ticket, timeout, issued, f))
    }
}

/// Bytes per rank in the id exchange of `split`.
const ID_RECORD: usize = 128;

/// Bytes of one handle in the host-page exchange: its length and bytes.
const HANDLE_RECORD: usize = 1 + crate::mem::shared::HANDLE_MAX;

/// Bytes per rank in the host-page exchange: three handles, the copy-in
/// memory the rank would choose, and the address peers probe cross-memory
/// reads with (u64s, little-endian).
const PAGES_RECORD: usize = 3 * HANDLE_RECORD + 16;

/// Where a host-page record holds the copy-in memory, and the probe
/// address.
const COPYIN_WORD: usize = 3 * HANDLE_RECORD;
const PROBE_WORD: usize = COPYIN_WORD + 8;

/// The u64 at `at` of a host-page record (`at` is one of the words above,
/// inside every record of `PAGES_RECORD` bytes).
fn record_word(rec: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(rec[at..at + 8].try_into().expect("8 bytes"))
}

/// `last_algorithm`'s value for the small-message path (not a schedule).
pub(crate) const SMALL_PATH: usize = usize::MAX;

/// The name behind a `last_algorithm` value (`?` for none).
pub(crate) fn algorithm_name(i: usize) -> &'static str {
    if i == SMALL_PATH {
        return "small";
    }
    i.checked_sub(1)
        .and_then(|i| algorithms::REGISTRY.get(i))
        .map_or("?", |a| a.name())
}

impl Inner {
    /// Who this communicator's flight dumps say wrote them.
    pub(crate) fn dumper(&self) -> crate::flight::Dumper {
        crate::flight::Dumper {
            comm: self.comm_id,
            rank: self.rank,
            nranks: self.nranks,
            world_rank: self.world[self.rank],
            host: self.peers[self.rank].hostname.clone(),
        }
    }

    /// Write the flight recorder into `dir`.
    pub(crate) fn dump_flight(
        &self,
        dir: &std::path::Path,
        reason: &str,
    ) -> Result<std::path::PathBuf> {
        self.flight.dump(dir, &self.dumper(), reason).map_err(|e| {
            Error::System(format!(
                "writing the flight recorder into {}: {e}",
                dir.display()
            ))
        })
    }

    /// Write the timeline trace (with `OXCCL_TRACE`), warning on failure.
    pub(crate) fn flush_trace(&self) {
        if let Some(t) = &self.tracer {
            if let Err(e) = t.flush(&self.dumper()) {
                tracing::warn!("oxccl: writing the trace: {e}");
            }
        }
    }

    fn abort(&self) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(dir) = &self.config.flight_dir {
            if let Err(d) = self.dump_flight(dir, "aborted (Communicator::abort)") {
                tracing::warn!("oxccl: {d}");
            }
        }
        crate::sys::signal(self.abort_fd.as_raw_fd());
        self.lane.wake();
        self.set_poison(Error::Aborted {
            by: None,
            world_by: None,
        });
        // Wake calls waiting for their turn.
        self.state.wake_all();
    }

    /// Record the first error, tell the others (when it is ours to tell).
    fn set_poison(&self, e: Error) {
        let mut p = self.poison.lock().unwrap();
        if p.is_some() {
            return;
        }
        // The caller gets the error itself; this event is for traces (a
        // handled error is not the library's to print).
        tracing::info!(rank = self.rank, "oxccl communicator failed: {e}");
        *p = Some(e.clone());
        self.poisoned.store(true, Ordering::Release);
        // The point-to-point lane fails its operations with it, now.
        self.lane.wake();
        drop(p);
        if let Some(n) = failure::notice_for(self.rank, &e) {
            self.sender.lock().unwrap().abort(&n);
        }
        if let Some(w) = &self.hosted_root {
            // This process may exit as soon as the caller sees the error,
            // taking the root along: the first cause (ours, another rank's,
            // or a stall verdict) must be out to everyone first.
            w.wait_relayed(RELAY_WAIT);
        }
    }

    /// The error that poisoned the communicator (a flag read while none
    /// did: inlined, since every call asks).
    #[inline]
    pub(crate) fn poisoned(&self) -> Option<Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.poison_cause()
    }

    #[cold]
    #[inline(never)]
    fn poison_cause(&self) -> Option<Error> {
        self.poison.lock().unwrap().clone()
    }

    /// Fail the communicator with `e` (the point-to-point lane's errors):
    /// recorded, told to the others, and every later call returns it.
    pub(crate) fn fail(&self, e: Error) {
        self.set_poison(e);
    }

    /// A failure notice that arrived on the control connection (`Break(Some)`),
    /// none and none to come because the root is gone (`Break(None)`), or
    /// nothing yet (`Continue`; also while a running call holds the
    /// connection: it reads it itself).
    pub(crate) fn control_notice(&self) -> ControlFlow<Option<Notice>> {
        let Some(mut st) = self.state.try_turn() else {
            return ControlFlow::Continue(());
        };
        match st.control.poll() {
            Some(bootstrap::ControlEvent::Notice(n)) => ControlFlow::Break(Some(n)),
            // Everything the root sent before it went was read: no
            // explanation can come any more.
            Some(bootstrap::ControlEvent::RootGone) => ControlFlow::Break(None),
            _ if st.control.is_gone() => ControlFlow::Break(None),
            _ => ControlFlow::Continue(()),
        }
    }

    /// Whether this rank read the end of its control connection. Unknown
    /// (false) while a running call holds it; that call judges for itself.
    pub(crate) fn root_gone(&self) -> bool {
        self.state.try_turn().is_some_and(|st| st.control.is_gone())
    }

    /// Wait for `ticket`'s turn: the call state, for this call alone.
    /// An abort ends the wait (the communicator is failed).
    #[inline(always)]
    fn wait_turn(&self, ticket: Ticket) -> Result<Turn<'_, State>> {
        match self
            .state
            .wait(ticket, || self.aborted.load(Ordering::Acquire))
        {
            Ok(turn) => Ok(turn),
            Err(no) => Err(self.no_turn(no)),
        }
    }

    #[cold]
    #[inline(never)]
    fn no_turn(&self, no: NoTurn) -> Error {
        match no {
            NoTurn::GaveUp => self.poisoned().unwrap_or(Error::Aborted {
                by: None,
                world_by: None,
            }),
            NoTurn::Broken => Error::Protocol(
                "an earlier call on this communicator panicked; its state is unknown".into(),
            ),
        }
    }

    /// The call state at the next turn (for work between calls, such as
    /// the page exchange at creation).
    fn state_now(&self) -> Result<Turn<'_, State>> {
        self.wait_turn(self.state.ticket())
    }

    pub(crate) fn run_ticket<R>(
        &self,
        ticket: Ticket,
        timeout: Option<Duration>,
        issued: Option<Stamp>,
        f: impl FnOnce(&Inner, &mut State) -> Result<R>,
    ) -> Result<R> {
        let mut st = self.wait_turn(ticket)?;
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        st.call_timeout = timeout;
        st.issued = issued;
        let r = f(self, &mut st);
        st.issued = None;
        // The success is built anew rather than `r` moved: see `numbered`.
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.call_failed(&mut st, e)),
        }
    }

    /// A call failed with `e`: its error in the job's numbering too, the
    /// flight record and trace written, and, unless only this call is
    /// affected, the communicator poisoned (before the turn passes: the
    /// next call fails with this cause, not with the closed links).
    #[cold]
    #[inline(never)]
    fn call_failed(&self, st: &mut State, e: Error) -> Error {
        let e = e.in_world(&self.world, &self.peers);
        // Every survivor of a failure leaves its account.
        if let Some(dir) = &self.config.flight_dir {
            if let Err(d) = self.dump_flight(dir, &e.to_string()) {
                tracing::warn!("oxccl: {d}");
            }
        }
        self.flush_trace();
        if !e.is_local() {
            st.net.close_all();
            self.set_poison(e.clone());
        }
        e
    }

    /// Run one collective's schedule with the given buffers.
    pub(crate) fn execute(
        &self,
        st: &mut State,
        fp: Fingerprint,
        sched: &Schedule,
        bufs: &[Region],
        direct: bool,
    ) -> Result<()> {
        // Memory no engine reaches fails this call alone, before it takes
        // a sequence number (the others' next call still matches ours).
        let engine = st.net.engine_for(bufs)?;
        self.numbered(st, |me, st, seq| {
            me.execute_seq(st, fp, seq, engine, sched, bufs, direct)
        })
    }

    /// Run the next call of the sequence (its number given to `run`) and
    /// record how it ended. (Inlined: a small call is bound by the
    /// instructions it runs, and the closure's captures otherwise travel
    /// through memory.)
    #[inline(always)]
    fn numbered(
        &self,
        st: &mut State,
        run: impl FnOnce(&Self, &mut State, u64) -> Result<()>,
    ) -> Result<()> {
        let seq = st.seq;
        st.seq += 1;
        let r = run(self, st, seq);
        self.flight.end(seq, r.as_ref().map(|_| ()));
        if let Some(t) = &self.tracer {
            let algorithm = self.last_algorithm.load(Ordering::Relaxed);
            t.call_ended(seq, algorithm, r.is_err());
        }
        // Built anew rather than `r` moved: a move copies the whole
        // `Result` (an `Error` is about a hundred bytes) in wide loads
        // over the narrow store of its tag, which cannot be forwarded, so
        // the load waits until every store before it has reached the
        // cache, the slot this call published on a peer's core among
        // them (a third of a 2-rank 8-byte broadcast's root, `perf`).
        if r.is_ok() {
            return Ok(());
        }
        r
    }

    /// Call `seq` starts: a failure announced meanwhile fails it first
    /// (see `notice_before`); the flight recorder's record of it starts at
    /// the clock read it returns (issued when its queued closure was
    /// submitted, else then). The call's start time.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn begin(
        &self,
        control: &mut Control,
        checked: &mut Stamp,
        clock: &mut CallClock,
        issued: &mut Option<Stamp>,
        fp: &Fingerprint,
        seq: u64,
        ids: u64,
    ) -> Result<Stamp> {
        let notice = self.notice_before(control, checked, clock, fp, seq, ids);
        let now = match &notice {
            Ok(now) => *now,
            Err(_) => Stamp::now(),
        };
        let issued = issued.take().unwrap_or(now);
        let algorithm = self.last_algorithm.load(Ordering::Relaxed);
        self.flight.start(seq, *fp, algorithm, issued, now);
        if let Some(t) = &self.tracer {
            t.call_started(now, *fp);
        }
        notice
    }

    #[allow(clippy::too_many_arguments)]
    fn execute_seq(
        &self,
        st: &mut State,
        fp: Fingerprint,
        seq: u64,
        engine: usize,
        sched: &Schedule,
        bufs: &[Region],
        direct: bool,
    ) -> Result<()> {
        let _span = tracing::debug_span!("collective", seq, kind = fp.kind.name(), count = fp.count, dtype = %fp.dtype).entered();
        // Direct steps need the peers' memory of the call's registered
        // buffers, and mapped access the flag pages. (Every rank of a
        // direct call knows its buffers, even one with no direct step, such
        // as a broadcast's root: headers and phases check them.)
        let syncs = sched
            .steps
            .iter()
            .filter(|s| s.action == Action::Sync)
            .count() as u32;
        let base = st.sync_phase;
        st.sync_phase = st.sync_phase.wrapping_add(syncs);
        let direct = if direct {
            let find = |r: Option<&Region>| r.and_then(|r| st.registered(self.comm_id, r));
            // A reduce's output is the root's alone (a non-root may pass
            // none): no peer addresses it, so ranks need not agree on it.
            let output = bufs.get(1).filter(|_| fp.kind != crate::call::Kind::Reduce);
            let maps = [find(bufs.first()), find(output)];
            Some(DirectCtx {
                flags: st.flags.as_ref(),
                base,
                maps,
                shared: st.staging.as_ref(),
                small: st.small.as_ref(),
                // Plain buffers (the registered ones resolve through their
                // maps first).
                plain: st.plain_reads.as_deref().map(|pids| PlainReads {
                    pids,
                    bufs: [bufs.first(), bufs.get(1)].map(|b| b.copied().unwrap_or(Region::EMPTY)),
                }),
            })
        } else {
            None
        };
        let ids = executor::buffer_ids(direct.as_ref());
        let now = self.begin(
            &mut st.control,
            &mut st.control_checked,
            &mut st.clock,
            &mut st.issued,
            &fp,
            seq,
            ids,
        )?;
        // A peer waiting for this call on the small-message path learns
        // that this rank runs another.
        if let Some(p) = &st.small {
            p.publish_general(self.rank, &fp, seq, direct.is_some());
        }
        let timeout = st.call_timeout.unwrap_or(self.config.timeout);
        let mut cx = self.call_ctx(&mut st.control, now, timeout, fp, seq, direct);
        executor::execute(sched, bufs, &mut st.net, engine, &mut cx)
    }

    /// Run a collective on the small-message path ([`executor::small`];
    /// the caller checked it applies: `st.small` is there, the call is
    /// eligible, its buffers are host memory), recorded as the last
    /// algorithm.
    #[inline(always)]
    pub(crate) fn execute_small(
        &self,
        st: &mut State,
        fp: Fingerprint,
        args: &executor::small::SmallArgs,
    ) -> Result<()> {
        self.last_algorithm.store(SMALL_PATH, Ordering::Relaxed);
        self.numbered(st, |me, st, seq| me.execute_small_seq(st, fp, seq, args))
    }

    #[inline(always)]
    fn execute_small_seq(
        &self,
        st: &mut State,
        fp: Fingerprint,
        seq: u64,
        args: &executor::small::SmallArgs,
    ) -> Result<()> {
        let ids = args.ids;
        // Described with its registered buffers, as it publishes itself.
        let now = self.begin(
            &mut st.control,
            &mut st.control_checked,
            &mut st.clock,
            &mut st.issued,
            &fp,
            seq,
            ids,
        )?;
        let timeout = st.call_timeout.unwrap_or(self.config.timeout);
        let State {
            net,
            control,
            small,
            ..
        } = st;
        let pages = small.as_mut().ok_or_else(|| {
            Error::Protocol("the small-message path without small pages (internal error)".into())
        })?;
        // The whole context only for a wait (see `SmallCtx`).
        let mut cx = executor::small::SmallCtx::new(self.rank, self.nranks, seq, fp, move || {
            let mut cx = self.call_ctx(control, now, timeout, fp, seq, None);
            // No direct steps, but its registered buffers are named.
            cx.ids = ids;
            cx
        });
        executor::small::run(pages, net.host_engine(), &mut cx, args)
    }

    /// A failure elsewhere that was announced while this rank was between
    /// calls fails call `seq` before it sends anything. (Checked at most
    /// once a millisecond: back-to-back calls would otherwise pay a system
    /// call each, and a failure still surfaces in any wait.) Returns the
    /// clock at the call's start.
    #[inline(always)]
    fn notice_before(
        &self,
        control: &mut Control,
        checked: &mut Stamp,
        clock: &mut CallClock,
        fp: &Fingerprint,
        seq: u64,
        ids: u64,
    ) -> Result<Stamp> {
        // One clock read per call: this look, the flight recorder's start
        // and the call's deadline.
        let now = clock.now();
        if now.since(*checked) > CONTROL_LOOK_EVERY {
            *checked = now;
            if let Some(bootstrap::ControlEvent::Notice(n)) = control.poll() {
                // Described as the peers know this call (with its buffers).
                let own = executor::describe(fp, seq, ids);
                let during = executor::CallName { fp: *fp, seq };
                return Err(failure::notice_to_error(
                    n,
                    self.rank,
                    &self.peers,
                    &during.to_string(),
                    &own,
                ));
            }
        }
        Ok(now)
    }

    /// The executor's view of call `seq`.
    fn call_ctx<'a>(
        &'a self,
        control: &'a mut Control,
        started: Stamp,
        timeout: Duration,
        fp: Fingerprint,
        seq: u64,
        direct: Option<DirectCtx<'a>>,
    ) -> CallCtx<'a> {
        let ids = executor::buffer_ids(direct.as_ref());
        CallCtx {
            rank: self.rank,
            nranks: self.nranks,
            dtype: fp.dtype,
            op: fp.op.kernel_op(),
            seq,
            fp,
            started,
            timeout,
            spin: self.config.spin,
            oversubscribed: self.oversubscribed,
            stage_writes: self.config.stage_writes,
            during: executor::CallName { fp, seq },
            peers: &self.peers,
            cache: self.shared_cache,
            control,
            sender: &self.sender,
            abort_fd: self.abort_fd.as_raw_fd(),
            aborted: &self.aborted,
            direct,
            ids,
            flight: &self.flight,
            trace: self.tracer.as_deref(),
        }
    }

    /// One monitored barrier (see `Communicator::monitored_barrier`).
    fn monitored_barrier(&self, st: &mut State, timeout: Duration) -> Result<()> {
        let number = st.monitored;
        st.monitored += 1;
        let during = format!("monitored_barrier #{number}");
        if self.nranks == 1 {
            return Ok(());
        }
        self.sender.lock().unwrap().arrive(number, timeout);
        // The root answers within `timeout` of the first arrival (this rank's
        // at the latest); allow for its latency.
        let until =
            crate::config::value::deadline_after(timeout.saturating_add(Duration::from_secs(2)));
        loop {
            match st.control.poll() {
                Some(bootstrap::ControlEvent::Released(n)) if n == number => return Ok(()),
                Some(bootstrap::ControlEvent::Notice(n)) => {
                    return Err(failure::notice_to_error(
                        n,
                        self.rank,
                        &self.peers,
                        &during,
                        &during,
                    ))
                }
                Some(bootstrap::ControlEvent::RootGone) => {
                    return Err(Error::Bootstrap(format!(
                        "{during}: the communicator's root went away (its process ended), so arrivals cannot be counted"
                    )))
                }
                Some(bootstrap::ControlEvent::Released(_)) | None => {}
            }
            if self.aborted.load(Ordering::Acquire) {
                return Err(Error::Aborted {
                    by: None,
                    world_by: None,
                });
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    during: during.clone(),
                    waiting_for: "the root's count of arrivals".into(),
                    after: timeout,
                    rank: None,
                    world_rank: None,
                });
            }
            crate::sys::wait_readable(
                &[st.control.fd(), self.abort_fd.as_raw_fd()],
                left.min(Duration::from_millis(100)),
            );
        }
    }

    /// The knobs of automatic algorithm choice: the configured ones, the
    /// least cache in the peer table, and whether the single copy pays
    /// (the ranks' agreement, `State::single_copy_pays`).
    pub(crate) fn tuning(&self, single_copy: bool) -> Tuning {
        Tuning {
            oneshot_bytes: self.config.oneshot_bytes,
            single_copy,
            host_cache: self.host_cache,
            ..Tuning::default()
        }
    }

    /// Elements per pipelined chunk for `dtype`.
    pub(crate) fn chunk_elems(&self, dtype: DataType) -> usize {
        (self.config.chunk() / dtype.size()).max(1)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // If this is the last handle, the departure runs here and now, not
        // on the lane's thread while this process may be exiting (see
        // `Lane::gate`).
        let gate = self.inner.lane.gate();
        let _held = gate.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.flush_trace();
        // A clean departure, even after an error: "lost" means crashed.
        if let Ok(mut s) = self.sender.lock() {
            s.goodbye();
        }
        self.state.get_mut().net.close_all();
    }
}
