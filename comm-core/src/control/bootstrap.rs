//! Rendezvous through a root, and the control plane that stays up after:
//! the root's threads and sockets, and a rank's side of its connection.
//!
//! The root (started by `UniqueId::new`, in the launcher or in rank 0's
//! process) accepts one control connection per rank, checks the handshake,
//! collects every rank's [`PeerInfo`] and sends the full table back. The
//! connections then stay open for the communicator's life: a rank that
//! fails sends an `Abort` with its cause and the root relays it to all
//! others; a rank whose connection ends without `Goodbye` (crash, kill) is
//! announced to all survivors as lost. So every survivor learns *which*
//! rank failed within milliseconds, whichever transport it used. What the
//! root decides is [`super::root`] (no I/O); this file only feeds it
//! events and carries out its actions.
//!
//! Strangers (wrong secret, other communicator, duplicate rank, garbage,
//! silence) are rejected and logged; each connection is handled on its own
//! thread with a read deadline, so none can block the others.

use super::message::{self, FromRank};
use super::notice::{Notice, MSG_NOTICE};
use super::root::{Action, ConnId, Event, Reply, Root};
use crate::error::{Error, Result};
use crate::handshake::{self, Hello, Purpose, Secret, ROOT};
use crate::transport::PeerInfo;
use crate::wire::{self, Reader};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use super::root::LATE_REJECT_WINDOW;
pub use crate::config::vars::MAX_RANKS;

/// Read deadline for a connection to finish its handshake and registration.
const DOOR_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- root ----

/// What a process hosting the root (a launcher) can learn from it: the
/// first failure the root relayed to the ranks — the job's root cause as
/// the control plane saw it, which a launcher reaping exit statuses cannot
/// tell (the victim and the survivors that fail in reaction all exit
/// within milliseconds).
#[derive(Debug, Default)]
pub struct RootWatch {
    state: std::sync::Mutex<WatchState>,
    changed: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct WatchState {
    /// The first failure relayed.
    first: Option<Notice>,
    /// The first failure has been sent to every rank.
    relayed: bool,
    /// Setup failed and the root told every rank why (or gave up).
    setup_failed: bool,
}

impl RootWatch {
    fn update(&self, f: impl FnOnce(&mut WatchState)) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_all();
    }

    /// Wait until `done` holds or `wait` passes; the state then.
    fn wait_until<R>(
        &self,
        wait: Duration,
        done: impl Fn(&WatchState) -> bool,
        read: impl FnOnce(&WatchState) -> R,
    ) -> R {
        let until = crate::config::value::deadline_after(wait);
        let mut st = self.state.lock().unwrap();
        while !done(&st) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self.changed.wait_timeout(st, left).unwrap().0;
        }
        read(&st)
    }

    fn record(&self, n: &Notice) {
        self.update(|st| {
            st.first.get_or_insert_with(|| n.clone());
        });
    }

    fn relay_done(&self) {
        self.update(|st| st.relayed = true);
    }

    fn setup_over(&self) {
        self.update(|st| st.setup_failed = true);
    }

    /// For the process hosting the root, on its own failure: wait, at
    /// most `wait`, until the root has sent the job's first failure to
    /// every rank. The process is likely to exit next, and the root with
    /// it; the relay must be out first, or the survivors blame whichever
    /// peer's link closed last.
    pub fn wait_relayed(&self, wait: Duration) {
        self.wait_until(wait, |st| st.relayed, |_| ());
    }

    /// For the process hosting the root (rank 0 under `OXCCL_ROOT`) whose
    /// own init failed: wait, at most `wait`, until the root has told the
    /// other ranks why — exiting at once would take the root along and
    /// leave them to time out reaching it.
    pub fn wait_setup_failure_told(&self, wait: Duration) {
        self.wait_until(wait, |st| st.setup_failed, |_| ());
    }

    /// The first failure relayed, waiting up to `wait` for one.
    pub fn first_failure(&self, wait: Duration) -> Option<Notice> {
        self.wait_until(wait, |st| st.first.is_some(), |st| st.first.clone())
    }
}

/// A connection thread's report, with the connection's write half when it
/// registered (the root answers on it).
struct Incoming {
    event: Event,
    stream: Option<TcpStream>,
}

/// Start the root on `listener`. It runs on its own threads until every
/// rank has left (or `init_timeout` passes before all registered).
pub(crate) fn spawn_root(
    listener: TcpListener,
    secret: Secret,
    init_timeout: Duration,
    watch: Arc<RootWatch>,
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Bootstrap(format!("root listener: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = unbounded::<Incoming>();
    let stop2 = stop.clone();
    std::thread::Builder::new()
        .name("oxccl-root-accept".into())
        .spawn(move || accept_loop(listener, secret, tx, stop2))
        .map_err(|e| Error::Bootstrap(format!("spawning root thread: {e}")))?;
    std::thread::Builder::new()
        .name("oxccl-root".into())
        .spawn(move || {
            coordinate(rx, init_timeout, watch, &stop);
            stop.store(true, Ordering::Relaxed);
        })
        .map_err(|e| Error::Bootstrap(format!("spawning root thread: {e}")))?;
    Ok(())
}

fn accept_loop(listener: TcpListener, secret: Secret, tx: Sender<Incoming>, stop: Arc<AtomicBool>) {
    let mut conn = 0u64;
    let fd = listener.as_raw_fd();
    crate::door::accept_until(
        "oxccl-root-conn",
        fd,
        &stop,
        || {
            let (s, addr) = listener.accept()?;
            conn += 1;
            Ok((conn, s, addr))
        },
        move |(conn, s, addr), permit| serve_rank(conn, s, addr, secret, tx.clone(), permit),
    );
}

/// Handshake, registration, then relay this rank's frames until it leaves.
fn serve_rank(
    conn: u64,
    s: TcpStream,
    addr: SocketAddr,
    secret: Secret,
    tx: Sender<Incoming>,
    permit: crate::door::Permit,
) {
    let _ = s.set_nodelay(true);
    // Handshake and registration within one deadline, however slowly the
    // bytes come.
    let mut s = crate::door::Admission::new(s);
    let comm_id = secret.comm_id();
    let mut seen = None;
    let hello = match handshake::server(&mut s, &secret, comm_id, |h: &Hello| {
        seen = Some(*h);
        if h.purpose != Purpose::Bootstrap || h.to != ROOT {
            return Err(Error::Handshake(format!(
                "{:?} connection sent to the rendezvous root",
                h.purpose
            )));
        }
        Ok(())
    }) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("oxccl root: rejected connection from {addr}: {e}");
            // A rank of this job's shape with another secret: the root
            // decides whether it stands for a rank that never registered.
            if let Some(h) = seen.filter(|h| h.purpose == Purpose::Bootstrap && h.to == ROOT) {
                let refused = Event::Refused {
                    rank: h.from as usize,
                    nranks: h.nranks as usize,
                    from: addr,
                };
                let _ = tx.send(Incoming {
                    event: refused,
                    stream: None,
                });
            }
            return;
        }
    };
    let reg = match wire::read_frame(&mut s, wire::MAX_FRAME) {
        Ok(Some(f)) => f,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("oxccl root: bad registration from {addr}: {e}");
            return;
        }
    };
    let parsed = message::parse_registration(&reg, hello.from as usize);
    let (nranks, info, settings) = match parsed {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!("oxccl root: bad registration from {addr}: {e}");
            return;
        }
    };
    let rank = info.rank;
    let mut s = s.into_inner();
    drop(permit); // admitted: the relay phase below lasts the job's life
    let _ = s.set_write_timeout(Some(DOOR_TIMEOUT));
    let Ok(writer) = s.try_clone() else { return };
    let registered = Event::Registered {
        conn,
        rank,
        nranks,
        info,
        settings,
    };
    if tx
        .send(Incoming {
            event: registered,
            stream: Some(writer),
        })
        .is_err()
    {
        return;
    }
    // Relay phase: no read deadline, the rank speaks only when it fails or leaves.
    let _ = s.set_read_timeout(None);
    loop {
        let event = match wire::read_frame(&mut s, wire::MAX_FRAME) {
            Ok(Some(f)) => match message::decode_from_rank(&f) {
                Ok(FromRank::Goodbye) => Event::Goodbye { conn, rank },
                Ok(FromRank::Arrive { barrier, wait }) => Event::Arrive {
                    conn,
                    rank,
                    barrier,
                    wait,
                },
                Ok(FromRank::Abort(notice)) => Event::Abort {
                    conn,
                    rank,
                    notice: notice.unwrap_or_else(|| Notice::Failed {
                        origin: rank,
                        aborted: false,
                        message: "unreadable abort".into(),
                    }),
                },
                Err(e) => {
                    tracing::warn!("oxccl root: rank {rank} sent an unreadable message: {e}");
                    continue;
                }
            },
            _ => Event::Eof { conn, rank },
        };
        let last = matches!(event, Event::Goodbye { .. } | Event::Eof { .. });
        let _ = tx.send(Incoming {
            event,
            stream: None,
        });
        if last {
            return;
        }
    }
}

fn send_to(s: &TcpStream, payload: &[u8]) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = wire::write_frame(&mut &*s, payload);
}
/// The root's loop: feed [`Root`] what the connection threads report and
/// the deadlines it asks for, and carry out what it decides, until it is
/// done.
fn coordinate(
    rx: Receiver<Incoming>,
    init_timeout: Duration,
    watch: Arc<RootWatch>,
    stop_accepting: &AtomicBool,
) {
    let mut root = Root::new(Instant::now(), init_timeout);
    // Registered connections' write halves, by connection.
    let mut streams: HashMap<ConnId, TcpStream> = HashMap::new();
    while !root.is_done() {
        let incoming = match root.next_wake() {
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(i) => Some(i),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(i) => Some(i),
                Err(_) => break,
            },
        };
        let actions = match incoming {
            Some(Incoming { event, stream }) => {
                if let (Event::Registered { conn, .. }, Some(s)) = (&event, stream) {
                    streams.insert(*conn, s);
                }
                root.on_event(Instant::now(), event)
            }
            None => root.on_timer(Instant::now()),
        };
        for action in actions {
            carry_out(action, &mut streams, &watch, stop_accepting);
        }
    }
}

fn carry_out(
    action: Action,
    streams: &mut HashMap<ConnId, TcpStream>,
    watch: &RootWatch,
    stop_accepting: &AtomicBool,
) {
    let send = |to: &[ConnId], frame: &[u8]| {
        for c in to {
            if let Some(s) = streams.get(c) {
                send_to(s, frame);
            }
        }
    };
    match action {
        Action::Send { to, reply } => {
            if let Reply::Reject(why) = &reply {
                tracing::warn!("oxccl root: rejected connections {to:?}: {why}");
            }
            send(&to, &message::encode_reply(&reply));
        }
        Action::Relay { to, notice } => {
            watch.record(&notice);
            send(&to, &notice.encode_frame());
            watch.relay_done();
        }
        Action::Close(conn) => {
            if let Some(s) = streams.remove(&conn) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        Action::CloseDoor => stop_accepting.store(true, Ordering::Relaxed),
        Action::SetupOver => watch.setup_over(),
    }
}

// ---------------------------------------------------------------- rank ----

/// A rank's control connection to the root.
pub(crate) struct Control {
    stream: TcpStream,
    buf: Vec<u8>,
    gone: bool,
    /// Announcements are held back (see [`Control::hold_notices`]).
    holding: bool,
    /// The first announcement held back, reported by the first poll after
    /// holding ends.
    held: Option<Notice>,
}

/// One attempt to reach the root: connect and shake hands within `left`.
fn join_root(
    root: SocketAddr,
    secret: &Secret,
    rank: usize,
    nranks: usize,
    left: Duration,
) -> Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&root, left.min(Duration::from_secs(5)))
        .map_err(|e| Error::Bootstrap(e.to_string()))?;
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(left.min(DOOR_TIMEOUT)));
    let _ = s.set_write_timeout(Some(left.min(DOOR_TIMEOUT)));
    let hello = Hello::new(Purpose::Bootstrap, secret.comm_id(), rank, ROOT, nranks, 0)?;
    handshake::client(&mut s, secret, &hello)?;
    Ok(s)
}

/// Connect to the root (retrying until it is up or `connect_deadline`
/// passes: a wrong address fails in seconds, not after the collective
/// timeout), register with the settings that must agree, and wait for the
/// peer table (until `deadline`).
pub(crate) fn rendezvous(
    root: SocketAddr,
    secret: &Secret,
    me: &PeerInfo,
    nranks: usize,
    settings: &[(&str, String)],
    connect_deadline: Instant,
    deadline: Instant,
) -> Result<(Control, Vec<PeerInfo>)> {
    let started = Instant::now();
    let mut last_error = String::from("no attempt finished");
    // Connect and shake hands, again and again until the deadline: the
    // root may not be up yet, or may close a connection on arrival when it
    // is busy admitting others. Only a refusal (another job) is final.
    let mut s = loop {
        let left = connect_deadline
            .min(deadline)
            .saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Bootstrap(format!(
                "could not reach the root at {root} within {:.1} s (OXCCL_CONNECT_TIMEOUT): {last_error}; check the address (OXCCL_ROOT / MASTER_ADDR / the unique id), that rank 0 or the launcher is running, and firewalls",
                started.elapsed().as_secs_f64(),
            )));
        }
        match join_root(root, secret, me.rank, nranks, left) {
            Ok(s) => break s,
            Err(e) if handshake::is_refusal(&e) => {
                return Err(Error::Bootstrap(format!("root at {root} refused us: {e}")))
            }
            Err(e) => {
                last_error = e.to_string();
                std::thread::sleep(Duration::from_millis(20).min(left));
            }
        }
    };
    let _ = s.set_write_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
            .min(DOOR_TIMEOUT),
    ));
    let reg = message::encode_registration(nranks, me, settings);
    wire::write_frame(&mut s, &reg)
        .map_err(|e| Error::Bootstrap(format!("registering with the root: {e}")))?;
    let _ = s.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ));
    let frame = wire::read_frame(&mut s, 64 << 20)
        .map_err(|e| {
            Error::Bootstrap(format!(
                "waiting for the other ranks at {root}: {e} (did every rank start?)"
            ))
        })?
        .ok_or_else(|| {
            Error::Bootstrap(format!(
                "root at {root} closed the connection during bootstrap"
            ))
        })?;
    let mut r = Reader::new(&frame, "peer table");
    let table = match r.u8()? {
        message::MSG_TABLE => message::decode_table(&mut r)?,
        message::MSG_REJECT => return Err(Error::Bootstrap(r.string(message::REJECT_TEXT)?)),
        t => {
            return Err(Error::Protocol(format!(
                "unexpected message {t} from the root"
            )))
        }
    };
    if table.len() != nranks {
        return Err(Error::Bootstrap(format!(
            "root sent a table of {} ranks, expected {nranks}",
            table.len()
        )));
    }
    s.set_read_timeout(None).ok();
    s.set_nonblocking(true)
        .map_err(|e| Error::Bootstrap(format!("control socket: {e}")))?;
    Ok((
        Control {
            stream: s,
            buf: Vec::new(),
            gone: false,
            holding: false,
            held: None,
        },
        table,
    ))
}

/// The write side of the control connection, shareable with `abort()`.
pub(crate) struct ControlSender {
    stream: TcpStream,
}

impl ControlSender {
    /// Tell the root (and through it everyone) that this rank failed.
    pub(crate) fn abort(&mut self, notice: &Notice) {
        self.send(&message::encode_from_rank(&FromRank::Abort(Some(
            notice.clone(),
        ))));
    }

    /// Tell the root this rank arrived at monitored barrier `number` and
    /// waits `wait` for the others.
    pub(crate) fn arrive(&mut self, number: u64, wait: Duration) {
        self.send(&message::encode_from_rank(&FromRank::Arrive {
            barrier: number,
            wait,
        }));
    }

    /// Tell the root this rank leaves normally.
    pub(crate) fn goodbye(&mut self) {
        self.send(&message::encode_from_rank(&FromRank::Goodbye));
    }

    fn send(&mut self, payload: &[u8]) {
        // The socket is non-blocking (shared with the reader); control frames
        // are tiny and the buffer is empty in practice, so retry briefly.
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(payload);
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut off = 0;
        while off < frame.len() && Instant::now() < deadline {
            match self.stream.write(&frame[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    crate::sys::poll_one(
                        self.stream.as_raw_fd(),
                        libc::POLLOUT,
                        Duration::from_millis(50),
                    );
                }
                Err(_) => return,
            }
        }
    }
}

/// What the control connection said.
pub(crate) enum ControlEvent {
    Notice(Notice),
    /// Every rank arrived at this monitored barrier.
    Released(u64),
    /// The root went away (its process ended).
    RootGone,
}

impl Control {
    /// Whether the root is gone (its connection ended): no failure will be
    /// relayed to this rank any more.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone
    }

    /// The fd to poll for notices; -1 (ignored by poll) once the root is gone.
    pub(crate) fn fd(&self) -> RawFd {
        if self.gone {
            -1
        } else {
            self.stream.as_raw_fd()
        }
    }

    pub(crate) fn sender(&self) -> Result<ControlSender> {
        Ok(ControlSender {
            stream: self
                .stream
                .try_clone()
                .map_err(|e| Error::Bootstrap(format!("control socket: {e}")))?,
        })
    }

    /// Hold announcements back (`true`) or report them again (`false`).
    /// For the exchanges inside `init`: they complete whenever every rank
    /// is alive, and a failure announced meanwhile belongs to a later call
    /// of ranks that finished `init` first (a rank that fails inside `init`
    /// closes its links, which its peers see). Held, the first one is
    /// reported by the first poll after holding ends.
    pub(crate) fn hold_notices(&mut self, hold: bool) {
        self.holding = hold;
    }

    /// The announcement held back, if any (it will not be reported).
    pub(crate) fn take_held(&mut self) -> Option<Notice> {
        self.held.take()
    }

    /// Read whatever arrived, without blocking; the first event, if any.
    /// `RootGone` is reported once; afterwards this returns `None`.
    pub(crate) fn poll(&mut self) -> Option<ControlEvent> {
        if !self.holding {
            if let Some(n) = self.held.take() {
                return Some(ControlEvent::Notice(n));
            }
        }
        if self.gone {
            return None;
        }
        let ev = loop {
            match self.poll_inner() {
                Some(ControlEvent::Notice(n)) if self.holding => {
                    self.held.get_or_insert(n);
                }
                ev => break ev,
            }
        };
        if matches!(ev, Some(ControlEvent::RootGone)) {
            self.gone = true;
        }
        ev
    }

    fn poll_inner(&mut self) -> Option<ControlEvent> {
        // Small: calls poll every millisecond, and clearing a larger
        // buffer each time showed in their profile; notices are short
        // and the loop reads until the socket is empty.
        let mut tmp = [0u8; 512];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => {
                    if let Some(ev) = self.parse() {
                        return Some(ev);
                    }
                    return Some(ControlEvent::RootGone);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    if self.buf.len() > wire::MAX_FRAME + 4 {
                        return Some(ControlEvent::RootGone);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return self.parse(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Some(ControlEvent::RootGone),
            }
        }
    }

    fn parse(&mut self) -> Option<ControlEvent> {
        while self.buf.len() >= 4 {
            let n = u32::from_le_bytes(self.buf[..4].try_into().unwrap()) as usize;
            if self.buf.len() < 4 + n {
                return None;
            }
            let frame: Vec<u8> = self.buf.drain(..4 + n).skip(4).collect();
            let mut r = Reader::new(&frame, "control notice");
            match r.u8().ok() {
                Some(MSG_NOTICE) => {
                    if let Ok(n) = Notice::decode(&mut r) {
                        return Some(ControlEvent::Notice(n));
                    }
                }
                Some(message::MSG_RELEASE) => {
                    if let Ok(n) = r.u64() {
                        return Some(ControlEvent::Released(n));
                    }
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control connection whose root end the test writes to.
    fn control() -> (Control, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let root = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let c = Control {
            stream: s,
            buf: Vec::new(),
            gone: false,
            holding: false,
            held: None,
        };
        (c, root)
    }

    fn send(root: &mut TcpStream, n: &Notice) {
        let body = n.encode_frame();
        root.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
        root.write_all(&body).unwrap();
    }

    fn lost(rank: usize) -> Notice {
        Notice::Lost {
            rank,
            detail: format!("rank {rank}"),
        }
    }

    /// Poll until `done` or 5 s; what the last poll said.
    fn poll_until(c: &mut Control, done: impl Fn(&Control) -> bool) -> Option<ControlEvent> {
        let t = Instant::now();
        loop {
            let ev = c.poll();
            if ev.is_some() || done(c) || t.elapsed() > Duration::from_secs(5) {
                return ev;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_notice_held_back_during_init_is_reported_by_the_first_poll_after() {
        let (mut c, mut root) = control();
        c.hold_notices(true);
        send(&mut root, &lost(1));
        send(&mut root, &lost(2));
        // Held: never reported while holding, however often polled.
        assert!(poll_until(&mut c, |c| c.held.is_some()).is_none());
        assert!(poll_until(&mut c, |c| c.buf.is_empty()).is_none());
        c.hold_notices(false);
        // The first one (the cause; later ones follow from it), once.
        match c.poll() {
            Some(ControlEvent::Notice(Notice::Lost { rank: 1, .. })) => {}
            _ => panic!("the held notice was not reported"),
        }
        assert!(c.poll().is_none());
        // Not holding: reported as it comes.
        send(&mut root, &lost(3));
        match poll_until(&mut c, |_| false) {
            Some(ControlEvent::Notice(Notice::Lost { rank: 3, .. })) => {}
            _ => panic!("a notice after holding was not reported"),
        }
    }

    #[test]
    fn a_notice_held_back_can_be_taken_instead() {
        let (mut c, mut root) = control();
        c.hold_notices(true);
        send(&mut root, &lost(4));
        assert!(poll_until(&mut c, |c| c.held.is_some()).is_none());
        c.hold_notices(false);
        assert!(matches!(c.take_held(), Some(Notice::Lost { rank: 4, .. })));
        assert!(c.poll().is_none());
    }
}
