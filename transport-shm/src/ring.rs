//! A single-producer single-consumer byte ring in shared memory, with an
//! eventcount for sleeping: a side that finds the ring empty (or full) raises
//! its "waiting" flag, re-checks, and only then sleeps on an eventfd; the
//! other side signals the eventfd only when it sees the flag. So a busy pair
//! makes no system calls at all, and an idle one never misses a wake-up.
//!
//! Header layout (128 bytes, producer and consumer fields on separate cache
//! lines so they never false-share):
//!
//! | offset | field | written by |
//! |---|---|---|
//! | 0 | head: bytes ever written (u64) | producer |
//! | 8 | writer_waiting (u32) | producer |
//! | 64 | tail: bytes ever read (u64) | consumer |
//! | 72 | reader_waiting (u32) | consumer |

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of a ring header.
pub const HEADER: usize = 128;

/// The least piece a streamed write streams (below it non-temporal stores
/// gain nothing over the cache, and `copy_streaming` copies plainly).
const STREAM_PIECE: usize = 4096;

/// One ring inside a mapping: `base` points at its header, `data` at its
/// `cap` bytes of payload.
pub struct Ring {
    base: *mut u8,
    data: *mut u8,
    cap: usize,
}

// SAFETY: the ring is shared memory used through atomics and disjoint
// ranges; each process uses one end only.
unsafe impl Send for Ring {}

impl Ring {
    /// # Safety
    /// `base` must point at `HEADER + cap` bytes of shared, 64-byte aligned
    /// memory that stays mapped as long as the ring is used, zeroed before
    /// first use, with one producer and one consumer.
    pub unsafe fn new(base: *mut u8, cap: usize) -> Ring {
        Ring {
            base,
            data: base.add(HEADER),
            cap,
        }
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: offset 0 of the header, 8-byte aligned, shared memory.
        unsafe { &*(self.base as *const AtomicU64) }
    }
    fn writer_waiting(&self) -> &AtomicU32 {
        // SAFETY: offset 8 of the header, 4-byte aligned.
        unsafe { &*(self.base.add(8) as *const AtomicU32) }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: offset 64 of the header, 8-byte aligned.
        unsafe { &*(self.base.add(64) as *const AtomicU64) }
    }
    fn reader_waiting(&self) -> &AtomicU32 {
        // SAFETY: offset 72 of the header, 4-byte aligned.
        unsafe { &*(self.base.add(72) as *const AtomicU32) }
    }

    /// Producer: copy as much of `bufs` as fits, through the cache or,
    /// with `streamed`, past it for pieces of a page or more (the consumer
    /// reads the same bytes; the streamed copy fences its stores before
    /// `head` is published). Returns (bytes written, whether the consumer
    /// asked to be woken).
    pub fn write(&self, bufs: &[IoSlice<'_>], streamed: bool) -> (usize, bool) {
        let head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::Acquire);
        let mut free = self.cap - (head - tail) as usize;
        let mut pos = head;
        for b in bufs {
            let mut src: &[u8] = b;
            while !src.is_empty() && free > 0 {
                let off = (pos % self.cap as u64) as usize;
                let n = src.len().min(free).min(self.cap - off);
                // SAFETY: [off, off+n) lies in the data area and belongs to the
                // producer until `head` is published (the consumer reads < head).
                unsafe {
                    match streamed && n >= STREAM_PIECE {
                        true => kernels::copy::copy_streaming(self.data.add(off), src.as_ptr(), n),
                        false => kernels::copy::copy_cached(self.data.add(off), src.as_ptr(), n),
                    }
                };
                src = &src[n..];
                free -= n;
                pos += n as u64;
            }
        }
        let n = (pos - head) as usize;
        if n == 0 {
            return (0, false);
        }
        self.head().store(pos, Ordering::Release);
        fence(Ordering::SeqCst);
        let wake = self.reader_waiting().load(Ordering::Relaxed) != 0
            && self.reader_waiting().swap(0, Ordering::AcqRel) != 0;
        (n, wake)
    }

    /// Consumer: copy out as much as is there. Returns (bytes read, whether
    /// the producer asked to be woken).
    pub fn read(&self, bufs: &mut [IoSliceMut<'_>]) -> (usize, bool) {
        let tail = self.tail().load(Ordering::Relaxed);
        let head = self.head().load(Ordering::Acquire);
        let mut avail = (head - tail) as usize;
        let mut pos = tail;
        for b in bufs.iter_mut() {
            let mut dst: &mut [u8] = b;
            while !dst.is_empty() && avail > 0 {
                let off = (pos % self.cap as u64) as usize;
                let n = dst.len().min(avail).min(self.cap - off);
                // SAFETY: [off, off+n) holds published bytes (< head) the
                // producer will not touch until `tail` moves past them.
                unsafe { kernels::copy::copy_cached(dst.as_mut_ptr(), self.data.add(off), n) };
                dst = &mut dst[n..];
                avail -= n;
                pos += n as u64;
            }
        }
        let n = (pos - tail) as usize;
        if n == 0 {
            return (0, false);
        }
        self.tail().store(pos, Ordering::Release);
        fence(Ordering::SeqCst);
        let wake = self.writer_waiting().load(Ordering::Relaxed) != 0
            && self.writer_waiting().swap(0, Ordering::AcqRel) != 0;
        (n, wake)
    }

    /// Consumer: announce sleeping; true if data arrived meanwhile (then the
    /// flag is withdrawn and the caller should read instead of sleeping).
    pub fn reader_sleep(&self) -> bool {
        self.reader_waiting().store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let ready = self.head().load(Ordering::Acquire) != self.tail().load(Ordering::Relaxed);
        if ready {
            self.reader_waiting().store(0, Ordering::Relaxed);
        }
        ready
    }

    /// Producer: announce sleeping; true if space appeared meanwhile.
    pub fn writer_sleep(&self) -> bool {
        self.writer_waiting().store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let head = self.head().load(Ordering::Relaxed);
        let ready = ((head - self.tail().load(Ordering::Acquire)) as usize) < self.cap;
        if ready {
            self.writer_waiting().store(0, Ordering::Relaxed);
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_in_order_across_wraparound() {
        let cap = 1000;
        let mut mem = vec![0u64; (HEADER + cap) / 8 + 1];
        // SAFETY: a zeroed local buffer, used by this one thread as both ends.
        let r = unsafe { Ring::new(mem.as_mut_ptr() as *mut u8, cap) };
        let mut next_in = 0u8;
        let mut next_out = 0u8;
        for round in 0..500 {
            let len = 1 + (round * 37) % 900;
            let src: Vec<u8> = (0..len)
                .map(|_| {
                    next_in = next_in.wrapping_add(1);
                    next_in
                })
                .collect();
            // Streamed and cached writes alternate: the same bytes arrive.
            let (n, _) = r.write(&[IoSlice::new(&src)], round % 2 == 1);
            next_in = next_in.wrapping_sub((len - n) as u8);
            let mut dst = vec![0u8; 700];
            let (m, _) = r.read(&mut [IoSliceMut::new(&mut dst)]);
            for b in &dst[..m] {
                next_out = next_out.wrapping_add(1);
                assert_eq!(*b, next_out);
            }
        }
        assert!(!r.reader_sleep() || r.read(&mut [IoSliceMut::new(&mut [0u8; 2000])]).0 > 0);
    }

    #[test]
    fn streamed_and_cached_pieces_arrive_alike_across_wraparound() {
        // Pieces of pages and more (streamed where asked), split by the
        // wrap at odd offsets, read back in other sizes.
        let cap = 3 * 65536 + 40;
        let mut mem = vec![0u64; (HEADER + cap) / 8 + 1];
        // SAFETY: a zeroed local buffer, used by this one thread as both ends.
        let r = unsafe { Ring::new(mem.as_mut_ptr() as *mut u8, cap) };
        let (mut sent, mut got) = (0u64, 0u64);
        let byte = |i: u64| (i * 7 + i / 251) as u8;
        for round in 0..200u64 {
            let len = 4096 + ((round * 9973) % 60000) as usize;
            let src: Vec<u8> = (sent..sent + len as u64).map(byte).collect();
            let (n, _) = r.write(&[IoSlice::new(&src)], round % 3 != 0);
            sent += n as u64;
            let mut dst = vec![0u8; 50000];
            let (m, _) = r.read(&mut [IoSliceMut::new(&mut dst)]);
            for b in &dst[..m] {
                assert_eq!(*b, byte(got), "byte {got}");
                got += 1;
            }
        }
        assert!(got > 4 * cap as u64, "{got}");
    }
}
