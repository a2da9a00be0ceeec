//! Whether a rank's writes into its shared staging memory stream past its
//! cache, by how fast its peers' staged pieces reach it.
//!
//! Staging here is the copy-in's shared memory and the ring buffers of
//! links that copy through memory (`Link::copies_through_memory`: the
//! shared-memory transport, which the rings and chains use): both hand
//! every piece from the core that wrote it to the core that reads it.
//! Where the two cores share a last-level cache that costs about what a
//! local copy does; where they do not (a
//! guest's vCPUs on two core complexes of the host, a placement that
//! changes every few seconds on this project's virtual machines) the
//! reader pulls every line out of the writer's cache, and the writer must
//! take back lines the other complex read last call: 3-5 times slower.
//! Streamed (non-temporal) writes send the piece to memory: 5-30 % slower
//! than a shared cache, 2-2.5 times faster than crossing for the copy-in,
//! 1.5-3 times for the rings (docs/PERFORMANCE.md, fourteenth and
//! fifteenth rounds).
//!
//! The choice is each rank's own and needs no agreement: a piece written
//! either way holds the same bytes. Every rank measures on the same calls
//! (the probes: call numbers every rank shares), on which every rank
//! writes through its cache: the rate of its copies into its staging
//! (and its links' rings) against that of its copies out of its peers'
//! (and out of its links' rings; reductions are not timed: they move
//! several times the bytes they read from peers). Rates far apart,
//! either way, mean the pieces crossed between caches; two
//! such probes in a row (one preempted copy is not a placement) and the
//! rank streams its writes until two probes in a row find the rates
//! close (one call after a pause is not a placement either: on two
//! caches a 2-rank 16 MiB all_to_all read about one such judgement in
//! twenty, and going back at one ran the next calls at twice their
//! streamed time, docs/PERFORMANCE.md, twenty-fourth round). The
//! placement being the same for both directions of a pair, a rank's
//! copies stand for its peers'. `OXCCL_STAGE_WRITES` forces either way.
//!
//! A rank whose probes only write its staging (the first rank of a
//! chain: a 2-rank broadcast's root, a 2-rank reduce's other rank) has no
//! reads to judge its writes by. It judges them against its own streamed
//! writes instead: once it holds a judgement's worth of writes through
//! its cache and next to no reads, its next probes stream their writes
//! and time those (the one kind of probe that does not write through
//! the cache), and the two rates far apart (streamed the faster) count
//! as a crossed judgement. Streamed writes go to memory at about one rate
//! wherever the reader runs; writes through the cache into lines a core
//! of the other complex read last call run at a fraction of it. A 2-rank
//! 64 KiB broadcast's root: through its cache 1.7-2.9 B/ns on two caches
//! and 14-22 on one, streamed 14-18 on either (the call 27-33 us cached
//! against 6 streamed on two caches, 2.5-4 cached on one; Open MPI 8-9;
//! docs/PERFORMANCE.md, twentieth round). The streamed rate serves
//! [`STREAMED_REUSE`] judgements before it is measured again: each
//! measurement streams a few probes on any placement.
//!
//! A probe call of [`SETTLES_FROM`] bytes or more settles within
//! itself: it writes its first pieces through its cache and judges them
//! by [`Handoff::judge_bytes`] at a time, and the rest of its writes
//! follow as soon as the judgements settle ([`Handoff::settle`]: one that
//! agrees with the way the gauge writes, or the second in a row against
//! it); writes past a judgement's worth whose reads lag go the gauge's
//! way meanwhile ([`Handoff::open_writes`]). Judging only at the end of
//! a probe, two probes eight calls apart, a 2-rank 16 MiB all_gather ran
//! cached through most of a benchmark caught split, at 1.6-1.9x Open MPI's time
//! and 2-2.8x its own with streamed writes (docs/PERFORMANCE.md,
//! eighteenth round). A large call (from [`EVERY_CALL_FROM`] bytes: a
//! 4-rank 256 MiB all_reduce takes 75-250 ms) probes at its own start
//! whatever its number: probing every eighth call, a benchmark of five
//! such calls ended before a split placement could stream (sixteenth
//! round).
//!
//! Pure state: the executor times the steps and reports them.

/// Every how many calls the ranks probe (call numbers divisible by it),
/// calls that settle within themselves ([`SETTLES_FROM`]). A placement
/// changes every few seconds; calls of the sizes that stage take tens of
/// microseconds to a few hundred milliseconds.
pub(crate) const PROBE_EVERY: u64 = 8;

/// Every how many calls smaller calls probe. Such a probe writes all its
/// staging through the cache, which on two caches costs the call 3-5
/// times its streamed time (a 2-rank 64 KiB all_gather 19-22 us against
/// 6, a broadcast 27-33 against 6): probing every eighth call added
/// 2-3 us a call to a streaming 64 KiB call, which left the broadcast
/// level with Open MPI on two caches (8.0-10.1 us against 8.5-10.7) and
/// the all_gather behind it (9.2-10.8 against 8.7-9.1); every 32nd, 4.5
/// and 7.4 (medians; Open MPI 9.5-9.7 and 8.8; docs/PERFORMANCE.md,
/// twentieth round).
pub(crate) const SMALL_PROBE_EVERY: u64 = 32;

/// The least bytes a probe must have read from peers and written to
/// staging to judge: below it one preemption decides.
const MIN_BYTES: u64 = 256 << 10;

/// The least bytes of input or output of a call that probes at its own
/// start, whatever its number.
pub(crate) const EVERY_CALL_FROM: usize = 32 << 20;

/// The least bytes of input or output of a probe call that settles
/// within itself ([`Handoff::settle`]): room for a few judgements of at
/// least [`MIN_BYTES`].
pub(crate) const SETTLES_FROM: usize = 4 << 20;

/// Judgements the gauge makes before calls that settle within
/// themselves probe only every [`PROBE_EVERY`]: the first (staging
/// written for the first time, its page faults timed) may read either
/// way, and streaming takes two crossed in a row.
const FIRST_JUDGEMENTS: u8 = 3;

/// Bytes of reads and of writes a judgement within a call takes at most
/// (the copy-in's 4-rank pieces are about 340 KiB: a dozen of them).
const JUDGE_MAX: u64 = 4 << 20;

/// Reads of peers' staged pieces and writes into the rank's own staging
/// (bytes per second) this far apart: the pieces crossed between caches.
/// A 2-rank 16 MiB all_to_all's judgements (the lesser rate over the
/// greater, the first of each run left out): with the vCPUs sharing a
/// cache 6 of 632 below 0.5, 35 below 0.6; on two caches 228 of 266
/// below 0.4, 11 more below 0.5, 6 between 0.5 and 0.6 (twenty-fourth
/// round). 0.4 left those 11 judging close.
const CROSSED: f64 = 0.5;

/// One-way judgements a measured streamed write rate serves.
const STREAMED_REUSE: u8 = 8;

/// Bytes moved and the nanoseconds they took.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    bytes: u64,
    ns: u64,
}

impl Tally {
    fn add(&mut self, bytes: usize, ns: u64) {
        self.bytes += bytes as u64;
        self.ns += ns;
    }

    /// Bytes per nanosecond (`None` until enough was moved).
    fn rate(&self) -> Option<f64> {
        (self.bytes >= MIN_BYTES).then(|| self.bytes as f64 / self.ns.max(1) as f64)
    }

    /// Whether this tally holds a judgement's worth and `other` next to
    /// nothing beside it (an eighth at most).
    fn outweighs(&self, other: &Tally) -> bool {
        self.rate().is_some() && other.bytes <= self.bytes / 8
    }
}

/// One rank's gauge of its hand-offs.
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    /// Whether this rank's staging writes stream outside its probes.
    streaming: bool,
    /// Whether the last judgement went against `streaming` (the second
    /// in a row turns it: one preempted copy is not a placement, nor is
    /// one call whose peer's lines had left its cache during a pause).
    against: bool,
    /// Judgements made, up to [`FIRST_JUDGEMENTS`].
    judgements: u8,
    reads: Tally,
    /// Writes through the cache.
    writes: Tally,
    /// Streamed writes, timed while a rank that only writes measures
    /// what it judges those through its cache against.
    streamed: Tally,
    /// One-way judgements made with `streamed`, up to [`STREAMED_REUSE`].
    streamed_used: u8,
}

impl Handoff {
    /// Whether call `seq`, whose largest buffer holds `call_bytes`, is a
    /// probe: every rank measures and writes through its cache (at least
    /// until it settles, from [`SETTLES_FROM`] bytes; a rank that only
    /// writes streams while it measures its streamed rate, see
    /// [`Handoff::streams`]). Every eighth call of those that settle
    /// within themselves is one, every 32nd smaller one
    /// ([`SMALL_PROBE_EVERY`]); a large call always; one that settles
    /// within itself also while the gauge has made fewer than
    /// [`FIRST_JUDGEMENTS`]: the ranks' first calls find the placement
    /// without waiting for the eighth (all ranks have judged alike so
    /// far: the same calls, sizes and bytes; a rank's judgements are its
    /// own, and a rank that probes while its peers stream only writes
    /// through its cache).
    pub fn probing(&self, seq: u64, call_bytes: usize) -> bool {
        let settles = Self::settles_in_call(call_bytes);
        let every = match settles {
            true => PROBE_EVERY,
            false => SMALL_PROBE_EVERY,
        };
        call_bytes >= EVERY_CALL_FROM
            || seq.is_multiple_of(every)
            || (settles && self.judgements < FIRST_JUDGEMENTS)
    }

    /// Whether the probe call of `call_bytes` settles within itself.
    pub fn settles_in_call(call_bytes: usize) -> bool {
        call_bytes >= SETTLES_FROM
    }

    /// Whether call `seq`'s staging writes stream. A probe's do not (not
    /// until it settles), unless this rank only writes and measures its
    /// streamed writes (`measures_streamed`).
    pub fn streams(&self, seq: u64, call_bytes: usize) -> bool {
        match self.probing(seq, call_bytes) {
            true => self.measures_streamed(),
            false => self.streaming,
        }
    }

    /// Whether this rank's probes stream their writes to time them: it
    /// only writes (`only_writes`) and has no streamed rate to judge its
    /// writes through the cache against.
    fn measures_streamed(&self) -> bool {
        self.only_writes() && self.streamed.rate().is_none()
    }

    /// Whether this rank's probes since the last judgement wrote a
    /// judgement's worth through the cache and read next to nothing (an
    /// eighth of it at most: a few small calls' reads, such as a
    /// benchmark's set-up, must not leave a chain's first rank unjudged).
    fn only_writes(&self) -> bool {
        self.writes.outweighs(&self.reads)
    }

    /// The same for reads.
    fn only_reads(&self) -> bool {
        self.reads.outweighs(&self.writes)
    }

    /// A probe's read of `bytes` of peers' staged pieces took `ns`.
    pub fn read(&mut self, bytes: usize, ns: u64) {
        self.reads.add(bytes, ns);
    }

    /// A probe's write of `bytes` into this rank's staging took `ns`,
    /// through the cache or streamed (`streamed`).
    pub fn wrote(&mut self, bytes: usize, ns: u64, streamed: bool) {
        match streamed {
            true => self.streamed.add(bytes, ns),
            false => self.writes.add(bytes, ns),
        }
    }

    /// Bytes of reads and of writes each judgement within a call whose
    /// largest buffer holds `call_bytes` takes: a sixteenth of it, at
    /// least [`MIN_BYTES`], at most [`JUDGE_MAX`] (a rank stages at most
    /// its largest buffer; the first judgements must leave most of it to
    /// stream).
    pub fn judge_bytes(call_bytes: usize) -> u64 {
        (call_bytes as u64 / 16).clamp(MIN_BYTES, JUDGE_MAX)
    }

    /// Within a call that still probes: once `judge` bytes were read and
    /// written, a judgement; `Some(streams)` when they have settled (a
    /// judgement that agrees with the way the writes go, or the second
    /// in a row against it, which turns them), and the rest of the call
    /// writes so without measuring. Each judgement counts as a probe for
    /// the calls after.
    pub fn settle(&mut self, judge: u64) -> Option<bool> {
        if self.reads.bytes < judge || self.writes.bytes < judge {
            return None;
        }
        self.judge();
        (!self.against).then_some(self.streaming)
    }

    /// How a probe call that settles within itself writes its staging
    /// while its judgement is open: through the cache (or streamed, by a
    /// rank that measures its streamed writes) until it holds a
    /// judgement's worth of writes through the cache (`judge` bytes),
    /// past that the way the gauge writes until its reads catch up. A
    /// rank whose writes outrun its reads would otherwise write its whole
    /// share through the cache before it could judge: in 2-rank 256 MiB
    /// pairwise all_to_alls on two caches one rank wrote all its 128 MiB
    /// (crossed, 2.3-2.7 B/ns) before it had read 4 MiB of its peer's,
    /// which read all of the rank's first, call after call, even with the
    /// gauge streaming; such launches ran 58-89 ms against 28-35
    /// (docs/PERFORMANCE.md, twenty-fifth round).
    pub fn open_writes(&self, judge: u64) -> bool {
        self.measures_streamed()
            || (self.streaming && self.writes.bytes >= judge && self.reads.bytes < judge)
    }

    /// A call ended (successfully): if it probed (`probed`) and the
    /// probes since the last judgement measured enough, that decides the
    /// writes until the next probe: they turn at the second judgement in
    /// a row against the way they go (`count`). Probes that moved too
    /// little add up until they can judge: a 2-rank 64 KiB all_gather's
    /// probe reads and writes 32 KiB, and with each probe judged alone
    /// (and too small to) the gauge never decided for such calls, which
    /// on two caches ran at 19-22 us against 5-7 streamed and Open MPI's
    /// 7.4 (docs/PERFORMANCE.md, nineteenth round). A rank whose probes
    /// only write judges its writes against its streamed ones
    /// (`judge_one_way`); one whose probes only read
    /// has nothing to decide (it writes no staging) and starts its tallies
    /// again rather than carry a long history into some later call's
    /// judgement.
    pub fn ended(&mut self, probed: bool) {
        if !probed {
            return;
        }
        if self.reads.rate().is_some() && self.writes.rate().is_some() {
            self.judge();
        } else if self.only_writes() {
            self.judge_one_way();
        } else if self.only_reads() {
            self.reads = Tally::default();
            self.writes = Tally::default();
        }
    }

    /// Judge the tallies when both hold enough, and start new ones.
    fn judge(&mut self) {
        if let (Some(r), Some(w)) = (self.reads.rate(), self.writes.rate()) {
            self.count(r.min(w) < CROSSED * r.max(w));
        }
        self.reads = Tally::default();
        self.writes = Tally::default();
    }

    /// A rank that only writes: its writes through the cache judged
    /// against its streamed ones once it has both (until then its probes
    /// stream, `measures_streamed`), and a new tally of writes started.
    fn judge_one_way(&mut self) {
        let (Some(cached), Some(streamed)) = (self.writes.rate(), self.streamed.rate()) else {
            return;
        };
        self.count(cached < CROSSED * streamed);
        self.reads = Tally::default();
        self.writes = Tally::default();
        self.streamed_used += 1;
        if self.streamed_used >= STREAMED_REUSE {
            self.streamed = Tally::default();
            self.streamed_used = 0;
        }
    }

    /// One more judgement, which found the pieces crossed or not: the
    /// second in a row against the way the writes go turns them.
    fn count(&mut self, crossed: bool) {
        self.judgements = self.judgements.saturating_add(1).min(FIRST_JUDGEMENTS);
        if crossed == self.streaming {
            self.against = false;
        } else if !self.against {
            self.against = true;
        } else {
            self.streaming = crossed;
            self.against = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe whose reads ran at `read` and writes at `write` GB/s
    /// (1 MiB each), then whether each of the next calls streams.
    fn after_probe(h: &mut Handoff, read: f64, write: f64) -> Vec<bool> {
        let mib = 1 << 20;
        h.read(mib, (mib as f64 / read) as u64);
        h.wrote(mib, (mib as f64 / write) as u64, false);
        h.ended(true);
        (1..=SMALL_PROBE_EVERY).map(|s| h.streams(s, 0)).collect()
    }

    #[test]
    fn two_probes_in_a_row_turn_the_writes_either_way() {
        let mut h = Handoff::default();
        let mut streamed = vec![true; SMALL_PROBE_EVERY as usize];
        // The next probe itself writes through the cache.
        *streamed.last_mut().unwrap() = false;
        let cached = vec![false; SMALL_PROBE_EVERY as usize];
        // Across core complexes: 1 MiB read in ~530 us, written in 20.
        // One such probe is not enough (a copy preempted reads the same).
        assert_eq!(after_probe(&mut h, 2.0, 50.0), cached);
        assert_eq!(after_probe(&mut h, 2.0, 50.0), streamed);
        // Writes into lines a core of the other complex read last call.
        assert_eq!(after_probe(&mut h, 28.0, 4.0), streamed);
        // A shared cache: reads and writes at about one rate. One such
        // probe is not enough to go back (a call after a pause, the
        // peer's lines gone from its cache, reads the same)...
        assert_eq!(after_probe(&mut h, 40.0, 35.0), streamed);
        assert_eq!(after_probe(&mut h, 2.0, 50.0), streamed);
        // ... two in a row are.
        assert_eq!(after_probe(&mut h, 40.0, 35.0), streamed);
        assert_eq!(after_probe(&mut h, 40.0, 35.0), cached);
        // Crossed, shared, crossed: never two in a row.
        assert_eq!(after_probe(&mut h, 2.0, 50.0), cached);
        assert_eq!(after_probe(&mut h, 40.0, 35.0), cached);
        assert_eq!(after_probe(&mut h, 2.0, 50.0), cached);
        // Half the rate is crossed; a little more than half is not.
        assert_eq!(after_probe(&mut h, 10.0, 4.9), streamed);
        assert_eq!(after_probe(&mut h, 10.0, 5.1), streamed);
        assert_eq!(after_probe(&mut h, 10.0, 5.1), cached);
    }

    #[test]
    fn only_probes_decide_and_only_with_enough_bytes() {
        let mut h = Handoff::default();
        after_probe(&mut h, 2.0, 50.0);
        after_probe(&mut h, 2.0, 50.0);
        assert!(h.streams(1, 0));
        // A call that is not a probe (it times nothing) decides nothing.
        h.ended(false);
        assert!(h.streams(4, 0));
        // A probe that moved too little keeps the last decision...
        h.read(4096, 1);
        h.wrote(4096, 1, false);
        h.ended(true);
        assert!(h.streams(2 * PROBE_EVERY + 1, 0));
        // ... and its bytes count in the next probe's judgement (close
        // rates: one against streaming, which a second turns).
        h.ended(false);
        h.read(MIN_BYTES as usize - 4096, 1);
        h.wrote(MIN_BYTES as usize - 4096, 1, false);
        h.ended(true);
        assert!(h.against);
        assert!(h.streams(3 * PROBE_EVERY + 1, 0));
        after_probe(&mut h, 40.0, 35.0);
        assert!(!h.streams(4 * PROBE_EVERY + 1, 0));
    }

    /// `JUDGE_MAX` read at `read` and written at `write` GB/s in a
    /// large call, then what `settle` says.
    fn judged(h: &mut Handoff, read: f64, write: f64) -> Option<bool> {
        let n = JUDGE_MAX as usize;
        h.read(n, (n as f64 / read) as u64);
        h.wrote(n, (n as f64 / write) as u64, false);
        h.settle(JUDGE_MAX)
    }

    #[test]
    fn probes_too_small_to_judge_add_up_until_they_can() {
        // A 2-rank 64 KiB all_gather's probe: 32 KiB through its ring
        // each way, crossed (reads 2 GB/s, writes 50).
        let mut h = Handoff::default();
        let piece = 32 << 10;
        let per_judgement = MIN_BYTES as usize / piece;
        let mut streams = Vec::new();
        for probe in 0..2 * per_judgement {
            h.read(piece, (piece as f64 / 2.0) as u64);
            h.wrote(piece, (piece as f64 / 50.0) as u64, false);
            h.ended(true);
            // The calls between probes time nothing and keep the tallies.
            h.ended(false);
            streams.push(h.streams(probe as u64 * PROBE_EVERY + 1, 64 << 10));
        }
        // Streamed from the second judgement on, the eight probes of each
        // adding up to it.
        let mut expected = vec![false; 2 * per_judgement];
        *expected.last_mut().unwrap() = true;
        assert_eq!(streams, expected);
    }

    #[test]
    fn a_rank_that_only_reads_keeps_no_history() {
        // A chain's last rank reads and never writes its staging: each
        // judgement's worth of reads is dropped, so a later call that
        // reads and writes is judged on its own copies alone.
        let mut h = Handoff::default();
        h.wrote(451, 2633, false);
        for _ in 0..4 {
            h.read(MIN_BYTES as usize, 1);
            h.ended(true);
        }
        assert_eq!(h.reads.bytes, 0);
        assert_eq!(h.writes.bytes, 0);
        assert_eq!(h.judgements, 0, "nothing was judged");
        h.read(MIN_BYTES as usize, 1);
        h.wrote(MIN_BYTES as usize, 1, false);
        h.ended(true);
        assert_eq!(h.judgements, 1);
        assert!(!h.streams(PROBE_EVERY + 1, 0));
    }

    /// Probe call `seq` of a rank that only writes: `piece` bytes at
    /// `cached` or `streamed` GB/s, whichever way the gauge has it
    /// write; then whether it streamed.
    fn write_only_probe(
        h: &mut Handoff,
        seq: u64,
        piece: usize,
        cached: f64,
        streamed: f64,
    ) -> bool {
        let s = h.streams(seq, piece);
        let rate = if s { streamed } else { cached };
        h.wrote(piece, (piece as f64 / rate) as u64, s);
        h.ended(true);
        s
    }

    #[test]
    fn a_rank_that_only_writes_judges_them_against_its_streamed_writes() {
        // A 2-rank 64 KiB broadcast's root on two caches: 2.5 GB/s
        // through its cache, 14 streamed.
        let piece = 64 << 10;
        let per = MIN_BYTES as usize / piece;
        let mut h = Handoff::default();
        // The benchmark's set-up read a few hundred bytes on a probe.
        h.read(451, 2633);
        let probes = |h: &mut Handoff, from: usize, n: usize, cached: f64, streamed: f64| {
            (from..from + n)
                .map(|p| write_only_probe(h, p as u64 * SMALL_PROBE_EVERY, piece, cached, streamed))
                .collect::<Vec<_>>()
        };
        // A judgement's worth through the cache, then as much streamed
        // (the first judgement: crossed), then through the cache again
        // (the second, against the same streamed rate).
        let expected = [vec![false; per], vec![true; per], vec![false; per]].concat();
        assert_eq!(probes(&mut h, 0, 3 * per, 2.5, 14.0), expected);
        // Two crossed in a row: the calls between probes stream.
        let next = 3 * per as u64 * SMALL_PROBE_EVERY;
        assert!(h.streams(next + 1, piece) && !h.streams(next, piece));

        // On one cache: through its cache 20 GB/s, streamed 17. It goes
        // back at the second judgement, and from then on measures its
        // streamed writes once every STREAMED_REUSE judgements.
        let cycle = (STREAMED_REUSE as usize + 1) * per;
        let modes = probes(&mut h, 3 * per, 3 * cycle, 20.0, 17.0);
        assert!(!h.streams(next + 1, piece));
        assert!(!h.streaming && !h.against);
        // The first streamed rate serves six more judgements; then each
        // cycle streams one judgement's worth of probes.
        let streamed = modes.iter().filter(|s| **s).count();
        assert_eq!(streamed, 3 * per, "one block of streamed probes per cycle");
        // Never more than a judgement's worth of either kept.
        assert!(h.writes.bytes < MIN_BYTES && h.streamed.bytes <= MIN_BYTES);

        // A preempted probe is not a placement: one crossed judgement
        // among close ones streams nothing.
        let mut h = Handoff::default();
        probes(&mut h, 0, 2 * per, 20.0, 17.0);
        probes(&mut h, 2 * per, per, 2.5, 17.0);
        assert!(h.against);
        assert!(!h.streams(1, piece));
        probes(&mut h, 3 * per, per, 20.0, 17.0);
        assert!(!h.streaming && !h.against);
    }

    #[test]
    fn a_large_call_probes_from_its_start_and_settles_within_itself() {
        let mut h = Handoff::default();
        // Large calls probe whatever their number, and write through the
        // cache until they settle, however the last one ended.
        assert!(h.probing(3, EVERY_CALL_FROM) && !h.probing(3, 0));
        // Not settled until a judgement's worth of reads and writes.
        h.read(JUDGE_MAX as usize - 1, 1);
        h.wrote(JUDGE_MAX as usize, 1, false);
        assert_eq!(h.settle(JUDGE_MAX), None);
        h.read(1, 1);
        // Close rates settle at once: through the cache.
        assert_eq!(h.settle(JUDGE_MAX), Some(false));
        // One crossed judgement is not enough; the second settles it.
        assert_eq!(judged(&mut h, 2.0, 50.0), None);
        assert_eq!(judged(&mut h, 2.0, 50.0), Some(true));
        // And counts for the calls after it, as a probe would.
        h.ended(false);
        assert!(h.streams(3, 0));
        assert!(!h.streams(3, EVERY_CALL_FROM));
        // The next large call: one crossed judgement keeps streaming;
        // one close one is not enough to go back, the second is.
        assert_eq!(judged(&mut h, 2.0, 50.0), Some(true));
        assert_eq!(judged(&mut h, 40.0, 35.0), None);
        assert!(h.streams(3, 0));
        assert_eq!(judged(&mut h, 40.0, 35.0), Some(false));
        assert!(!h.streams(3, 0));
    }

    #[test]
    fn writes_that_outrun_reads_go_the_gauges_way_until_the_judgement() {
        let judge = JUDGE_MAX;
        let n = judge as usize;
        // A gauge that streams (two crossed judgements).
        let mut h = Handoff::default();
        assert_eq!(judged(&mut h, 2.0, 50.0), None);
        assert_eq!(judged(&mut h, 2.0, 50.0), Some(true));
        // The next large call writes through the cache while it judges...
        assert!(!h.streams(3, EVERY_CALL_FROM) && !h.open_writes(judge));
        h.wrote(n - 1, (n as f64 / 2.5) as u64, false);
        h.read(n / 2, 1);
        assert!(!h.open_writes(judge));
        // ... until it holds a judgement's worth of writes: the reads
        // lag, and its further writes stream, as the gauge does.
        h.wrote(1, 1, false);
        assert!(h.open_writes(judge));
        h.wrote(8 * n, 1, true);
        assert!(h.open_writes(judge));
        // Once the reads catch up it judges (crossed: settled, streams).
        h.read(n / 2, (n as f64 / 15.0) as u64);
        assert_eq!(h.settle(judge), Some(true));
        // A gauge that writes through the cache keeps doing so.
        let mut h = Handoff::default();
        assert_eq!(judged(&mut h, 40.0, 35.0), Some(false));
        h.wrote(2 * n, 1, false);
        h.read(n / 2, 1);
        assert!(!h.open_writes(judge));
        // A rank that only writes, with no streamed rate yet, streams to
        // measure one (`measures_streamed`), as its probes did before.
        let mut h = Handoff::default();
        h.wrote(n, (n as f64 / 2.0) as u64, false);
        h.ended(true);
        assert!(h.measures_streamed());
        assert!(h.open_writes(judge));
    }

    #[test]
    fn smaller_calls_probe_every_32nd_call_those_that_settle_every_8th() {
        // A smaller call's probe writes all of it through the cache (on
        // two caches 3-5 times its streamed time); a settling call's only
        // its first judgements.
        let h = Handoff {
            judgements: FIRST_JUDGEMENTS,
            ..Handoff::default()
        };
        let small = SETTLES_FROM - 1;
        let probes = |bytes: usize| {
            (1..=64)
                .filter(|s| h.probing(*s, bytes))
                .collect::<Vec<u64>>()
        };
        assert_eq!(probes(small), [32, 64]);
        assert_eq!(probes(SETTLES_FROM), [8, 16, 24, 32, 40, 48, 56, 64]);
        assert_eq!(probes(EVERY_CALL_FROM).len(), 64);
    }

    #[test]
    fn a_judgement_is_a_sixteenth_of_the_call_within_bounds() {
        // A 2-rank 16 MiB all_gather stages 8 MiB a rank: two judgements
        // of 1 MiB leave three quarters of it to stream.
        assert_eq!(Handoff::judge_bytes(16 << 20), 1 << 20);
        assert_eq!(Handoff::judge_bytes(SETTLES_FROM), MIN_BYTES);
        assert_eq!(Handoff::judge_bytes(1 << 20), MIN_BYTES);
        assert_eq!(Handoff::judge_bytes(256 << 20), JUDGE_MAX);
        // A mid-sized probe settles on its smaller judgements.
        let mut h = Handoff::default();
        let (mib, judge) = (1 << 20, Handoff::judge_bytes(16 << 20));
        h.read(mib, (mib as f64 / 2.0) as u64);
        h.wrote(mib, (mib as f64 / 50.0) as u64, false);
        assert_eq!(h.settle(judge), None);
        h.read(mib, (mib as f64 / 2.0) as u64);
        h.wrote(mib, (mib as f64 / 50.0) as u64, false);
        assert_eq!(h.settle(judge), Some(true));
    }

    #[test]
    fn calls_that_settle_probe_each_until_the_gauge_has_judged_three_times() {
        let mut h = Handoff::default();
        let mid = 16 << 20;
        let judge = Handoff::judge_bytes(mid) as usize;
        // Smaller calls wait for the eighth; calls that settle probe now.
        assert!(!h.probing(3, SETTLES_FROM - 1) && h.probing(3, mid));
        // The first judgement (page faults) reads close, two crossed.
        for (read, write, settled) in [
            (1.2, 0.9, Some(false)),
            (11.0, 2.4, None),
            (12.0, 2.1, Some(true)),
        ] {
            assert!(h.probing(5, mid));
            h.read(judge, (judge as f64 / read) as u64);
            h.wrote(judge, (judge as f64 / write) as u64, false);
            assert_eq!(h.settle(judge as u64), settled);
        }
        // Judged three times: the next such calls stream, and probe again
        // only on the eighth.
        assert!(!h.probing(5, mid) && h.streams(5, mid));
        assert!(h.probing(PROBE_EVERY, mid) && !h.streams(PROBE_EVERY, mid));
    }
}
