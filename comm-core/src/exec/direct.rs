//! Direct access in the executor: where a span of a peer's registered
//! buffer lies (mapped in this process, or remote behind a one-sided
//! link, or, for plain buffers of ranks of one host, at an address in the
//! peer's process that the kernel copies from), and the `Sync` phases of
//! mapped access. (One-sided schedules have no `Sync`: their phases are
//! messages.)
//!
//! A phase is a counter per rank in a flag page every local rank maps
//! (exported and imported through the transports' [`DirectAccess`]). A rank
//! reaching the k-th `Sync` of a call stores `base + k + 1` in its counter
//! (Release) and wakes sleepers; the `Sync` completes when every peer's
//! counter has reached it (Acquire), so what each rank wrote before is
//! visible to all after. At the first `Sync` each rank also publishes its
//! call (fingerprint, sequence number, buffer ids) and checks everyone's:
//! a disagreement is `Error::Mismatch`. A call whose peers read its plain
//! buffers also publishes where they lie in its process (the words stay
//! valid until the last `Sync`, which no rank passes while a peer may
//! still read). Waiting spins in the executor, then
//! sleeps on the lagging peer's counter with a futex in 2 ms slices, between
//! which the executor checks the deadline, `abort()`, the control plane and
//! whether the peer's process still exists: a dead peer is an error, never
//! a hang.
//!
//! [`DirectAccess`]: crate::transport::DirectAccess

use super::call::describe_call;
use super::small::SmallPages;
use crate::algorithms::SHARED;
use crate::call::Fingerprint;
use crate::error::{Error, Result};
use crate::mem::shared::SharedMaps;
use crate::mem::Region;
use crate::transport::{Mapped, PeerMemory, RemoteMemory};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long one futex sleep lasts before the waiter looks around.
pub(crate) const SLEEP_SLICE: Duration = Duration::from_millis(2);

/// Every local rank's flag page (this rank's own, peers' imported).
pub(crate) struct SyncFlags {
    own: Box<dyn Mapped>,
    peers: Vec<Option<Box<dyn Mapped>>>,
}

impl SyncFlags {
    pub(crate) fn new(own: Box<dyn Mapped>, peers: Vec<Option<Box<dyn Mapped>>>) -> SyncFlags {
        SyncFlags { own, peers }
    }

    fn page(&self, rank: usize) -> *mut u8 {
        match self.peers.get(rank).and_then(|p| p.as_ref()) {
            Some(m) => m.region().ptr(),
            None => self.own.region().ptr(),
        }
    }
    fn phase(&self, rank: usize) -> &AtomicU32 {
        // SAFETY: offset 0 of a mapped, page-aligned flag page that lives as
        // long as `self`.
        unsafe { &*(self.page(rank) as *const AtomicU32) }
    }
    fn waiters(&self, rank: usize) -> &AtomicU32 {
        // SAFETY: offset 4 of the page.
        unsafe { &*(self.page(rank).add(4) as *const AtomicU32) }
    }
    fn call(&self, rank: usize) -> &[AtomicU64; 4] {
        // SAFETY: offsets 8..40 of the page, 8-byte aligned.
        unsafe { &*(self.page(rank).add(8) as *const [AtomicU64; 4]) }
    }
    /// The plain buffers of the rank's call: input address and length,
    /// output address and length (bytes, in its process).
    fn buffers(&self, rank: usize) -> &[AtomicU64; 4] {
        // SAFETY: offsets 40..72 of the page, 8-byte aligned.
        unsafe { &*(self.page(rank).add(40) as *const [AtomicU64; 4]) }
    }
}

/// Bytes of a flag page.
pub(crate) const FLAG_PAGE: usize = 4096;

/// Bytes of each rank's shared memory for copy-in schedules: two pieces
/// (see [`crate::algorithms::copyin`]). Pages are touched only when used.
pub(crate) const SHARED_BYTES: usize = 4 << 20;

/// The shared memory, over all of a host's ranks, that copy-in schedules
/// use when the configuration does not say (`Config::copyin_memory`): a
/// quarter of the last-level cache (`llc`), so that the pieces in flight
/// stay cached beside the inputs and outputs streaming past them; 8 MiB
/// when the cache is not known. Measured (256 MiB all_reduce, busbw GB/s):
/// with a 32 MiB cache, 4 ranks 4.12 with 8 MiB (medians of 6), 3.52 with
/// 16, 3.93 with 4; 2 ranks 6.35 with 8, 6.22 with 4. With an 8 MiB cache
/// (a virtual machine's share of a larger one), 8 MiB against 2 (medians
/// of 5 alternating runs): 2 ranks 2.22 against 3.82, 4 ranks 1.44
/// against 2.31 (docs/PERFORMANCE.md, eighth round).
pub(crate) fn copyin_memory(llc: Option<usize>) -> usize {
    llc.map_or(8 << 20, |c| (c / 4).max(256 << 10))
}

/// The least shared memory copy-in schedules are given, over all ranks
/// (`OXCCL_COPYIN_MEMORY`'s minimum).
pub(crate) const COPYIN_MIN: usize = 64 << 10;

/// The bytes of shared memory a copy-in schedule of `n` ranks uses, of
/// `total` agreed over all of them: an equal share each, at most
/// [`SHARED_BYTES`].
pub(crate) fn shared_bytes(n: usize, total: usize) -> usize {
    (total / n.max(1)).min(SHARED_BYTES)
}

/// Where a span of a peer's buffer lies.
pub(crate) enum PeerSpan {
    /// Mapped here (or this rank's own).
    Mapped(Region),
    /// In the peer's process, read through the link to it.
    Remote(RemoteMemory),
    /// In the peer's process at `addr` (its plain buffer), copied from by
    /// the kernel (cross-memory attach).
    Process { pid: u32, addr: u64 },
}

/// The plain buffers of a call whose peers read them, and who the peers
/// are.
pub(crate) struct PlainReads<'a> {
    /// Every rank's process id.
    pub pids: &'a [u32],
    /// This rank's input and output.
    pub bufs: [Region; 2],
}

/// One call's direct-access context.
pub(crate) struct DirectCtx<'a> {
    /// The phase flags (mapped access; `None` for one-sided access).
    pub flags: Option<&'a SyncFlags>,
    /// Every rank's phase counter stood here before this call.
    pub base: u32,
    /// The registered buffers behind INPUT and OUTPUT (None: plain memory).
    pub maps: [Option<Arc<SharedMaps>>; 2],
    /// Every rank's shared memory of copy-in schedules ([`SHARED`]), when
    /// the ranks map each other's.
    pub shared: Option<&'a SharedMaps>,
    /// Every rank's small page (ranks of one host), where each publishes
    /// the general call it runs: a peer exchanging messages in this call
    /// would never reach its phases.
    pub small: Option<&'a SmallPages>,
    /// The call's plain buffers, when its peers read them (ranks of one
    /// host that agreed at creation that the kernel lets them).
    pub plain: Option<PlainReads<'a>>,
}

impl DirectCtx<'_> {
    /// Ids of the call's registered buffers, as the first phase checks them.
    pub(super) fn ids(&self) -> u64 {
        let id = |m: &Option<Arc<SharedMaps>>| m.as_ref().map_or(0, |m| m.id);
        id(&self.maps[0]) << 32 | id(&self.maps[1]) & 0xffff_ffff
    }

    /// The phase flags, which a `Sync` step needs.
    pub fn flags(&self) -> Result<&SyncFlags> {
        self.flags.ok_or_else(|| {
            Error::Protocol(
                "a Sync step on one-sided direct access, whose phases are messages (internal error)"
                    .into(),
            )
        })
    }

    /// The first `bytes` of this rank's shared memory ([`SHARED`]).
    pub fn shared_own(&self, bytes: usize) -> Result<Region> {
        match self.shared.map(|m| m.own.region()) {
            Some(r) if r.len >= bytes => Ok(r.sub(0, bytes)),
            _ => Err(Error::Protocol(format!(
                "a schedule uses {bytes} bytes of shared memory, which this communicator has not (internal error)"
            ))),
        }
    }

    /// Where span bytes `[off, off+len)` of this rank's buffer `buf`
    /// (`mine`, already resolved here) lie in rank `peer`'s copy of it.
    pub fn peer_span(&self, buf: u16, mine: Region, peer: usize) -> Result<PeerSpan> {
        let m = match buf {
            SHARED => self.shared,
            b => self.maps.get(b as usize).and_then(|m| m.as_deref()),
        };
        if let (None, Some(p)) = (m, &self.plain) {
            return self.plain_span(p, buf, mine, peer);
        }
        let m = m
            .filter(|m| m.zero_copy)
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "a direct step reads buffer {buf}, which is not registered for direct access (internal error)"
                ))
            })?;
        let own = m.own.region();
        let off = mine.addr - own.addr;
        match m.peers.get(peer).and_then(|p| p.as_ref()) {
            // The mapping's own space: host pages for shared memory, this
            // rank's device for CUDA IPC (an engine checks what it reaches).
            Some(PeerMemory::Mapped(p)) => Ok(PeerSpan::Mapped(Region {
                space: p.region().space,
                addr: p.region().addr + off,
                len: mine.len,
            })),
            Some(PeerMemory::Remote(r)) => {
                r.sub(off, mine.len).map(PeerSpan::Remote).ok_or_else(|| {
                    Error::Protocol(format!(
                        "a direct step reads past rank {peer}'s registered buffer (internal error)"
                    ))
                })
            }
            None => Ok(PeerSpan::Mapped(mine)),
        }
    }
}

impl DirectCtx<'_> {
    /// Where span `mine` of this rank's plain buffer `buf` lies in rank
    /// `peer`'s process: at the same offset of the buffer the peer
    /// published at the call's first `Sync` (which must have passed).
    fn plain_span(
        &self,
        p: &PlainReads<'_>,
        buf: u16,
        mine: Region,
        peer: usize,
    ) -> Result<PeerSpan> {
        let internal = |what: String| Err(Error::Protocol(format!("{what} (internal error)")));
        let Some(own) = p.bufs.get(buf as usize) else {
            return internal(format!(
                "a direct step reads buffer {buf} of a peer's plain call"
            ));
        };
        let Some(off) = mine
            .addr
            .checked_sub(own.addr)
            .filter(|o| o + mine.len <= own.len)
        else {
            return internal(format!("a direct step reads outside buffer {buf}"));
        };
        if p.pids.len() <= peer {
            return internal(format!(
                "a direct step reads rank {peer}, which is not a peer"
            ));
        }
        let words = self.flags()?.buffers(peer);
        let i = 2 * buf as usize;
        let (addr, len) = (
            words[i].load(Ordering::Relaxed),
            words[i + 1].load(Ordering::Relaxed),
        );
        // The peer's buffer has this call's shape (the first phase checked
        // the fingerprint), so the span fits; a length that says otherwise
        // is a peer misbehaving, not a read to attempt.
        if (off + mine.len) as u64 > len {
            return Err(Error::Protocol(format!(
                "rank {peer} published a {len}-byte buffer {buf} for a call that reads {} bytes of it",
                off + mine.len
            )));
        }
        Ok(PeerSpan::Process {
            pid: p.pids[peer],
            // (A bogus address from a misbehaving peer wraps here and is
            // refused by the kernel, an error naming the peer.)
            addr: addr.wrapping_add(off as u64),
        })
    }
}

/// Whether a phase counter at `v` has reached `target`, across wraparound.
pub(crate) fn reached(v: u32, target: u32) -> bool {
    v.wrapping_sub(target) as i32 >= 0
}

/// The ids of a call's registered buffers as it publishes them (0: none).
pub(crate) fn buffer_ids(direct: Option<&DirectCtx<'_>>) -> u64 {
    direct.map_or(0, |dx| dx.ids())
}

/// How a rank describes a call in mismatch reports: as it publishes it
/// (with the ids of its registered buffers), so a relayed report can be
/// matched to the right side.
pub(crate) fn describe(fp: &Fingerprint, seq: u64, ids: u64) -> String {
    if ids == 0 {
        return describe_call(fp, seq);
    }
    format!(
        "{} on registered buffers {}/{}",
        describe_call(fp, seq),
        ids >> 32,
        ids & 0xffff_ffff
    )
}

/// Publish this rank's arrival at phase `target` (and, at the call's first
/// phase, the call itself) and wake peers sleeping on it.
pub(crate) fn arrive(
    dx: &DirectCtx<'_>,
    me: usize,
    target: u32,
    first: Option<(Fingerprint, u64)>,
) -> Result<()> {
    let f = dx.flags()?;
    if let Some((fp, seq)) = first {
        let call = f.call(me);
        let [x, y] = fp.to_words();
        call[0].store(x, Ordering::Relaxed);
        call[1].store(y, Ordering::Relaxed);
        call[2].store(seq, Ordering::Relaxed);
        call[3].store(dx.ids(), Ordering::Relaxed);
        if let Some(p) = &dx.plain {
            let words = f.buffers(me);
            for (i, r) in p.bufs.iter().enumerate() {
                words[2 * i].store(r.addr as u64, Ordering::Relaxed);
                words[2 * i + 1].store(r.len as u64, Ordering::Relaxed);
            }
        }
    }
    f.phase(me).store(target, Ordering::Release);
    fence(Ordering::SeqCst);
    if f.waiters(me).load(Ordering::SeqCst) > 0 {
        crate::sys::futex_wake(f.phase(me));
    }
    Ok(())
}

/// The first peer that has not reached `target`, or `None` when all have.
/// At the first phase (`first`), each peer's published call is checked as
/// soon as it has arrived: a different call is `Error::Mismatch`.
pub(crate) fn lagging(
    dx: &DirectCtx<'_>,
    me: usize,
    n: usize,
    target: u32,
    first: Option<(Fingerprint, u64)>,
) -> Result<Option<usize>> {
    let f = dx.flags()?;
    for k in (0..n).filter(|k| *k != me) {
        if !reached(f.phase(k).load(Ordering::Acquire), target) {
            // A peer running this call with messages never arrives (its
            // buffers are not of the kind ours are: plain, registered or
            // device memory, so it chose another algorithm).
            if let (Some((fp, seq)), Some(p)) = (first, dx.small) {
                if let Some((theirs, false)) = p.general_call(k, seq) {
                    return Err(Error::Mismatch {
                        local: describe(&fp, seq, dx.ids()),
                        peer: k,
                        world_peer: k,
                        remote: match theirs {
                            Some(t) => format!(
                                "{} exchanging messages (other kinds of buffers)",
                                describe(&t, seq, 0)
                            ),
                            None => "something unreadable".into(),
                        },
                    });
                }
            }
            return Ok(Some(k));
        }
        if let Some((fp, seq)) = first {
            let c = f.call(k);
            let theirs = Fingerprint::from_words([
                c[0].load(Ordering::Relaxed),
                c[1].load(Ordering::Relaxed),
            ]);
            let (their_seq, their_ids) =
                (c[2].load(Ordering::Relaxed), c[3].load(Ordering::Relaxed));
            let ids = dx.ids();
            if !(theirs.is_some_and(|t| t.agrees_with(&fp)) && their_seq == seq && their_ids == ids)
            {
                return Err(Error::Mismatch {
                    local: describe(&fp, seq, ids),
                    peer: k,
                    world_peer: k,
                    remote: match theirs {
                        Some(t) => describe(&t, their_seq, their_ids),
                        None => "something unreadable".into(),
                    },
                });
            }
        }
    }
    Ok(None)
}

/// Sleep one slice on `peer`'s phase counter while it is below `target`.
pub(crate) fn sleep_on(dx: &DirectCtx<'_>, peer: usize, target: u32) -> Result<()> {
    let f = dx.flags()?;
    let (word, waiters) = (f.phase(peer), f.waiters(peer));
    waiters.fetch_add(1, Ordering::SeqCst);
    let v = word.load(Ordering::SeqCst);
    if !reached(v, target) {
        crate::sys::futex_wait(word, v, SLEEP_SLICE);
    }
    waiters.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{copyin_memory, reached, shared_bytes, SHARED_BYTES};

    #[test]
    fn the_copy_in_takes_a_quarter_of_the_cache_within_what_is_exported() {
        // The 32 MiB cache it was tuned on keeps its 8 MiB; an 8 MiB one
        // gets 2; unknown, 8; a tiny one no less than 256 KiB.
        assert_eq!(copyin_memory(Some(32 << 20)), 8 << 20);
        assert_eq!(copyin_memory(Some(8 << 20)), 2 << 20);
        assert_eq!(copyin_memory(None), 8 << 20);
        assert_eq!(copyin_memory(Some(512 << 10)), 256 << 10);
        // An equal share each, never more than a rank exported.
        assert_eq!(shared_bytes(4, 8 << 20), 2 << 20);
        assert_eq!(shared_bytes(2, 64 << 20), SHARED_BYTES);
    }

    #[test]
    fn phase_comparison_survives_wraparound() {
        assert!(reached(5, 5));
        assert!(!reached(4, 5));
        assert!(reached(2, u32::MAX - 1));
        assert!(!reached(u32::MAX - 2, 1));
    }
}
