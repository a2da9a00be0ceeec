//! What an algorithm is asked to build: the kind of collective and every
//! argument that shapes one rank's schedule.

/// The kind of a communication call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    AllReduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Broadcast = 4,
    Reduce = 5,
    AllToAll = 6,
    Barrier = 7,
    /// Point-to-point send or receive (numbered per peer pair, not in the
    /// collective sequence).
    P2p = 8,
}

impl Kind {
    /// Every collective kind (not `P2p`, which has no algorithm).
    pub const COLLECTIVES: [Kind; 7] = [
        Kind::AllReduce,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::Broadcast,
        Kind::Reduce,
        Kind::AllToAll,
        Kind::Barrier,
    ];

    /// Decode the wire code.
    pub fn from_code(c: u8) -> Option<Kind> {
        Kind::COLLECTIVES
            .into_iter()
            .chain([Kind::P2p])
            .find(|k| *k as u8 == c)
    }

    /// The snake_case name users know from NCCL (`all_reduce`).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
            Kind::P2p => "send/recv",
        }
    }
}

/// One rank's view of one collective call: what an [`crate::Algorithm`]
/// needs to build that rank's schedule. Equal specs give equal schedules,
/// so a spec (with the algorithm's name) is also the schedule cache key.
///
/// Buffer conventions (NCCL's): `count` is what each rank contributes to an
/// all_gather and receives from a reduce_scatter; all_to_all exchanges
/// `count` elements with each rank. In place, all_gather's input is the
/// output's segment `rank` and reduce_scatter's output is the input's
/// segment `rank`; otherwise input and output are the same memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CollSpec {
    pub kind: Kind,
    pub rank: usize,
    pub nranks: usize,
    /// The NCCL-style count (see above).
    pub count: usize,
    /// Root of broadcast and reduce (0 otherwise).
    pub root: usize,
    /// The reduction is an average: divide once, by `nranks`, at the end.
    pub avg: bool,
    /// Input and output share memory (see above).
    pub in_place: bool,
    /// Elements per pipelined message.
    pub chunk: usize,
    /// Bytes per element (for size thresholds).
    pub elem_size: usize,
    /// Every rank can reach every other rank's buffers of this call
    /// directly (registered memory on a direct-access transport), and how.
    pub direct: Option<Access>,
    /// How ranks are spread over hosts, when every host has as many of
    /// them in one of the placements launchers use (for hierarchical
    /// algorithms); `None` when unknown or irregular.
    pub layout: Option<Layout>,
    /// Elements of shared memory ([`crate::SHARED`]) each rank has and
    /// every peer maps (ranks of one host); 0 when there is none.
    pub shared: usize,
    /// Every rank can copy from every other rank's plain (unregistered)
    /// buffers of this call: ranks of one host whose kernel lets them read
    /// each other's memory (cross-memory attach). Such a copy is a
    /// `CopyFrom` of a peer's `INPUT` or `OUTPUT` between `Sync`s, as on
    /// mapped memory, but only reads: no `ReduceFrom`, no `CopyTo`.
    pub plain_reads: bool,
}

/// Ranks spread evenly over hosts: `per_host` on each, in blocks (rank `r`
/// on host `r / per_host`: `mpirun`'s and `srun`'s default) or round robin
/// (rank `r` on host `r % hosts`: `srun --distribution=cyclic`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Ranks per host (at least 1; divides the rank count).
    pub per_host: usize,
    /// Round robin rather than blocks.
    pub cyclic: bool,
}

impl Layout {
    /// The layout of ranks on hosts `host[r]` (any host identities), when
    /// it is one: every host has as many ranks, in blocks or round robin
    /// (blocks when both fit: one host, or one rank per host).
    pub fn of_hosts<T: Eq + std::hash::Hash>(host: &[T]) -> Option<Layout> {
        let n = host.len();
        let hosts = host.iter().collect::<std::collections::HashSet<_>>().len();
        if n == 0 || !n.is_multiple_of(hosts) {
            return None;
        }
        let per_host = n / hosts;
        let blocks = (0..n).all(|r| host[r] == host[r - r % per_host]);
        let cyclic = (0..n).all(|r| host[r] == host[r % hosts]);
        match (blocks, cyclic) {
            (true, _) => Some(Layout {
                per_host,
                cyclic: false,
            }),
            (false, true) => Some(Layout {
                per_host,
                cyclic: true,
            }),
            _ => None,
        }
    }

    /// Hosts of an `n`-rank job.
    pub fn hosts(&self, n: usize) -> usize {
        n / self.per_host.max(1)
    }

    /// `(host, local index)` of rank `r` of `n`.
    pub fn place(&self, r: usize, n: usize) -> (usize, usize) {
        let (hosts, per) = (self.hosts(n), self.per_host.max(1));
        if self.cyclic {
            (r % hosts, r / hosts)
        } else {
            (r / per, r % per)
        }
    }

    /// The rank with local index `local` on host `host` of an `n`-rank job.
    pub fn rank(&self, host: usize, local: usize, n: usize) -> usize {
        if self.cyclic {
            local * self.hosts(n) + host
        } else {
            host * self.per_host + local
        }
    }
}

/// How a rank reaches its peers' registered buffers in a direct call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Mapped into this process: loads and stores, with phase flags in
    /// pages every rank maps (shared memory; CUDA IPC next).
    Mapped,
    /// Through the link to the peer, with one-sided reads that complete
    /// asynchronously; phases are zero-length messages (RDMA).
    OneSided,
}

impl CollSpec {
    /// A spec with the common defaults: no root, no average, out of place,
    /// 4-byte elements, one chunk of everything, no direct access.
    pub fn new(kind: Kind, rank: usize, nranks: usize, count: usize) -> CollSpec {
        CollSpec {
            kind,
            rank,
            nranks,
            count,
            root: 0,
            avg: false,
            in_place: false,
            chunk: usize::MAX,
            elem_size: 4,
            direct: None,
            layout: None,
            shared: 0,
            plain_reads: false,
        }
    }

    /// Bytes each rank contributes (what size thresholds compare).
    pub fn bytes(&self) -> usize {
        self.count.saturating_mul(self.elem_size)
    }

    /// Elements of the input buffer.
    pub fn input_len(&self) -> usize {
        match self.kind {
            Kind::ReduceScatter | Kind::AllToAll => self.nranks * self.count,
            Kind::Barrier | Kind::P2p => 0,
            _ => self.count,
        }
    }

    /// Elements of the output buffer.
    pub fn output_len(&self) -> usize {
        match self.kind {
            Kind::AllGather | Kind::AllToAll => self.nranks * self.count,
            Kind::Barrier | Kind::P2p => 0,
            _ => self.count,
        }
    }

    /// In place: where the input lies in the output (`Some(offset)`), or the
    /// output in the input (`Err(offset)`) — the memory both share.
    pub fn in_place_offset(&self) -> std::result::Result<usize, usize> {
        match self.kind {
            Kind::AllGather => Ok(self.rank * self.count),
            Kind::ReduceScatter => Err(self.rank * self.count),
            _ => Ok(0),
        }
    }
}

/// Knobs of automatic choice (`OXCCL_ONESHOT_BYTES`; a cost model later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Largest all_reduce (bytes per rank) for the one-shot algorithm.
    pub oneshot_bytes: usize,
    /// Smallest all_reduce (bytes per rank) for the copy-in algorithm.
    pub copyin_bytes: usize,
    /// Whether the kernel's copy between processes pays on this host, so
    /// that calls [`CollSpec::plain_reads`] allows prefer the single copy
    /// at its sizes: the ranks' agreement at creation (timed there, or
    /// forced by `OXCCL_CMA=on`). Without it the single copy runs only
    /// when forced by name.
    pub single_copy: bool,
    /// The least last-level cache (bytes) among the ranks, as they
    /// reported it at bootstrap (every rank sees the same table).
    pub host_cache: Option<usize>,
}

impl Tuning {
    /// Smallest all_gather output (bytes) for the copy-in algorithm on
    /// `nranks` ranks: its all_reduce threshold four times over
    /// (docs/PERFORMANCE.md, tenth round; below it the ring, or on 2 ranks
    /// the single copy), and on 2 ranks at least half the host's cache.
    /// Two ranks' ring holds its own hand-offs in a cache that holds the
    /// outputs: with 8 MiB the copy-in led from 4 MiB of output (0.48x the
    /// ring's time), with 32 MiB the ring led at 4 MiB (0.41-0.85x the
    /// copy-in's), was level at 8 and behind from 16 (fifteenth round).
    /// Four ranks on two cores: the copy-in led from 2 MiB with either
    /// cache.
    pub fn copyin_gather_bytes(&self, nranks: usize) -> usize {
        let least = self.copyin_bytes.saturating_mul(4);
        match (nranks, self.host_cache) {
            (2, Some(cache)) => least.max(cache / 2),
            _ => least,
        }
    }

    /// Smallest broadcast (bytes) for the copy-in algorithm on `nranks`
    /// ranks (3 or more): its all_reduce threshold, and at least what
    /// fills the host's cache with every rank's copy. Below it the tree
    /// and the chain hand each piece on while it is cached; above, the
    /// copy-in's single staging wins. 4 ranks, in place: with 8 MiB of
    /// cache the copy-in took 0.84-0.91x the chain's time at 1 MiB and
    /// 0.44-0.51x at 4 (tenth round); with 32 MiB the tree took 0.3-0.4x
    /// the copy-in's at 1 MiB, 0.6-0.8x at 4, and the copy-in led from 8
    /// (fifteenth round).
    pub fn copyin_broadcast_bytes(&self, nranks: usize) -> usize {
        match self.host_cache {
            Some(cache) => self.copyin_bytes.max(cache / nranks.max(1)),
            None => self.copyin_bytes,
        }
    }
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            oneshot_bytes: 16 << 10,
            copyin_bytes: 1 << 20,
            single_copy: true,
            host_cache: None,
        }
    }
}
