//! One RDMA message link: a reliable-connected queue pair to one peer that
//! carries an ordered byte stream each way.
//!
//! Each side owns a receive ring of `slots` fixed-size slots in registered
//! memory and told the peer its address and rkey (see [`crate::exchange`]).
//! A send is one RDMA WRITE WITH IMMEDIATE into the next slot, the immediate
//! being the byte count; the receiver's completion says a slot is full (the
//! receive it consumes carries no data). Read-out slots go back to the
//! sender as credits in a zero-length SEND WITH IMMEDIATE. See
//! [`crate::credit`] for the rules that make overrun impossible.
//!
//! Sends come from one of two places:
//! - a *bounce slot* (registered at setup): the bytes are copied there and
//!   the write returns at once (small messages, plain buffers);
//! - the caller's memory itself, when it lies in a registered range of the
//!   [`RegCache`] and is large: zero-copy. The write then reports bytes only
//!   once their send completed, so the caller never reuses memory the device
//!   still reads. Up to `slots` writes are in flight, so a large message
//!   streams while the peer drains earlier slots.
//!
//! One-sided reads ([`OneSided`]): the peer's exported memory (registered
//! for remote reads, see `RdmaDirect`) is read with RDMA READ into this
//! rank's registered memory, in chunks of [`READ_CHUNK`], at most
//! [`READ_DEPTH`] posted at a time; reads complete in posting order (RC),
//! so a ticket counter says which are done.
//!
//! Waiting: the executor spins on [`Link::read`]/[`Link::write`] (which poll
//! the CQ), then calls [`Link::arm`], which requests a completion event and
//! re-polls, and sleeps in `poll(2)` on an epoll fd holding the completion
//! channel and the setup socket (kept open: its hang-up says the peer
//! process is gone, as with shared memory).

use crate::credit::{RecvWindow, SendWindow};
use crate::exchange::QpEndpoint;
use crate::regcache::RegCache;
use crate::verbs::{status_str, Cq, Local, Mr, Qp, Wc};
use comm_core::transport::{Link, OneSided, RemoteMemory};
use comm_core::Region;
use ibverbs_sys::{ibv_wc_opcode, ibv_wc_status};
use std::collections::VecDeque;
use std::io::{self, ErrorKind, IoSlice, IoSliceMut};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Sends at least this large from registered memory go zero-copy.
pub const ZERO_COPY_MIN: usize = 32 << 10;

/// Work request ids: what a completion belongs to (a failed completion
/// carries no opcode, only this).
const WR_DATA: u64 = 1;
const WR_CREDIT: u64 = 2;
pub const WR_RECV: u64 = 3;
const WR_READ: u64 = 4;

/// Bytes per RDMA READ work request.
pub const READ_CHUNK: usize = 1 << 20;
/// RDMA READs posted at a time per link (room in the send queue beyond
/// what messages use).
pub const READ_DEPTH: usize = 8;

/// A posted send, in posting order (RC completes sends in that order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    Data {
        zero_copy: bool,
    },
    Credit,
    /// A chunk of a one-sided read; the last chunk carries its ticket.
    Read {
        last_of: Option<u64>,
    },
}

/// A one-sided read not yet fully posted.
struct PendingRead {
    local: u64,
    remote: u64,
    rkey: u32,
    left: usize,
    ticket: u64,
    /// Keeps the local registration alive while the device writes there
    /// (none for a read of nothing).
    mr: Option<Arc<Mr>>,
}

/// A zero-copy write from the caller's memory.
struct ZeroCopy {
    addr: usize,
    len: usize,
    done: bool,
    /// Keeps the registration alive while the device reads the memory.
    _mr: Arc<Mr>,
}

/// Registered memory owned by a link (ring or bounce slots).
pub struct Slots {
    // Field order: the region is deregistered before the memory is freed.
    pub mr: Mr,
    pub mem: Box<[u8]>,
}

/// What a link needs from setup.
pub struct Parts {
    pub peer: usize,
    pub qp: Qp,
    pub cq: Cq,
    pub ring: Slots,
    pub ring_slots: u32,
    pub ring_slot_bytes: u32,
    pub bounce: Slots,
    pub remote: QpEndpoint,
    pub sq_cap: usize,
    pub sock: TcpStream,
    pub cache: Arc<RegCache<Mr>>,
}

/// A link over one RC queue pair.
pub struct RdmaLink {
    peer: usize,
    // Drop order matters: the QP goes before its CQ, both before the memory.
    qp: Qp,
    cq: Cq,
    ring: Slots,
    bounce: Slots,
    ring_slot_bytes: usize,
    remote: QpEndpoint,
    tx: SendWindow,
    rx: RecvWindow,
    sent: VecDeque<Sent>,
    sq_cap: usize,
    zero_copy: VecDeque<ZeroCopy>,
    cache: Arc<RegCache<Mr>>,
    sock: TcpStream,
    epoll: OwnedFd,
    wc: Vec<Wc>,
    /// The first failure, repeated by every later call.
    failed: Option<(ErrorKind, String)>,
    closed: bool,
    peer_gone: bool,
    /// Logged once per link (debug): evidence that zero-copy is in use.
    used_zero_copy: bool,
    /// One-sided reads waiting to be posted, and the registrations of
    /// posted chunks (in posting order).
    reads: VecDeque<PendingRead>,
    read_mrs: VecDeque<Arc<Mr>>,
    next_ticket: u64,
    /// Every read with a smaller ticket has completed.
    reads_done: u64,
    used_reads: bool,
}

impl RdmaLink {
    pub fn new(p: Parts) -> io::Result<RdmaLink> {
        p.sock.set_nonblocking(true)?;
        let epoll = comm_core::net::epoll_of(&[p.cq.fd(), p.sock.as_raw_fd()])?;
        Ok(RdmaLink {
            peer: p.peer,
            tx: SendWindow::new(p.remote.slots),
            rx: RecvWindow::new(p.ring_slots, p.ring_slot_bytes),
            qp: p.qp,
            cq: p.cq,
            ring: p.ring,
            bounce: p.bounce,
            ring_slot_bytes: p.ring_slot_bytes as usize,
            remote: p.remote,
            sent: VecDeque::with_capacity(p.sq_cap),
            sq_cap: p.sq_cap,
            zero_copy: VecDeque::new(),
            cache: p.cache,
            sock: p.sock,
            epoll,
            wc: vec![Wc::default(); 32],
            failed: None,
            closed: false,
            peer_gone: false,
            used_zero_copy: false,
            reads: VecDeque::new(),
            read_mrs: VecDeque::with_capacity(READ_DEPTH),
            next_ticket: 0,
            reads_done: 0,
            used_reads: false,
        })
    }

    /// Move the queue pair to the error state but keep the setup socket
    /// open: what a peer looks like whose device or QP failed while its
    /// process lives (fault-injection for tests).
    pub fn fail_queue_pair(&mut self) {
        self.qp.to_error();
    }

    fn fail(&mut self, kind: ErrorKind, detail: String) -> io::Error {
        if self.failed.is_none() {
            self.failed = Some((kind, detail));
            // Flush everything outstanding; the peer sees its next transfer fail.
            self.qp.to_error();
        }
        let (k, d) = self.failed.as_ref().unwrap();
        io::Error::new(*k, d.clone())
    }

    /// Handle every completion waiting in the CQ; returns whether any was.
    fn progress(&mut self) -> io::Result<bool> {
        if let Some((k, d)) = &self.failed {
            return Err(io::Error::new(*k, d.clone()));
        }
        let mut any = false;
        loop {
            let n = match self.cq.poll(&mut self.wc) {
                Ok(n) => n,
                Err(e) => return Err(self.fail(ErrorKind::InvalidData, e.to_string())),
            };
            for i in 0..n {
                let wc = self.wc[i];
                self.complete(&wc)?;
            }
            any |= n > 0;
            if n < self.wc.len() {
                break;
            }
        }
        self.return_credits()?;
        self.post_reads()?;
        Ok(any)
    }

    /// Post chunks of pending one-sided reads while there is room; a read
    /// of nothing completes once every read before it has.
    fn post_reads(&mut self) -> io::Result<()> {
        while let Some(p) = self.reads.front() {
            let (ticket, left) = (p.ticket, p.left);
            let Some(mr) = p.mr.clone().filter(|_| left > 0) else {
                if !self.read_mrs.is_empty() {
                    break;
                }
                self.reads_done = ticket + 1;
                self.reads.pop_front();
                continue;
            };
            if self.read_mrs.len() >= READ_DEPTH {
                break;
            }
            let len = left.min(READ_CHUNK);
            let local = Local {
                addr: p.local,
                len: len as u32,
                lkey: mr.lkey(),
            };
            let (remote, rkey) = (p.remote, p.rkey);
            // SAFETY: the destination lies in `mr`'s registered range (looked
            // up when the read started) and the caller of `start_read` leaves it
            // alone until the ticket completes; `read_mrs` keeps the
            // registration until this chunk's completion.
            if let Err(e) = unsafe { self.qp.post_read(WR_READ, local, remote, rkey) } {
                return Err(self.fail(ErrorKind::InvalidData, e.to_string()));
            }
            self.read_mrs.push_back(mr);
            let last = len == left;
            if last {
                self.reads.pop_front();
            } else if let Some(p) = self.reads.front_mut() {
                p.local += len as u64;
                p.remote += len as u64;
                p.left -= len;
            }
            self.sent.push_back(Sent::Read {
                last_of: last.then_some(ticket),
            });
        }
        Ok(())
    }

    fn complete(&mut self, wc: &Wc) -> io::Result<()> {
        if let Some((status, vendor)) = wc.error() {
            let verb = match wc.wr_id() {
                WR_DATA => "RDMA WRITE WITH IMMEDIATE",
                WR_CREDIT => "SEND WITH IMMEDIATE (credit)",
                WR_READ => "RDMA READ (of its registered buffer)",
                _ => "RECV",
            };
            // Retries exhausted or flushed: the peer stopped answering (died,
            // or its QP is gone), so it is lost. A dying process's memory and
            // QP vanish in no set order, so a peer whose setup socket hung
            // up is lost whatever the status. Anything else is a precise
            // transport error.
            let kind = match status {
                ibv_wc_status::IBV_WC_RETRY_EXC_ERR
                | ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
                | ibv_wc_status::IBV_WC_WR_FLUSH_ERR => ErrorKind::ConnectionReset,
                _ if comm_core::net::hung_up(self.sock.as_raw_fd()) => ErrorKind::ConnectionReset,
                _ => ErrorKind::InvalidData,
            };
            let detail = format!(
                "{verb} with rank {} failed: {} (status {status}, vendor error {vendor:#x})",
                self.peer,
                status_str(status)
            );
            return Err(self.fail(kind, detail));
        }
        let flow = match wc.wr_id() {
            WR_DATA => {
                let s = self.sent.pop_front();
                if let Some(Sent::Data { zero_copy: true }) = s {
                    if let Some(z) = self.zero_copy.iter_mut().find(|z| !z.done) {
                        z.done = true;
                    }
                }
                self.tx.completed()
            }
            WR_CREDIT => {
                self.sent.pop_front();
                Ok(())
            }
            WR_READ => {
                if let Some(Sent::Read { last_of: Some(t) }) = self.sent.pop_front() {
                    self.reads_done = t + 1;
                }
                self.read_mrs.pop_front();
                Ok(())
            }
            _ => {
                if let Err(e) = self.qp.post_recv(WR_RECV) {
                    return Err(self.fail(ErrorKind::InvalidData, e.to_string()));
                }
                let imm = wc.imm_data().map(u32::from_be).unwrap_or(0);
                match wc.opcode() {
                    ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => self.rx.arrived(imm),
                    _ => self.tx.credit(imm),
                }
            }
        };
        flow.map_err(|e| {
            self.fail(
                ErrorKind::InvalidData,
                format!("rank {} broke the RDMA flow control: {e}", self.peer),
            )
        })
    }

    /// Send freed slots back to the peer (later if the send queue is full).
    fn return_credits(&mut self) -> io::Result<()> {
        if self.sent.len() >= self.sq_cap {
            return Ok(());
        }
        if let Some(c) = self.rx.take_credits() {
            if let Err(e) = self.qp.post_send_imm(WR_CREDIT, c) {
                return Err(self.fail(ErrorKind::InvalidData, e.to_string()));
            }
            self.sent.push_back(Sent::Credit);
        }
        Ok(())
    }

    fn remote_slot(&self, slot: u32) -> u64 {
        self.remote.ring_addr + slot as u64 * self.remote.slot_bytes as u64
    }

    fn registered(&self, b: &[u8]) -> Option<Arc<Mr>> {
        if b.len() < ZERO_COPY_MIN {
            return None;
        }
        self.cache.lookup(b.as_ptr() as usize, b.len())
    }

    /// Post the next data message (take a slot; the immediate is the
    /// length).
    ///
    /// # Safety
    /// `local` must stay valid and unchanged until the send completes.
    unsafe fn post_data(&mut self, local: Local, zero_copy: bool) -> io::Result<()> {
        let slot = self.tx.post();
        let remote = self.remote_slot(slot);
        let len = local.len;
        if let Err(e) = self
            .qp
            .post_write_imm(WR_DATA, local, remote, self.remote.rkey, len)
        {
            return Err(self.fail(ErrorKind::InvalidData, e.to_string()));
        }
        self.sent.push_back(Sent::Data { zero_copy });
        Ok(())
    }

    /// Zero-copy send of `b` (registered in `mr`): report the completed
    /// prefix, or post more writes and ask to be called again.
    fn write_zero_copy(&mut self, b: &[u8], mr: Arc<Mr>) -> io::Result<usize> {
        let base = b.as_ptr() as usize;
        if let Some(z) = self.zero_copy.front() {
            if z.addr != base {
                return Err(self.fail(
                    ErrorKind::InvalidInput,
                    "zero-copy send resumed at another address".into(),
                ));
            }
        }
        let mut done = 0;
        while let Some(z) = self.zero_copy.front() {
            if !z.done || z.addr != base + done {
                break;
            }
            done += z.len;
            self.zero_copy.pop_front();
        }
        if done > 0 {
            return Ok(done);
        }
        let mut next = base + self.zero_copy.iter().map(|z| z.len).sum::<usize>();
        let end = base + b.len();
        while next < end && self.tx.can_post() {
            let len = (end - next).min(self.remote.slot_bytes as usize);
            // SAFETY: [next, next+len) lies in `b`, inside the registered
            // range of `mr`; the caller keeps `b` unchanged until this write
            // reports it done, which is after its completion.
            unsafe {
                self.post_data(
                    Local {
                        addr: next as u64,
                        len: len as u32,
                        lkey: mr.lkey(),
                    },
                    true,
                )?
            };
            if !self.used_zero_copy {
                self.used_zero_copy = true;
                tracing::debug!("oxccl rdma: first zero-copy send to rank {}", self.peer);
            }
            self.zero_copy.push_back(ZeroCopy {
                addr: next,
                len,
                done: false,
                _mr: mr.clone(),
            });
            next += len;
        }
        Err(ErrorKind::WouldBlock.into())
    }
}

impl Link for RdmaLink {
    fn streams(&self) -> usize {
        1
    }

    fn one_sided(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }

    fn write(&mut self, _stream: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.closed || self.peer_gone {
            return Err(ErrorKind::ConnectionReset.into());
        }
        self.progress()?;
        let Some(first) = bufs.iter().position(|b| !b.is_empty()) else {
            return Ok(0);
        };
        if let Some(mr) = self.registered(&bufs[first]) {
            return self.write_zero_copy(&bufs[first], mr);
        }
        if !self.zero_copy.is_empty() {
            return Err(self.fail(
                ErrorKind::InvalidInput,
                "zero-copy send abandoned mid-way".into(),
            ));
        }
        if !self.tx.can_post() {
            return Err(ErrorKind::WouldBlock.into());
        }
        let sb = self.remote.slot_bytes as usize;
        // The slot `post_data` will take: its bounce slot is free (can_post).
        let off = self.tx.next_slot() as usize * sb;
        let mut n = 0;
        for (i, b) in bufs.iter().enumerate().skip(first) {
            // A later registered slice goes zero-copy in its own call.
            if n == sb || (i > first && self.registered(b).is_some()) {
                break;
            }
            let k = b.len().min(sb - n);
            self.bounce.mem[off + n..off + n + k].copy_from_slice(&b[..k]);
            n += k;
        }
        let local = Local {
            addr: self.bounce.mem[off..].as_ptr() as u64,
            len: n as u32,
            lkey: self.bounce.mr.lkey(),
        };
        // SAFETY: the bounce slot lies in `bounce.mr` and is not touched
        // again until the window says this send completed.
        unsafe { self.post_data(local, false)? };
        Ok(n)
    }

    fn read(&mut self, _stream: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        if self.closed {
            return Ok(0);
        }
        self.progress()?;
        let mut n = 0;
        for b in bufs.iter_mut() {
            let mut at = 0;
            while at < b.len() {
                let Some((slot, off, left)) = self.rx.front() else {
                    break;
                };
                let k = (left as usize).min(b.len() - at);
                let src = slot as usize * self.ring_slot_bytes + off as usize;
                b[at..at + k].copy_from_slice(&self.ring.mem[src..src + k]);
                self.rx.consume(k as u32);
                at += k;
            }
            n += at;
            if at < b.len() {
                break;
            }
        }
        self.return_credits()?;
        if n > 0 || bufs.iter().all(|b| b.is_empty()) {
            Ok(n)
        } else if self.peer_gone {
            Ok(0) // nothing buffered and nobody left to send more
        } else {
            Err(ErrorKind::WouldBlock.into())
        }
    }

    fn arm(&mut self, _stream: usize, _read: bool, _write: bool) -> bool {
        if self.failed.is_some() || self.closed || self.peer_gone {
            return true;
        }
        if let Err(e) = self.cq.arm() {
            self.fail(ErrorKind::InvalidData, e.to_string());
            return true;
        }
        // Completions that arrived before the request raise no event.
        if !matches!(self.progress(), Ok(false)) {
            return true;
        }
        if comm_core::net::hung_up(self.sock.as_raw_fd()) {
            self.peer_gone = true;
            return true;
        }
        false
    }

    fn fd(&self, _stream: usize) -> RawFd {
        self.epoll.as_raw_fd()
    }

    fn poll_events(&self, _stream: usize, _read: bool, _write: bool) -> i16 {
        libc::POLLIN
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.qp.to_error();
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl OneSided for RdmaLink {
    unsafe fn start_read(&mut self, local: Region, remote: RemoteMemory) -> io::Result<u64> {
        if self.closed || self.peer_gone {
            return Err(ErrorKind::ConnectionReset.into());
        }
        if let Some((k, d)) = &self.failed {
            return Err(io::Error::new(*k, d.clone()));
        }
        if local.len != remote.len || !local.space.is_host() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "a one-sided read of {} bytes into {} bytes of {}",
                    remote.len, local.len, local.space
                ),
            ));
        }
        let mr = match self.cache.lookup(local.addr, local.len) {
            _ if local.len == 0 => None,
            Some(mr) => Some(mr),
            None => {
                return Err(io::Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "a one-sided read into {} bytes at {:#x}, which are not registered with the device",
                        local.len, local.addr
                    ),
                ))
            }
        };
        if !self.used_reads {
            self.used_reads = true;
            tracing::debug!(
                "oxccl rdma: first one-sided read of rank {}'s memory",
                self.peer
            );
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.reads.push_back(PendingRead {
            local: local.addr as u64,
            remote: remote.addr,
            rkey: remote.key,
            left: local.len,
            ticket,
            mr,
        });
        self.post_reads()?;
        Ok(ticket)
    }

    fn reads_completed(&mut self) -> io::Result<u64> {
        if self.closed {
            return Err(ErrorKind::ConnectionReset.into());
        }
        self.progress()?;
        if self.peer_gone && self.reads_done < self.next_ticket {
            // Its memory went with its process: these reads cannot finish.
            return Err(io::Error::new(
                ErrorKind::ConnectionReset,
                format!(
                    "rank {} hung up with reads of its memory pending",
                    self.peer
                ),
            ));
        }
        Ok(self.reads_done)
    }
}

impl Drop for RdmaLink {
    fn drop(&mut self) {
        self.close();
    }
}
