//! Algorithms as *schedules*: pure functions from (collective, rank,
//! nranks, count, chunking) to the ordered steps one rank performs. No I/O
//! here: the executor runs a schedule over real links, the tests run every
//! rank's schedule symbolically and check that each element ends up with
//! exactly the contributions it must have.
//!
//! Ordering rules the executor relies on:
//! - messages from rank A to rank B are matched in the order both sides'
//!   schedules list them (each side numbers them 0, 1, 2, ...);
//! - a step starts only after all its `deps` have completed; a send
//!   completes when its last byte is handed to the transport, a receive when
//!   its last byte has arrived (and been reduced).

mod chain;
mod direct;
mod ring;

pub use chain::{broadcast, reduce};
pub use direct::{all_reduce_oneshot, all_to_all, barrier, p2p, P2pStep};
pub use ring::{all_gather, all_reduce, reduce_scatter};

/// Index of a buffer in the table the executor is given. Algorithms use
/// [`INPUT`], [`OUTPUT`] and [`SCRATCH`]; point-to-point groups use one per
/// operation.
pub type BufId = u16;
/// The caller's send buffer (mapped to the output for in-place calls).
pub const INPUT: BufId = 0;
/// The caller's receive buffer.
pub const OUTPUT: BufId = 1;
/// Executor-owned temporary memory of `Schedule::scratch` elements.
pub const SCRATCH: BufId = u16::MAX;

/// A span of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub buf: BufId,
    pub off: usize,
    pub len: usize,
}

impl Span {
    pub const fn new(buf: BufId, off: usize, len: usize) -> Span {
        Span { buf, off, len }
    }
}

/// What one step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `src` to `peer` as one message.
    Send { peer: usize, src: Span },
    /// Receive one message from `peer` into `dst`.
    Recv { peer: usize, dst: Span },
    /// Receive one message from `peer` and store `dst = incoming op with`
    /// (`with` may be `dst` itself).
    RecvReduce { peer: usize, dst: Span, with: Span },
    /// Copy `src` to `dst` locally (a no-op when they are the same memory).
    Copy { src: Span, dst: Span },
    /// Divide `dst` by the rank count (the end of `Avg`).
    Divide { dst: Span },
    /// `dst = src_0 op src_1 op .. op src_{n-1}`, combined in rank order,
    /// where `src_me` is `input` and every other `src_k` is the `dst.len`
    /// elements at `slots.off + k * dst.len` of `slots.buf`. Every rank that
    /// combines the same contributions computes the same bits.
    Combine {
        dst: Span,
        input: Span,
        slots: Span,
        me: usize,
    },
}

/// One step and the steps it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub action: Action,
    pub deps: Vec<u32>,
}

/// The steps of one rank for one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    pub steps: Vec<Step>,
    /// Elements of scratch memory the schedule uses.
    pub scratch: usize,
}

impl Schedule {
    /// The whole schedule of a one-rank communicator: copy input to output.
    pub fn copy_all(count: usize) -> Schedule {
        let mut s = Schedule::default();
        s.push(
            Action::Copy {
                src: Span::new(INPUT, 0, count),
                dst: Span::new(OUTPUT, 0, count),
            },
            &[],
        );
        s
    }

    /// Append a step; returns its index for later `deps`.
    pub fn push(&mut self, action: Action, deps: &[u32]) -> u32 {
        self.steps.push(Step {
            action,
            deps: deps.to_vec(),
        });
        (self.steps.len() - 1) as u32
    }
}

/// Size of segment `k` when `count` elements are cut into `n` nearly equal
/// parts (the first `count % n` get one more).
pub fn seg_len(count: usize, n: usize, k: usize) -> usize {
    count / n + usize::from(k < count % n)
}

/// Offset of segment `k`.
pub fn seg_off(count: usize, n: usize, k: usize) -> usize {
    k * (count / n) + k.min(count % n)
}

/// Cut `[off, off+len)` into pieces of at most `chunk` elements.
pub fn chunks(off: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |i| (off + i * chunk, chunk.min(len - i * chunk)))
}

/// `(a - b) mod n` for ring arithmetic on ranks.
pub(crate) fn sub_mod(a: usize, b: usize, n: usize) -> usize {
    (a + n - b % n) % n
}

#[cfg(test)]
mod check;
