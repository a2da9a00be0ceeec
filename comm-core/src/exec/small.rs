//! The small-message path: a collective whose input is at most [`SLOT`]
//! bytes per rank among ranks that all share this host, without a
//! schedule, messages or headers. Every collective takes it (all_reduce,
//! all_gather, reduce_scatter, broadcast, reduce, all_to_all, barrier).
//!
//! Every rank maps every other's small page (exported through the host's
//! direct access at communicator creation). A page holds [`DEPTH`] slots;
//! call `s` uses slot `s % DEPTH`. For call `s` every rank copies its
//! whole input into that slot (a broadcast's receivers copy nothing; up
//! to [`INLINE`] bytes go in the cache line that publishes the call),
//! then publishes the call there (fingerprint, `s + 1`: Release). Every
//! rank waits until each peer it reads (all of them; a broadcast's
//! receivers only the root; a reduce's root all, its other ranks none) has
//! published the same call in the same slot (Acquire), and builds its
//! output from those slots: reductions combine in rank order, so every
//! rank computes the same bits; gathers and exchanges copy their part. It
//! has then finished the call, whether it read or not (calls finish in
//! order), and says so in its `finished` word (`s + 1`, stored every
//! [`FINISH_EVERY`] calls and before any wait). A slot is rewritten only
//! once every peer's `finished` has reached the call that last wrote it;
//! the writer keeps the value it last read, so with peers close behind it
//! reads a peer's word about once in `DEPTH` calls. A rank that reads nothing (a
//! reduce's non-root, a broadcast's root) returns once its part is
//! published, as an eager send does; the wait for `finished` `DEPTH` calls
//! later bounds how far it runs ahead (`DEPTH - FINISH_EVERY` calls past
//! a peer that stopped calling).
//!
//! The checks every wait makes are made here too: a peer that published a
//! different call is `Error::Mismatch`; a peer that runs this sequence
//! number on the general path (it publishes its call in its page when it
//! starts one: [`SmallPages::publish_general`]) is a mismatch as well,
//! since every rank chooses the path from the call and the agreed
//! settings alone. (A rank that reads nothing checks nothing: its peers
//! that read it report the mismatch.) Waiting spins, then sleeps on the
//! peer's slot word with a futex in slices, between which it looks at
//! abort, the deadline, the control plane and whether the peer's process
//! still exists: a dead peer is an error, never a hang.

use super::call::CallCtx;
use super::direct::{describe, reached, SLEEP_SLICE};
use crate::call::{Fingerprint, Kind};
use crate::compute::{Compute, Pending};
use crate::error::{Error, Result};
use crate::mem::{MemorySpace, Region};
use crate::transport::Mapped;
use crate::wait::{Sleep, Spin};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Largest input per rank the path takes, in bytes.
pub(crate) const SLOT: usize = 4096;

/// Slots per page: calls `s` use slot `s % DEPTH`, so a rank that reads
/// nothing (a broadcast's root, a reduce's other ranks) runs up to
/// `DEPTH - 1` calls ahead of its slowest peer, as an eager send does.
/// (8 B broadcasts on 4 ranks sharing 2 cores: 1.2 us a call with 8
/// slots, 0.7-0.8 with 32: a rank runs more calls per time slice. 64 and
/// 128 measured within noise of 32 while `finished` was stored every
/// call; once it lagged by [`FINISH_EVERY`], 64 took 4-rank 8-byte
/// broadcast and reduce 16-19 % below 32, paired, 2 ranks unchanged.
/// A page is 264 KiB.)
const DEPTH: usize = 64;

/// Calls a rank finishes before it stores its `finished` word. Storing it
/// after every call took a cache-line transfer per call whenever a peer
/// that runs ahead (a broadcast's root) was polling the word for a free
/// slot (2-rank 8-byte broadcast 6-11 % faster with 4, paired; 8 took
/// 7-10 % more off a reduce, whose root's word its other rank polls; 16
/// measured no better than 8). A rank stores what it finished before it
/// waits for anything and when it starts a call on the general path, so
/// a peer never waits for a word this rank holds back while it waits
/// itself; a rank that reads nothing may now run `DEPTH - FINISH_EVERY`
/// calls ahead of an idle peer rather than `DEPTH - 1` (a program that
/// needs a rank to run further ahead than that, while its peer waits
/// for it elsewhere, deadlocks with any window).
const FINISH_EVERY: u32 = 8;

/// How many calls ahead a rank takes its publication line back for
/// writing. The line a call publishes in was last read by the peers
/// `DEPTH` calls ago and sits in their caches; writing it makes the
/// store wait for their copies to be invalidated, which with the ranks
/// on two caches (the 2-rank 8-byte broadcast's root, a reduce's other
/// rank) held up every call. Taking it two calls early overlaps that with
/// the calls between: 2-rank 8-byte broadcast on two caches 0.196-0.199
/// -> 0.149-0.164 us, reduce 0.189-0.190 -> 0.158-0.160, one binary with
/// the claim switched (docs/PERFORMANCE.md, twenty-first round); 4 or 8
/// calls ahead no better, one cache and 4 ranks unchanged. The peers
/// read that slot's last call long ago (a rank runs at most
/// `DEPTH - FINISH_EVERY` calls ahead), and the hint changes no value.
const CLAIM_AHEAD: usize = 2;

/// Bytes of a small page: the control words (a page), then the slots.
pub(crate) const PAGE: usize = DATA + DEPTH * SLOT;

// Control words of a page (each group on its own cache line).
/// Slot `q`'s publication: `[ready: u32 (low half of s + 1), unused: u32]`
/// at `64 q`, then the fingerprint (two words), `s + 1` and the ids of
/// the registered buffers passed (0: plain memory), as a direct call
/// names them; then, at [`INLINE_AT`], the data of a call whose slot
/// bytes fit in [`INLINE`].
const SLOT_WORDS: usize = 0;
/// Where a slot's publication line keeps inline data, and how much.
/// A reader fetches the line that says the call is published anyway:
/// with the data in it, an 8-byte call moves one cache line from writer
/// to reader instead of two (the data line's transfer was about a tenth
/// of a 2-rank 8-byte all_reduce, `perf`).
const INLINE_AT: usize = 40;
const INLINE: usize = 64 - INLINE_AT;
/// `[finished: u32 (low half of s + 1 of the last call this rank
/// finished on this path; calls finish in order)]`.
const FINISHED: usize = 64 * DEPTH;
/// The call this rank runs on the general path: `[s + 1, fp, fp]`, with
/// [`PHASED`] set in `s + 1` when it runs in phases (direct steps).
const GENERAL: usize = FINISHED + 64;
/// The flag of a general call that runs in phases rather than messages.
const PHASED: u64 = 1 << 63;
/// `[ready sleepers: u32, finished sleepers: u32]`: peers asleep on any
/// slot's `ready` of this page, and on its `finished`, for the rank that
/// stores them to know whether to wake anyone. On a line of its own,
/// written only by sleepers: a rank reads it after every store of a word,
/// and a line that peers read (a publication line) has often moved to the
/// reader's core by then, so a count kept beside the word cost a cache
/// miss per call (a third of a 2-rank 8-byte broadcast's root, `perf`).
/// Two counts, not one: a broadcast's root sleeps on its receiver's
/// `finished` while the receiver publishes call after call, and one count
/// for both would make every publication a wake-up (a system call).
const SLEEPERS: usize = GENERAL + 64;
/// The slots' data, on the first page boundary after the control words.
const DATA: usize = (SLEEPERS + 8).next_multiple_of(4096);

/// This host's ranks' small pages (all of the communicator's ranks).
pub(crate) struct SmallPages {
    /// Every rank's page by rank (this rank's own, peers' imported); kept
    /// for their lifetime: `base` points into them.
    _own: Box<dyn Mapped>,
    _peers: Vec<Option<Box<dyn Mapped>>>,
    /// Where each rank's page is mapped here.
    base: Vec<usize>,
    /// `s + 1` of the call that last wrote each of this rank's slots.
    written: [u64; DEPTH],
    /// Each peer's `finished` as last read here: while it covers the call
    /// that last wrote a slot, reusing the slot reads nothing of the peer.
    seen: Vec<u32>,
    /// The least of `seen` over the peers: while it covers that call, no
    /// peer needs a look (one comparison a call instead of a loop).
    seen_all: u32,
    /// The slots a call combines, one per rank (kept: a warm call
    /// allocates nothing).
    srcs: Vec<Region>,
    /// `s + 1` of the last call this rank finished but has not yet stored
    /// in its `finished` word, and how many calls that covers (see
    /// [`FINISH_EVERY`]).
    unstored: Cell<(u32, u32)>,
    /// Whether this CPU can take a line for writing ahead of the write
    /// ([`SmallPages::claim`]).
    claims: bool,
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
            written: [0; DEPTH],
            seen: vec![0; n],
            seen_all: 0,
            srcs: vec![Region::EMPTY; n],
            unstored: Cell::new((0, 0)),
            claims: crate::sys::prefetches_for_write(),
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

    fn sleepers(&self, rank: usize, word: Word) -> &AtomicU32 {
        match word {
            Word::Ready => self.word32(rank, SLEEPERS),
            Word::Finished => self.word32(rank, SLEEPERS + 4),
        }
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

    fn finished(&self, rank: usize) -> &AtomicU32 {
        self.word32(rank, FINISHED)
    }

    /// The futex word a waiter sleeps on, and the count of its kind's
    /// sleepers on the page that holds it.
    fn futex(&self, rank: usize, q: usize, word: Word) -> (&AtomicU32, &AtomicU32) {
        let w = match word {
            Word::Ready => self.ready(rank, q),
            Word::Finished => self.finished(rank),
        };
        (w, self.sleepers(rank, word))
    }

    /// Store `v` in this rank's `word` of slot `q`, waking its sleepers.
    ///
    /// No fence between the store and the look at the sleepers: it would
    /// wait for the store to reach the peers, a cache-line transfer on
    /// every call (10-20 % of a 2-rank call, measured). The price: a
    /// sleeper that registers in the instant the store is still on its way
    /// may miss this wake-up; it sleeps its first, short slice
    /// ([`FIRST_SLICE`]) out and then sees the value. Sleepers stay
    /// registered for their whole wait, so only that first registration
    /// can race.
    fn store_and_wake(&self, me: usize, q: usize, word: Word, v: u32) {
        let (w, sleepers) = self.futex(me, q, word);
        w.store(v, Ordering::Release);
        if sleepers.load(Ordering::Relaxed) > 0 {
            crate::sys::futex_wake(w);
        }
    }

    /// Start fetching rank `k`'s publication line of slot `q` (with the
    /// inline data) into this core's cache.
    fn prefetch(&self, k: usize, q: usize) {
        crate::sys::prefetch_for_read(self.ready(k, q) as *const AtomicU32 as *const u8);
    }

    /// Start taking this rank's publication line of slot `q` back from
    /// the peers that read it (see [`CLAIM_AHEAD`]), where the CPU can.
    fn claim(&self, me: usize, q: usize) {
        if self.claims {
            let line = self.ready(me, q) as *const AtomicU32 as *const u8;
            // SAFETY: `claims` says the CPU has the instruction.
            unsafe { crate::sys::prefetch_for_write(line) };
        }
    }

    /// This rank finished call `s` (`target` = `s + 1`): stored in its
    /// `finished` word once every [`FINISH_EVERY`] calls (and before any
    /// wait: [`SmallPages::store_finished`]).
    fn finish(&self, me: usize, target: u32) {
        let (_, count) = self.unstored.get();
        self.unstored.set((target, count + 1));
        if count + 1 >= FINISH_EVERY {
            self.store_finished(me);
        }
    }

    /// Store the calls this rank finished and has not stored yet: before
    /// it waits for anything, since the peer it waits for may itself wait
    /// for this word (to reuse a slot) before it can go on.
    fn store_finished(&self, me: usize) {
        let (target, count) = self.unstored.get();
        if count > 0 {
            self.unstored.set((0, 0));
            self.store_and_wake(me, 0, Word::Finished, target);
        }
    }

    fn general(&self, rank: usize) -> [&AtomicU64; 3] {
        [
            self.word64(rank, GENERAL),
            self.word64(rank, GENERAL + 8),
            self.word64(rank, GENERAL + 16),
        ]
    }

    /// Rank `rank`'s slot `q` for a call of `slot_bytes` (see
    /// [`SmallCall::slot_bytes`]): in its publication line when they fit.
    fn data(&self, rank: usize, q: usize, slot_bytes: usize) -> Region {
        let (at, len) = match slot_bytes <= INLINE {
            true => (SLOT_WORDS + 64 * q + INLINE_AT, INLINE),
            false => (DATA + q * SLOT, SLOT),
        };
        Region {
            space: MemorySpace::Host,
            addr: self.page(rank) as usize + at,
            len,
        }
    }

    /// Say that this rank runs call `seq` on the general path, in phases
    /// or with messages (so a peer waiting for it on the small path, or in
    /// phases while this rank exchanges messages, reports the mismatch).
    pub(crate) fn publish_general(&self, me: usize, fp: &Fingerprint, seq: u64, phased: bool) {
        // A general call may wait for peers that wait for this word.
        self.store_finished(me);
        let [s, a, b] = self.general(me);
        let [x, y] = fp.to_words();
        a.store(x, Ordering::Relaxed);
        b.store(y, Ordering::Relaxed);
        s.store(
            (seq + 1) | if phased { PHASED } else { 0 },
            Ordering::Release,
        );
    }

    /// The call rank `k` runs on the general path, if it is call `seq`:
    /// its fingerprint (`None`: unreadable) and whether it runs in phases.
    pub(crate) fn general_call(&self, k: usize, seq: u64) -> Option<(Option<Fingerprint>, bool)> {
        let [gs, ga, gb] = self.general(k);
        let v = gs.load(Ordering::Acquire);
        (v & !PHASED == seq + 1).then(|| {
            let fp =
                Fingerprint::from_words([ga.load(Ordering::Relaxed), gb.load(Ordering::Relaxed)]);
            (fp, v & PHASED != 0)
        })
    }
}

/// Which of a peer's words a waiter sleeps on: its slot's `ready` (it
/// publishes a call) or its `finished` (it finished one).
#[derive(Clone, Copy)]
enum Word {
    Ready,
    Finished,
}

/// The first sleep of a wait: short, since a wake-up may race with it
/// ([`SmallPages::store_and_wake`]); later ones last [`SLEEP_SLICE`].
const FIRST_SLICE: std::time::Duration = std::time::Duration::from_micros(50);

/// A sleeper's registration on a peer's word, withdrawn when the wait
/// ends however it ends.
struct Registered<'a>(&'a AtomicU32);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a peer stands for this call.
enum Peer {
    Ready,
    NotYet,
}

/// A call on the small path: which collective, its root, its NCCL-style
/// count in bytes (elements times their size) and whether a reduction
/// averages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmallCall {
    pub kind: Kind,
    pub root: usize,
    pub bytes: usize,
    pub avg: bool,
}

impl SmallCall {
    /// Bytes each writer puts in its slot: its whole input.
    pub(crate) fn slot_bytes(&self, nranks: usize) -> usize {
        match self.kind {
            Kind::ReduceScatter | Kind::AllToAll => self.bytes * nranks,
            _ => self.bytes,
        }
    }

    /// Bytes rank `me` copies into its slot: its whole input, but none
    /// at a broadcast's receivers (they publish their call all the same,
    /// so that a peer that reads them checks it).
    fn writes(&self, me: usize, nranks: usize) -> usize {
        match self.kind {
            Kind::Broadcast if me != self.root => 0,
            _ => self.slot_bytes(nranks),
        }
    }

    /// Whether rank `me` reads rank `k`'s slot (and so waits for it and
    /// checks its call): a broadcast's receivers read the root's, a
    /// reduce's root reads all, every other collective reads all.
    fn reads(&self, me: usize, k: usize) -> bool {
        match self.kind {
            Kind::Broadcast => me != self.root && k == self.root,
            Kind::Reduce => me == self.root,
            _ => true,
        }
    }

    /// The peers whose slots rank `me` reads (see [`SmallCall::reads`]).
    fn read_peers(&self, me: usize, n: usize) -> Peers {
        match self.kind {
            Kind::Broadcast if me != self.root => Peers {
                next: self.root,
                end: self.root + 1,
                me,
            },
            _ if self.reads(me, me) => Peers::all(me, n),
            _ => Peers::NONE,
        }
    }
}

/// The earlier of two calls' `s + 1` (within 2^31 calls of each other:
/// compared as [`reached`] does, across the wrap of the low 32 bits).
fn earlier(a: u32, b: u32) -> u32 {
    match reached(b, a) {
        true => a,
        false => b,
    }
}

/// Ranks `next..end` but `me`: a small call's peers, as plain counters (an
/// iterator adapter over a range cost a 2-rank 8-byte call about 20
/// instructions a loop, `callgrind`).
#[derive(Clone, Copy)]
struct Peers {
    next: usize,
    end: usize,
    me: usize,
}

impl Peers {
    const NONE: Peers = Peers {
        next: 0,
        end: 0,
        me: 0,
    };

    /// Every rank of `n` but `me`.
    fn all(me: usize, n: usize) -> Peers {
        Peers {
            next: 0,
            end: n,
            me,
        }
    }
}

impl Iterator for Peers {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        if self.next == self.me {
            self.next += 1;
        }
        let k = self.next;
        (k < self.end).then(|| {
            self.next += 1;
            k
        })
    }
}

/// Whether a call takes the small path: the same answer on every rank (it
/// depends on the call and on settings every rank agrees on), so a rank
/// that takes the other path runs a different call.
pub(crate) fn eligible(call: &SmallCall, nranks: usize, forced: bool) -> bool {
    let bytes = call.slot_bytes(nranks);
    let fits = match call.kind {
        Kind::P2p => false,
        Kind::Barrier => true,
        _ => bytes > 0,
    };
    fits && bytes <= SLOT && !forced
}

/// Who runs a small call and which call it is: all the call needs while
/// no peer keeps it waiting. The executor's whole view of the call
/// ([`CallCtx`]: deadline, control connection, flight recorder, ...;
/// about 20 stores) is made by the first wait that does not end at its
/// first look, from `make`, at most once. A small call's time is the
/// work it does (0.022 µs added to each made 2-rank 8-byte calls
/// 0.022-0.028 µs slower), and a broadcast's receiver often finds the
/// root's part published at once: made on every call, the context took
/// the 2-rank 8-byte broadcast to 0.134 µs against 0.117 now
/// (docs/PERFORMANCE.md, twenty-second round).
pub(crate) struct SmallCtx<'a, F: FnOnce() -> CallCtx<'a>> {
    pub rank: usize,
    pub nranks: usize,
    pub seq: u64,
    pub fp: Fingerprint,
    make: Option<F>,
    made: Option<CallCtx<'a>>,
}

impl<'a, F: FnOnce() -> CallCtx<'a>> SmallCtx<'a, F> {
    pub(crate) fn new(rank: usize, nranks: usize, seq: u64, fp: Fingerprint, make: F) -> Self {
        SmallCtx {
            rank,
            nranks,
            seq,
            fp,
            make: Some(make),
            made: None,
        }
    }

    /// The call's whole context, made now if no wait made it yet.
    #[cold]
    fn full(&mut self) -> &mut CallCtx<'a> {
        let make = &mut self.make;
        self.made.get_or_insert_with(|| match make.take() {
            Some(make) => make(),
            // `made` is set whenever `make` was taken.
            None => unreachable!("a small call's context is made once"),
        })
    }
}

/// A small call with its buffers, host memory that holds them as the
/// executor names them (in place, all_gather's input is the output's
/// segment of this rank and reduce_scatter's output the input's); `ids`
/// names the registered buffers passed (as a direct call does; 0: plain
/// memory). Plain words, passed by reference: `Region`s (40 bytes, a
/// `MemorySpace` inside) moved by value from layer to layer were much of
/// what the layers above this path cost a small call
/// (docs/PERFORMANCE.md, twenty-third round).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmallArgs {
    pub call: SmallCall,
    pub ids: u64,
    pub input: HostSpan,
    pub output: HostSpan,
}

/// `len` bytes of host memory at `addr`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostSpan {
    pub addr: usize,
    pub len: usize,
}

impl HostSpan {
    /// Where `r` lies (its memory space aside).
    #[inline(always)]
    pub(crate) fn of(r: &Region) -> HostSpan {
        HostSpan {
            addr: r.addr,
            len: r.len,
        }
    }

    /// The `len` bytes at `off` of it (panics outside it: [`Region::sub`]).
    #[inline(always)]
    pub(crate) fn sub(self, off: usize, len: usize) -> HostSpan {
        HostSpan::of(&self.region().sub(off, len))
    }

    /// As a region of plain host memory.
    fn region(self) -> Region {
        Region {
            space: MemorySpace::Host,
            addr: self.addr,
            len: self.len,
        }
    }
}

/// Run a small call over the small pages.
pub(crate) fn run<'a, F: FnOnce() -> CallCtx<'a>>(
    pages: &mut SmallPages,
    engine: &mut dyn Compute,
    cx: &mut SmallCtx<'a, F>,
    args: &SmallArgs,
) -> Result<()> {
    let SmallArgs {
        call,
        ids,
        input,
        output,
    } = *args;
    let (input, output) = (input.region(), output.region());
    let (me, n, seq) = (cx.rank, cx.nranks, cx.seq);
    let q = (seq % DEPTH as u64) as usize;
    let target = seq + 1;
    let slot_bytes = call.slot_bytes(n);
    let part = input.sub(0, call.writes(me, n));
    let fp = cx.fp;
    let words = fp.to_words();
    write(pages, cx, words, ids, slot_bytes, part)?;
    // Every part this rank reads, of the same call.
    for k in call.read_peers(me, n) {
        let published = |p: &SmallPages| {
            if reached(p.ready(k, q).load(Ordering::Acquire), target as u32)
                && p.published(k, q)[2].load(Ordering::Relaxed) == target
            {
                let [a, b, _, i] = p.published(k, q);
                let theirs = [a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)];
                let their_ids = i.load(Ordering::Relaxed);
                // The same words are the same call; other words may still
                // be (an operator a broadcast ignores), so they decode.
                if theirs == words && their_ids == ids {
                    return Ok(Peer::Ready);
                }
                return match Fingerprint::from_words(theirs) {
                    Some(t) if t.agrees_with(&fp) && their_ids == ids => Ok(Peer::Ready),
                    theirs => Err(mismatch(&fp, ids, k, seq, theirs, their_ids)),
                };
            }
            // A peer on the general path for this call runs another call.
            if let Some((theirs, _)) = p.general_call(k, seq) {
                return Err(mismatch(&fp, ids, k, seq, theirs, 0));
            }
            Ok(Peer::NotYet)
        };
        wait_for(pages, cx, k, q, Word::Ready, "publish its part", published)?;
    }
    combine(pages, engine, cx, call, slot_bytes, input, output)?;
    // A peer that runs ahead (a broadcast's root, a reduce's other ranks)
    // has most likely published the next call already: fetch its line
    // now, while this call's bookkeeping runs, rather than wait for it
    // then (2-rank 8-byte reduce -15 %, broadcast -12 %, paired; all_reduce
    // and all_gather, where peers run side by side, unchanged).
    let next = (q + 1) % DEPTH;
    for k in call.read_peers(me, n) {
        pages.prefetch(k, next);
    }
    pages.claim(me, (q + CLAIM_AHEAD) % DEPTH);
    // Read: the slots of this number may be rewritten. (Stored by every
    // rank, readers or not: a writer waits for every peer's.)
    pages.finish(me, target as u32);
    Ok(())
}

/// Copy this rank's part into its slot for the call and publish
/// the call there (`words`: its fingerprint), once every peer has read
/// what the slot last held.
fn write<'a, F: FnOnce() -> CallCtx<'a>>(
    pages: &mut SmallPages,
    cx: &mut SmallCtx<'a, F>,
    words: [u64; 2],
    ids: u64,
    slot_bytes: usize,
    input: Region,
) -> Result<()> {
    let (me, n, seq) = (cx.rank, cx.nranks, cx.seq);
    let q = (seq % DEPTH as u64) as usize;
    let target = seq + 1;
    // The slot is free once every peer finished the call that last wrote
    // it (as last seen here, else as its word says now).
    let last = pages.written[q] as u32;
    if pages.written[q] != 0 && !reached(pages.seen_all, last) {
        for k in Peers::all(me, n) {
            if reached(pages.seen[k], last) {
                continue;
            }
            let read = |p: &SmallPages| {
                Ok(match reached(p.finished(k).load(Ordering::Acquire), last) {
                    true => Peer::Ready,
                    false => Peer::NotYet,
                })
            };
            let what = "finish the call that last wrote this rank's slot";
            wait_for(pages, cx, k, q, Word::Finished, what, read)?;
            pages.seen[k] = pages.finished(k).load(Ordering::Acquire);
        }
        let seen = Peers::all(me, n).map(|k| pages.seen[k]);
        pages.seen_all = seen.reduce(earlier).unwrap_or(last);
    }
    // No peer reads the slot now (above); it holds the call's slot bytes
    // (`INLINE` or `SLOT`), at least `len`.
    let slot = pages.data(me, q, slot_bytes);
    copy(slot.sub(0, input.len), input);
    let [x, y] = words;
    let [a, b, s, i] = pages.published(me, q);
    a.store(x, Ordering::Relaxed);
    b.store(y, Ordering::Relaxed);
    s.store(target, Ordering::Relaxed);
    i.store(ids, Ordering::Relaxed);
    pages.store_and_wake(me, q, Word::Ready, target as u32);
    pages.written[q] = target;
    Ok(())
}

/// This rank's output from the slots it reads (all published for this
/// call), combining in rank order so every rank computes the same bits.
fn combine<'a, F: FnOnce() -> CallCtx<'a>>(
    pages: &mut SmallPages,
    engine: &mut dyn Compute,
    cx: &SmallCtx<'a, F>,
    call: SmallCall,
    slot_bytes: usize,
    input: Region,
    output: Region,
) -> Result<()> {
    let (me, n) = (cx.rank, cx.nranks);
    let q = (cx.seq % DEPTH as u64) as usize;
    let b = call.bytes;
    // Rank k's part of its slot that this rank reads.
    // (Its slot holds `slot_bytes`: `b`, or `b` per rank.)
    let at = match call.kind {
        Kind::ReduceScatter | Kind::AllToAll => me * b,
        _ => 0,
    };
    let part = |p: &SmallPages, k: usize| Region {
        space: MemorySpace::Host,
        addr: p.data(k, q, slot_bytes).addr + at,
        len: b,
    };
    match call.kind {
        Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce => {
            if !call.reads(me, me) {
                return Ok(());
            }
            let mut srcs = std::mem::take(&mut pages.srcs);
            for (k, src) in srcs.iter_mut().enumerate() {
                *src = part(pages, k);
            }
            let out = output.sub(0, b);
            let (dtype, op) = (cx.fp.dtype, cx.fp.op.kernel_op());
            // SAFETY: `out` is the caller's host buffer, lent for the call
            // and holding `b` bytes; the sources are slots of mapped pages
            // (never the caller's memory), each holding `b` bytes that no
            // rank rewrites before this rank's `finished` says so.
            unsafe { crate::compute::reduce_host(dtype, op, out, &srcs) };
            pages.srcs = srcs;
            if call.avg {
                let d = engine.divide(dtype, out, n)?;
                finish(engine, d)?;
            }
        }
        Kind::AllGather | Kind::AllToAll => {
            for k in 0..n {
                copy(output.sub(k * b, b), part(pages, k));
            }
        }
        Kind::Broadcast if me == call.root => {
            copy(output.sub(0, b), input.sub(0, b));
        }
        Kind::Broadcast => {
            copy(output.sub(0, b), part(pages, call.root));
        }
        Kind::Barrier | Kind::P2p => {}
    }
    Ok(())
}

/// Copy `src` to `dst` (as much as both hold). Not through the compute
/// engine: every region the path touches is host memory (its caller
/// checks the buffers; the slots are mapped pages), and at these sizes
/// the engine's checks and dispatch cost more than the copy (an 8-byte
/// copy through it was about 145 instructions, `callgrind`).
fn copy(dst: Region, src: Region) {
    let n = dst.len.min(src.len);
    if n == 0 || dst.addr == src.addr {
        return;
    }
    // SAFETY: both are host memory holding at least `n` bytes (a slot of
    // a mapped page, or a buffer the caller lends for the call); they may
    // overlap only where a caller passed overlapping buffers, which
    // `ptr::copy` tolerates.
    unsafe { std::ptr::copy(src.addr as *const u8, dst.addr as *mut u8, n) }
}

/// Wait for `work` (the host engine's is done when started).
fn finish(engine: &mut dyn Compute, work: Pending) -> Result<()> {
    match engine.poll(work)? {
        true => Ok(()),
        false => engine.quiesce(),
    }
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
/// on the peer's `word` (counted among its sleepers from the first slice
/// to the end of the wait, so that it wakes us),
/// looking at abort, the deadline, the control plane and the peer's
/// process between slices.
fn wait_for<'a, F: FnOnce() -> CallCtx<'a>>(
    pages: &SmallPages,
    cx: &mut SmallCtx<'a, F>,
    k: usize,
    q: usize,
    word: Word,
    what: &str,
    look: impl Fn(&SmallPages) -> Result<Peer>,
) -> Result<()> {
    if let Peer::Ready = look(pages)? {
        return Ok(());
    }
    pages.store_finished(cx.rank);
    let cx = cx.full();
    let mut spin = Spin::new(cx.spin, cx.oversubscribed);
    let mut sleep = None;
    let mut registered = None;
    loop {
        if let Peer::Ready = look(pages)? {
            return Ok(());
        }
        if spin.turn() {
            continue;
        }
        // Made at the first sleep: a wait the spin ends reads no clock.
        let sleep = sleep.get_or_insert_with(|| Sleep::new(cx.deadline()));
        if let Err(stop) = sleep.look(cx.aborted, cx.control.is_gone()) {
            return Err(cx.stopped(stop, |cx| {
                (format!("rank {k} to {what} in {}", cx.during), Some(k))
            }));
        }
        let (v, sleepers) = pages.futex(k, q, word);
        let slice = match registered {
            Some(_) => SLEEP_SLICE,
            None => {
                cx.sleeps_on([k]);
                sleepers.fetch_add(1, Ordering::SeqCst);
                registered = Some(Registered(sleepers));
                FIRST_SLICE
            }
        };
        let seen = v.load(Ordering::SeqCst);
        if let Peer::NotYet = look(pages)? {
            crate::sys::futex_wait(v, seen, slice);
        }
        // The peer moved, if not yet far enough: spin again (it may be
        // microseconds away now).
        if v.load(Ordering::SeqCst) != seen {
            spin.moved();
        }
        // A peer that published and then ended (its last call done) is
        // no failure: look before judging.
        if let Peer::Ready = look(pages)? {
            return Ok(());
        }
        cx.after_slice(k)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reads_exactly_the_peers_it_waits_for() {
        for kind in Kind::COLLECTIVES {
            for n in 1..6 {
                for root in 0..n {
                    let call = SmallCall {
                        kind,
                        root,
                        bytes: 8,
                        avg: false,
                    };
                    for me in 0..n {
                        let want: Vec<usize> =
                            (0..n).filter(|k| *k != me && call.reads(me, *k)).collect();
                        let got: Vec<usize> = call.read_peers(me, n).collect();
                        assert_eq!(got, want, "{kind:?} root {root}, rank {me} of {n}");
                        let all: Vec<usize> = Peers::all(me, n).collect();
                        assert_eq!(all, (0..n).filter(|k| *k != me).collect::<Vec<_>>());
                    }
                }
            }
        }
    }

    #[test]
    fn the_earlier_call_is_found_across_the_wrap() {
        assert_eq!(earlier(5, 7), 5);
        assert_eq!(earlier(7, 5), 5);
        assert_eq!(earlier(9, 9), 9);
        // `u32::MAX` comes two calls before 1 once the low bits wrap.
        assert_eq!(earlier(1, u32::MAX), u32::MAX);
        assert_eq!(earlier(u32::MAX, 1), u32::MAX);
    }
}
