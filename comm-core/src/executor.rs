//! Runs a [`Schedule`] over message links: the only place where schedules
//! meet bytes.
//!
//! One thread drives every link of a call. Each (peer, stream) pair has a
//! FIFO of sends and one of receives, in schedule order; the k-th message
//! to a peer travels on stream `k % streams`, so both sides agree where each
//! message goes without negotiating. Non-blocking writes and reads advance
//! whatever is ready; when nothing is, the thread sleeps in `poll(2)` on the
//! fds it needs plus the control connection (failure notices from other
//! ranks) and the abort eventfd, bounded by the call's deadline.
//!
//! Every message starts with a 48-byte header naming the call (sequence
//! number, fingerprint), the message index and the payload length, so a
//! rank that runs a different call is reported as a mismatch and a stray
//! or truncated message can never be taken for data.

use crate::bootstrap::{poll_one, Control, ControlEvent, ControlSender, Notice};
use crate::call::{Fingerprint, Kind};
use crate::error::{Error, Result};
use crate::schedule::{Action, Schedule, Span, SCRATCH};
use crate::transport::{Link, PeerInfo};
use crate::types::DataType;
use crate::with_dtype;
use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Bytes of the per-message header.
pub const HEADER_LEN: usize = 48;
const MAGIC: &[u8; 4] = b"OXM1";
/// How long a rank that saw a peer's connection close waits for the root
/// to explain (another rank's failure) before blaming that peer.
const EXPLAIN_GRACE: Duration = Duration::from_millis(1500);
/// How long a waiting call spins without yielding when it has a core.
const PURE_SPIN: Duration = Duration::from_micros(2);
/// How long a rank that timed out waits for the root's verdict.
const STALL_VERDICT_WAIT: Duration = Duration::from_millis(1500);
/// Streams per link the staging table is sized for.
pub const MAX_STREAMS: usize = 16;

/// A caller buffer as raw memory for the duration of one call.
#[derive(Clone, Copy, Debug)]
pub struct BufSpec {
    pub ptr: *mut u8,
    pub bytes: usize,
}

impl BufSpec {
    /// No memory (barriers, unused buffer slots): a dangling, aligned
    /// pointer to zero bytes.
    pub const EMPTY: BufSpec = BufSpec {
        ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        bytes: 0,
    };
    pub fn read_only(s: &[u8]) -> BufSpec {
        BufSpec {
            ptr: s.as_ptr() as *mut u8,
            bytes: s.len(),
        }
    }
    pub fn writable(s: &mut [u8]) -> BufSpec {
        BufSpec {
            ptr: s.as_mut_ptr(),
            bytes: s.len(),
        }
    }
}

/// The data-moving state a communicator owns between calls.
pub struct Net {
    /// One link per peer (None for self).
    pub links: Vec<Option<Box<dyn Link>>>,
    staging: Vec<Vec<u64>>,
    scratch: Vec<u64>,
    pollfds: Vec<libc::pollfd>,
    work: Work,
}

/// Per-call bookkeeping, kept between calls so that a call allocates
/// nothing once the communicator has warmed up (small-message latency).
#[derive(Default)]
struct Work {
    chans: Vec<Chan>,
    nchans: usize,
    msg_of: Vec<u32>,
    sent: Vec<u32>,
    recvd: Vec<u32>,
    locals: Vec<u32>,
    done: Vec<bool>,
    /// Source addresses of a `Combine`.
    srcs: Vec<usize>,
}

impl Net {
    pub fn new(links: Vec<Option<Box<dyn Link>>>) -> Net {
        let n = links.len();
        Net {
            links,
            staging: (0..n * MAX_STREAMS).map(|_| Vec::new()).collect(),
            scratch: Vec::new(),
            pollfds: Vec::new(),
            work: Work::default(),
        }
    }

    /// Close every link (used on poison and drop).
    pub fn close_all(&mut self) {
        for l in self.links.iter_mut().flatten() {
            l.close();
        }
    }
}

/// Everything about the current call the executor needs besides buffers.
pub(crate) struct CallCtx<'a> {
    pub rank: usize,
    pub nranks: usize,
    pub dtype: DataType,
    pub op: kernels::Op,
    pub seq: u64,
    pub fp: Fingerprint,
    pub deadline: Instant,
    pub timeout: Duration,
    /// How long to retry before sleeping in `poll(2)`.
    pub spin: Duration,
    /// More ranks on this host than cores: never spin without yielding.
    pub oversubscribed: bool,
    /// Names the call in messages (`all_reduce #12`); built only on error.
    pub during: CallName,
    pub peers: &'a [PeerInfo],
    /// Point-to-point groups: the (pair sequence number, fingerprint) of the
    /// operation each step belongs to, overriding `seq` and `fp`.
    pub per_step: Option<Vec<(u64, Fingerprint)>>,
    pub control: &'a mut Control,
    pub sender: &'a std::sync::Mutex<ControlSender>,
    pub abort_fd: RawFd,
    pub aborted: &'a AtomicBool,
}

impl CallCtx<'_> {
    fn host(&self, rank: usize) -> String {
        self.peers
            .get(rank)
            .map(|p| p.hostname.clone())
            .unwrap_or_default()
    }

    /// Turn a control-plane notice into this call's error.
    pub fn notice_error(&self, n: Notice) -> Error {
        notice_to_error(
            n,
            self.rank,
            self.peers,
            &self.during.to_string(),
            &describe_call(&self.fp, self.seq),
        )
    }

    fn root_gone(&self) -> Error {
        Error::Bootstrap(format!(
            "lost the connection to the rendezvous root during {} (the launcher or the rank hosting the root ended)",
            self.during
        ))
    }

    /// Wait briefly for the control plane to explain a broken link (another
    /// rank's failure or death, announced by the root).
    fn explained(&mut self) -> Option<Error> {
        let until = (Instant::now() + EXPLAIN_GRACE).min(self.deadline);
        loop {
            match self.control.poll() {
                Some(ControlEvent::Notice(n)) => return Some(self.notice_error(n)),
                Some(ControlEvent::RootGone) | None => {}
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            poll_one(
                self.control.fd(),
                libc::POLLIN,
                left.as_millis().clamp(1, 100) as i32,
            );
        }
    }

    /// A peer's connection broke: unless the control plane explains it,
    /// blame the peer.
    fn lost(&mut self, peer: usize, detail: String) -> Error {
        self.explained().unwrap_or_else(|| Error::PeerLost {
            rank: peer,
            host: self.host(peer),
            during: self.during.to_string(),
            detail,
        })
    }

    /// A link call failed. `InvalidData` is the transport's verdict that the
    /// link broke in a precise way (an RDMA work completion in error, a
    /// flow-control violation): a transport error naming the peer, unless
    /// the control plane says the peer died (a dying process can make its
    /// peers' transfers fail in such ways too). Any other error means the
    /// connection is gone: the peer is lost.
    fn link_failed(&mut self, peer: usize, what: &str, e: std::io::Error) -> Error {
        if e.kind() == ErrorKind::InvalidData {
            return self.explained().unwrap_or_else(|| Error::Transport {
                peer,
                detail: format!("{what} during {}: {e}", self.during),
            });
        }
        self.lost(peer, format!("{what} failed: {e}"))
    }

    fn seq_fp(&self, step: u32) -> (u64, Fingerprint) {
        match &self.per_step {
            Some(v) => v[step as usize],
            None => (self.seq, self.fp),
        }
    }

    fn header(&self, step: u32, msg: u32, len: usize) -> [u8; HEADER_LEN] {
        let (seq, fp) = self.seq_fp(step);
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&seq.to_le_bytes());
        h[16..20].copy_from_slice(&msg.to_le_bytes());
        h[24..32].copy_from_slice(&(len as u64).to_le_bytes());
        h[32..48].copy_from_slice(&fp.encode());
        h
    }

    /// Check a received header against what this rank expects.
    fn check_header(
        &self,
        step: u32,
        peer: usize,
        h: &[u8; HEADER_LEN],
        msg: u32,
        len: usize,
    ) -> Result<()> {
        let (my_seq, my_fp) = self.seq_fp(step);
        let Some(WireHeader {
            seq,
            msg: their_msg,
            len: their_len,
            fp,
        }) = WireHeader::parse(h)
        else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent bytes that are not an oxccl message during {}",
                self.during
            )));
        };
        let mine = describe_call(&my_fp, my_seq);
        let Some(fp) = fp else {
            return Err(Error::Protocol(format!(
                "rank {peer} sent an unreadable call fingerprint during {}",
                self.during
            )));
        };
        if seq != my_seq || !fp.agrees_with(&my_fp) {
            return Err(Error::Mismatch {
                local: mine,
                peer,
                remote: describe_call(&fp, seq),
            });
        }
        if their_msg != msg || their_len != len as u64 {
            return Err(Error::Protocol(format!(
                "rank {peer} sent message {their_msg} of {their_len} bytes, expected message {msg} of {len} bytes during {}",
                self.during
            )));
        }
        Ok(())
    }
}

/// A message header as read from the wire (see [`HEADER_LEN`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireHeader {
    pub seq: u64,
    pub msg: u32,
    pub len: u64,
    /// `None` when the fingerprint bytes name no known call.
    pub fp: Option<Fingerprint>,
}

impl WireHeader {
    /// Decode; `None` unless the magic is right. Total: any 48 bytes.
    pub fn parse(h: &[u8; HEADER_LEN]) -> Option<WireHeader> {
        if &h[..4] != MAGIC {
            return None;
        }
        Some(WireHeader {
            seq: u64::from_le_bytes(h[8..16].try_into().unwrap()),
            msg: u32::from_le_bytes(h[16..20].try_into().unwrap()),
            len: u64::from_le_bytes(h[24..32].try_into().unwrap()),
            fp: Fingerprint::decode(h[32..48].try_into().unwrap()),
        })
    }
}

/// Per (peer, stream) progress of one call.
struct Chan {
    peer: usize,
    stream: usize,
    sends: Vec<u32>,
    recvs: Vec<u32>,
    s_head: usize,
    s_off: usize,
    s_hdr: [u8; HEADER_LEN],
    r_head: usize,
    r_off: usize,
    r_hdr: [u8; HEADER_LEN],
}

/// Resolved memory of a span.
fn mem(
    bufs: &[BufSpec],
    scratch: *mut u8,
    scratch_bytes: usize,
    sp: Span,
    es: usize,
) -> (*mut u8, usize) {
    let (base, cap) = if sp.buf == SCRATCH {
        (scratch, scratch_bytes)
    } else {
        (bufs[sp.buf as usize].ptr, bufs[sp.buf as usize].bytes)
    };
    let (off, len) = (sp.off * es, sp.len * es);
    assert!(
        off + len <= cap,
        "schedule span {sp:?} exceeds its buffer of {cap} bytes"
    );
    // SAFETY: off + len <= cap keeps the pointer inside (or one past) the buffer.
    (unsafe { base.add(off) }, len)
}

/// Run `sched` with `bufs` indexed by [`BufId`] (INPUT and OUTPUT first).
pub(crate) fn execute(
    sched: &Schedule,
    bufs: &[BufSpec],
    net: &mut Net,
    cx: &mut CallCtx<'_>,
) -> Result<()> {
    let mut w = std::mem::take(&mut net.work);
    let r = execute_with(sched, bufs, net, cx, &mut w);
    net.work = w;
    r
}

fn execute_with(
    sched: &Schedule,
    bufs: &[BufSpec],
    net: &mut Net,
    cx: &mut CallCtx<'_>,
    w: &mut Work,
) -> Result<()> {
    let es = cx.dtype.size();
    let nsteps = sched.steps.len();
    if nsteps == 0 {
        return Ok(());
    }
    // Scratch memory (u64 keeps every element type aligned).
    let scratch_bytes = sched.scratch * es;
    if net.scratch.len() * 8 < scratch_bytes {
        net.scratch.resize(scratch_bytes.div_ceil(8), 0);
    }
    let scratch = net.scratch.as_mut_ptr() as *mut u8;

    // Assign every message its index and its (peer, stream) channel.
    w.nchans = 0;
    w.msg_of.clear();
    w.msg_of.resize(nsteps, 0);
    w.sent.clear();
    w.sent.resize(cx.nranks, 0);
    w.recvd.clear();
    w.recvd.resize(cx.nranks, 0);
    w.locals.clear();
    w.done.clear();
    w.done.resize(nsteps, false);
    let Work {
        chans,
        nchans,
        msg_of,
        sent,
        recvd,
        locals,
        done,
        srcs,
    } = w;
    for (i, st) in sched.steps.iter().enumerate() {
        let (peer, is_send) = match st.action {
            Action::Send { peer, .. } => (peer, true),
            Action::Recv { peer, .. } | Action::RecvReduce { peer, .. } => (peer, false),
            _ => {
                locals.push(i as u32);
                continue;
            }
        };
        let link = net
            .links
            .get(peer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "schedule of {} talks to rank {peer}, which has no link",
                    cx.during
                ))
            })?;
        let counter = if is_send {
            &mut sent[peer]
        } else {
            &mut recvd[peer]
        };
        let msg = *counter;
        *counter += 1;
        let stream = msg as usize % link.streams().min(MAX_STREAMS);
        let c = match chans[..*nchans]
            .iter()
            .position(|c| c.peer == peer && c.stream == stream)
        {
            Some(c) => c,
            None => {
                let fresh = Chan {
                    peer,
                    stream,
                    sends: Vec::new(),
                    recvs: Vec::new(),
                    s_head: 0,
                    s_off: 0,
                    s_hdr: [0; HEADER_LEN],
                    r_head: 0,
                    r_off: 0,
                    r_hdr: [0; HEADER_LEN],
                };
                if *nchans < chans.len() {
                    // Reuse the slot and its lists' capacity.
                    let old = &mut chans[*nchans];
                    let (mut sends, mut recvs) = (
                        std::mem::take(&mut old.sends),
                        std::mem::take(&mut old.recvs),
                    );
                    sends.clear();
                    recvs.clear();
                    *old = Chan {
                        sends,
                        recvs,
                        ..fresh
                    };
                } else {
                    chans.push(fresh);
                }
                *nchans += 1;
                *nchans - 1
            }
        };
        if is_send {
            chans[c].sends.push(i as u32);
        } else {
            chans[c].recvs.push(i as u32);
        }
        msg_of[i] = msg;
    }

    let chans = &mut chans[..*nchans];
    let mut remaining = nsteps;
    let mut idle_since: Option<Instant> = None;
    let ready = |done: &[bool], i: u32| {
        sched.steps[i as usize]
            .deps
            .iter()
            .all(|d| done[*d as usize])
    };

    loop {
        let mut progressed = false;

        // Local steps whose inputs are ready.
        for &i in locals.iter() {
            if done[i as usize] || !ready(done, i) {
                continue;
            }
            match sched.steps[i as usize].action {
                Action::Copy { src, dst } => {
                    let (s, n) = mem(bufs, scratch, scratch_bytes, src, es);
                    let (d, _) = mem(bufs, scratch, scratch_bytes, dst, es);
                    if s != d && n > 0 {
                        // SAFETY: both spans lie inside their buffers (checked by `mem`);
                        // `copy` tolerates overlap.
                        unsafe { std::ptr::copy(s, d, n) };
                    }
                }
                Action::Divide { dst } => {
                    let (d, n) = mem(bufs, scratch, scratch_bytes, dst, es);
                    with_dtype!(cx.dtype, T => {
                        // SAFETY: the span is inside a writable buffer aligned for T
                        // (caller buffers are typed slices; scratch is u64-aligned).
                        let s = unsafe { std::slice::from_raw_parts_mut(d as *mut T, n / es) };
                        kernels::div_assign(s, cx.nranks);
                    });
                }
                Action::Combine {
                    dst,
                    input,
                    slots,
                    me,
                } => {
                    let (d, n) = mem(bufs, scratch, scratch_bytes, dst, es);
                    let (mut inp, _) = mem(bufs, scratch, scratch_bytes, input, es);
                    let slot = |k: usize| Span::new(slots.buf, slots.off + k * dst.len, dst.len);
                    if inp == d {
                        // In place: keep our contribution in our own (unused) slot.
                        let (own, _) = mem(bufs, scratch, scratch_bytes, slot(me), es);
                        // SAFETY: both spans hold n bytes; the slot is scratch, distinct from dst.
                        unsafe { std::ptr::copy_nonoverlapping(inp, own, n) };
                        inp = own;
                    }
                    srcs.clear();
                    for k in 0..cx.nranks {
                        srcs.push(if k == me {
                            inp as usize
                        } else {
                            mem(bufs, scratch, scratch_bytes, slot(k), es).0 as usize
                        });
                    }
                    with_dtype!(cx.dtype, T => {
                        let len = n / es;
                        // SAFETY: every source holds `len` elements of T, aligned, and
                        // none of them is `dst` (the own input was moved to scratch above).
                        let view = |p: usize| unsafe { std::slice::from_raw_parts(p as *const T, len) };
                        // SAFETY: dst holds `len` writable elements nobody else touches now.
                        let out = unsafe { std::slice::from_raw_parts_mut(d as *mut T, len) };
                        // Up to 32 sources live on the stack: no allocation per call.
                        if srcs.len() <= 32 {
                            let mut views: [&[T]; 32] = [&[]; 32];
                            for (v, p) in views.iter_mut().zip(srcs.iter()) {
                                *v = view(*p);
                            }
                            kernels::reduce_n(cx.op, out, &views[..srcs.len()]);
                        } else {
                            let views: Vec<&[T]> = srcs.iter().map(|p| view(*p)).collect();
                            kernels::reduce_n(cx.op, out, &views);
                        }
                    });
                }
                _ => unreachable!(),
            }
            done[i as usize] = true;
            remaining -= 1;
            progressed = true;
        }

        for ch in chans.iter_mut() {
            // Sends, in order, as far as the socket takes them.
            while ch.s_head < ch.sends.len() {
                let i = ch.sends[ch.s_head];
                if !ready(done, i) {
                    break;
                }
                let Action::Send { src, .. } = sched.steps[i as usize].action else {
                    unreachable!()
                };
                let (p, n) = mem(bufs, scratch, scratch_bytes, src, es);
                if ch.s_off == 0 {
                    ch.s_hdr = cx.header(i, msg_of[i as usize], n);
                }
                // SAFETY: the span was bounds-checked by `mem`; the caller keeps the
                // buffer alive and unmodified for the call.
                let payload = unsafe { std::slice::from_raw_parts(p, n) };
                let r = {
                    let link = net.links[ch.peer].as_mut().unwrap();
                    if ch.s_off < HEADER_LEN {
                        link.write(
                            ch.stream,
                            &[IoSlice::new(&ch.s_hdr[ch.s_off..]), IoSlice::new(payload)],
                        )
                    } else {
                        link.write(
                            ch.stream,
                            &[IoSlice::new(&payload[ch.s_off - HEADER_LEN..])],
                        )
                    }
                };
                match r {
                    Ok(k) => {
                        ch.s_off += k;
                        progressed |= k > 0;
                        if ch.s_off == HEADER_LEN + n {
                            ch.s_off = 0;
                            ch.s_head += 1;
                            done[i as usize] = true;
                            remaining -= 1;
                        } else {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let peer = ch.peer;
                        return Err(cx.link_failed(peer, "sending to it", e));
                    }
                }
            }
            // Receives, in order.
            while ch.r_head < ch.recvs.len() {
                let i = ch.recvs[ch.r_head];
                if !ready(done, i) {
                    break;
                }
                let (dst, reduce_with) = match sched.steps[i as usize].action {
                    Action::Recv { dst, .. } => (dst, None),
                    Action::RecvReduce { dst, with, .. } => (dst, Some(with)),
                    _ => unreachable!(),
                };
                let (dptr, n) = mem(bufs, scratch, scratch_bytes, dst, es);
                // Reductions land in a staging slot first; plain receives go
                // straight into the destination.
                let target = if reduce_with.is_some() {
                    let st = &mut net.staging[ch.peer * MAX_STREAMS + ch.stream];
                    if st.len() * 8 < n {
                        st.resize(n.div_ceil(8), 0);
                    }
                    st.as_mut_ptr() as *mut u8
                } else {
                    dptr
                };
                // SAFETY: `target` has at least n bytes (destination span checked by
                // `mem`, or the staging slot sized above) and nothing else aliases it now.
                let payload = unsafe { std::slice::from_raw_parts_mut(target, n) };
                let r = {
                    let link = net.links[ch.peer].as_mut().unwrap();
                    if ch.r_off < HEADER_LEN {
                        let (h, _) = ch.r_hdr.split_at_mut(HEADER_LEN);
                        link.read(
                            ch.stream,
                            &mut [
                                IoSliceMut::new(&mut h[ch.r_off..]),
                                IoSliceMut::new(payload),
                            ],
                        )
                    } else {
                        link.read(
                            ch.stream,
                            &mut [IoSliceMut::new(&mut payload[ch.r_off - HEADER_LEN..])],
                        )
                    }
                };
                match r {
                    Ok(0) if HEADER_LEN + n > ch.r_off => {
                        let peer = ch.peer;
                        return Err(cx.lost(
                            peer,
                            "its connection closed (process exited or was killed)".into(),
                        ));
                    }
                    Ok(k) => {
                        let before = ch.r_off;
                        ch.r_off += k;
                        progressed |= k > 0;
                        if before < HEADER_LEN && ch.r_off >= HEADER_LEN {
                            let (peer, hdr) = (ch.peer, ch.r_hdr);
                            cx.check_header(i, peer, &hdr, msg_of[i as usize], n)?
                        }
                        if ch.r_off == HEADER_LEN + n {
                            ch.r_off = 0;
                            ch.r_head += 1;
                            if let Some(with) = reduce_with {
                                let (wptr, _) = mem(bufs, scratch, scratch_bytes, with, es);
                                reduce_into(cx.dtype, cx.op, dptr, wptr, target, n);
                            }
                            done[i as usize] = true;
                            remaining -= 1;
                        } else {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        let peer = ch.peer;
                        return Err(cx.link_failed(peer, "receiving from it", e));
                    }
                }
            }
        }

        if remaining == 0 {
            return Ok(());
        }
        if progressed {
            idle_since = None;
        } else {
            // Spin (yielding, so a peer sharing this core can run) for a
            // while before sleeping: a wake-up through poll costs far more
            // than a few retries when the data is microseconds away.
            let since = *idle_since.get_or_insert_with(Instant::now);
            let idle = since.elapsed();
            if idle < cx.spin {
                // With a core each, the first microseconds are a pure spin
                // (the data is usually on its way); after that, or always
                // when this host's ranks outnumber its cores, yield so the
                // peer we wait for can run.
                if !cx.oversubscribed && idle < PURE_SPIN {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                if cx.aborted.load(Ordering::Relaxed) {
                    return Err(Error::Aborted { by: None });
                }
                continue;
            }
            wait(chans, done, sched, net, cx)?;
            idle_since = None;
        }
    }
}

/// `dst = with op staged` (or `dst op= staged` when `dst` is `with`).
fn reduce_into(
    dtype: DataType,
    op: kernels::Op,
    dst: *mut u8,
    with: *mut u8,
    staged: *mut u8,
    n: usize,
) {
    with_dtype!(dtype, T => {
        let len = n / std::mem::size_of::<T>();
        // SAFETY: all three regions hold `n` bytes aligned for T; the staging
        // slot is private; `dst` and `with` are either the same span or
        // disjoint (schedules never overlap them partially).
        unsafe {
            let s = std::slice::from_raw_parts(staged as *const T, len);
            if dst == with {
                kernels::reduce_assign(op, std::slice::from_raw_parts_mut(dst as *mut T, len), s);
            } else {
                let w = std::slice::from_raw_parts(with as *const T, len);
                kernels::reduce(op, std::slice::from_raw_parts_mut(dst as *mut T, len), w, s);
            }
        }
    });
}

/// Sleep until a needed fd is ready, a notice arrives, abort, or deadline.
fn wait(
    chans: &[Chan],
    done: &[bool],
    sched: &Schedule,
    net: &mut Net,
    cx: &mut CallCtx<'_>,
) -> Result<()> {
    let ready = |i: u32| {
        sched.steps[i as usize]
            .deps
            .iter()
            .all(|d| done[*d as usize])
    };
    // What each channel waits for now: (read, write).
    let wants = |c: &Chan| {
        (
            c.r_head < c.recvs.len() && ready(c.recvs[c.r_head]),
            c.s_head < c.sends.len() && ready(c.sends[c.s_head]),
        )
    };
    // Let transports that wake pollers themselves ask for a wake-up first.
    let mut became_ready = false;
    for c in chans {
        let (r, w) = wants(c);
        if r || w {
            became_ready |= net.links[c.peer].as_mut().unwrap().arm(c.stream, r, w);
        }
    }
    if became_ready {
        return Ok(());
    }
    net.pollfds.clear();
    for c in chans {
        let (r, w) = wants(c);
        if r || w {
            let link = net.links[c.peer].as_ref().unwrap();
            net.pollfds.push(libc::pollfd {
                fd: link.fd(c.stream),
                events: link.poll_events(c.stream, r, w),
                revents: 0,
            });
        }
    }
    if net.pollfds.is_empty() {
        return Err(Error::Protocol(format!(
            "schedule of {} cannot make progress (internal error)",
            cx.during
        )));
    }
    net.pollfds.push(libc::pollfd {
        fd: cx.control.fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    net.pollfds.push(libc::pollfd {
        fd: cx.abort_fd,
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        if cx.aborted.load(Ordering::Acquire) {
            return Err(Error::Aborted { by: None });
        }
        let left = cx.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // Described only now: waits are frequent, timeouts are not.
            let mut waiting_for = Vec::new();
            for c in chans {
                let (r, w) = wants(c);
                if w {
                    waiting_for.push(format!(
                        "rank {} to take data (stream {})",
                        c.peer, c.stream
                    ));
                }
                if r {
                    waiting_for.push(format!("data from rank {} (stream {})", c.peer, c.stream));
                }
            }
            let waits_on = chans
                .iter()
                .find(|c| wants(c) != (false, false))
                .map(|c| c.peer);
            let (during, own) = (cx.during.to_string(), describe_call(&cx.fp, cx.seq));
            return Err(stall_error(
                cx.control,
                cx.sender,
                cx.rank,
                cx.peers,
                waiting_for.join(", "),
                waits_on,
                &during,
                &own,
                cx.timeout,
            ));
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: pollfds is a valid array of initialised pollfd for the call.
        let r = unsafe {
            libc::poll(
                net.pollfds.as_mut_ptr(),
                net.pollfds.len() as libc::nfds_t,
                ms,
            )
        };
        if r < 0 {
            continue; // EINTR
        }
        let nf = net.pollfds.len();
        if net.pollfds[nf - 1].revents != 0 || cx.aborted.load(Ordering::Acquire) {
            return Err(Error::Aborted { by: None });
        }
        if net.pollfds[nf - 2].revents != 0 {
            match cx.control.poll() {
                Some(ControlEvent::Notice(n)) => return Err(cx.notice_error(n)),
                Some(ControlEvent::RootGone) => {
                    // No more notices will come; the data links still tell.
                    net.pollfds[nf - 2].fd = -1;
                    tracing::debug!("oxccl: {}", cx.root_gone());
                }
                None => {}
            }
        }
        if net.pollfds[..nf - 2].iter().any(|p| p.revents != 0) {
            return Ok(());
        }
    }
}

/// The name of a call for messages, formatted only when one is needed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallName {
    pub fp: Fingerprint,
    pub seq: u64,
}

impl std::fmt::Display for CallName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.fp.kind == Kind::P2p {
            // A group's own fingerprint is a placeholder (each message
            // carries its operation's): name the group, not a fake count.
            write!(f, "a send/recv group of {}", self.fp.dtype)
        } else {
            write!(f, "{} #{}", self.fp.kind.name(), self.seq)
        }
    }
}

/// How messages describe a call: `all_reduce(count=.., f32, sum) as collective #7`.
pub(crate) fn describe_call(fp: &Fingerprint, seq: u64) -> String {
    if fp.kind == Kind::P2p {
        format!("{fp} as point-to-point message #{seq}")
    } else {
        format!("{fp} as collective #{seq}")
    }
}

/// Turn a control-plane notice into the error of this rank's call
/// (`during` names it for messages, `own` describes it for mismatches).
pub(crate) fn notice_to_error(
    n: Notice,
    me: usize,
    peers: &[PeerInfo],
    during: &str,
    own: &str,
) -> Error {
    match n {
        Notice::Lost { rank, detail } => Error::PeerLost {
            rank,
            host: peers
                .get(rank)
                .map(|p| p.hostname.clone())
                .unwrap_or_default(),
            during: during.to_string(),
            detail,
        },
        Notice::Failed {
            origin,
            aborted: true,
            ..
        } => Error::Aborted { by: Some(origin) },
        Notice::Failed {
            origin, message, ..
        } => Error::Remote {
            rank: origin,
            message,
        },
        // Every rank reports the disagreement as a mismatch, naming the side
        // it does not agree with.
        Notice::Mismatch {
            a,
            a_call,
            b,
            b_call,
        } => {
            if me == a || (me != b && own == a_call) {
                Error::Mismatch {
                    local: own.to_string(),
                    peer: b,
                    remote: b_call,
                }
            } else if me == b || own == b_call {
                Error::Mismatch {
                    local: own.to_string(),
                    peer: a,
                    remote: a_call,
                }
            } else {
                Error::Mismatch {
                    local: own.to_string(),
                    peer: b,
                    remote: b_call,
                }
            }
        }
        Notice::Timeout {
            origin,
            waiting_for,
            after_ms,
            ..
        } => Error::Timeout {
            during: during.to_string(),
            waiting_for: format!("{waiting_for} (seen by rank {origin})"),
            after: Duration::from_millis(after_ms),
        },
        Notice::Stalled { rank, detail } => Error::Timeout {
            during: during.to_string(),
            waiting_for: format!("rank {rank}: {detail}"),
            after: Duration::ZERO,
        },
    }
}

/// This rank timed out waiting for `waits_on` (`waiting_for` in words):
/// report it to the root, which collects every rank's report for a moment
/// and names the rank at the end of the chain of waits (a stopped or hung
/// process), and return that verdict as this call's `Timeout` — so every
/// survivor names the same culprit, not just its own neighbour.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stall_error(
    control: &mut Control,
    sender: &std::sync::Mutex<ControlSender>,
    me: usize,
    peers: &[PeerInfo],
    waiting_for: String,
    waits_on: Option<usize>,
    during: &str,
    own: &str,
    after: Duration,
) -> Error {
    let report = Notice::Timeout {
        origin: me,
        waiting_for: waiting_for.clone(),
        after_ms: after.as_millis() as u64,
        waits_on: waits_on.map_or(u32::MAX, |r| r as u32),
    };
    if let Ok(mut s) = sender.lock() {
        s.abort(&report);
    }
    let until = Instant::now() + STALL_VERDICT_WAIT;
    while Instant::now() < until {
        match control.poll() {
            Some(ControlEvent::Notice(Notice::Stalled { rank, detail })) => {
                return Error::Timeout {
                    during: during.to_string(),
                    waiting_for: format!("rank {rank}: {detail}"),
                    after,
                };
            }
            Some(ControlEvent::Notice(n)) => return notice_to_error(n, me, peers, during, own),
            Some(ControlEvent::RootGone) => break,
            None => {}
        }
        poll_one(control.fd(), libc::POLLIN, 50);
    }
    Error::Timeout {
        during: during.to_string(),
        waiting_for,
        after,
    }
}

/// Map an own error to what the others should hear (None: not ours to tell).
pub(crate) fn notice_for(rank: usize, e: &Error) -> Option<Notice> {
    match e {
        Error::PeerLost { rank, detail, .. } => Some(Notice::Lost {
            rank: *rank,
            detail: detail.clone(),
        }),
        Error::Aborted { by: None } => Some(Notice::Failed {
            origin: rank,
            aborted: true,
            message: "abort()".into(),
        }),
        Error::Aborted { by: Some(_) } | Error::Remote { .. } => None,
        Error::Mismatch {
            local,
            peer,
            remote,
        } => Some(Notice::Mismatch {
            a: rank,
            a_call: local.clone(),
            b: *peer,
            b_call: remote.clone(),
        }),
        // Reported to the root by `stall_error` before the call returned.
        Error::Timeout { .. } => None,
        Error::InvalidArgument(_) => None,
        other => Some(Notice::Failed {
            origin: rank,
            aborted: false,
            message: other.to_string(),
        }),
    }
}
