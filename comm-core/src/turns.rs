//! Calls in issue order, one at a time: a ticket lock over the
//! communicator's call state.
//!
//! Every call takes a ticket when it is issued and runs when the ticket's
//! turn comes; the turn is also the only way to the state, so the order
//! and the exclusion are one mechanism. (They were two: a ticket counter
//! for the order and a `Mutex` for the state. With the turn's `SeqCst`
//! release, a call made four atomic read-modify-writes; each waits on
//! x86 for every store before it to reach its cache line, and the store
//! that publishes a small call is a line a peer core holds, so each call
//! waited a cache-line transfer. Now a call makes one: its ticket.)
//!
//! Ending a turn is a plain store (`Release`) and then a look at the
//! sleepers. Without a fence between them a thread that starts to sleep
//! in that instant may miss its wake-up; sleepers sleep in slices of
//! [`SLICE`] and look again, so that costs it one slice at most. (The
//! window is the store's way to memory, nanoseconds; waits for a turn
//! happen only when several threads or the async worker issue calls.)

use crate::sys::{futex_wait, futex_wake};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// The longest a sleeper sleeps before it looks again.
const SLICE: Duration = Duration::from_millis(1);

/// A place in the order of calls (tickets wrap; only equality matters).
/// Not `Copy`: a ticket is waited for once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a ticket not waited for blocks every later one"]
pub(crate) struct Ticket(u32);

/// Why a wait for a turn ended without it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoTurn {
    /// The caller's `give_up` said so (the communicator was aborted).
    GaveUp,
    /// An earlier turn ended in a panic: the state may be half-updated.
    Broken,
}

/// The call state `T`, reached one turn at a time in ticket order.
pub(crate) struct Turns<T> {
    /// The next ticket to hand out.
    next: AtomicU32,
    /// The ticket whose turn it is; sleepers sleep on it.
    now: AtomicU32,
    /// Threads asleep (or about to be) on `now`: a turn that ends wakes
    /// them only when there are some (a wake-up is a system call).
    sleepers: AtomicU32,
    /// A turn ended in a panic.
    broken: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Turn`, and at most one
// exists at a time (the one of the ticket whose turn it is), so moving
// `T` between threads is all sharing needs, as with `Mutex<T>`.
unsafe impl<T: Send> Sync for Turns<T> {}

impl<T> Turns<T> {
    pub(crate) fn new(value: T) -> Turns<T> {
        Turns {
            next: AtomicU32::new(0),
            now: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            broken: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Take the next place in the order.
    #[inline]
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Wait for `ticket`'s turn, unless `give_up` says to stop first (it
    /// is asked before each sleep; [`Turns::wake_all`] makes sleepers ask
    /// at once). A ticket given up never runs, and no later ticket either:
    /// giving up is for a communicator that fails every call from then on.
    #[inline]
    pub(crate) fn wait(
        &self,
        ticket: Ticket,
        give_up: impl Fn() -> bool,
    ) -> Result<Turn<'_, T>, NoTurn> {
        if self.now.load(Ordering::Acquire) != ticket.0 {
            self.sleep_until(&ticket, give_up)?;
        }
        self.turn(ticket)
    }

    /// The turn of `ticket`, whose turn it is now.
    #[inline]
    fn turn(&self, ticket: Ticket) -> Result<Turn<'_, T>, NoTurn> {
        let turn = Turn {
            turns: self,
            ticket,
        };
        match self.broken.load(Ordering::Relaxed) {
            // Dropped: the turn passes on, and every later one fails too.
            true => Err(NoTurn::Broken),
            false => Ok(turn),
        }
    }

    #[cold]
    fn sleep_until(&self, ticket: &Ticket, give_up: impl Fn() -> bool) -> Result<(), NoTurn> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let waited = loop {
            let now = self.now.load(Ordering::Acquire);
            if now == ticket.0 {
                break Ok(());
            }
            if give_up() {
                break Err(NoTurn::GaveUp);
            }
            futex_wait(&self.now, now, SLICE);
        };
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        waited
    }

    /// A turn now if no call runs or waits for one (for a look at the
    /// state from another thread that must not wait behind calls).
    pub(crate) fn try_turn(&self) -> Option<Turn<'_, T>> {
        let now = self.now.load(Ordering::Acquire);
        let ticket = self
            .next
            .compare_exchange(
                now,
                now.wrapping_add(1),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .ok()?;
        self.turn(Ticket(ticket)).ok()
    }

    /// Wake every sleeper to ask its `give_up` again.
    pub(crate) fn wake_all(&self) {
        futex_wake(&self.now);
    }

    /// The state, through exclusive access to the whole (no turn needed).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Exclusive access to the state during one ticket's turn; dropping it
/// passes the turn on.
pub(crate) struct Turn<'a, T> {
    turns: &'a Turns<T>,
    ticket: Ticket,
}

impl<T> Deref for Turn<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this is the turn of the ticket in `now`, the only one
        // that exists (a ticket is handed out once; `Turn` is made only
        // when `now` holds it and ends by moving `now` past it).
        unsafe { &*self.turns.value.get() }
    }
}

impl<T> DerefMut for Turn<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as `deref`, and `&mut self` makes this access unique.
        unsafe { &mut *self.turns.value.get() }
    }
}

impl<T> Drop for Turn<'_, T> {
    #[inline]
    fn drop(&mut self) {
        let t = self.turns;
        if std::thread::panicking() {
            t.broken.store(true, Ordering::Relaxed);
        }
        // Release: the next turn sees what this one wrote.
        t.now
            .store(self.ticket.0.wrapping_add(1), Ordering::Release);
        if t.sleepers.load(Ordering::Relaxed) > 0 {
            futex_wake(&t.now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn turns_come_in_ticket_order_across_threads() {
        let turns = Arc::new(Turns::new(Vec::new()));
        let tickets: Vec<Ticket> = (0..8).map(|_| turns.ticket()).collect();
        // Waited for in reverse: each thread must wait for the earlier.
        let threads: Vec<_> = tickets
            .into_iter()
            .enumerate()
            .rev()
            .map(|(i, t)| {
                let turns = Arc::clone(&turns);
                std::thread::spawn(move || {
                    let mut turn = turns.wait(t, || false).unwrap();
                    turn.push(i);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let t = turns.ticket();
        assert_eq!(
            *turns.wait(t, || false).unwrap(),
            (0..8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn exclusive_under_contention() {
        // A non-atomic read-modify-write under the turn: lost updates
        // would show if two turns overlapped.
        let turns = Arc::new(Turns::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let turns = Arc::clone(&turns);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let t = turns.ticket();
                        let mut turn = turns.wait(t, || false).unwrap();
                        let v = *turn;
                        std::hint::black_box(&v);
                        *turn = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let t = turns.ticket();
        assert_eq!(*turns.wait(t, || false).unwrap(), 80_000);
    }

    #[test]
    fn try_turn_only_when_nobody_runs_or_waits() {
        let turns = Turns::new(());
        assert!(turns.try_turn().is_some());
        let t = turns.ticket();
        let running = turns.wait(t, || false).unwrap();
        assert!(turns.try_turn().is_none(), "a call runs");
        let queued = turns.ticket();
        drop(running);
        assert!(turns.try_turn().is_none(), "a call waits for its turn");
        drop(turns.wait(queued, || false).unwrap());
        assert!(turns.try_turn().is_some());
    }

    #[test]
    fn a_sleeper_gives_up_when_woken() {
        let turns = Arc::new(Turns::new(()));
        let stop = Arc::new(AtomicBool::new(false));
        let first = turns.ticket();
        let held = turns.wait(first, || false).unwrap();
        let second = turns.ticket();
        let waiter = {
            let (turns, stop) = (Arc::clone(&turns), Arc::clone(&stop));
            std::thread::spawn(move || {
                turns
                    .wait(second, || stop.load(Ordering::Relaxed))
                    .map(|_| ())
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        turns.wake_all();
        assert_eq!(waiter.join().unwrap(), Err(NoTurn::GaveUp));
        drop(held);
    }

    #[test]
    fn a_panic_in_a_turn_breaks_the_later_ones() {
        let turns = Arc::new(Turns::new(()));
        let t = turns.ticket();
        let panicked = {
            let turns = Arc::clone(&turns);
            std::thread::spawn(move || {
                let _turn = turns.wait(t, || false).unwrap();
                panic!("inside a turn");
            })
            .join()
        };
        assert!(panicked.is_err());
        let next = turns.ticket();
        assert_eq!(turns.wait(next, || false).err(), Some(NoTurn::Broken));
        // The broken turn passed on all the same: nothing hangs.
        let later = turns.ticket();
        assert_eq!(turns.wait(later, || false).err(), Some(NoTurn::Broken));
    }
}
