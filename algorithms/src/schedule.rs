//! A *schedule*: the ordered steps one rank performs for one call. No I/O
//! here: the executor runs a schedule over real links and compute engines,
//! the checker ([`crate::check`]) runs every rank's schedule symbolically
//! and checks that each element ends up with exactly the contributions it
//! must have.
//!
//! Ordering rules the executor relies on:
//! - messages from rank A to rank B are matched in the order both sides'
//!   schedules list them (each side numbers them 0, 1, 2, ...);
//! - a step starts only after all its `deps` have completed; a send
//!   completes when its last byte is handed to the transport, a receive when
//!   its last byte has arrived (and been reduced).

/// Index of a buffer in the table the executor is given. Algorithms use
/// [`INPUT`], [`OUTPUT`] and [`SCRATCH`]; point-to-point groups use one per
/// operation.
pub type BufId = u16;
/// The caller's send buffer (mapped to the output for in-place calls).
pub const INPUT: BufId = 0;
/// The caller's receive buffer.
pub const OUTPUT: BufId = 1;
/// Executor-owned temporary memory of `Schedule::scratch` elements, in the
/// memory space of the call's buffers (device memory for a device call).
pub const SCRATCH: BufId = u16::MAX;
/// Executor-owned host memory of `Schedule::stage` elements that messages
/// of a staged schedule travel through ([`crate::staged`]).
pub const STAGE: BufId = u16::MAX - 1;
/// Executor-owned host memory of `Schedule::shared` elements that every
/// rank of one host maps: a direct step may read a peer's (the copy-in
/// algorithm, [`crate::copyin`], for plain buffers). Only schedules of a
/// spec with `shared > 0` use it.
pub const SHARED: BufId = u16::MAX - 2;

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
    /// `dst = a op b` locally (`dst` may be `a` or `b`): the reduction of a
    /// staged receive-reduce, `a` the message, `b` the original `with`.
    Reduce { dst: Span, a: Span, b: Span },
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
    /// Direct access: `dst = src of rank 0 op src of rank 1 op ..`, in rank
    /// order, reading every peer's `src` where it lies (peers' memory mapped
    /// here; the buffer has the same shape on every rank) and, for this
    /// rank's own contribution, `own` (its `src`, or any of its memory of
    /// that length). `dst` may be `own` (in place), never a span peers read
    /// before the next [`Action::Sync`]. `also`: the same combination
    /// written into this span of this rank's memory too, in the same pass
    /// (a copy-in owner's segment of its own output, beside the copy its
    /// peers read; nobody reads it during the call).
    ReduceFrom {
        dst: Span,
        src: Span,
        own: Span,
        also: Option<Span>,
    },
    /// Direct access: [`Action::ReduceFrom`]'s combination written into
    /// `dst` of this rank and of every peer (mapped access only; the buffer
    /// has the same shape on every rank), in one pass: what a reduction
    /// into scratch followed by a [`Action::CopyTo`] per peer does in two.
    /// `dst` may be `own` (in place).
    ReduceToAll { dst: Span, src: Span, own: Span },
    /// Direct access: copy rank `peer`'s `src` into this rank's `dst`.
    CopyFrom { peer: usize, src: Span, dst: Span },
    /// Direct access: copy this rank's `src` into rank `peer`'s `dst` (the
    /// buffer has the same shape on every rank; mapped access only).
    CopyTo { peer: usize, src: Span, dst: Span },
    /// Direct access: wait until every rank has reached its matching `Sync`
    /// (the k-th `Sync` of the call on each rank). What a rank wrote before
    /// its `Sync` is visible to every rank after theirs; what a rank reads
    /// after one `Sync` nobody changes before the next.
    Sync,
}

impl Action {
    /// The peer a message step talks to (`None` for local and direct steps).
    pub fn message_peer(&self) -> Option<(usize, bool)> {
        match *self {
            Action::Send { peer, .. } => Some((peer, true)),
            Action::Recv { peer, .. } | Action::RecvReduce { peer, .. } => Some((peer, false)),
            _ => None,
        }
    }
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
    /// Elements of host staging memory ([`STAGE`]) it uses.
    pub stage: usize,
    /// Elements of shared memory ([`SHARED`]) it uses.
    pub shared: usize,
    /// Peers read this rank's output during the call (a registered
    /// broadcast's root): what the rank copies into it should stay cached
    /// rather than stream past the cache as a final output.
    pub output_read: bool,
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
pub fn sub_mod(a: usize, b: usize, n: usize) -> usize {
    (a + n - b % n) % n
}
