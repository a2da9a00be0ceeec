//! The small-message path: an all_reduce of at most [`SLOT`] bytes per
//! rank among ranks that all share this host, without a schedule,
//! messages or headers.
//!
//! Every rank maps every other's small page (exported through the host's
//! direct access at communicator creation). A page holds two slots, used
//! by calls of even and odd sequence numbers. For call `s` a rank copies
//! its input into its slot `s % 2`, then publishes the call there
//! (fingerprint, `s + 1`: Release); every rank waits until each peer has
//! published the same call in the same slot (Acquire) and combines all
//! slots in rank order into its output, so every rank computes the same
//! bits. It then stores `s + 1` in its `done` word of that parity. A slot
//! is rewritten only once every peer's `done` of its parity has reached
//! the call that last wrote it (usually at once: a peer that published
//! call `s + 1` finished `s`; calls of the general path in between do not
//! prove that, so the word is checked).
//!
//! The checks every wait makes are made here too: a peer that published a
//! different call is `Error::Mismatch`; a peer that runs this sequence
//! number on the general path (it publishes its call in its page when it
//! starts one: [`SmallPages::publish_general`]) is a mismatch as well,
//! since every rank chooses the path from the call and the agreed
//! settings alone. Waiting spins, then sleeps on the peer's slot word with
//! a futex in slices, between which it looks at abort, the deadline, the
//! control plane and whether the peer's process still exists: a dead peer
//! is an error, never a hang.

use super::call::CallCtx;
use super::direct::{describe, reached, SLEEP_SLICE};
use crate::call::{Fingerprint, Kind};
use crate::compute::Compute;
use crate::error::{Error, Result};
use crate::mem::{MemorySpace, Region};
use crate::transport::Mapped;
use crate::wait::{Sleep, Spin};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Largest input per rank the path takes, in bytes.
pub(crate) const SLOT: usize = 4096;

/// Bytes of a small page: a page of control words, then the two slots.
pub(crate) const PAGE: usize = 4096 + 2 * SLOT;

// Control words of a page (each group on its own cache line).
/// Slot `q`'s publication: `[ready: u32 (low half of s + 1), waiters: u32]`
/// at `64 q`, then the fingerprint (two words), `s + 1` and the ids of
/// the registered buffers passed (0: plain memory), as a direct call
/// names them.
const SLOT_WORDS: usize = 0;
/// `done[q]`: `s + 1` of the last call of parity `q` this rank has read.
const DONE: usize = 128;
/// The call this rank runs on the general path: `[s + 1, fp, fp]`.
const GENERAL: usize = 192;
/// The slots' data.
const DATA: usize = 4096;

/// Whether a call takes the small path: the same answer on every rank (it
/// depends on the call and on settings every rank agrees on), so a rank
/// that takes the other path runs a different call.
pub(crate) fn eligible(kind: Kind, bytes: usize, forced: bool) -> bool {
    kind == Kind::AllReduce && bytes > 0 && bytes <= SLOT && !forced
}

/// This host's ranks' small pages (all of the communicator's ranks).
pub(crate) struct SmallPages {
    /// Every rank's page by rank (this rank's own, peers' imported); kept
    /// for their lifetime: `base` points into them.
    _own: Box<dyn Mapped>,
    _peers: Vec<Option<Box<dyn Mapped>>>,
    /// Where each rank's page is mapped here.
    base: Vec<usize>,
    /// `s + 1` of the call that last wrote each of this rank's slots.
    written: [u64; 2],
    /// The slots a call combines (kept: a warm call allocates nothing).
    srcs: Vec<Region>,
}

impl SmallPages {
    pub(crate) fn new(own: Box<dyn Mapped>, peers: Vec<Option<Box<dyn Mapped>>>) -> SmallPages {
        let n = peers.len();
        let base = (0..n)
            .map(|k| match &peers[k] {
                Some(m) => m.region().addr,
                None => own.region().addr,
            })
            .collect();
        SmallPages {
            _own: own,
            _peers: peers,
            base,
            written: [0; 2],
            srcs: Vec::with_capacity(n),
        }
    }

    fn page(&self, rank: usize) -> *mut u8 {
        self.base[rank] as *mut u8
    }

    fn word32(&self, rank: usize, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is a 4-aligned offset inside the mapped page, which
        // lives as long as `self`.
        unsafe { &*(self.page(rank).add(at) as *const AtomicU32) }
    }

    fn word64(&self, rank: usize, at: usize) -> &AtomicU64 {
        // SAFETY: as `word32`, 8-aligned.
        unsafe { &*(self.page(rank).add(at) as *const AtomicU64) }
    }

    fn ready(&self, rank: usize, q: usize) -> &AtomicU32 {
        self.word32(rank, SLOT_WORDS + 64 * q)
    }

    fn waiters(&self, rank: usize, q: usize) -> &AtomicU32 {
        self.word32(rank, SLOT_WORDS + 64 * q + 4)
    }

    /// Slot `q`'s published call: fingerprint words, `s + 1`, buffer ids.
    fn published(&self, rank: usize, q: usize) -> [&AtomicU64; 4] {
        let at = SLOT_WORDS + 64 * q + 8;
        [
            self.word64(rank, at),
            self.word64(rank, at + 8),
            self.word64(rank, at + 16),
            self.word64(rank, at + 24),
        ]
    }

    fn done(&self, rank: usize, q: usize) -> &AtomicU64 {
        self.word64(rank, DONE + 8 * q)
    }

    fn general(&self, rank: usize) -> [&AtomicU64; 3] {
        [
            self.word64(rank, GENERAL),
            self.word64(rank, GENERAL + 8),
            self.word64(rank, GENERAL + 16),
        ]
    }

    fn data(&self, rank: usize, q: usize) -> Region {
        Region {
            space: MemorySpace::Host,
            addr: self.page(rank) as usize + DATA + q * SLOT,
            len: SLOT,
        }
    }

    /// Say that this rank runs call `seq` on the general path (so a peer
    /// waiting for it on the small path reports the mismatch).
    pub(crate) fn publish_general(&self, me: usize, fp: &Fingerprint, seq: u64) {
        let [s, a, b] = self.general(me);
        let [x, y] = fp.to_words();
        a.store(x, Ordering::Relaxed);
        b.store(y, Ordering::Relaxed);
        s.store(seq + 1, Ordering::Release);
    }
}

/// How a peer stands for this call.
enum Peer {
    Ready,
    NotYet,
}

/// All-reduce `input` into `output` (both host memory, `input.len` bytes
/// of whole elements, at most [`SLOT`]) over the small pages; `ids` names
/// the registered buffers passed (as a direct call does); `avg` divides
/// the sum by the number of ranks.
pub(crate) fn all_reduce(
    pages: &mut SmallPages,
    engine: &mut dyn Compute,
    cx: &mut CallCtx<'_>,
    ids: u64,
    input: Region,
    output: Region,
    avg: bool,
) -> Result<()> {
    let (me, n, seq, fp) = (cx.rank, cx.nranks, cx.seq, cx.fp);
    let q = (seq % 2) as usize;
    let target = seq + 1;
    let len = input.len;
    // 1. The slot is free once every peer read what it last held.
    let last = pages.written[q];
    if last != 0 {
        for k in (0..n).filter(|k| *k != me) {
            let read = |p: &SmallPages| {
                Ok(match p.done(k, q).load(Ordering::Acquire) >= last {
                    true => Peer::Ready,
                    false => Peer::NotYet,
                })
            };
            wait_for(pages, cx, k, q, "read this rank's previous part", read)?;
        }
    }
    // 2. The input into the slot, then the call published.
    let mine = Region {
        len,
        ..pages.data(me, q)
    };
    // SAFETY: the caller's input holds `len` readable bytes; the slot is
    // this rank's, `SLOT >= len` bytes, and no peer reads it now (step 1).
    unsafe { std::ptr::copy_nonoverlapping(input.addr as *const u8, mine.addr as *mut u8, len) };
    let [x, y] = fp.to_words();
    let [a, b, s, i] = pages.published(me, q);
    a.store(x, Ordering::Relaxed);
    b.store(y, Ordering::Relaxed);
    s.store(target, Ordering::Relaxed);
    i.store(ids, Ordering::Relaxed);
    pages.ready(me, q).store(target as u32, Ordering::Release);
    fence(Ordering::SeqCst);
    if pages.waiters(me, q).load(Ordering::SeqCst) > 0 {
        crate::sys::futex_wake(pages.ready(me, q));
    }
    pages.written[q] = target;
    // 3. Every peer's part of the same call.
    for k in (0..n).filter(|k| *k != me) {
        let published = |p: &SmallPages| {
            if reached(p.ready(k, q).load(Ordering::Acquire), target as u32)
                && p.published(k, q)[2].load(Ordering::Relaxed) == target
            {
                let [a, b, _, i] = p.published(k, q);
                let their_ids = i.load(Ordering::Relaxed);
                return match Fingerprint::from_words([
                    a.load(Ordering::Relaxed),
                    b.load(Ordering::Relaxed),
                ]) {
                    Some(t) if t.agrees_with(&fp) && their_ids == ids => Ok(Peer::Ready),
                    theirs => Err(mismatch(&fp, ids, k, seq, theirs, their_ids)),
                };
            }
            // A peer on the general path for this call runs another call.
            let [gs, ga, gb] = p.general(k);
            if gs.load(Ordering::Acquire) == target {
                let theirs = Fingerprint::from_words([
                    ga.load(Ordering::Relaxed),
                    gb.load(Ordering::Relaxed),
                ]);
                return Err(mismatch(&fp, ids, k, seq, theirs, 0));
            }
            Ok(Peer::NotYet)
        };
        wait_for(pages, cx, k, q, "publish its part", published)?;
    }
    // 4. Every rank's part, combined in rank order.
    let mut srcs = std::mem::take(&mut pages.srcs);
    srcs.clear();
    srcs.extend((0..n).map(|k| Region {
        len,
        ..pages.data(k, q)
    }));
    let reduced = engine.reduce(cx.dtype, cx.op, output, &srcs);
    pages.srcs = srcs;
    let done = reduced?;
    engine.poll(done)?;
    if avg {
        let d = engine.divide(cx.dtype, output, n)?;
        engine.poll(d)?;
    }
    // 5. Read: the slots of this parity may be rewritten.
    pages.done(me, q).store(target, Ordering::Release);
    Ok(())
}

fn mismatch(
    fp: &Fingerprint,
    ids: u64,
    k: usize,
    seq: u64,
    theirs: Option<Fingerprint>,
    their_ids: u64,
) -> Error {
    Error::Mismatch {
        local: describe(fp, seq, ids),
        peer: k,
        world_peer: k,
        remote: match theirs {
            Some(t) => describe(&t, seq, their_ids),
            None => "something unreadable".into(),
        },
    }
}

/// Wait until `look` says peer `k` is ready: spin, then sleep in slices
/// on the peer's `word` (its `waiters` counted so it wakes us), looking at
/// abort, the deadline, the control plane and the peer's process between
/// slices.
fn wait_for(
    pages: &SmallPages,
    cx: &mut CallCtx<'_>,
    k: usize,
    q: usize,
    what: &str,
    look: impl Fn(&SmallPages) -> Result<Peer>,
) -> Result<()> {
    if let Peer::Ready = look(pages)? {
        return Ok(());
    }
    let mut spin = Spin::new(cx.spin, cx.oversubscribed);
    let sleep = Sleep::new(cx.deadline);
    loop {
        if let Peer::Ready = look(pages)? {
            return Ok(());
        }
        if spin.turn() {
            continue;
        }
        if let Err(stop) = sleep.look(cx.aborted, cx.control.is_gone()) {
            return Err(cx.stopped(stop, |cx| {
                (format!("rank {k} to {what} in {}", cx.during), Some(k))
            }));
        }
        // The peer's slot word wakes sleepers when it publishes; a `done`
        // store wakes none, so a slice bounds that wait.
        let (w, v) = (pages.waiters(k, q), pages.ready(k, q));
        w.fetch_add(1, Ordering::SeqCst);
        let seen = v.load(Ordering::SeqCst);
        if let Peer::NotYet = look(pages)? {
            crate::sys::futex_wait(v, seen, SLEEP_SLICE);
        }
        w.fetch_sub(1, Ordering::SeqCst);
        // A peer that published and then ended (its last call done) is
        // no failure: look before judging.
        if let Peer::Ready = look(pages)? {
            return Ok(());
        }
        cx.after_slice(k)?;
    }
}
