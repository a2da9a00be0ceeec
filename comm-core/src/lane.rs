//! The point-to-point lane: sends and receives travel on links of their
//! own (made at init next to the collectives' links, by the same
//! transports) and are progressed by a thread of their own (started at the
//! first send or receive), so they never wait behind collectives or each
//! other: a posted receive (`recv_async`) completes whenever its data
//! comes, whatever this rank calls meanwhile, and "post a receive, then
//! send" completes on both sides.
//!
//! Progress: the lane's state is shared by its thread and the callers. A
//! blocking call (or a group without collectives) drives the lane itself
//! while bytes move and for `OXCCL_SPIN_US` once idle (a pure spin for 2
//! µs, then yielding, as the collectives' executor waits), without waking
//! the lane's thread, so a small send or receive costs no thread hand-off;
//! then it wakes the thread and sleeps on its result.
//!
//! Matching: per peer and direction, operations are matched in the order
//! they were posted (MPI's non-overtaking rule, NCCL's per-peer order).
//! Each message is one header (the collectives' format: the operation's
//! number in its direction, payload length, the operation's fingerprint)
//! and its payload, so a send matched with a receive of another type or
//! length is a mismatch that names both sides.
//!
//! Failure: the lane fails the communicator the way a collective does: a
//! closed link is a lost peer (unless the control plane, or the peer's
//! living process, says otherwise), a receive or send that waits past its
//! deadline is reported to the root, whose verdict (the stalled rank, or a
//! cycle of waits) becomes the error, and every pending operation fails
//! with the cause. An error of the communicator fails the lane's
//! operations too.

use crate::call::Fingerprint;
use crate::comm::Inner;
use crate::control::failure;
use crate::control::notice::Notice;
use crate::error::{Error, Result};
use crate::exec::header::{self, WireHeader, HEADER_LEN};
use crate::exec::{self as executor};
use crate::mem::Region;
use crate::transport::Link;
use crate::wait::{look_until, Spin, EXPLAIN_WAIT};
use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// What runs when every operation of a batch finished: `Ok` or the first
/// error.
pub(crate) type Then = Box<dyn FnOnce(Result<()>) + Send>;

/// The operations of one call, completed together.
struct Batch {
    left: AtomicUsize,
    err: Mutex<Option<Error>>,
    then: Mutex<Option<Then>>,
}

impl Batch {
    fn op_done(&self, r: Result<()>) {
        if let Err(e) = r {
            self.err.lock().unwrap().get_or_insert(e);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let result = self.err.lock().unwrap().take().map_or(Ok(()), Err);
            if let Some(then) = self.then.lock().unwrap().take() {
                then(result);
            }
        }
    }
}

/// One posted operation.
struct Op {
    send: bool,
    peer: usize,
    region: Region,
    fp: Fingerprint,
    /// Its number among the operations with `peer` in its direction.
    seq: u64,
    /// The header: built for a send, read into for a receive.
    header: [u8; HEADER_LEN],
    /// The payload's parts, one per stream of the link (one part below
    /// `SPLIT_BYTES`); part 0 goes after the header on stream 0.
    parts: [Part; MAX_PARTS],
    nparts: usize,
    deadline: Instant,
    timeout: Duration,
    batch: Arc<Batch>,
}

impl Op {
    fn name(&self) -> String {
        match self.send {
            true => format!("send #{} to rank {}", self.seq, self.peer),
            false => format!("recv #{} from rank {}", self.seq, self.peer),
        }
    }

    /// Bytes moved so far, headers included.
    fn moved(&self) -> usize {
        self.parts[..self.nparts].iter().map(|p| p.moved).sum()
    }
}

/// Payloads of at least this many bytes are split over every stream of the
/// link (TCP's sockets move in parallel), as the collectives spread their
/// messages; smaller ones travel whole on stream 0.
const SPLIT_BYTES: usize = 256 << 10;

/// Most streams one operation uses.
const MAX_PARTS: usize = 8;

/// One stream's share of an operation: `start..end` of the payload (after
/// the header on stream 0), `moved` bytes of it done (header included).
#[derive(Clone, Copy, Debug, Default)]
struct Part {
    stream: usize,
    start: usize,
    end: usize,
    moved: usize,
}

impl Part {
    fn header(&self) -> usize {
        if self.stream == 0 {
            HEADER_LEN
        } else {
            0
        }
    }

    fn len(&self) -> usize {
        self.header() + self.end - self.start
    }

    fn done(&self) -> bool {
        self.moved == self.len()
    }
}

/// The parts of a `len`-byte payload over a link of `streams` streams.
fn split(len: usize, streams: usize) -> ([Part; MAX_PARTS], usize) {
    let n = if len >= SPLIT_BYTES {
        streams.clamp(1, MAX_PARTS)
    } else {
        1
    };
    let mut parts = [Part::default(); MAX_PARTS];
    for (i, p) in parts[..n].iter_mut().enumerate() {
        *p = Part {
            stream: i,
            start: len * i / n,
            end: len * (i + 1) / n,
            moved: 0,
        };
    }
    (parts, n)
}

/// The lane of one communicator: its shared state, the thread's wake-up,
/// and how long callers drive it before they sleep.
pub(crate) struct Lane {
    core: Arc<Mutex<Core>>,
    wake: Arc<OwnedFd>,
    /// Held by the lane's thread while it holds the communicator (see
    /// [`Lane::gate`]).
    gate: Arc<Mutex<()>>,
    started: AtomicBool,
    spin: Duration,
    oversubscribed: bool,
}

/// One operation to post: `region` holds elements of `fp.dtype`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneOp {
    pub send: bool,
    pub peer: usize,
    pub region: Region,
    pub fp: Fingerprint,
}

impl Lane {
    /// The lane over `links` (one per peer; `None` for this rank).
    pub(crate) fn new(
        me: usize,
        links: Vec<Option<Box<dyn Link>>>,
        spin: Duration,
        oversubscribed: bool,
    ) -> Result<Lane> {
        let n = links.len();
        let wake =
            Arc::new(crate::sys::eventfd().map_err(|e| Error::System(format!("eventfd: {e}")))?);
        Ok(Lane {
            core: Arc::new(Mutex::new(Core {
                me,
                links,
                sends: (0..n).map(|_| VecDeque::new()).collect(),
                recvs: (0..n).map(|_| VecDeque::new()).collect(),
                sent: vec![0; n],
                received: vec![0; n],
                failed: None,
                closed: false,
            })),
            wake,
            gate: Arc::new(Mutex::new(())),
            started: AtomicBool::new(false),
            spin,
            oversubscribed,
        })
    }

    /// The lane's thread keeps only a weak handle on the communicator and
    /// holds a strong one for a moment at a time, under this lock. Were the
    /// user's last handle dropped in such a moment, the thread would run
    /// the departure (the goodbye to the root) and the process could end
    /// first, so peers would report this rank lost: the last handle drops
    /// holding this lock ([`crate::Communicator`]'s `Drop`).
    pub(crate) fn gate(&self) -> Arc<Mutex<()>> {
        self.gate.clone()
    }

    /// Wake the lane's thread (an abort, an error, a new post).
    pub(crate) fn wake(&self) {
        crate::sys::signal(self.wake.as_raw_fd());
    }

    /// Post `ops` (checked by the caller); `then` runs once all finished,
    /// on whichever thread finishes the last one (or here, when there is
    /// nothing to do or the communicator already failed). `driven`: the
    /// caller drives the lane next ([`Lane::drive`]), so the lane's thread
    /// is not woken (it would only contend for the lane, and for a core).
    pub(crate) fn post(
        &self,
        inner: &Arc<Inner>,
        ops: &[LaneOp],
        timeout: Duration,
        driven: bool,
        then: Then,
    ) {
        if ops.is_empty() {
            return then(Ok(()));
        }
        if let Some(e) = inner.poisoned() {
            return then(Err(e));
        }
        if let Err(e) = self.start(inner) {
            return then(Err(e));
        }
        let batch = Arc::new(Batch {
            left: AtomicUsize::new(ops.len()),
            err: Mutex::new(None),
            then: Mutex::new(Some(then)),
        });
        let now = Instant::now();
        let mut core = self.core.lock().unwrap();
        for o in ops {
            let counter = match o.send {
                true => &mut core.sent[o.peer],
                false => &mut core.received[o.peer],
            };
            *counter += 1;
            let seq = *counter - 1;
            let streams = core.links[o.peer].as_ref().map_or(1, |l| l.streams());
            let (parts, nparts) = split(o.region.len, streams);
            core.queue(Op {
                send: o.send,
                peer: o.peer,
                region: o.region,
                fp: o.fp,
                seq,
                header: match o.send {
                    true => header::encode(seq, 0, 0, o.region.len as u64, &o.fp),
                    false => [0; HEADER_LEN],
                },
                parts,
                nparts,
                deadline: now + timeout,
                timeout,
                batch: batch.clone(),
            });
        }
        drop(core);
        if !driven {
            self.wake();
        }
    }

    /// Drive the lane from this thread until `done()`, or until nothing
    /// moved for the spin time; then wake the lane's thread to go on (the
    /// caller sleeps on its result).
    pub(crate) fn drive(&self, inner: &Inner, done: impl Fn() -> bool) {
        let mut spin = Spin::new(self.spin, self.oversubscribed);
        while !done() {
            if let Ok(mut core) = self.core.try_lock() {
                if core.step(inner) {
                    spin.moved();
                }
            }
            if done() {
                return;
            }
            if !spin.turn() {
                return self.wake();
            }
        }
    }

    /// Start the lane's thread, the first time.
    fn start(&self, inner: &Arc<Inner>) -> Result<()> {
        if self.started.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let thread = Thread {
            inner: Arc::downgrade(inner),
            core: self.core.clone(),
            wake: self.wake.clone(),
            gate: self.gate.clone(),
        };
        std::thread::Builder::new()
            .name("oxccl-p2p".into())
            .spawn(move || thread.run())
            .map(|_| ())
            .map_err(|e| Error::System(format!("cannot start the point-to-point thread: {e}")))
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // The thread sees the lane closed, fails what is left, and ends.
        if let Ok(mut core) = self.core.lock() {
            core.closed = true;
        }
        self.wake();
    }
}

/// The lane's thread: steps the lane, then sleeps on the links of the
/// head operations, its wake-up, or the nearest deadline.
struct Thread {
    inner: Weak<Inner>,
    core: Arc<Mutex<Core>>,
    wake: Arc<OwnedFd>,
    gate: Arc<Mutex<()>>,
}

impl Thread {
    fn run(self) {
        let mut fds = Vec::new();
        loop {
            crate::sys::drain(self.wake.as_raw_fd());
            // Held from the upgrade to the drop (see `Lane::gate`).
            let gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
            // Upgraded outside the lock and dropped after it: if this is the
            // last handle, dropping it drops the lane, which takes the lock.
            let inner = self.inner.upgrade();
            let limit = {
                let mut core = self.core.lock().unwrap();
                let Some(inner) = inner.as_ref().filter(|_| !core.closed) else {
                    // The communicator is gone: nothing can complete any more.
                    core.fail_all(Error::Aborted {
                        by: None,
                        world_by: None,
                    });
                    core.close();
                    return;
                };
                match core.step(inner) {
                    true => None,
                    // `None` from the set: a link became ready meanwhile.
                    false => core.poll_set(&mut fds, self.wake.as_raw_fd()),
                }
            };
            drop(inner);
            drop(gate);
            if let Some(limit) = limit {
                crate::sys::poll(&mut fds, limit);
            }
        }
    }
}

/// The lane's state: per peer, a queue of sends and one of receives,
/// progressed head first, and the numbering of posted operations.
struct Core {
    me: usize,
    links: Vec<Option<Box<dyn Link>>>,
    sends: Vec<VecDeque<Op>>,
    recvs: Vec<VecDeque<Op>>,
    /// Operations posted per peer and direction (their numbers).
    sent: Vec<u64>,
    received: Vec<u64>,
    /// Once the communicator failed: every later operation fails with it.
    failed: Option<Error>,
    /// The communicator is gone.
    closed: bool,
}

impl Core {
    fn queue(&mut self, op: Op) {
        if let Some(e) = &self.failed {
            return op.batch.op_done(Err(e.clone()));
        }
        let peer = op.peer;
        match op.send {
            true => self.sends[peer].push_back(op),
            false => self.recvs[peer].push_back(op),
        }
    }

    /// One round: take the communicator's error, move what can move, fail
    /// on a broken link or an overdue operation. Whether anything moved.
    fn step(&mut self, inner: &Inner) -> bool {
        if self.failed.is_none() {
            if let Some(e) = inner.poisoned() {
                self.fail(inner, e, false);
            }
        }
        if let Some(e) = self.failed.clone() {
            self.fail_all(e);
            return false;
        }
        match self.progress(inner) {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                self.fail(inner, e, true);
                return true;
            }
        }
        if let Some(op) = self.overdue() {
            let e = self.stalled(inner, op);
            self.fail(inner, e, true);
            return true;
        }
        false
    }

    fn heads(&self) -> impl Iterator<Item = &Op> {
        self.sends
            .iter()
            .chain(self.recvs.iter())
            .filter_map(|q| q.front())
    }

    /// Move what can move now; whether anything did.
    fn progress(&mut self, inner: &Inner) -> Result<bool> {
        let mut moved = false;
        for peer in 0..self.links.len() {
            for send in [true, false] {
                loop {
                    let queue = match send {
                        true => &mut self.sends[peer],
                        false => &mut self.recvs[peer],
                    };
                    let Some(op) = queue.front_mut() else {
                        break;
                    };
                    let link = self.links[peer].as_mut().unwrap();
                    let before = op.moved();
                    let step = match send {
                        true => write_some(link.as_mut(), op),
                        false => read_some(link.as_mut(), op),
                    };
                    moved |= op.moved() != before;
                    match step {
                        Ok(true) => {
                            let op = queue.pop_front().unwrap();
                            op.batch.op_done(Ok(()));
                        }
                        Ok(false) => break,
                        Err(Fault::Mismatch(remote)) => {
                            return Err(Error::Mismatch {
                                local: executor::describe_call(&op.fp, op.seq),
                                peer,
                                world_peer: peer,
                                remote,
                            });
                        }
                        Err(Fault::Link(e)) => {
                            let name = op.name();
                            return Err(self.link_failed(inner, peer, &name, e));
                        }
                    }
                }
            }
        }
        Ok(moved)
    }

    /// A head operation past its deadline, if any.
    fn overdue(&self) -> Option<(bool, usize)> {
        let now = Instant::now();
        self.heads()
            .find(|o| o.deadline <= now)
            .map(|o| (o.send, o.peer))
    }

    /// Fill `fds` with what the thread sleeps on (its wake-up first); how
    /// long at most. `None`: a link became ready meanwhile (step again).
    fn poll_set(&mut self, fds: &mut Vec<libc::pollfd>, wake: i32) -> Option<Duration> {
        fds.clear();
        fds.push(libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        });
        if self.failed.is_some() {
            return Some(Duration::from_secs(3600));
        }
        for peer in 0..self.links.len() {
            // The streams the head operations wait on: (read, write) each.
            let mut wants = [(false, false); MAX_PARTS];
            let heads = [
                (false, self.recvs[peer].front()),
                (true, self.sends[peer].front()),
            ];
            for (send, op) in heads {
                for p in op
                    .iter()
                    .flat_map(|o| &o.parts[..o.nparts])
                    .filter(|p| !p.done())
                {
                    match send {
                        true => wants[p.stream].1 = true,
                        false => wants[p.stream].0 = true,
                    }
                }
            }
            let Some(link) = self.links[peer].as_mut() else {
                continue; // this rank itself
            };
            for (stream, (r, w)) in wants.into_iter().enumerate() {
                if !(r || w) {
                    continue;
                }
                if link.arm(stream, r, w) {
                    return None;
                }
                fds.push(libc::pollfd {
                    fd: link.fd(stream),
                    events: link.poll_events(stream, r, w),
                    revents: 0,
                });
            }
        }
        let next = self
            .heads()
            .map(|o| o.deadline)
            .min()
            .map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(Instant::now())
            });
        // Also look at the communicator's state now and then (an error
        // elsewhere, an abort).
        Some(next.min(Duration::from_millis(200)))
    }

    /// The first error: every operation fails with it, the links close,
    /// and (when it is this lane's to tell) the communicator fails too.
    fn fail(&mut self, inner: &Inner, e: Error, ours: bool) {
        let e = e.in_world(&inner.world, &inner.peers);
        if ours {
            inner.fail(e.clone());
        }
        let e = inner.poisoned().unwrap_or(e);
        self.failed = Some(e.clone());
        self.close();
        self.fail_all(e);
    }

    fn fail_all(&mut self, e: Error) {
        for q in self.sends.iter_mut().chain(self.recvs.iter_mut()) {
            for op in q.drain(..) {
                op.batch.op_done(Err(e.clone()));
            }
        }
    }

    fn close(&mut self) {
        for l in self.links.iter_mut().flatten() {
            l.close();
        }
    }

    /// Wait a moment for the control plane (or the collectives, which read
    /// it while they run) to explain what went wrong.
    fn explanation(&self, inner: &Inner, during: &str) -> Option<Error> {
        look_until(
            Instant::now() + EXPLAIN_WAIT,
            || match inner.poisoned() {
                Some(e) => ControlFlow::Break(Some(e)),
                None => inner.control_notice().map_break(|n| {
                    n.map(|n| failure::notice_to_error(n, self.me, &inner.peers, during, during))
                }),
            },
            // The control connection may be held by a collective: look
            // again soon rather than poll it.
            |left| std::thread::sleep(left.min(Duration::from_millis(20))),
        )
    }

    /// A link failed under `op_name`: the control plane's explanation, or
    /// the peer (or the rank found dead instead) lost.
    fn link_failed(&self, inner: &Inner, peer: usize, op_name: &str, e: std::io::Error) -> Error {
        if let Some(x) = self.explanation(inner, op_name) {
            return x;
        }
        let detail = match e.kind() {
            ErrorKind::UnexpectedEof => {
                "its connection closed (process exited or was killed)".into()
            }
            _ => format!("{op_name} failed: {e}"),
        };
        let root_gone = inner.root_gone();
        failure::closed_link(self.me, peer, &inner.peers, root_gone, op_name, detail)
    }

    /// The head operation (`send`, `peer`) passed its deadline: report it
    /// to the root, whose verdict names the stalled rank or the cycle.
    fn stalled(&self, inner: &Inner, (send, peer): (bool, usize)) -> Error {
        let q = match send {
            true => &self.sends[peer],
            false => &self.recvs[peer],
        };
        let op = q.front().unwrap();
        let name = op.name();
        let waiting_for = match send {
            true => format!("rank {peer} to receive ({name})"),
            false => format!("rank {peer} to send ({name})"),
        };
        inner.sender.lock().unwrap().abort(&Notice::Timeout {
            origin: self.me,
            waiting_for: waiting_for.clone(),
            after_ms: op.timeout.as_millis() as u64,
            waits_on: peer as u32,
        });
        self.explanation(inner, &name).unwrap_or(Error::Timeout {
            during: name,
            waiting_for,
            after: op.timeout,
            rank: Some(peer),
            world_rank: Some(peer),
        })
    }
}

/// Write what the link takes of a send, on every stream it uses; whether
/// it is complete.
fn write_some(link: &mut dyn Link, op: &mut Op) -> Result<bool, Fault> {
    // SAFETY: the poster keeps the memory valid and unwritten until the
    // operation completes (a blocking call waits; an async call owns it).
    let payload = unsafe { std::slice::from_raw_parts(op.region.addr as *const u8, op.region.len) };
    let mut complete = true;
    for part in op.parts[..op.nparts].iter_mut() {
        while !part.done() {
            let body = &payload[part.start..part.end];
            let r = if part.moved < part.header() {
                let bufs = [IoSlice::new(&op.header[part.moved..]), IoSlice::new(body)];
                link.write(part.stream, &bufs)
            } else {
                let off = part.moved - part.header();
                link.write(part.stream, &[IoSlice::new(&body[off..])])
            };
            match outcome(r, false).map_err(Fault::Link)? {
                Some(n) => part.moved += n,
                None => {
                    complete = false;
                    break;
                }
            }
        }
    }
    Ok(complete)
}

/// Read what has arrived of a receive, on every stream it uses (checking
/// the header once whole); whether it is complete.
fn read_some(link: &mut dyn Link, op: &mut Op) -> Result<bool, Fault> {
    // SAFETY: as in `write_some`; nobody else touches the memory. (A part
    // is read with the header, as the collectives read plain receives: one
    // call; a mismatch fails the receive anyway.)
    let payload =
        unsafe { std::slice::from_raw_parts_mut(op.region.addr as *mut u8, op.region.len) };
    let mut complete = true;
    for i in 0..op.nparts {
        let part = &mut op.parts[i];
        while !part.done() {
            let body = &mut payload[part.start..part.end];
            let r = if part.moved < part.header() {
                let mut bufs = [
                    IoSliceMut::new(&mut op.header[part.moved..]),
                    IoSliceMut::new(body),
                ];
                link.read(part.stream, &mut bufs)
            } else {
                let off = part.moved - part.header();
                link.read(part.stream, &mut [IoSliceMut::new(&mut body[off..])])
            };
            match outcome(r, true).map_err(Fault::Link)? {
                Some(n) => {
                    let before = part.moved;
                    part.moved += n;
                    if before < part.header() && part.moved >= part.header() {
                        check_header(&op.header, op.seq, &op.fp, op.region.len)
                            .map_err(Fault::Mismatch)?;
                    }
                }
                None => {
                    complete = false;
                    break;
                }
            }
        }
    }
    Ok(complete)
}

/// A link call's outcome: bytes moved (`Some`; 0 after an interruption,
/// to retry), or `None` when the stream is full (or empty) for now. End of
/// stream on a read is the peer gone.
fn outcome(r: std::io::Result<usize>, reading: bool) -> std::io::Result<Option<usize>> {
    match r {
        Ok(0) if reading => Err(ErrorKind::UnexpectedEof.into()),
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == ErrorKind::Interrupted => Ok(Some(0)),
        Err(e) => Err(e),
    }
}

/// Why moving an operation's bytes stopped.
enum Fault {
    /// The link failed (or the peer closed it).
    Link(std::io::Error),
    /// The peer sent another operation than the one expected: what it sent.
    Mismatch(String),
}

/// A received header must be the matching send's: the same number, an
/// agreeing fingerprint, the same length; else what the peer sent instead.
fn check_header(
    header: &[u8; HEADER_LEN],
    seq: u64,
    fp: &Fingerprint,
    len: usize,
) -> std::result::Result<(), String> {
    let theirs = WireHeader::parse(header);
    let agrees = theirs.is_some_and(|h| {
        h.seq == seq && h.fp.is_some_and(|f| f.agrees_with(fp)) && h.len == len as u64
    });
    if agrees {
        return Ok(());
    }
    Err(match theirs {
        Some(h) => match h.fp {
            Some(fp) => executor::describe_call(&fp, h.seq),
            None => "an unreadable operation".into(),
        },
        None => "bytes that are not an oxccl message".into(),
    })
}
