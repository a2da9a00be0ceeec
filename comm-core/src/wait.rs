//! How oxccl waits: one primitive for every thread that waits for work it
//! cannot do itself.
//!
//! A waiter first *spins* ([`Spin`]): retrying costs far less than a
//! wake-up when the data is microseconds away. The spin is pure for
//! [`PURE_SPIN`] when this host's ranks have a core each
//! ([`oversubscribed`]), then yields (a peer sharing the core must run for
//! the data to come), and ends after
//! `OXCCL_SPIN_US`, once per wait: until something moves (a step, or the
//! peer slept on, even if not yet far enough), a waiter that sleeps in
//! slices goes from one slice straight into the next. Then the waiter
//! *sleeps* on what can wake it —
//! `poll(2)` on its links' fds (RDMA links too: their completions wake an
//! fd), the engine's completion fd, the control connection and the abort
//! eventfd; or a futex slice on a peer's phase counter in shared memory —
//! and before every sleep looks, in one fixed order, at abort, the control
//! plane gone while nothing moved ([`ORPHAN_IDLE`]) and the deadline
//! ([`Sleep::look`]). A waiter that saw a link break waits a moment for
//! the control plane to explain why ([`look_until`], [`EXPLAIN_WAIT`]).
//!
//! Users: the executor (every collective, its shared-memory `Sync`
//! phases, one-sided reads), the point-to-point lane (a blocking caller's
//! spin, explanations of broken links) and the failure plane (waiting for
//! the root's verdict on a stall).

use crate::sys::Stamp;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long an idle waiter spins without yielding when it has a core.
pub(crate) const PURE_SPIN: Duration = Duration::from_micros(2);

/// How long a waiter whose control connection is gone may see no progress
/// before it fails: without the root nobody relays another rank's failure
/// or judges a stall. Long next to any healthy pause between two messages.
pub(crate) const ORPHAN_IDLE: Duration = Duration::from_secs(2);

/// How long a rank that saw a link break (or reported a stall) waits for
/// the control plane to explain it before judging alone.
pub(crate) const EXPLAIN_WAIT: Duration = Duration::from_millis(1500);

/// Whether this host's ranks share cores, so that a waiter must yield (a
/// peer it waits for may need its core): more ranks than CPUs in the
/// union of their affinity masks (`masks`, one per rank of this host,
/// [`crate::sys::affinity`]), or than this process's CPU quota, when
/// `available` (std's count: its own mask's CPUs, fewer under a cgroup
/// quota) is below its own mask (`own`). With a mask unknown, `available`
/// stands for the host.
///
/// Not `available` alone: a launcher that binds each rank to its own core
/// (Open MPI's default, Slurm's `--cpu-bind`) leaves every rank a
/// one-CPU mask, and a 2-rank 8-byte all_reduce that yields on every
/// turn took 1.13 us against 0.37 spinning (bound by `mpirun`, this
/// machine).
pub(crate) fn oversubscribed(masks: &[&[u8]], own: &[u8], available: usize) -> bool {
    let ranks = masks.len();
    if own.is_empty() || masks.iter().any(|m| m.is_empty()) {
        return ranks > available;
    }
    let width = masks.iter().map(|m| m.len()).max().unwrap_or(0);
    let union: usize = (0..width)
        .map(|i| {
            let byte = masks
                .iter()
                .fold(0u8, |acc, m| acc | m.get(i).copied().unwrap_or(0));
            byte.count_ones() as usize
        })
        .sum();
    let own_cpus: usize = own.iter().map(|b| b.count_ones() as usize).sum();
    let quota = match available < own_cpus {
        true => available,
        false => usize::MAX,
    };
    ranks > union.min(quota)
}

/// The spinning half of a wait.
#[derive(Debug)]
pub(crate) struct Spin {
    limit: Duration,
    oversubscribed: bool,
    idle: Idle,
    /// Idle turns since the clock was last read (it is read every
    /// [`CLOCK_EVERY`] turns: a clock read costs as much as several
    /// looks at the data).
    turns: u32,
}

/// Where a spin stands since something last moved.
#[derive(Clone, Copy, Debug)]
enum Idle {
    /// Not idle yet (or the spin's start not read yet).
    Fresh,
    /// Spinning since then.
    Since(Stamp),
    /// The spin time passed with nothing moving: no more spinning until
    /// something moves (a waiter that sleeps in slices spins once per
    /// wait, not once per slice).
    Spent,
}

/// Idle turns between clock reads while spinning.
const CLOCK_EVERY: u32 = 16;

impl Spin {
    /// Spin for `limit` once idle; `oversubscribed`: more ranks than cores
    /// on this host, so always yield.
    pub(crate) fn new(limit: Duration, oversubscribed: bool) -> Spin {
        Spin {
            limit,
            oversubscribed,
            idle: Idle::Fresh,
            turns: 0,
        }
    }

    /// Something moved: the next idle turn starts a new spin.
    pub(crate) fn moved(&mut self) {
        self.idle = Idle::Fresh;
    }

    /// One idle turn: spins (or yields) and returns true while the spin
    /// time lasts; false once it is over (sleep now), and on every turn
    /// after until [`Spin::moved`].
    pub(crate) fn turn(&mut self) -> bool {
        if let Idle::Spent = self.idle {
            return false;
        }
        // Between clock reads, a pure spin goes on (a yielding one reads
        // the clock every turn: a yield costs more than the read). The
        // first read, too, waits for `CLOCK_EVERY` turns: most waits of a
        // warm loop end before it.
        if !self.oversubscribed && !self.limit.is_zero() && self.turns < CLOCK_EVERY {
            self.turns += 1;
            std::hint::spin_loop();
            return true;
        }
        self.turns = 0;
        // One clock read a look (the first look's is also the spin's start).
        let now = Stamp::now();
        let since = match self.idle {
            Idle::Since(s) => s,
            _ => {
                self.idle = Idle::Since(now);
                now
            }
        };
        let idle = now.since(since);
        if idle >= self.limit {
            self.idle = Idle::Spent;
            return false;
        }
        if !self.oversubscribed && idle < PURE_SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        true
    }
}

/// Why a sleeping waiter must stop waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `abort()` was called.
    Aborted,
    /// The control connection is gone and nothing moved for
    /// [`ORPHAN_IDLE`].
    Orphaned,
    /// The deadline passed.
    Deadline,
}

/// The sleeping half of a wait: from the first sleep after progress
/// stopped until something moves again.
#[derive(Debug)]
pub(crate) struct Sleep {
    since: Stamp,
    deadline: Stamp,
}

impl Sleep {
    /// A waiter that stops at `deadline`.
    pub(crate) fn new(deadline: Stamp) -> Sleep {
        Sleep {
            since: Stamp::now(),
            deadline,
        }
    }

    /// The looks before each sleep, in order: abort, the control plane
    /// gone (`orphaned`) for too long, the deadline. Either why to stop or
    /// how long the next sleep may last (a sleep that can miss a wake-up,
    /// e.g. on a phase counter, takes less).
    pub(crate) fn look(&self, aborted: &AtomicBool, orphaned: bool) -> Result<Duration, Stop> {
        if aborted.load(Ordering::Acquire) {
            return Err(Stop::Aborted);
        }
        let now = Stamp::now();
        if orphaned && now.since(self.since) >= ORPHAN_IDLE {
            return Err(Stop::Orphaned);
        }
        let left = self.deadline.since(now);
        if left.is_zero() {
            return Err(Stop::Deadline);
        }
        Ok(match orphaned {
            true => left.min(ORPHAN_IDLE),
            false => left,
        })
    }
}

/// Look (`look`) until it answers or `until` passes; between looks,
/// `pause(left)` sleeps at most `left` (e.g. in `poll(2)` on the control
/// connection, which wakes it when a notice arrives). `look` breaks with
/// its answer, or with `None` when no answer can come any more.
pub(crate) fn look_until<T>(
    until: Instant,
    mut look: impl FnMut() -> ControlFlow<Option<T>>,
    mut pause: impl FnMut(Duration),
) -> Option<T> {
    loop {
        if let ControlFlow::Break(answer) = look() {
            return answer;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        pause(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_ends_after_its_limit_and_starts_again_after_progress() {
        let mut s = Spin::new(Duration::from_millis(5), true);
        let t = Instant::now();
        while s.turn() {}
        assert!(t.elapsed() >= Duration::from_millis(5));
        // Spent: nothing moved, so no new spin (a sleeping waiter wakes
        // from each slice straight into the next).
        assert!(!s.turn());
        s.moved();
        assert!(s.turn());
        assert!(!Spin::new(Duration::ZERO, false).turn());
    }

    #[test]
    fn ranks_share_cores_when_their_masks_hold_fewer_cpus_than_ranks() {
        let (c0, c1, both) = (&[0b01u8][..], &[0b10u8][..], &[0b11u8][..]);
        // Bound one to a core each: not shared, though each sees one CPU.
        assert!(!oversubscribed(&[c0, c1], c0, 1));
        // Both on one core, or four ranks on two.
        assert!(oversubscribed(&[c0, c0], c0, 1));
        assert!(oversubscribed(&[both; 4], both, 2));
        assert!(!oversubscribed(&[both; 2], both, 2));
        // CPUs beyond the first byte count; masks of different lengths.
        let c9 = &[0u8, 0b10][..];
        assert!(!oversubscribed(&[c0, c9], c9, 1));
        // A quota below the process's own mask (cgroup `cpu.max`): two
        // CPUs' worth for four ranks on a 64-CPU host.
        let wide = &[0xffu8; 8][..];
        assert!(oversubscribed(&[wide; 4], wide, 2));
        assert!(!oversubscribed(&[wide; 4], wide, 64));
        // A mask unknown: the process's count stands for the host.
        assert!(oversubscribed(&[c0, &[]], c0, 1));
        assert!(!oversubscribed(&[&[], &[]], &[], 2));
    }

    #[test]
    fn looks_stop_for_abort_first_then_orphan_then_deadline() {
        let aborted = AtomicBool::new(false);
        let now = Stamp::now();
        let live = Sleep::new(now.after(Duration::from_secs(60)));
        let d = live.look(&aborted, false).unwrap();
        assert!(d > Duration::from_secs(59));
        // Orphaned but recent: sleep at most the orphan idle time.
        assert_eq!(live.look(&aborted, true), Ok(ORPHAN_IDLE));
        let old = Sleep {
            since: now.before(ORPHAN_IDLE),
            deadline: now,
        };
        assert_eq!(old.look(&aborted, false), Err(Stop::Deadline));
        assert_eq!(old.look(&aborted, true), Err(Stop::Orphaned));
        aborted.store(true, Ordering::Release);
        assert_eq!(old.look(&aborted, true), Err(Stop::Aborted));
        assert_eq!(live.look(&aborted, false), Err(Stop::Aborted));
    }

    #[test]
    fn look_until_answers_gives_up_or_times_out() {
        let until = Instant::now() + Duration::from_secs(10);
        let mut n = 0;
        let pause = |_| {};
        let r = look_until(
            until,
            || {
                n += 1;
                match n {
                    3 => ControlFlow::Break(Some(n)),
                    _ => ControlFlow::Continue(()),
                }
            },
            pause,
        );
        assert_eq!(r, Some(3));
        let r: Option<()> = look_until(until, || ControlFlow::Break(None), pause);
        assert_eq!(r, None);
        let t = Instant::now();
        let r: Option<()> = look_until(
            t + Duration::from_millis(20),
            || ControlFlow::Continue(()),
            |left| std::thread::sleep(left.min(Duration::from_millis(5))),
        );
        assert_eq!(r, None);
        assert!(t.elapsed() >= Duration::from_millis(20));
    }
}
