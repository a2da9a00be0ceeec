//! Registered buffers: memory every rank of a one-host communicator can
//! read directly, and the zero-copy all-reduce that uses it.
//!
//! [`Communicator::alloc_shared`] is collective: each rank creates an
//! anonymous memfd of the requested size, ranks exchange (pid, fd) through
//! an all_gather, and each maps every peer's buffer by opening
//! `/proc/<pid>/fd/<fd>` (same user; never a name in `/dev/shm`). The first
//! allocation also shares one flag page per rank.
//!
//! The all-reduce over registered buffers moves no message at all: after a
//! "ready" phase, rank `r` reduces segment `r` reading every rank's buffer
//! directly (n-way kernel, one rounding for halves), a "reduced" phase, then
//! every rank copies the other segments from their owners, and a "done"
//! phase keeps any buffer from changing while someone still reads it. A
//! phase is a counter per rank in the flag page; waiting spins (yielding),
//! then sleeps on the peer's counter with a futex in short slices, checking
//! the deadline, `abort()`, the control plane and the peer's process between
//! slices, so a dead peer is an error, never a hang. Each rank also writes
//! its call (kind, count, dtype, op, buffers, sequence number) before
//! "ready", and every rank checks everyone's: a mismatch is `Error::Mismatch`.
//!
//! When the communicator spans several hosts, a `SharedBuffer` is ordinary
//! memory and its collectives take the usual path.

use crate::bootstrap::ControlEvent;
use crate::call::{Fingerprint, Kind};
use crate::comm::{Communicator, Inner, State};
use crate::error::{Error, Result};
use crate::executor::notice_to_error;
use crate::schedule::{seg_len, seg_off};
use crate::shmem::{self, Mapping as Map};
use crate::types::{Element, ReduceOp};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Map a buffer: our own (`owner` None) or rank `owner`'s.
fn map(fd: &OwnedFd, len: usize, owner: Option<usize>) -> Result<Map> {
    Map::new(fd, len).map_err(|e| match owner {
        Some(peer) => Error::Transport {
            peer,
            detail: format!("mapping its shared buffer: {e}"),
        },
        None => Error::System(format!("mmap of a {len}-byte shared buffer: {e}")),
    })
}

fn memfd(len: usize) -> Result<OwnedFd> {
    shmem::memfd(c"oxccl-registered", len)
        .map_err(|e| Error::System(format!("memfd of {len} bytes: {e}")))
}

/// Whether a phase counter at `v` has reached `target`, across wraparound.
fn reached(v: u32, target: u32) -> bool {
    v.wrapping_sub(target) as i32 >= 0
}

/// Open another process's fd through /proc (same user).
fn open_peer_fd(pid: u32, fd: i32, rank: usize) -> Result<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).unwrap();
    // SAFETY: NUL-terminated path; the fd is owned below.
    let f = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if f < 0 {
        return Err(Error::Transport {
            peer: rank,
            detail: format!(
                "cannot open rank {rank}'s shared buffer (/proc/{pid}/fd/{fd}): {}; registered buffers need all ranks of a host to run as one user",
                std::io::Error::last_os_error()
            ),
        });
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(f) })
}

const PAGE: usize = 4096;

/// One flag page per rank: `phase` (futex word), `waiters`, and the call
/// description checked at "ready".
pub(crate) struct Flags {
    own: Map,
    _fd: OwnedFd,
    peers: Vec<Option<Map>>,
    pids: Vec<u32>,
}

impl Flags {
    fn page(&self, rank: usize, me: usize) -> *mut u8 {
        if rank == me {
            self.own.ptr()
        } else {
            self.peers[rank]
                .as_ref()
                .expect("flag page of a local peer")
                .ptr()
        }
    }
    fn phase(&self, rank: usize, me: usize) -> &AtomicU32 {
        // SAFETY: offset 0 of a mapped, page-aligned flag page.
        unsafe { &*(self.page(rank, me) as *const AtomicU32) }
    }
    fn waiters(&self, rank: usize, me: usize) -> &AtomicU32 {
        // SAFETY: offset 4 of the page.
        unsafe { &*(self.page(rank, me).add(4) as *const AtomicU32) }
    }
    fn call(&self, rank: usize, me: usize) -> &[AtomicU64; 4] {
        // SAFETY: offsets 8..40 of the page, 8-byte aligned.
        unsafe { &*(self.page(rank, me).add(8) as *const [AtomicU64; 4]) }
    }
}

/// A buffer of `T` in memory every rank of this host maps (see module docs).
pub struct SharedBuffer<T: Element> {
    /// Registrations with transports that send straight from memory (RDMA);
    /// dropped, and so unregistered, before the memory is unmapped.
    _registered: Vec<crate::transport::Registration>,
    own: Map,
    _fd: OwnedFd,
    len: usize,
    /// Every rank's buffer of the same allocation, mapped here (None for self).
    peers: Vec<Option<Map>>,
    /// Whether all ranks are on this host (zero-copy collectives possible).
    zero_copy: bool,
    /// Same on every rank for the same allocation.
    id: u64,
    comm_id: u64,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns its mappings; T is a plain number type.
unsafe impl<T: Element> Send for SharedBuffer<T> {}
// SAFETY: shared access only through `&self` (reads).
unsafe impl<T: Element> Sync for SharedBuffer<T> {}

impl<T: Element> SharedBuffer<T> {
    /// Whether collectives on this buffer read peers' memory directly.
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    fn peer_ptr(&self, rank: usize, me: usize) -> *mut T {
        if rank == me {
            self.own.ptr() as *mut T
        } else {
            self.peers[rank]
                .as_ref()
                .expect("mapping of a local peer")
                .ptr() as *mut T
        }
    }
}

impl<T: Element> Deref for SharedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds at least `len` elements of T, page aligned.
        unsafe { std::slice::from_raw_parts(self.own.ptr() as *const T, self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` excludes other local borrows,
        // and peers read it only inside a collective this rank takes part in.
        unsafe { std::slice::from_raw_parts_mut(self.own.ptr() as *mut T, self.len) }
    }
}

/// User memory registered with the communicator's transports for
/// zero-copy sends (see [`Communicator::register_memory`]); unregistered
/// when dropped.
#[must_use = "the memory is unregistered when this is dropped"]
pub struct MemoryRegistration {
    _regs: Vec<crate::transport::Registration>,
}

impl MemoryRegistration {
    /// Whether some transport registered the memory (false when none can
    /// send straight from memory, e.g. without RDMA: then this is a no-op).
    pub fn is_active(&self) -> bool {
        !self._regs.is_empty()
    }
}

impl Communicator {
    /// Register `buf` with the transports that can send straight from user
    /// memory (RDMA, like `ncclCommRegister`): large sends from it then go
    /// zero-copy instead of through bounce buffers. Local (not collective),
    /// and a no-op on transports without such a path. Registering the same
    /// buffer again only counts a reference.
    ///
    /// # Safety
    /// `buf`'s memory must stay allocated, and must not be freed and reused
    /// for something else, until the returned registration is dropped: the
    /// device keeps the *pages* it pinned now, so data written into a
    /// reallocation at the same address would not be what it sends.
    /// (`alloc_shared` buffers are registered safely by construction.)
    pub unsafe fn register_memory<T: Element>(&self, buf: &[T]) -> Result<MemoryRegistration> {
        let (addr, len) = (buf.as_ptr() as usize, std::mem::size_of_val(buf));
        if len == 0 {
            return Ok(MemoryRegistration { _regs: Vec::new() });
        }
        let regs = self
            .inner
            .registries
            .iter()
            .map(|r| crate::transport::Registration::new(r.clone(), addr, len))
            .collect::<Result<Vec<_>>>()?;
        Ok(MemoryRegistration { _regs: regs })
    }

    /// Allocate `len` zeroed elements every rank of this host can read
    /// directly (collective: every rank calls it, in the same order, with
    /// the same `len`). On a one-host communicator, all_reduce over such
    /// buffers copies nothing through intermediate buffers; otherwise it is
    /// ordinary memory and collectives take the usual path.
    pub fn alloc_shared<T: Element>(&self, len: usize) -> Result<SharedBuffer<T>> {
        let (me, n) = (self.rank(), self.nranks());
        let bytes = (len * std::mem::size_of::<T>())
            .max(1)
            .next_multiple_of(PAGE);
        let fd = memfd(bytes)?;
        let own = map(&fd, bytes, None)?;
        let my_host = self.peers()[me].host_id;
        let zero_copy = n > 1 && self.peers().iter().all(|p| p.host_id == my_host);
        let comm_id = self.id();
        let id = self.run(|_, st| {
            st.shared_allocs += 1;
            Ok(st.shared_allocs)
        })?;
        // For zero-copy sends to other hosts (RDMA). Optional: memory that
        // cannot be registered (e.g. `ulimit -l`) still works through bounce
        // buffers, and failing here, before the collective exchange below,
        // would leave the other ranks waiting.
        let mut _registered = Vec::new();
        if !zero_copy {
            for r in &self.inner.registries {
                match crate::transport::Registration::new(r.clone(), own.ptr() as usize, bytes) {
                    Ok(reg) => _registered.push(reg),
                    Err(e) => tracing::warn!(
                        "oxccl: alloc_shared: {e}; this buffer is sent through bounce buffers"
                    ),
                }
            }
        }
        let mut buf = SharedBuffer {
            _registered,
            own,
            _fd: fd,
            len,
            peers: (0..n).map(|_| None).collect(),
            zero_copy,
            id,
            comm_id,
            _t: PhantomData,
        };
        if !zero_copy {
            return Ok(buf);
        }
        let need_flags = self.run(|_, st| Ok(st.flags.is_none()))?;
        let flag_fd = if need_flags { Some(memfd(PAGE)?) } else { None };
        // Exchange (pid, buffer fd, flag fd, length) with everyone.
        let mine = [
            std::process::id() as u64,
            buf._fd.as_raw_fd() as u64,
            flag_fd.as_ref().map_or(u64::MAX, |f| f.as_raw_fd() as u64),
            len as u64,
        ];
        let mut all = vec![0u64; 4 * n];
        self.all_gather(&mine, &mut all)?;
        for k in 0..n {
            if all[4 * k + 3] != len as u64 {
                return Err(Error::invalid(format!(
                    "alloc_shared: rank {k} asked for {} elements, this rank for {len}; every rank must allocate the same size in the same order",
                    all[4 * k + 3]
                )));
            }
        }
        let mut flag_peers: Vec<Option<Map>> = (0..n).map(|_| None).collect();
        for k in (0..n).filter(|k| *k != me) {
            let pid = all[4 * k] as u32;
            let f = open_peer_fd(pid, all[4 * k + 1] as i32, k)?;
            buf.peers[k] = Some(map(&f, bytes, Some(k))?);
            if need_flags {
                let ff = open_peer_fd(pid, all[4 * k + 2] as i32, k)?;
                flag_peers[k] = Some(map(&ff, PAGE, Some(k))?);
            }
        }
        if let Some(ffd) = flag_fd {
            let own = map(&ffd, PAGE, None)?;
            let pids = (0..n).map(|k| all[4 * k] as u32).collect();
            self.run(move |_, st| {
                st.flags = Some(Flags {
                    own,
                    _fd: ffd,
                    peers: flag_peers,
                    pids,
                });
                Ok(())
            })?;
        }
        // Nobody may close its fds before every peer has opened them.
        self.barrier()?;
        Ok(buf)
    }

    /// In-place all-reduce of a registered buffer (zero-copy on one host).
    pub fn all_reduce_shared<T: Element>(
        &self,
        buf: &mut SharedBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        if !buf.zero_copy {
            return self.all_reduce_in_place(&mut buf[..], op);
        }
        self.check_shared(buf)?;
        let (send, recv) = (buf as *const SharedBuffer<T>, buf as *const SharedBuffer<T>);
        // SAFETY: both point at `buf`, borrowed mutably for the whole call.
        self.run(|inner, st| unsafe { zero_copy_all_reduce(inner, st, &*send, &*recv, op) })
    }

    /// Out-of-place all-reduce between registered buffers (zero-copy on one host).
    pub fn all_reduce_shared_from<T: Element>(
        &self,
        send: &SharedBuffer<T>,
        recv: &mut SharedBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        if send.len != recv.len {
            return Err(Error::invalid(format!(
                "all_reduce: send has {} elements, recv {}",
                send.len, recv.len
            )));
        }
        if !(send.zero_copy && recv.zero_copy) {
            return self.all_reduce(&send[..], &mut recv[..], op);
        }
        self.check_shared(send)?;
        self.check_shared(recv)?;
        self.run(|inner, st| zero_copy_all_reduce(inner, st, send, recv, op))
    }

    fn check_shared<T: Element>(&self, b: &SharedBuffer<T>) -> Result<()> {
        if b.comm_id != self.id() {
            return Err(Error::invalid(
                "this shared buffer was allocated by another communicator",
            ));
        }
        Ok(())
    }
}

/// Wait until every local peer's phase counter reached `target`; `verify`
/// runs for each peer as soon as it has (so a disagreement is reported as
/// such, before any news of it from elsewhere can arrive).
fn wait_all(
    inner: &Inner,
    st: &mut State,
    target: u32,
    during: &str,
    own: &str,
    deadline: Instant,
    verify: impl Fn(&Flags, usize) -> Result<()>,
) -> Result<()> {
    let me = inner.rank;
    let spin = inner.config.spin;
    for k in (0..inner.nranks).filter(|k| *k != me) {
        let mut idle = Instant::now();
        loop {
            let flags = st.flags.as_ref().unwrap();
            let word = flags.phase(k, me);
            let v = word.load(Ordering::Acquire);
            if reached(v, target) {
                verify(flags, k)?;
                break;
            }
            if inner.aborted.load(Ordering::Acquire) {
                return Err(Error::Aborted { by: None });
            }
            if Instant::now() >= deadline {
                return Err(crate::executor::stall_error(
                    &mut st.control,
                    &inner.sender,
                    me,
                    &inner.peers,
                    format!("rank {k} to reach phase {target}"),
                    Some(k),
                    during,
                    own,
                    inner.config.timeout,
                ));
            }
            if idle.elapsed() < spin {
                std::thread::yield_now();
                continue;
            }
            // Sleep on the peer's counter for a short slice, then look around.
            let waiters = flags.waiters(k, me);
            waiters.fetch_add(1, Ordering::SeqCst);
            if word.load(Ordering::SeqCst) == v {
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 2_000_000,
                };
                // SAFETY: FUTEX_WAIT on a 4-byte aligned word of a shared
                // mapping, with a timeout; spurious returns are handled by the loop.
                unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        word as *const AtomicU32,
                        libc::FUTEX_WAIT,
                        v,
                        &ts,
                        0usize,
                        0u32,
                    )
                };
            }
            waiters.fetch_sub(1, Ordering::SeqCst);
            if let Some(ControlEvent::Notice(n)) = st.control.poll() {
                return Err(notice_to_error(n, me, &inner.peers, during, own));
            }
            let pid = st.flags.as_ref().unwrap().pids[k] as i32;
            // SAFETY: signal 0 only checks that the process exists.
            if unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            {
                return Err(Error::PeerLost {
                    rank: k,
                    host: inner.peers[k].hostname.clone(),
                    during: during.to_string(),
                    detail: format!("its process (pid {pid}) no longer exists"),
                });
            }
            idle = Instant::now();
        }
    }
    Ok(())
}

/// Publish this rank's phase and wake peers sleeping on it.
fn arrive(st: &State, me: usize, target: u32) {
    let flags = st.flags.as_ref().unwrap();
    flags.phase(me, me).store(target, Ordering::Release);
    fence(Ordering::SeqCst);
    if flags.waiters(me, me).load(Ordering::SeqCst) > 0 {
        // SAFETY: FUTEX_WAKE on our own shared counter.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                flags.phase(me, me) as *const AtomicU32,
                libc::FUTEX_WAKE,
                i32::MAX,
                0usize,
                0usize,
                0u32,
            )
        };
    }
}

/// Elements per block of the reduce phase (bounded temporary for in place).
const BLOCK: usize = 64 << 10;

/// The phases of one zero-copy call: "ready" (every rank has published its
/// call and they agree) is passed by [`Phases::begin`]; each further
/// [`Phases::barrier`] is one more phase.
struct Phases {
    next: u32,
    during: String,
    own: String,
    deadline: Instant,
}

impl Phases {
    /// Take a sequence number, publish this rank's call (fingerprint and
    /// buffer ids), reserve `phases` phase numbers, and pass "ready":
    /// every peer has arrived and called the same thing.
    fn begin(
        inner: &Inner,
        st: &mut State,
        fp: Fingerprint,
        ids: u64,
        phases: u32,
    ) -> Result<Phases> {
        let me = inner.rank;
        let seq = st.seq;
        st.seq += 1;
        let base = st.shared_phase;
        st.shared_phase = st.shared_phase.wrapping_add(phases);
        let describe = |fp: &Fingerprint, seq: u64, ids: u64| {
            format!(
                "{fp} as collective #{seq} on shared buffers {}/{}",
                ids >> 32,
                ids & 0xffff_ffff
            )
        };
        let mut p = Phases {
            next: base.wrapping_add(1),
            during: format!("{} #{seq} (registered)", fp.kind.name()),
            own: describe(&fp, seq, ids),
            deadline: Instant::now() + inner.config.timeout,
        };
        {
            let call = st.flags.as_ref().unwrap().call(me, me);
            let f = fp.encode();
            call[0].store(
                u64::from_le_bytes(f[..8].try_into().unwrap()),
                Ordering::Relaxed,
            );
            call[1].store(
                u64::from_le_bytes(f[8..].try_into().unwrap()),
                Ordering::Relaxed,
            );
            call[2].store(seq, Ordering::Relaxed);
            call[3].store(ids, Ordering::Relaxed);
        }
        arrive(st, me, p.next);
        let own = p.own.clone();
        wait_all(
            inner,
            st,
            p.next,
            &p.during,
            &p.own,
            p.deadline,
            |flags, k| {
                let c = flags.call(k, me);
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&c[0].load(Ordering::Relaxed).to_le_bytes());
                b[8..].copy_from_slice(&c[1].load(Ordering::Relaxed).to_le_bytes());
                let theirs = Fingerprint::decode(&b);
                let (their_seq, their_ids) =
                    (c[2].load(Ordering::Relaxed), c[3].load(Ordering::Relaxed));
                if theirs.is_some_and(|t| t.agrees_with(&fp))
                    && their_seq == seq
                    && their_ids == ids
                {
                    return Ok(());
                }
                let remote = match theirs {
                    Some(t) => describe(&t, their_seq, their_ids),
                    None => "something unreadable".into(),
                };
                Err(Error::Mismatch {
                    local: own.clone(),
                    peer: k,
                    remote,
                })
            },
        )?;
        p.next = p.next.wrapping_add(1);
        Ok(p)
    }

    /// Arrive at the next phase and wait until every peer has.
    fn barrier(&mut self, inner: &Inner, st: &mut State) -> Result<()> {
        arrive(st, inner.rank, self.next);
        wait_all(
            inner,
            st,
            self.next,
            &self.during,
            &self.own,
            self.deadline,
            |_, _| Ok(()),
        )?;
        self.next = self.next.wrapping_add(1);
        Ok(())
    }
}

/// `dst[..len] = op over ranks k of src_k[at..at+len]` (src of rank k read
/// directly), in blocks; `dst` may be this rank's own source (in place).
#[allow(clippy::too_many_arguments)]
fn reduce_direct<T: Element>(
    st: &mut State,
    src: &SharedBuffer<T>,
    at: usize,
    len: usize,
    dst: *mut T,
    op: ReduceOp,
    me: usize,
    n: usize,
) {
    if st.shared_tmp.len() * 8 < BLOCK * std::mem::size_of::<T>() {
        st.shared_tmp
            .resize((BLOCK * std::mem::size_of::<T>()).div_ceil(8), 0);
    }
    let mut done = 0;
    while done < len {
        let m = (len - done).min(BLOCK);
        // SAFETY: every rank's buffer holds the allocation's length (checked
        // at allocation); this range of the sources is only read while the
        // phase lasts, and nobody writes it.
        let srcs: Vec<&[T]> = (0..n)
            .map(|k| unsafe { std::slice::from_raw_parts(src.peer_ptr(k, me).add(at + done), m) })
            .collect();
        // SAFETY: the temporary holds BLOCK elements of T (u64-aligned).
        let tmp =
            unsafe { std::slice::from_raw_parts_mut(st.shared_tmp.as_mut_ptr() as *mut T, m) };
        kernels::reduce_n(op.kernel_op(), tmp, &srcs);
        if op == ReduceOp::Avg {
            kernels::div_assign(tmp, n);
        }
        // SAFETY: `dst` is this rank's own memory for `len` elements, which
        // no peer reads during this phase.
        unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst.add(done), m) };
        done += m;
    }
}

fn zero_copy_all_reduce<T: Element>(
    inner: &Inner,
    st: &mut State,
    send: &SharedBuffer<T>,
    recv: &SharedBuffer<T>,
    op: ReduceOp,
) -> Result<()> {
    let (me, n, count) = (inner.rank, inner.nranks, recv.len);
    let fp = Fingerprint::new(Kind::AllReduce, T::DTYPE, count).with_op(op);
    let mut ph = Phases::begin(inner, st, fp, send.id << 32 | recv.id, 3)?;
    // Reduce-scatter by direct reads: this rank owns segment `me`.
    let (off, len) = (seg_off(count, n, me), seg_len(count, n, me));
    // SAFETY: our own receive buffer, segment `me`.
    reduce_direct(
        st,
        send,
        off,
        len,
        unsafe { recv.peer_ptr(me, me).add(off) },
        op,
        me,
        n,
    );
    ph.barrier(inner, st)?;
    // All-gather by direct reads of the owners' reduced segments.
    for k in (0..n).filter(|k| *k != me) {
        let (o, l) = (seg_off(count, n, k), seg_len(count, n, k));
        // SAFETY: segment k of rank k's receive buffer is final and stays
        // unchanged until the last phase; ours is written by us only.
        unsafe {
            std::ptr::copy_nonoverlapping(
                recv.peer_ptr(k, me).add(o),
                recv.peer_ptr(me, me).add(o),
                l,
            )
        };
    }
    ph.barrier(inner, st)
}

fn zero_copy_broadcast<T: Element>(
    inner: &Inner,
    st: &mut State,
    buf: &SharedBuffer<T>,
    root: usize,
) -> Result<()> {
    let me = inner.rank;
    let fp = Fingerprint::new(Kind::Broadcast, T::DTYPE, buf.len).with_root(root);
    let mut ph = Phases::begin(inner, st, fp, buf.id << 32 | buf.id, 2)?;
    if me != root {
        // SAFETY: the root's buffer does not change until the last phase.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.peer_ptr(root, me), buf.peer_ptr(me, me), buf.len)
        };
    }
    ph.barrier(inner, st)
}

fn zero_copy_all_gather<T: Element>(
    inner: &Inner,
    st: &mut State,
    buf: &SharedBuffer<T>,
) -> Result<()> {
    let (me, n) = (inner.rank, inner.nranks);
    let c = buf.len / n;
    let fp = Fingerprint::new(Kind::AllGather, T::DTYPE, c);
    let mut ph = Phases::begin(inner, st, fp, buf.id << 32 | buf.id, 2)?;
    for k in (0..n).filter(|k| *k != me) {
        // SAFETY: segment k of rank k's buffer is its contribution, unchanged
        // until the last phase; we write only our own buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.peer_ptr(k, me).add(k * c),
                buf.peer_ptr(me, me).add(k * c),
                c,
            )
        };
    }
    ph.barrier(inner, st)
}

fn zero_copy_reduce_scatter<T: Element>(
    inner: &Inner,
    st: &mut State,
    send: &SharedBuffer<T>,
    dst: *mut T,
    op: ReduceOp,
) -> Result<()> {
    let (me, n) = (inner.rank, inner.nranks);
    let c = send.len / n;
    let fp = Fingerprint::new(Kind::ReduceScatter, T::DTYPE, c).with_op(op);
    let mut ph = Phases::begin(inner, st, fp, send.id << 32 | send.id, 2)?;
    reduce_direct(st, send, me * c, c, dst, op, me, n);
    ph.barrier(inner, st)
}

impl Communicator {
    /// In-place broadcast of a registered buffer (zero-copy on one host).
    pub fn broadcast_shared<T: Element>(
        &self,
        buf: &mut SharedBuffer<T>,
        root: usize,
    ) -> Result<()> {
        if root >= self.nranks() {
            return Err(Error::invalid(format!(
                "root {root} is not a rank of this {}-rank communicator",
                self.nranks()
            )));
        }
        if !buf.zero_copy {
            return self.broadcast_in_place(&mut buf[..], root);
        }
        self.check_shared(buf)?;
        let b = buf as *const SharedBuffer<T>;
        // SAFETY: `b` is `buf`, borrowed mutably for the whole call.
        self.run(|inner, st| zero_copy_broadcast(inner, st, unsafe { &*b }, root))
    }

    /// In-place all-gather of a registered buffer: this rank's part is at
    /// `buf[rank * len/nranks..]` (zero-copy on one host).
    pub fn all_gather_shared<T: Element>(&self, buf: &mut SharedBuffer<T>) -> Result<()> {
        if !buf.len.is_multiple_of(self.nranks()) {
            return Err(Error::invalid(format!(
                "all_gather: {} elements are not divisible by {} ranks",
                buf.len,
                self.nranks()
            )));
        }
        if !buf.zero_copy {
            return self.all_gather_in_place(&mut buf[..]);
        }
        self.check_shared(buf)?;
        let b = buf as *const SharedBuffer<T>;
        // SAFETY: `b` is `buf`, borrowed mutably for the whole call.
        self.run(|inner, st| zero_copy_all_gather(inner, st, unsafe { &*b }))
    }

    /// Reduce-scatter from a registered buffer into plain memory (`recv`
    /// gets this rank's `len/nranks` elements; `send` is left unchanged).
    pub fn reduce_scatter_shared_from<T: Element>(
        &self,
        send: &SharedBuffer<T>,
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.nranks();
        if send.len != recv.len() * n {
            return Err(Error::invalid(format!(
                "reduce_scatter: send must hold nranks x recv = {} elements, has {}",
                recv.len() * n,
                send.len
            )));
        }
        if !send.zero_copy {
            return self.reduce_scatter(&send[..], recv, op);
        }
        self.check_shared(send)?;
        let dst = recv.as_mut_ptr();
        self.run(|inner, st| zero_copy_reduce_scatter(inner, st, send, dst, op))
    }

    /// In-place reduce-scatter of a registered buffer: the result lands at
    /// `buf[rank * len/nranks..]`, the rest is left as it was (zero-copy on
    /// one host).
    pub fn reduce_scatter_shared<T: Element>(
        &self,
        buf: &mut SharedBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.nranks();
        if !buf.len.is_multiple_of(n) {
            return Err(Error::invalid(format!(
                "reduce_scatter: {} elements are not divisible by {n} ranks",
                buf.len
            )));
        }
        if !buf.zero_copy {
            return self.reduce_scatter_in_place(&mut buf[..], op);
        }
        self.check_shared(buf)?;
        let c = buf.len / n;
        let dst = buf
            .peer_ptr(self.rank(), self.rank())
            .wrapping_add(self.rank() * c);
        let b = buf as *const SharedBuffer<T>;
        // SAFETY: `b` is `buf`, borrowed mutably for the whole call; `dst` is
        // this rank's segment of it.
        self.run(|inner, st| zero_copy_reduce_scatter(inner, st, unsafe { &*b }, dst, op))
    }
}

#[cfg(test)]
mod tests {
    use super::reached;

    #[test]
    fn phase_comparison_survives_wraparound() {
        assert!(reached(5, 5));
        assert!(!reached(4, 5));
        assert!(reached(2, u32::MAX - 1));
        assert!(!reached(u32::MAX - 2, 1));
    }
}
