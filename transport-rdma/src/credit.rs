//! Credit-based flow control over a ring of fixed-size slots, with no I/O.
//!
//! The receiver owns `slots` slots of `slot_bytes` each in registered memory
//! and advertised their address and key. Message `m` (counted from 0 on
//! each side) always goes to slot `m % slots`. The sender may post message
//! `m` only when the receiver has freed message `m - slots` (a *credit*) and
//! its own send of message `m - slots` has completed locally (the bounce
//! slot it used is free again). The receiver frees a slot once its bytes
//! have been read out, and returns freed slots as credits in batches.
//!
//! Because both sides count messages and RC delivers in order, slot indices
//! never travel: a data message carries its length, a credit message the
//! number of slots freed. Anything that contradicts the counts (a credit for
//! a slot never sent, a message into a slot not yet freed, a message longer
//! than a slot) is a protocol error, never an overrun.

use std::collections::VecDeque;
use std::fmt;

/// A peer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowError(pub String);

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The sending side of one direction.
#[derive(Debug, Clone)]
pub struct SendWindow {
    slots: u64,
    /// Messages posted.
    posted: u64,
    /// Messages the receiver has freed (credits received).
    freed: u64,
    /// Messages whose local send completion arrived.
    completed: u64,
}

impl SendWindow {
    pub fn new(slots: u32) -> SendWindow {
        SendWindow {
            slots: slots as u64,
            posted: 0,
            freed: 0,
            completed: 0,
        }
    }

    /// Whether message `posted` may go now: its remote slot is free and
    /// the local buffer of the message `slots` before it is done.
    pub fn can_post(&self) -> bool {
        self.posted - self.freed < self.slots && self.posted - self.completed < self.slots
    }

    /// The slot the next [`SendWindow::post`] takes.
    pub fn next_slot(&self) -> u32 {
        (self.posted % self.slots) as u32
    }

    /// Take the next slot; call only when [`SendWindow::can_post`].
    pub fn post(&mut self) -> u32 {
        debug_assert!(self.can_post());
        let slot = (self.posted % self.slots) as u32;
        self.posted += 1;
        slot
    }

    /// The receiver freed `n` more slots.
    pub fn credit(&mut self, n: u32) -> Result<(), FlowError> {
        if n == 0 || self.freed + n as u64 > self.posted {
            return Err(FlowError(format!(
                "peer returned {n} credits with only {} messages unacknowledged",
                self.posted - self.freed
            )));
        }
        self.freed += n as u64;
        Ok(())
    }

    /// The oldest outstanding local send completed.
    pub fn completed(&mut self) -> Result<(), FlowError> {
        if self.completed >= self.posted {
            return Err(FlowError("a send completed that was never posted".into()));
        }
        self.completed += 1;
        Ok(())
    }

    /// Messages posted whose completion has not arrived.
    pub fn in_flight(&self) -> u64 {
        self.posted - self.completed
    }
}

/// One arrived message not yet fully read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    pub slot: u32,
    pub len: u32,
    pub read: u32,
}

/// The receiving side of one direction.
#[derive(Debug, Clone)]
pub struct RecvWindow {
    slots: u32,
    slot_bytes: u32,
    arrived: u64,
    freed: u64,
    /// Freed slots not yet returned to the sender.
    unreported: u32,
    queue: VecDeque<Filled>,
}

impl RecvWindow {
    pub fn new(slots: u32, slot_bytes: u32) -> RecvWindow {
        RecvWindow {
            slots,
            slot_bytes,
            arrived: 0,
            freed: 0,
            unreported: 0,
            queue: VecDeque::with_capacity(slots as usize),
        }
    }

    /// A data message of `len` bytes arrived (in the next slot).
    pub fn arrived(&mut self, len: u32) -> Result<(), FlowError> {
        if self.arrived - self.freed >= self.slots as u64 {
            return Err(FlowError(format!(
                "peer wrote a message with all {} slots full (no credit)",
                self.slots
            )));
        }
        if len == 0 || len > self.slot_bytes {
            return Err(FlowError(format!(
                "peer announced a message of {len} bytes (slots hold 1..={})",
                self.slot_bytes
            )));
        }
        let slot = (self.arrived % self.slots as u64) as u32;
        self.arrived += 1;
        self.queue.push_back(Filled { slot, len, read: 0 });
        Ok(())
    }

    /// The oldest unread bytes: (slot, offset in it, bytes left).
    pub fn front(&self) -> Option<(u32, u32, u32)> {
        self.queue.front().map(|f| (f.slot, f.read, f.len - f.read))
    }

    /// `n` bytes of the front message were read out (at most what is left).
    pub fn consume(&mut self, n: u32) {
        let f = self.queue.front_mut().expect("consume with nothing queued");
        debug_assert!(n <= f.len - f.read);
        f.read += n;
        if f.read == f.len {
            self.queue.pop_front();
            self.freed += 1;
            self.unreported += 1;
        }
    }

    /// Credits to return now, if any (they are then counted as returned).
    ///
    /// Credits go back in batches of half the window: one credit message
    /// per several data messages, while the sender still has the other half
    /// of the slots to keep writing into. This cannot stall a sender: it
    /// waits only with every slot unacknowledged, and once the receiver has
    /// read them all (it reads in order, and those are the bytes it needs
    /// next) at least a full window is due.
    pub fn take_credits(&mut self) -> Option<u32> {
        if self.unreported < self.slots.div_ceil(2) {
            return None;
        }
        Some(std::mem::take(&mut self.unreported))
    }

    /// Give credits back that could not be sent (no room in the send queue).
    pub fn untake_credits(&mut self, n: u32) {
        self.unreported += n;
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_stops_at_the_window_and_resumes_on_credit_and_completion() {
        let mut s = SendWindow::new(4);
        let slots: Vec<u32> = (0..4)
            .map(|_| {
                let next = s.next_slot();
                let got = s.post();
                assert_eq!(next, got);
                got
            })
            .collect();
        assert_eq!(slots, vec![0, 1, 2, 3]);
        assert!(!s.can_post(), "a fifth message would overrun the receiver");
        s.credit(1).unwrap();
        assert!(
            !s.can_post(),
            "the bounce slot is still in use until the send completes"
        );
        s.completed().unwrap();
        assert!(s.can_post());
        assert_eq!(s.post(), 0);
        assert!(!s.can_post());
        s.completed().unwrap();
        assert!(
            !s.can_post(),
            "completion alone does not free the remote slot"
        );
        s.credit(2).unwrap();
        assert!(s.can_post());
        assert_eq!(s.in_flight(), 3);
    }

    #[test]
    fn bogus_credits_and_completions_are_errors() {
        let mut s = SendWindow::new(4);
        assert!(s.credit(1).is_err(), "credit before any message");
        s.post();
        assert!(s.credit(0).is_err());
        assert!(s.credit(2).is_err(), "more credits than messages");
        s.credit(1).unwrap();
        s.completed().unwrap();
        assert!(s.completed().is_err());
    }

    #[test]
    fn receiver_frees_slots_in_order_and_batches_credits() {
        let mut r = RecvWindow::new(3, 100);
        r.arrived(10).unwrap();
        r.arrived(100).unwrap();
        assert_eq!(r.front(), Some((0, 0, 10)));
        r.consume(4);
        assert_eq!(r.front(), Some((0, 4, 6)));
        assert_eq!(r.take_credits(), None, "nothing freed yet");
        r.consume(6);
        assert_eq!(
            r.take_credits(),
            None,
            "one slot is less than half the window"
        );
        assert_eq!(r.front(), Some((1, 0, 100)));
        r.consume(100);
        assert!(r.is_empty());
        assert_eq!(r.take_credits(), Some(2));
        assert_eq!(r.take_credits(), None);
        r.untake_credits(2);
        assert_eq!(r.take_credits(), Some(2));
        // Slots wrap around.
        for len in [1, 2, 3] {
            r.arrived(len).unwrap();
        }
        assert_eq!(r.front(), Some((2, 0, 1)));
    }

    #[test]
    fn receiver_rejects_overrun_and_bad_lengths() {
        let mut r = RecvWindow::new(2, 64);
        assert!(r.arrived(0).is_err());
        assert!(r.arrived(65).is_err());
        r.arrived(64).unwrap();
        r.arrived(1).unwrap();
        assert!(r.arrived(1).is_err(), "a third message with two slots full");
        r.consume(64);
        r.arrived(1).unwrap();
    }

    #[test]
    fn a_sender_and_receiver_agree_under_random_interleavings() {
        // Drive both state machines with a deterministic pseudo-random
        // schedule; every message lands in the slot the sender chose and the
        // receiver is never overrun.
        let (slots, bytes) = (5u32, 32u32);
        let mut s = SendWindow::new(slots);
        let mut r = RecvWindow::new(slots, bytes);
        let mut wire: VecDeque<(u32, u32)> = VecDeque::new(); // (slot, len)
        let mut credits: VecDeque<u32> = VecDeque::new();
        let mut pending_completions = 0u32;
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut delivered = 0u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 5 {
                0 if s.can_post() => {
                    let slot = s.post();
                    wire.push_back((slot, 1 + (x >> 8) as u32 % bytes));
                    pending_completions += 1;
                }
                1 if pending_completions > 0 => {
                    s.completed().unwrap();
                    pending_completions -= 1;
                }
                2 => {
                    if let Some((slot, len)) = wire.pop_front() {
                        r.arrived(len).unwrap();
                        assert_eq!(r.queue.back().unwrap().slot, slot);
                        delivered += 1;
                    }
                }
                3 => {
                    if let Some((_, _, left)) = r.front() {
                        r.consume(left.min(1 + (x >> 20) as u32 % 40));
                    }
                    if let Some(c) = r.take_credits() {
                        credits.push_back(c);
                    }
                }
                _ => {
                    if let Some(c) = credits.pop_front() {
                        s.credit(c).unwrap();
                    }
                }
            }
        }
        assert!(delivered > 1000, "the schedule made progress ({delivered})");
        // Drain: deliver and read everything; the sender must be able to
        // post again (batched credits never strand a full window).
        while let Some((_, len)) = wire.pop_front() {
            r.arrived(len).unwrap();
        }
        while let Some((_, _, left)) = r.front() {
            r.consume(left);
        }
        if let Some(c) = r.take_credits() {
            credits.push_back(c);
        }
        while let Some(c) = credits.pop_front() {
            s.credit(c).unwrap();
        }
        while pending_completions > 0 {
            s.completed().unwrap();
            pending_completions -= 1;
        }
        assert!(s.can_post(), "sender stranded with everything read");
    }
}
