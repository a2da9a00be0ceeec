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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
