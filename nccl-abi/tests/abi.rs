//! The C entry points called as a C program would, with threads as ranks:
//! every collective on host memory (in and out of place, results exact),
//! the queries, and the errors (codes and `ncclGetLastError` texts).
//!
//! One test function: the configuration comes from the environment
//! (`OXCCL_SOCKET_IFNAME=lo` keeps traffic on loopback), set once before
//! any rank starts.

use oxccl_nccl::coll::*;
use oxccl_nccl::comm::*;
use oxccl_nccl::config::*;
use oxccl_nccl::device::*;
use oxccl_nccl::group::*;
use oxccl_nccl::id::*;
use oxccl_nccl::init::*;
use oxccl_nccl::mem::*;
use oxccl_nccl::param::*;
use oxccl_nccl::register::*;
use oxccl_nccl::resize::*;
use oxccl_nccl::result::*;
use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};

const FLOAT: i32 = 7;
const SUM: i32 = 0;
const MAX: i32 = 2;

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by this thread's last error.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Run `f(comm, rank)` on `n` ranks (threads) of a fresh communicator.
fn with_ranks(n: usize, f: impl Fn(ncclComm_t, usize) + Sync) {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: room for one id.
    assert_eq!(
        unsafe { ncclGetUniqueId(&mut id) },
        ncclSuccess,
        "{}",
        last_error()
    );
    std::thread::scope(|s| {
        for r in 0..n {
            let f = &f;
            s.spawn(move || {
                let mut comm: ncclComm_t = null_mut();
                // SAFETY: room for a handle; the id is from ncclGetUniqueId.
                let rc = unsafe { ncclCommInitRank(&mut comm, n as c_int, id, r as c_int) };
                assert_eq!(rc, ncclSuccess, "rank {r}: {}", last_error());
                f(comm, r);
                // SAFETY: from ncclCommInitRank.
                assert_eq!(unsafe { ncclCommDestroy(comm) }, ncclSuccess);
            });
        }
    });
}

fn p(v: &[f32]) -> *const c_void {
    v.as_ptr() as *const c_void
}
fn pm(v: &mut [f32]) -> *mut c_void {
    v.as_mut_ptr() as *mut c_void
}

/// Every collective on 3 ranks, checked exactly.
fn collectives() {
    let n = 3;
    with_ranks(n, |comm, r| {
        let (mut got_n, mut got_r) = (0, 0);
        // SAFETY (every call below): buffers of the sizes nccl.h asks for,
        // a live communicator, a NULL stream.
        unsafe {
            assert_eq!(ncclCommCount(comm, &mut got_n), ncclSuccess);
            assert_eq!(ncclCommUserRank(comm, &mut got_r), ncclSuccess);
        }
        assert_eq!((got_n as usize, got_r as usize), (n, r));
        let c = 1000;
        let mine: Vec<f32> = (0..c).map(|i| (r * c + i) as f32).collect();
        let sum: Vec<f32> = (0..c)
            .map(|i| (0..n).map(|k| (k * c + i) as f32).sum())
            .collect();

        let mut out = vec![0f32; c];
        unsafe {
            assert_eq!(
                ncclAllReduce(p(&mine), pm(&mut out), c, FLOAT, SUM, comm, null_mut()),
                0
            )
        };
        assert_eq!(out, sum, "all_reduce");
        let mut inplace = mine.clone();
        let ip = pm(&mut inplace);
        unsafe { assert_eq!(ncclAllReduce(ip, ip, c, FLOAT, MAX, comm, null_mut()), 0) };
        let max: Vec<f32> = (0..c).map(|i| ((n - 1) * c + i) as f32).collect();
        assert_eq!(inplace, max, "all_reduce in place");

        let mut b = vec![0f32; c];
        unsafe {
            assert_eq!(
                ncclBroadcast(p(&mine), pm(&mut b), c, FLOAT, 1, comm, null_mut()),
                0
            )
        };
        let root1: Vec<f32> = (0..c).map(|i| (c + i) as f32).collect();
        assert_eq!(b, root1, "broadcast");
        // Non-roots may pass a NULL sendbuff.
        let mut b2 = vec![0f32; c];
        let s = if r == 2 { p(&mine) } else { null() };
        unsafe {
            assert_eq!(
                ncclBroadcast(s, pm(&mut b2), c, FLOAT, 2, comm, null_mut()),
                0
            )
        };
        assert_eq!(
            b2[c - 1],
            (2 * c + c - 1) as f32,
            "broadcast, NULL sendbuff off the root"
        );
        let mut bc = mine.clone();
        unsafe { assert_eq!(ncclBcast(pm(&mut bc), c, FLOAT, 0, comm, null_mut()), 0) };
        assert_eq!(bc[..3], [0.0, 1.0, 2.0], "bcast");

        // Non-roots may pass a NULL recvbuff.
        let mut red = vec![0f32; c];
        let rb = if r == 2 { pm(&mut red) } else { null_mut() };
        unsafe {
            assert_eq!(
                ncclReduce(p(&mine), rb, c, FLOAT, SUM, 2, comm, null_mut()),
                0
            )
        };
        if r == 2 {
            assert_eq!(red, sum, "reduce");
        }

        let mut all = vec![0f32; n * c];
        unsafe {
            assert_eq!(
                ncclAllGather(p(&mine), pm(&mut all), c, FLOAT, comm, null_mut()),
                0
            )
        };
        let gathered: Vec<f32> = (0..n * c).map(|i| i as f32).collect();
        assert_eq!(all, gathered, "all_gather");
        let mut all_in = vec![0f32; n * c];
        all_in[r * c..(r + 1) * c].copy_from_slice(&mine);
        let base = pm(&mut all_in);
        let own = unsafe { (base as *mut f32).add(r * c) } as *const c_void;
        unsafe { assert_eq!(ncclAllGather(own, base, c, FLOAT, comm, null_mut()), 0) };
        assert_eq!(all_in, gathered, "all_gather in place");

        let input: Vec<f32> = (0..n * c).map(|i| (i + r) as f32).collect();
        let want: Vec<f32> = (0..c)
            .map(|i| (0..n).map(|k| (r * c + i + k) as f32).sum())
            .collect();
        let mut rs = vec![0f32; c];
        unsafe {
            assert_eq!(
                ncclReduceScatter(p(&input), pm(&mut rs), c, FLOAT, SUM, comm, null_mut()),
                0
            )
        };
        assert_eq!(rs, want, "reduce_scatter");
        let mut rs_in = input.clone();
        let base = pm(&mut rs_in);
        let own = unsafe { (base as *mut f32).add(r * c) } as *mut c_void;
        unsafe {
            assert_eq!(
                ncclReduceScatter(base, own, c, FLOAT, SUM, comm, null_mut()),
                0
            )
        };
        assert_eq!(
            rs_in[r * c..(r + 1) * c],
            want[..],
            "reduce_scatter in place"
        );

        // all_to_all: rank r sends r*1000 + j to block j.
        let send: Vec<f32> = (0..n * c).map(|i| (r * 100_000 + i) as f32).collect();
        let mut recv = vec![0f32; n * c];
        unsafe {
            assert_eq!(
                ncclAlltoAll(p(&send), pm(&mut recv), c, FLOAT, comm, null_mut()),
                0
            )
        };
        for k in 0..n {
            assert_eq!(
                recv[k * c],
                (k * 100_000 + r * c) as f32,
                "all_to_all from {k}"
            );
        }
    });
}

/// Groups: a ring exchange of sends and receives with a collective in the
/// same group, and one thread driving two communicators in one group in
/// opposite orders on the two ranks (run one after the other, that would
/// wait forever: each communicator's group runs at the same time).
fn groups() {
    let n = 3;
    with_ranks(n, |comm, r| {
        let mine = vec![r as f32; 100];
        let mut from_prev = vec![0f32; 100];
        let mut sum = vec![0f32; 100];
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        unsafe {
            assert_eq!(ncclGroupStart(), ncclSuccess);
            assert_eq!(
                ncclRecv(
                    pm(&mut from_prev),
                    100,
                    FLOAT,
                    prev as c_int,
                    comm,
                    null_mut()
                ),
                0
            );
            assert_eq!(
                ncclAllReduce(p(&mine), pm(&mut sum), 100, FLOAT, SUM, comm, null_mut()),
                0
            );
            assert_eq!(
                ncclSend(p(&mine), 100, FLOAT, next as c_int, comm, null_mut()),
                0
            );
            // Nothing ran yet.
            assert_eq!(from_prev[0], 0.0);
            assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
        }
        assert_eq!(from_prev, vec![prev as f32; 100]);
        assert_eq!(sum, vec![3.0; 100]);
    });
    // Two communicators of the same two ranks, in one group per thread.
    let mut ids = [ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    }; 2];
    for id in &mut ids {
        assert_eq!(unsafe { ncclGetUniqueId(id) }, ncclSuccess);
    }
    std::thread::scope(|s| {
        for r in 0..2usize {
            let ids = &ids;
            s.spawn(move || {
                let comms: Vec<ncclComm_t> = ids
                    .iter()
                    .map(|id| {
                        let mut c: ncclComm_t = null_mut();
                        assert_eq!(unsafe { ncclCommInitRank(&mut c, 2, *id, r as c_int) }, 0);
                        c
                    })
                    .collect();
                let x = [vec![1f32; 64], vec![10f32; 64]];
                let mut y = [vec![0f32; 64], vec![0f32; 64]];
                let order: [usize; 2] = if r == 0 { [0, 1] } else { [1, 0] };
                unsafe {
                    assert_eq!(ncclGroupStart(), 0);
                    for &k in &order {
                        let (xk, yk) = (p(&x[k]), y[k].as_mut_ptr() as *mut c_void);
                        assert_eq!(
                            ncclAllReduce(xk, yk, 64, FLOAT, SUM, comms[k], null_mut()),
                            0
                        );
                    }
                    assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
                }
                assert_eq!((y[0][0], y[1][63]), (2.0, 20.0));
                for c in comms {
                    assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
                }
            });
        }
    });
    unsafe {
        assert_eq!(ncclGroupEnd(), ncclInvalidUsage);
        assert!(
            last_error().contains("without ncclGroupStart"),
            "{}",
            last_error()
        );
    }
}

/// `ncclCommSplit` (colors, keys reversing the order, a rank with no
/// color) and `ncclCommInitAll` (3 ranks in this thread, driven by one
/// group).
fn split_and_init_all() {
    with_ranks(4, |comm, r| {
        let color = if r == 3 {
            NCCL_SPLIT_NOCOLOR
        } else {
            (r % 2) as c_int
        };
        let mut sub: ncclComm_t = null_mut();
        let rc = unsafe { ncclCommSplit(comm, color, -(r as c_int), &mut sub, null_mut()) };
        assert_eq!(rc, ncclSuccess, "{}", last_error());
        if r == 3 {
            assert!(sub.is_null());
            return;
        }
        let (mut n, mut me) = (0, 0);
        unsafe {
            assert_eq!(ncclCommCount(sub, &mut n), 0);
            assert_eq!(ncclCommUserRank(sub, &mut me), 0);
        }
        // Evens {0, 2} keyed 0, -2: rank 2 first; odds {1}.
        let want = match r {
            0 => (2, 1),
            2 => (2, 0),
            _ => (1, 0),
        };
        assert_eq!((n, me), want, "rank {r}");
        let x = vec![r as f32; 8];
        let mut y = vec![0f32; 8];
        unsafe {
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, FLOAT, SUM, sub, null_mut()),
                0
            );
            assert_eq!(ncclCommDestroy(sub), 0);
        }
        assert_eq!(y[0], if r % 2 == 0 { 2.0 } else { 1.0 });
    });
    let mut comms = [null_mut(); 3];
    unsafe {
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 3, null()),
            ncclSuccess,
            "{}",
            last_error()
        );
    }
    let xs: Vec<Vec<f32>> = (0..3).map(|r| vec![r as f32 + 1.0; 16]).collect();
    let mut ys = vec![vec![0f32; 16]; 3];
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for (r, y) in ys.iter_mut().enumerate() {
            assert_eq!(
                ncclAllReduce(p(&xs[r]), pm(y), 16, FLOAT, SUM, comms[r], null_mut()),
                0
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
        for (r, c) in comms.iter().enumerate() {
            let mut me = -1;
            assert_eq!(ncclCommUserRank(*c, &mut me), 0);
            assert_eq!(me, r as c_int);
            assert_eq!(ncclCommDestroy(*c), 0);
        }
    }
    assert!(ys.iter().all(|y| y == &vec![6f32; 16]));
}

/// Bad calls: each a code and a text that names what was wrong; nothing
/// is sent, so the communicator stays usable.
fn errors() {
    with_ranks(2, |comm, _| {
        let x = vec![1f32; 8];
        let mut y = vec![0f32; 8];
        unsafe {
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, FLOAT, SUM, null_mut(), null_mut()),
                ncclInvalidArgument
            );
            assert!(last_error().contains("comm is NULL"), "{}", last_error());
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, 10, SUM, comm, null_mut()),
                ncclInvalidArgument
            );
            assert!(last_error().contains("float8"), "{}", last_error());
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, 42, SUM, comm, null_mut()),
                ncclInvalidArgument
            );
            assert!(last_error().contains("datatype 42"), "{}", last_error());
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, FLOAT, 5, comm, null_mut()),
                ncclInvalidArgument
            );
            assert!(last_error().contains("operator 5"), "{}", last_error());
            let stream = 0x1000 as cudaStream_t;
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, FLOAT, SUM, comm, stream),
                ncclInvalidUsage
            );
            assert!(last_error().contains("stream"), "{}", last_error());
            assert_eq!(
                ncclAllReduce(null(), pm(&mut y), 8, FLOAT, SUM, comm, null_mut()),
                ncclInvalidArgument
            );
            assert!(
                last_error().contains("sendbuff is NULL"),
                "{}",
                last_error()
            );
            assert_eq!(
                ncclBroadcast(p(&x), pm(&mut y), 8, FLOAT, 7, comm, null_mut()),
                ncclInvalidArgument
            );
            assert!(last_error().contains("root 7"), "{}", last_error());
            // Still usable.
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut y), 8, FLOAT, SUM, comm, null_mut()),
                ncclSuccess
            );
            let mut e = -1;
            assert_eq!(ncclCommGetAsyncError(comm, &mut e), ncclSuccess);
            assert_eq!(e, ncclSuccess);
        }
        assert_eq!(y, vec![2f32; 8]);
    });
    // A mismatch: rank 0 all_reduces while rank 1 broadcasts. Both get
    // ncclInvalidUsage at once, with both calls described.
    with_ranks(2, |comm, r| {
        let x = vec![1f32; 8];
        let mut y = vec![0f32; 8];
        // SAFETY: buffers of 8 floats, a live communicator.
        let rc = unsafe {
            match r {
                0 => ncclAllReduce(p(&x), pm(&mut y), 8, FLOAT, SUM, comm, null_mut()),
                _ => ncclBroadcast(p(&x), pm(&mut y), 8, FLOAT, 0, comm, null_mut()),
            }
        };
        let why = last_error();
        assert_eq!(rc, ncclInvalidUsage, "rank {r}: {why}");
        let lower = why.to_lowercase();
        assert!(
            lower.contains("all_reduce") && lower.contains("broadcast"),
            "rank {r}: {why}"
        );
    });
    let mut comm: ncclComm_t = null_mut();
    let bad = ncclUniqueId {
        internal: [b'x'; NCCL_UNIQUE_ID_BYTES],
    };
    unsafe {
        assert_eq!(ncclCommInitRank(&mut comm, 2, bad, 0), ncclInvalidArgument);
        assert!(last_error().contains("NUL"), "{}", last_error());
        assert_eq!(ncclCommInitRank(&mut comm, 2, bad, 2), ncclInvalidArgument);
        assert!(
            last_error().contains("rank 2 is not a rank of 2"),
            "{}",
            last_error()
        );
        assert_eq!(ncclCommDestroy(null_mut()), ncclInvalidArgument);
        let s = CStr::from_ptr(ncclGetErrorString(ncclRemoteError)).to_string_lossy();
        assert!(s.contains("remote"), "{s}");
        // ncclMemAlloc: page-aligned host memory, usable, freed.
        let mut m: *mut c_void = null_mut();
        assert_eq!(ncclMemAlloc(&mut m, 1 << 20), ncclSuccess);
        assert!(!m.is_null() && (m as usize).is_multiple_of(4096));
        std::ptr::write_bytes(m as *mut u8, 7, 1 << 20);
        assert_eq!(ncclMemFree(m), ncclSuccess);
        assert_eq!(ncclMemAlloc(null_mut(), 8), ncclInvalidArgument);
        let mut v = 0;
        assert_eq!(ncclGetVersion(&mut v), ncclSuccess);
        assert_eq!(v, 23206);
        assert_eq!(pncclGetVersion(&mut v), ncclSuccess);
    }
}

/// One thread creates 3 ranks inside a group (each ncclCommInitRank
/// returns at once; ncclGroupEnd waits for all), then drives an all_reduce
/// on all three in one group; a non-blocking rank in a group: ncclGroupEnd
/// says ncclInProgress until it is made.
fn creation_in_groups() {
    let n = 3;
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    let mut comms = vec![null_mut(); n];
    // SAFETY (every call below): room for the outputs, handles from here,
    // host buffers of the sizes given.
    unsafe {
        assert_eq!(ncclGetUniqueId(&mut id), ncclSuccess);
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(
                ncclCommInitRank(c, n as c_int, id, r as c_int),
                ncclSuccess,
                "{}",
                last_error()
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
        let mut bufs: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32 + 1.0; 64]).collect();
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            assert_eq!(
                ncclAllReduce(p(b), pm(b), 64, FLOAT, SUM, *c, null_mut()),
                ncclSuccess
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
        assert!(bufs.iter().all(|b| b.iter().all(|x| *x == 6.0)), "{bufs:?}");
        for c in comms {
            assert_eq!(ncclCommDestroy(c), ncclSuccess);
        }
    }
    // Non-blocking ranks in a group: the end does not wait for them.
    let mut comms = vec![null_mut(); 2];
    let mut cfg = config_initializer();
    cfg.blocking = 0;
    // SAFETY: as above.
    unsafe {
        assert_eq!(ncclGetUniqueId(&mut id), ncclSuccess);
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(
                ncclCommInitRankConfig(c, 2, id, r as c_int, &mut cfg),
                ncclSuccess
            );
        }
        let end = ncclGroupEnd();
        assert!(
            end == ncclInProgress || end == ncclSuccess,
            "group end {end}"
        );
        for c in &comms {
            let mut state = ncclInProgress;
            while state == ncclInProgress {
                assert_eq!(ncclCommGetAsyncError(*c, &mut state), ncclSuccess);
            }
            assert_eq!(state, ncclSuccess, "{}", last_error());
        }
        for c in comms {
            assert_eq!(ncclCommDestroy(c), ncclSuccess);
        }
    }
}

/// NCCL_CONFIG_INITIALIZER.
fn config_initializer() -> ncclConfig_t {
    let u = UNDEF_INT;
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: NCCL_API_MAGIC,
        version: 23206,
        blocking: u,
        cgaClusterSize: u,
        minCTAs: u,
        maxCTAs: u,
        netName: null(),
        splitShare: u,
        trafficClass: u,
        commName: null(),
        collnetEnable: u,
        CTAPolicy: u,
        shrinkShare: u,
        nvlsCTAs: u,
        nChannelsPerNetPeer: u,
        nvlinkCentricSched: u,
        graphUsageMode: u,
        numRmaCtx: u,
        maxP2pPeers: u,
        graphStreamOrdering: u,
        launchOrderImplicit: u,
        numRmaSig: u,
        rmaEagerInit: u,
        hostCftMode: u,
        nvlsHostMode: u,
    }
}

/// 2 ranks grow to 4: rank 0 makes the id, the 2 new ranks join with it,
/// and all 4 all_reduce on the new communicator. Also
/// ncclCommInitRankScalable (several ids, the first used).
fn grow_and_scalable() {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: room for an id.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, ncclSuccess);
    let (tx, rx) = std::sync::mpsc::channel::<ncclUniqueId>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for r in 0..4usize {
            let (tx, rx) = (tx.clone(), &rx);
            s.spawn(move || {
                // SAFETY (every call below): handles from here, room for
                // outputs, host buffers of the sizes given.
                unsafe {
                    let mut grown = null_mut();
                    if r < 2 {
                        let mut comm = null_mut();
                        assert_eq!(ncclCommInitRank(&mut comm, 2, id, r as c_int), ncclSuccess);
                        let mut gid = ncclUniqueId {
                            internal: [0; NCCL_UNIQUE_ID_BYTES],
                        };
                        let mine = if r == 0 {
                            assert_eq!(
                                ncclCommGetUniqueId(comm, &mut gid),
                                ncclSuccess,
                                "{}",
                                last_error()
                            );
                            assert_eq!(
                                ncclCommGetUniqueId(comm, &mut gid),
                                ncclInvalidUsage,
                                "a second id before a grow"
                            );
                            tx.send(gid).unwrap();
                            tx.send(gid).unwrap();
                            &gid as *const _
                        } else {
                            null()
                        };
                        let rc = ncclCommGrow(comm, 4, mine, -1, &mut grown, null_mut());
                        assert_eq!(rc, ncclSuccess, "rank {r}: {}", last_error());
                        assert_eq!(ncclCommDestroy(comm), ncclSuccess);
                    } else {
                        let gid = rx.lock().unwrap().recv().unwrap();
                        let rc =
                            ncclCommGrow(null_mut(), 4, &gid, r as c_int, &mut grown, null_mut());
                        assert_eq!(rc, ncclSuccess, "new rank {r}: {}", last_error());
                    }
                    let (mut n, mut me) = (0, 0);
                    assert_eq!(ncclCommCount(grown, &mut n), ncclSuccess);
                    assert_eq!(ncclCommUserRank(grown, &mut me), ncclSuccess);
                    assert_eq!((n, me as usize), (4, r));
                    let mut v = vec![r as f32; 8];
                    assert_eq!(
                        ncclAllReduce(p(&v), pm(&mut v), 8, FLOAT, SUM, grown, null_mut()),
                        ncclSuccess
                    );
                    assert_eq!(v, vec![6.0; 8]);
                    assert_eq!(ncclCommDestroy(grown), ncclSuccess);
                }
            });
        }
    });
    // Scalable: 2 ids, every rank passes both.
    let mut ids = [ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    }; 2];
    // SAFETY: room for the ids.
    unsafe {
        assert_eq!(ncclGetUniqueId(&mut ids[0]), ncclSuccess);
        assert_eq!(ncclGetUniqueId(&mut ids[1]), ncclSuccess);
    }
    std::thread::scope(|s| {
        for r in 0..2 {
            let mut ids = ids;
            s.spawn(move || {
                let mut c = null_mut();
                // SAFETY: room for a handle; two ids.
                unsafe {
                    let rc =
                        ncclCommInitRankScalable(&mut c, 2, r, 2, ids.as_mut_ptr(), null_mut());
                    assert_eq!(rc, ncclSuccess, "{}", last_error());
                    assert_eq!(ncclCommDestroy(c), ncclSuccess);
                }
            });
        }
    });
}

/// What a communicator on host memory says of itself (properties, teams),
/// the parameter API, and what is refused with its reason (the device-side
/// API, windows, TLS, simulated group ends), revoke.
fn properties_parameters_and_refusals() {
    with_ranks(2, |comm, r| {
        // SAFETY (every call below): a live communicator, room for the
        // outputs.
        unsafe {
            let mut props: ncclCommProperties_t = std::mem::zeroed();
            props.size = std::mem::size_of::<ncclCommProperties_t>();
            props.magic = NCCL_API_MAGIC;
            assert_eq!(
                ncclCommQueryProperties(comm, &mut props),
                ncclSuccess,
                "{}",
                last_error()
            );
            assert_eq!(
                (props.rank as usize, props.nRanks, props.cudaDev),
                (r, 2, -1)
            );
            assert!(!props.deviceApiSupport && !props.multimemSupport);
            let w = ncclTeamWorld(comm);
            assert_eq!(
                w,
                ncclTeam_t {
                    nRanks: 2,
                    rank: r as c_int,
                    stride: 1
                }
            );
            assert_eq!(
                ncclTeamLsa(comm).nRanks,
                1,
                "no peer memory is load/store reachable"
            );
            assert_eq!(ncclTeamRankToWorld(comm, w, 1 - r as c_int), 1 - r as c_int);
            assert_eq!(ncclTeamRankToLsa(comm, w, 1 - r as c_int), -1);
            assert_eq!(ncclTeamRankToLsa(comm, w, r as c_int), 0);
            let mut dev = std::mem::zeroed::<[u8; 64]>();
            assert_eq!(
                ncclDevCommCreate(comm, null(), dev.as_mut_ptr() as *mut c_void),
                ncclInvalidUsage
            );
            assert!(last_error().contains("device-side API"), "{}", last_error());
            let mut win = null_mut();
            assert_eq!(
                ncclCommWindowRegister(comm, dev.as_mut_ptr() as *mut c_void, 64, &mut win, 0),
                ncclInvalidUsage
            );
            assert_eq!(ncclLLA2ACalcSlots(16, 8), -1);

            // Parameters: BUFFSIZE as a number, its keys listed.
            let mut h = null();
            assert_eq!(
                ncclParamBind(&mut h, c"BUFFSIZE".as_ptr()),
                ncclSuccess,
                "{}",
                last_error()
            );
            let mut v: u64 = 0;
            assert_eq!(ncclParamGetU64(h, &mut v), ncclSuccess, "{}", last_error());
            assert_eq!(v, 65536);
            let mut small: i8 = 0;
            assert_eq!(
                ncclParamGetI8(h, &mut small),
                ncclInvalidArgument,
                "65536 is no i8"
            );
            let (mut table, mut len) = (null(), 0);
            assert_eq!(
                ncclParamGetAllParameterKeys(&mut table, &mut len),
                ncclSuccess
            );
            let keys: Vec<String> = (0..len as usize)
                .map(|i| CStr::from_ptr(*table.add(i)).to_string_lossy().into_owned())
                .collect();
            assert!(keys.contains(&"NCCL_SOCKET_IFNAME".to_string()), "{keys:?}");
            assert_eq!(
                ncclParamBind(&mut h, c"NVLS_ENABLE".as_ptr()),
                ncclInvalidArgument
            );

            let mut enc = ncclEncryptionConfig_t {
                size: 32,
                magic: NCCL_API_MAGIC,
                version: 23206,
                mode: 0,
                psk: null(),
            };
            assert_eq!(ncclSetEncryption(&enc), ncclSuccess);
            enc.mode = 1;
            assert_eq!(ncclSetEncryption(&enc), ncclInvalidUsage);
            let mut sim = ncclSimInfo_t {
                size: 24,
                magic: 0x7468_5283,
                version: 23206,
                estimatedTime: -1.0,
            };
            assert_eq!(ncclGroupStart(), ncclSuccess);
            assert_eq!(ncclGroupSimulateEnd(&mut sim), ncclInvalidUsage);
            assert_eq!(
                ncclGroupEnd(),
                ncclInvalidUsage,
                "the simulated end closed the group"
            );

            // Revoke: calls refused, the state quiescent, then shrink-able.
            let mut x = [1.0f32];
            assert_eq!(ncclCommRevoke(comm, 0), ncclSuccess);
            assert_eq!(
                ncclAllReduce(p(&x), pm(&mut x), 1, FLOAT, SUM, comm, null_mut()),
                ncclInvalidUsage
            );
            assert!(last_error().contains("revoked"), "{}", last_error());
            let mut state = ncclInternalError;
            assert_eq!(ncclCommGetAsyncError(comm, &mut state), ncclSuccess);
            assert_eq!(state, ncclSuccess);
        }
    });
}

#[test]
fn the_c_api_from_threads_as_ranks() {
    // Before any thread reads the environment.
    std::env::set_var("OXCCL_SOCKET_IFNAME", "lo");
    // A group that deadlocked would fail in 30 s rather than hang.
    std::env::set_var("OXCCL_TIMEOUT", "30");
    // NCCL's name for a setting oxccl has (read back as a parameter).
    std::env::set_var("NCCL_BUFFSIZE", "65536");
    collectives();
    groups();
    split_and_init_all();
    errors();
    creation_in_groups();
    grow_and_scalable();
    properties_parameters_and_refusals();
}
