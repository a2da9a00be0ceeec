//! The monotonic clock as an integer: a call's time stamps cost an integer
//! subtraction where `Instant` costs `Duration` arithmetic (about 9 ns a
//! conversion on the 2-core VM, as much as the rest of the flight
//! recorder's record; docs/PERFORMANCE.md, "The flight recorder's cost").

use std::time::Duration;

/// Nanoseconds on `CLOCK_MONOTONIC` (the clock `Instant` reads on Linux).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

impl Stamp {
    /// The clock now.
    #[inline]
    pub fn now() -> Stamp {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a timespec this call may write; CLOCK_MONOTONIC
        // always exists, so the call cannot fail (and `ts` stays zero if
        // it somehow did: a stamp at the clock's origin, not a crash).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Stamp((ts.tv_sec as u64).wrapping_mul(1_000_000_000) + ts.tv_nsec as u64)
    }

    /// Nanoseconds from `earlier` to this stamp (0 if `earlier` is later).
    #[inline]
    pub fn ns_since(self, earlier: Stamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Time from `earlier` to this stamp (zero if `earlier` is later).
    #[inline]
    pub fn since(self, earlier: Stamp) -> Duration {
        Duration::from_nanos(self.ns_since(earlier))
    }

    /// The stamp `d` after this one (a timeout of centuries saturates:
    /// never).
    #[inline]
    pub fn after(self, d: Duration) -> Stamp {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Stamp(self.0.saturating_add(ns))
    }

    /// The stamp `d` before this one (at most back to the clock's origin).
    #[cfg(test)]
    pub fn before(self, d: Duration) -> Stamp {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Stamp(self.0.saturating_sub(ns))
    }
}

/// A clock for a call's hot path: `CLOCK_MONOTONIC`, read through the
/// CPU's time-stamp counter between anchors at least [`ANCHOR_EVERY_NS`]
/// apart.
///
/// Why: `clock_gettime` orders its counter read after every earlier
/// instruction (`lfence; rdtsc` in the vDSO), so inside a call it waits
/// for the call's outstanding cache misses; the one read a call made was
/// 9-13 % of a 2-rank 8-byte broadcast, reduce or all_reduce here (taken
/// out, alternating pairs). A plain `rdtsc` waits for nothing. A stamp is
/// the last anchor's time plus the ticks since, at the rate measured
/// between the last two anchors: it stays within that rate's error over
/// one interval (tens of nanoseconds) of the real clock, so it cannot
/// drift. Used only where the kernel itself keeps time with the counter
/// (clocksource `tsc`: invariant and synchronised across CPUs) on x86-64;
/// elsewhere, and until a rate is known, every stamp is a
/// `clock_gettime`.
#[derive(Debug)]
pub struct CallClock {
    counter: bool,
    anchor: Stamp,
    anchor_ticks: u64,
    /// Nanoseconds per tick in 32.32 fixed point; 0: not known yet.
    rate: u64,
    /// Ticks in one anchor interval at `rate`: past them, anchor again.
    span: u64,
}

/// Time between anchors of a [`CallClock`].
pub const ANCHOR_EVERY_NS: u64 = 1_000_000;

/// Ticks an anchor's two counter reads may lie apart (under a
/// microsecond at 2-3 GHz; the read between them takes about 30 ns): a
/// rank interrupted between them retries at its next stamp rather than
/// anchor late, so an anchor is off by at most half of this and a rate
/// by this over one interval.
const ANCHOR_SLACK_TICKS: u64 = 2048;

impl CallClock {
    pub fn new() -> CallClock {
        CallClock {
            counter: counter_keeps_time(),
            anchor: Stamp(0),
            anchor_ticks: 0,
            rate: 0,
            span: 0,
        }
    }

    /// The clock now.
    #[inline]
    pub fn now(&mut self) -> Stamp {
        if self.counter && self.rate != 0 {
            let d = ticks().wrapping_sub(self.anchor_ticks);
            if d < self.span {
                let ns = (d as u128 * self.rate as u128) >> 32;
                return Stamp(self.anchor.0 + ns as u64);
            }
        }
        self.read()
    }

    /// A real read, anchoring again when the last anchor is an interval
    /// old (and the read was not interrupted).
    #[cold]
    fn read(&mut self) -> Stamp {
        if !self.counter {
            return Stamp::now();
        }
        let t0 = ticks();
        let now = Stamp::now();
        let t1 = ticks();
        let dns = now.ns_since(self.anchor);
        let clean = t1.wrapping_sub(t0) < ANCHOR_SLACK_TICKS;
        if clean && (self.anchor.0 == 0 || dns >= ANCHOR_EVERY_NS) {
            let t = t0 + (t1 - t0) / 2;
            let dt = t.wrapping_sub(self.anchor_ticks);
            // 32.32 ns per tick; between 50 MHz and 20 GHz, else unknown.
            let rate = match self.anchor.0 != 0 && dt != 0 {
                true => ((dns as u128) << 32) / dt as u128,
                false => 0,
            };
            self.rate = match (1u128 << 32) / 20..=(20u128 << 32) {
                r if r.contains(&rate) => rate as u64,
                _ => 0,
            };
            self.span = match self.rate {
                0 => 0,
                r => ((ANCHOR_EVERY_NS as u128) << 32).div_ceil(r as u128) as u64,
            };
            self.anchor = now;
            self.anchor_ticks = t;
        }
        now
    }
}

impl Default for CallClock {
    fn default() -> CallClock {
        CallClock::new()
    }
}

/// The time-stamp counter (unordered: it waits for no earlier load).
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` exists on every x86-64 CPU and has no side effect.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Whether the kernel keeps `CLOCK_MONOTONIC` with the time-stamp counter
/// (so it is invariant and the same on every CPU), asked once a process.
fn counter_keeps_time() -> bool {
    static TSC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TSC.get_or_init(|| {
        cfg!(target_arch = "x86_64")
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|s| s.trim() == "tsc")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_call_clock_keeps_to_the_real_clock() {
        let mut c = CallClock::new();
        let until = Stamp::now().after(Duration::from_millis(40));
        let (mut worst, mut reads) = (0u64, 0u64);
        while Stamp::now() < until {
            let before = Stamp::now();
            let s = c.now();
            let after = Stamp::now();
            // Inside [before, after], up to the rate's error (a preempted
            // read only widens the bracket).
            let off = before.ns_since(s).max(s.ns_since(after));
            worst = worst.max(off);
            reads += 1;
        }
        assert!(worst < 5_000, "{worst} ns off the real clock");
        assert!(reads > 1000, "{reads}");
        // Where the counter keeps time it is used after the first interval.
        assert_eq!(c.rate != 0, counter_keeps_time(), "{c:?}");
    }

    #[test]
    fn stamps_advance_with_instants() {
        let (s, i) = (Stamp::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (s2, i2) = (Stamp::now(), Instant::now());
        let by_stamp = s2.ns_since(s) as i128;
        let by_instant = i2.duration_since(i).as_nanos() as i128;
        assert!(by_stamp >= 20_000_000, "{by_stamp}");
        assert!(
            (by_stamp - by_instant).abs() < 1_000_000,
            "{by_stamp} {by_instant}"
        );
        assert_eq!(s.ns_since(s2), 0, "earlier minus later saturates");
        assert_eq!(s2.since(s), Duration::from_nanos(s2.ns_since(s)));
        assert_eq!(s.after(Duration::from_millis(20)).ns_since(s), 20_000_000);
        assert_eq!(s.after(Duration::MAX), Stamp(u64::MAX), "saturates");
        assert_eq!(
            s.after(Duration::from_millis(3))
                .before(Duration::from_millis(3)),
            s
        );
    }
}
