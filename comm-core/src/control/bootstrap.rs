//! Rendezvous through a root, and the control plane that stays up after.
//!
//! The root (started by `UniqueId::new`, in the launcher or in rank 0's
//! process) accepts one control connection per rank, checks the handshake,
//! collects every rank's [`PeerInfo`] and sends the full table back. The
//! connections then stay open for the communicator's life: a rank that
//! fails sends an `Abort` with its cause and the root relays it to all
//! others; a rank whose connection ends without `Goodbye` (crash, kill) is
//! announced to all survivors as lost. So every survivor learns *which*
//! rank failed within milliseconds, whichever transport it used.
//!
//! Strangers (wrong secret, other communicator, duplicate rank, garbage,
//! silence) are rejected and logged; each connection is handled on its own
//! thread with a read deadline, so none can block the others.

use crate::error::{Error, Result};
use crate::handshake::{self, Hello, Purpose, Secret, ROOT};
use crate::transport::PeerInfo;
use crate::wire::{self, Put, Reader};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MSG_REGISTER: u8 = 1;
const MSG_ABORT: u8 = 2;
const MSG_GOODBYE: u8 = 3;
/// A rank arrived at monitored barrier `n` (u64) and waits `ms` (u64).
const MSG_ARRIVE: u8 = 4;
const MSG_TABLE: u8 = 10;
const MSG_REJECT: u8 = 11;
const MSG_NOTICE: u8 = 12;
/// Every rank arrived at monitored barrier `n` (u64).
const MSG_RELEASE: u8 = 13;

/// Most ranks one communicator may have (bounds decoder allocations).
pub use crate::config::vars::MAX_RANKS;
/// Read deadline for a connection to finish its handshake and registration.
const DOOR_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed setup, how long the root keeps telling late ranks why.
pub(crate) const LATE_REJECT_WINDOW: Duration = Duration::from_secs(30);

/// Why the job is failing, as relayed between ranks. Structured, so that
/// every rank reports the same kind of error the detecting rank saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// `rank` died or dropped its connection without saying goodbye.
    Lost { rank: usize, detail: String },
    /// `origin` failed (or aborted) with this message.
    Failed {
        origin: usize,
        aborted: bool,
        message: String,
    },
    /// Rank `a` called `a_call` while rank `b` called `b_call`.
    Mismatch {
        a: usize,
        a_call: String,
        b: usize,
        b_call: String,
    },
    /// `origin` timed out after `after_ms` waiting for `waiting_for`
    /// (rank `waits_on`, `u32::MAX` if unknown). Sent to the root, which
    /// collects them and answers with `Stalled`.
    Timeout {
        origin: usize,
        waiting_for: String,
        after_ms: u64,
        waits_on: u32,
    },
    /// The root's verdict after timeouts: `rank` is the one everybody
    /// (directly or through others) was waiting for; the reporters had
    /// waited `after_ms`.
    Stalled {
        rank: usize,
        detail: String,
        after_ms: u64,
    },
    /// The root's verdict after timeouts: `ranks` wait for each other in a
    /// cycle (each for the next, the last for the first).
    Cycle {
        ranks: Vec<usize>,
        detail: String,
        after_ms: u64,
    },
    /// `ranks` did not arrive at a monitored barrier within `after_ms` of
    /// the first arrival (`detail` names the barrier).
    Absent {
        ranks: Vec<usize>,
        detail: String,
        after_ms: u64,
    },
}

impl Notice {
    /// The rank this failure blames, if it names one.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            Notice::Lost { rank, .. } | Notice::Stalled { rank, .. } => Some(*rank),
            Notice::Failed { origin, .. } | Notice::Timeout { origin, .. } => Some(*origin),
            Notice::Mismatch { .. } => None,
            Notice::Cycle { ranks, .. } | Notice::Absent { ranks, .. } => ranks.first().copied(),
        }
    }
}

/// One line, as a launcher reports the job's first failure.
impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::Lost { rank, detail } => write!(f, "rank {rank} was lost ({detail})"),
            Notice::Failed {
                origin,
                aborted: true,
                ..
            } => write!(f, "rank {origin} aborted the communicator"),
            Notice::Failed {
                origin, message, ..
            } => write!(f, "rank {origin} failed: {message}"),
            Notice::Mismatch {
                a,
                a_call,
                b,
                b_call,
            } => write!(
                f,
                "mismatched calls, rank {a} called {a_call} while rank {b} called {b_call}"
            ),
            Notice::Stalled { detail, .. } => f.write_str(detail),
            Notice::Cycle { ranks, .. } => {
                write!(f, "ranks {ranks:?} wait for each other in a cycle")
            }
            Notice::Absent { ranks, detail, .. } => {
                write!(f, "ranks {ranks:?} did not arrive at {detail}")
            }
            Notice::Timeout {
                origin,
                waiting_for,
                ..
            } => write!(f, "rank {origin} timed out waiting for {waiting_for}"),
        }
    }
}

/// Longest text a notice carries (bounds the decoder).
const NOTICE_TEXT: usize = 4096;

impl Notice {
    /// The notice as one control frame body (type byte included).
    pub fn encode_frame(&self) -> Vec<u8> {
        self.encode()
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = vec![MSG_NOTICE];
        match self {
            Notice::Lost { rank, detail } => {
                v.put_u8(0);
                v.put_u32(*rank as u32);
                v.put_str(detail);
            }
            Notice::Failed {
                origin,
                aborted,
                message,
            } => {
                v.put_u8(if *aborted { 2 } else { 1 });
                v.put_u32(*origin as u32);
                v.put_str(message);
            }
            Notice::Mismatch {
                a,
                a_call,
                b,
                b_call,
            } => {
                v.put_u8(3);
                v.put_u32(*a as u32);
                v.put_str(a_call);
                v.put_u32(*b as u32);
                v.put_str(b_call);
            }
            Notice::Timeout {
                origin,
                waiting_for,
                after_ms,
                waits_on,
            } => {
                v.put_u8(4);
                v.put_u32(*origin as u32);
                v.put_str(waiting_for);
                v.put_u64(*after_ms);
                v.put_u32(*waits_on);
            }
            Notice::Stalled {
                rank,
                detail,
                after_ms,
            } => {
                v.put_u8(5);
                v.put_u32(*rank as u32);
                v.put_str(detail);
                v.put_u64(*after_ms);
            }
            Notice::Cycle {
                ranks,
                detail,
                after_ms,
            }
            | Notice::Absent {
                ranks,
                detail,
                after_ms,
            } => {
                v.put_u8(if matches!(self, Notice::Cycle { .. }) {
                    6
                } else {
                    7
                });
                v.put_u32(ranks.len() as u32);
                v.put_str(detail);
                v.put_u64(*after_ms);
                for r in ranks {
                    v.put_u32(*r as u32);
                }
            }
        }
        v
    }

    /// Decode the body after the message type byte.
    pub fn decode(r: &mut Reader<'_>) -> Result<Notice> {
        let kind = r.u8()?;
        let rank = r.u32()? as usize;
        let text = r.string(NOTICE_TEXT)?;
        match kind {
            0 => Ok(Notice::Lost { rank, detail: text }),
            1 | 2 => Ok(Notice::Failed {
                origin: rank,
                aborted: kind == 2,
                message: text,
            }),
            3 => Ok(Notice::Mismatch {
                a: rank,
                a_call: text,
                b: r.u32()? as usize,
                b_call: r.string(NOTICE_TEXT)?,
            }),
            4 => Ok(Notice::Timeout {
                origin: rank,
                waiting_for: text,
                after_ms: r.u64()?,
                waits_on: r.u32()?,
            }),
            5 => Ok(Notice::Stalled {
                rank,
                detail: text,
                after_ms: r.u64()?,
            }),
            6 | 7 => {
                // `rank` is the number of ranks listed here.
                if rank == 0 || rank > MAX_RANKS {
                    return Err(Error::Protocol(format!("a notice listing {rank} ranks")));
                }
                let after_ms = r.u64()?;
                let ranks = (0..rank)
                    .map(|_| r.u32().map(|x| x as usize))
                    .collect::<Result<Vec<_>>>()?;
                let detail = text;
                Ok(match kind {
                    6 => Notice::Cycle {
                        ranks,
                        detail,
                        after_ms,
                    },
                    _ => Notice::Absent {
                        ranks,
                        detail,
                        after_ms,
                    },
                })
            }
            k => Err(Error::Protocol(format!("unknown notice kind {k}"))),
        }
    }
}

/// Encode one [`PeerInfo`] (registration and table entries).
pub fn encode_info(v: &mut Vec<u8>, p: &PeerInfo) {
    v.put_u32(p.rank as u32);
    v.put_str(&p.hostname);
    v.put_u64(p.host_id);
    v.put_u32(p.pid);
    v.put_u8(p.addrs.len() as u8);
    for a in &p.addrs {
        v.put_blob(a);
    }
    v.put_str(&p.rescue.map(|a| a.to_string()).unwrap_or_default());
    v.put_u8(p.hosts_root as u8);
}

/// Decode one [`PeerInfo`] (bounded: 255 addresses of at most 4 KiB).
pub fn decode_info(r: &mut Reader<'_>) -> Result<PeerInfo> {
    let rank = r.u32()? as usize;
    let hostname = r.string(255)?;
    let host_id = r.u64()?;
    let pid = r.u32()?;
    let n = r.u8()? as usize;
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        addrs.push(r.blob(4096)?.to_vec());
    }
    let rescue = match r.string(64)? {
        t if t.is_empty() => None,
        t => Some(
            t.parse()
                .map_err(|_| Error::Protocol(format!("rank {rank}: bad rescue address {t:?}")))?,
        ),
    };
    let hosts_root = match r.u8()? {
        0 => false,
        1 => true,
        b => return Err(Error::Protocol(format!("rank {rank}: bad root flag {b}"))),
    };
    Ok(PeerInfo {
        rank,
        hostname,
        host_id,
        pid,
        addrs,
        rescue,
        hosts_root,
    })
}

/// Decode a table message body (after the type byte).
pub fn decode_table(r: &mut Reader<'_>) -> Result<Vec<PeerInfo>> {
    let n = r.u32()? as usize;
    if n == 0 || n > MAX_RANKS {
        return Err(Error::Protocol(format!("peer table with {n} ranks")));
    }
    // Grow as entries actually decode: `n` is only a claim.
    let mut v = Vec::with_capacity(n.min(64));
    for i in 0..n {
        let p = decode_info(r)?;
        if p.rank != i {
            return Err(Error::Protocol(format!(
                "peer table entry {i} claims rank {}",
                p.rank
            )));
        }
        v.push(p);
    }
    r.finish()?;
    Ok(v)
}

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

/// What a connection thread reports; `conn` numbers connections so
/// events of a rejected duplicate are never taken for the real rank's.
enum Event {
    Registered {
        conn: u64,
        rank: usize,
        nranks: usize,
        info: PeerInfo,
        settings: Settings,
        stream: TcpStream,
    },
    Abort {
        conn: u64,
        rank: usize,
        notice: Notice,
    },
    Goodbye {
        conn: u64,
        rank: usize,
    },
    /// Arrived at monitored barrier `barrier`, waiting `wait`.
    Arrive {
        conn: u64,
        rank: usize,
        barrier: u64,
        wait: Duration,
    },
    Eof {
        conn: u64,
        rank: usize,
    },
    /// A connection claiming `rank` of `nranks` failed the handshake for
    /// another communicator (a different secret or unique id).
    Refused {
        rank: usize,
        nranks: usize,
        from: SocketAddr,
    },
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
    let (tx, rx) = unbounded();
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

fn accept_loop(listener: TcpListener, secret: Secret, tx: Sender<Event>, stop: Arc<AtomicBool>) {
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

/// Settings a rank registers with: (variable, value) pairs that must be
/// the same on every rank (see `Config::agreement`).
pub type Settings = Vec<(String, String)>;

/// Most settings one registration carries (bounds the decoder).
const MAX_SETTINGS: usize = 32;

/// Encode the settings of a registration (after its `PeerInfo`).
pub fn encode_settings(v: &mut Vec<u8>, settings: &[(&str, String)]) {
    v.put_u8(settings.len() as u8);
    for (name, value) in settings {
        v.put_str(name);
        v.put_str(value);
    }
}

fn decode_settings(r: &mut Reader<'_>) -> Result<Settings> {
    let n = r.u8()? as usize;
    if n > MAX_SETTINGS {
        return Err(Error::Protocol(format!("a registration with {n} settings")));
    }
    (0..n)
        .map(|_| Ok((r.string(64)?, r.string(256)?)))
        .collect()
}

/// The first setting in which `b` differs from `a`, as text naming both
/// ranks and both values; `None` when they agree.
pub fn settings_differ(a: (usize, &Settings), b: (usize, &Settings)) -> Option<String> {
    let value = |s: &Settings, name: &str| {
        s.iter().find(|(n, _)| n == name).map_or_else(
            || "(not sent: an older oxccl)".to_string(),
            |(_, v)| v.clone(),
        )
    };
    // Every name either side sent (a name both sent is compared twice,
    // harmlessly: the first difference is what is reported).
    a.1.iter().chain(b.1.iter()).map(|(n, _)| n.as_str()).find_map(|name| {
        let (va, vb) = (value(a.1, name), value(b.1, name));
        (va != vb).then(|| {
            format!(
                "ranks disagree on {name}: rank {} has {vb}, rank {} has {va} (it must be the same on every rank)",
                b.0, a.0
            )
        })
    })
}

/// Decode a rank's registration (it must name the rank its handshake did).
pub fn parse_registration(reg: &[u8], from: usize) -> Result<(usize, PeerInfo, Settings)> {
    let mut r = Reader::new(reg, "registration");
    if r.u8()? != MSG_REGISTER {
        return Err(Error::Protocol("expected a registration".into()));
    }
    let nranks = r.u32()? as usize;
    let info = decode_info(&mut r)?;
    let settings = decode_settings(&mut r)?;
    r.finish()?;
    if nranks == 0 || nranks > MAX_RANKS || info.rank >= nranks || info.rank != from {
        return Err(Error::Protocol(format!(
            "rank {} of {nranks} is out of range",
            info.rank
        )));
    }
    Ok((nranks, info, settings))
}

/// Decode everything a rank can receive on its control connection: a
/// stream of length-prefixed frames, each a table, a rejection or a notice.
pub fn parse_control_stream(mut bytes: &[u8]) -> Vec<Result<Notice>> {
    let mut out = Vec::new();
    while let Ok(Some(frame)) = wire::read_frame(&mut bytes, wire::MAX_FRAME) {
        let mut r = Reader::new(&frame, "control message");
        out.push(match r.u8() {
            Ok(MSG_NOTICE) => Notice::decode(&mut r),
            Ok(MSG_TABLE) => decode_table(&mut r).map(|_| Notice::Lost {
                rank: 0,
                detail: String::new(),
            }),
            Ok(MSG_RELEASE) => r.u64().map(|_| Notice::Lost {
                rank: 0,
                detail: String::new(),
            }),
            Ok(MSG_REJECT) => r.string(4096).map(|m| Notice::Failed {
                origin: 0,
                aborted: false,
                message: m,
            }),
            Ok(t) => Err(Error::Protocol(format!("unknown control message {t}"))),
            Err(e) => Err(e),
        });
    }
    out
}

/// Handshake, registration, then relay this rank's frames until it leaves.
fn serve_rank(
    conn: u64,
    s: TcpStream,
    addr: SocketAddr,
    secret: Secret,
    tx: Sender<Event>,
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
                let _ = tx.send(Event::Refused {
                    rank: h.from as usize,
                    nranks: h.nranks as usize,
                    from: addr,
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
    let parsed = parse_registration(&reg, hello.from as usize);
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
    if tx
        .send(Event::Registered {
            conn,
            rank,
            nranks,
            info,
            settings,
            stream: writer,
        })
        .is_err()
    {
        return;
    }
    // Relay phase: no read deadline, the rank speaks only when it fails or leaves.
    let _ = s.set_read_timeout(None);
    loop {
        match wire::read_frame(&mut s, wire::MAX_FRAME) {
            Ok(Some(f)) => {
                let mut r = Reader::new(&f, "control message");
                let ev = match r.u8() {
                    Ok(MSG_GOODBYE) => Event::Goodbye { conn, rank },
                    Ok(MSG_ARRIVE) => match (r.u64(), r.u64()) {
                        (Ok(barrier), Ok(ms)) => Event::Arrive {
                            conn,
                            rank,
                            barrier,
                            wait: Duration::from_millis(ms),
                        },
                        _ => {
                            tracing::warn!("oxccl root: rank {rank} sent an unreadable arrival");
                            continue;
                        }
                    },
                    Ok(MSG_ABORT) => match r
                        .u8()
                        .ok()
                        .filter(|t| *t == MSG_NOTICE)
                        .map(|_| Notice::decode(&mut r))
                    {
                        Some(Ok(notice)) => Event::Abort { conn, rank, notice },
                        _ => Event::Abort {
                            conn,
                            rank,
                            notice: Notice::Failed {
                                origin: rank,
                                aborted: false,
                                message: "unreadable abort".into(),
                            },
                        },
                    },
                    _ => {
                        tracing::warn!("oxccl root: rank {rank} sent an unknown control message");
                        continue;
                    }
                };
                let leaving = matches!(ev, Event::Goodbye { .. });
                let _ = tx.send(ev);
                if leaving {
                    return;
                }
            }
            _ => {
                let _ = tx.send(Event::Eof { conn, rank });
                return;
            }
        }
    }
}

fn send_to(s: &mut TcpStream, payload: &[u8]) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = wire::write_frame(s, payload);
}

/// The registered ranks, when registration completes.
struct Registered {
    nranks: usize,
    conns: Vec<Option<TcpStream>>,
    conn_ids: Vec<u64>,
    infos: Vec<PeerInfo>,
}

/// Phase 1: wait for every rank's registration. Anything that makes the
/// job unable to start — ranks disagreeing on the world size or a setting,
/// a rank of this job's shape refused for another secret, a registered
/// rank leaving — fails every rank at once, naming the cause
/// ([`fail_setup`]), instead of leaving the others to wait for the timeout.
fn register_all(rx: &Receiver<Event>, init_timeout: Duration) -> Option<Registered> {
    let deadline = crate::config::value::deadline_after(init_timeout);
    let mut nranks = 0usize;
    let mut conns: Vec<Option<TcpStream>> = Vec::new();
    let mut conn_ids: Vec<u64> = Vec::new();
    let mut infos: Vec<Option<PeerInfo>> = Vec::new();
    // The first registrant's settings: everyone else must match them.
    let mut reference: Option<(usize, Settings)> = None;
    // Ranks refused for another secret, until we know the job's shape.
    let mut refused: Vec<(usize, usize, SocketAddr)> = Vec::new();
    // Ranks turned away with a connection (told through `conns`).
    let mut offenders: Vec<usize> = Vec::new();
    let mut registered = 0usize;
    while nranks == 0 || registered < nranks {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = match rx.recv_timeout(left) {
            Ok(ev) => ev,
            Err(_) => {
                let missing: Vec<usize> = (0..nranks).filter(|r| infos[*r].is_none()).collect();
                let why = format!(
                    "ranks {missing:?} of {nranks} did not reach the root within {:.0} s (OXCCL_TIMEOUT)",
                    init_timeout.as_secs_f64()
                );
                fail_setup(&why, nranks, &mut conns, Vec::new(), rx, Instant::now());
                return None;
            }
        };
        let fatal = match ev {
            Event::Registered {
                conn,
                rank,
                nranks: n,
                info,
                settings,
                mut stream,
            } => {
                if nranks == 0 {
                    nranks = n;
                    conns = (0..n).map(|_| None).collect();
                    conn_ids = vec![0; n];
                    infos = vec![None; n];
                }
                if n != nranks {
                    conns.push(Some(stream));
                    offenders.push(rank);
                    Some(format!(
                        "rank {rank} says the world has {n} ranks, the ranks before it say {nranks} (OXCCL_WORLD_SIZE or the launcher's size differs)"
                    ))
                } else if infos[rank].is_some() {
                    // Not fatal: a second process claiming a rank that is
                    // already here (a stray restart) is turned away alone.
                    tracing::warn!(
                        "oxccl root: rejected a second registration of rank {rank} from {:?}",
                        stream.peer_addr().ok()
                    );
                    let mut v = vec![MSG_REJECT];
                    v.put_str(&format!("rank {rank} is already registered"));
                    send_to(&mut stream, &v);
                    let _ = stream.shutdown(Shutdown::Both);
                    None
                } else {
                    let differs = match &reference {
                        Some((r0, s0)) => settings_differ((*r0, s0), (rank, &settings)),
                        None => {
                            reference = Some((rank, settings));
                            None
                        }
                    };
                    infos[rank] = Some(info);
                    conns[rank] = Some(stream);
                    conn_ids[rank] = conn;
                    registered += 1;
                    differs
                }
            }
            Event::Refused {
                rank,
                nranks: n,
                from,
            } => {
                refused.push((rank, n, from));
                None
            }
            Event::Eof { conn, rank }
            | Event::Goodbye { conn, rank }
            | Event::Arrive { conn, rank, .. }
            | Event::Abort { conn, rank, .. } => {
                (rank < nranks && conns[rank].is_some() && conn_ids[rank] == conn)
                    .then(|| format!("rank {rank} left during bootstrap"))
            }
        };
        let fatal = fatal.or_else(|| {
            refused
                .iter()
                .find(|(r, _, _)| *r < nranks && infos[*r].is_none())
                .map(|(r, n, from)| {
                    if *n != nranks {
                        format!(
                            "rank {r} (connecting from {from}) was refused: it believes the world has {n} ranks, the others {nranks} (OXCCL_WORLD_SIZE or the launcher's size differs; with an address rendezvous that also changes the job secret)"
                        )
                    } else {
                        format!(
                            "rank {r} (connecting from {from}) was refused: it uses another secret or unique id (OXCCL_SECRET / OXCCL_UNIQUE_ID / MASTER_ADDR must be the same on every rank)"
                        )
                    }
                })
        });
        if let Some(why) = fatal {
            let told = (0..nranks)
                .filter(|r| infos[*r].is_some())
                .chain(refused.iter().map(|(r, _, _)| *r))
                .chain(offenders)
                .collect();
            fail_setup(&why, nranks, &mut conns, told, rx, deadline);
            return None;
        }
    }
    Some(Registered {
        nranks,
        conns,
        conn_ids,
        infos: infos.into_iter().flatten().collect(),
    })
}

/// The job cannot start: tell every rank why, then tell the same to ranks
/// that register late (they would otherwise wait for a table that never
/// comes), until every rank of `nranks` has been told (refused ranks were
/// told at their handshake) or `until`, and stop.
fn fail_setup(
    why: &str,
    nranks: usize,
    conns: &mut [Option<TcpStream>],
    mut told: Vec<usize>,
    rx: &Receiver<Event>,
    until: Instant,
) {
    tracing::warn!("oxccl root: setup failed: {why}");
    let mut v = vec![MSG_REJECT];
    v.put_str(why);
    for c in conns.iter_mut().flatten() {
        send_to(c, &v);
    }
    let everyone = |told: &mut Vec<usize>| {
        told.sort_unstable();
        told.dedup();
        nranks > 0 && (0..nranks).all(|r| told.binary_search(&r).is_ok())
    };
    let until = until.min(Instant::now() + LATE_REJECT_WINDOW);
    while !everyone(&mut told) {
        let Ok(ev) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) else {
            return;
        };
        match ev {
            Event::Registered {
                mut stream, rank, ..
            } => {
                send_to(&mut stream, &v);
                told.push(rank);
            }
            Event::Refused { rank, .. } => told.push(rank),
            _ => {}
        }
    }
}

fn coordinate(
    rx: Receiver<Event>,
    init_timeout: Duration,
    watch: Arc<RootWatch>,
    stop_accepting: &AtomicBool,
) {
    let Some(Registered {
        nranks,
        mut conns,
        conn_ids,
        infos,
    }) = register_all(&rx, init_timeout)
    else {
        watch.setup_over();
        return;
    };
    // Everyone is here: the door closes (nobody may join a running job).
    stop_accepting.store(true, Ordering::Relaxed);
    let mut table = vec![MSG_TABLE];
    table.put_u32(nranks as u32);
    for i in &infos {
        encode_info(&mut table, i);
    }
    for c in conns.iter_mut().flatten() {
        send_to(c, &table);
    }
    // Phase 2: relay failures until everyone has left.
    let mut gone = vec![false; nranks];
    let mut relayed_failure = false;
    // Timeouts are collected for a moment, then answered with a verdict
    // naming the rank everybody waits for (a stopped or hung process).
    let mut stalls: Vec<Stall> = Vec::new();
    let mut stall_window: Option<Instant> = None;
    // The monitored barrier in progress, if any.
    let mut barrier: Option<MonitoredBarrier> = None;
    while gone.iter().any(|g| !g) {
        let wake = match (stall_window, barrier.as_ref().map(|b| b.deadline)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ev = match wake {
            Some(until) => match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(ev) => ev,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    let mut verdicts = Vec::new();
                    if stall_window.is_some_and(|t| t <= now) {
                        verdicts.push(stall_verdict(&stalls));
                        stalls.clear();
                        stall_window = None;
                    }
                    if let Some(b) = barrier.take_if(|b| b.deadline <= now) {
                        verdicts.push(b.absent());
                        relayed_failure = true;
                    }
                    for v in verdicts {
                        watch.record(&v);
                        let msg = v.encode();
                        for (i, c) in conns.iter_mut().enumerate() {
                            if !gone[i] {
                                if let Some(c) = c {
                                    send_to(c, &msg);
                                }
                            }
                        }
                        watch.relay_done();
                    }
                    continue;
                }
                Err(_) => return,
            },
            None => match rx.recv() {
                Ok(ev) => ev,
                Err(_) => return,
            },
        };
        let claimed = match &ev {
            Event::Refused { .. } => continue, // after setup, only logged
            Event::Registered { rank, .. }
            | Event::Abort { rank, .. }
            | Event::Goodbye { rank, .. }
            | Event::Arrive { rank, .. }
            | Event::Eof { rank, .. } => *rank,
        };
        if claimed >= nranks {
            if let Event::Registered { mut stream, .. } = ev {
                tracing::warn!("oxccl root: rejected a registration claiming rank {claimed} of a {nranks}-rank job");
                let mut v = vec![MSG_REJECT];
                v.put_str("rank out of range");
                send_to(&mut stream, &v);
            }
            continue;
        }
        let (rank, notice) = match ev {
            Event::Goodbye { conn, rank }
            | Event::Eof { conn, rank }
            | Event::Arrive { conn, rank, .. }
            | Event::Abort { conn, rank, .. }
                if conn_ids[rank] != conn =>
            {
                continue; // a rejected stranger, not the rank itself
            }
            Event::Arrive {
                rank,
                barrier: number,
                wait,
                ..
            } => {
                let b = barrier.get_or_insert_with(|| MonitoredBarrier {
                    number,
                    arrived: vec![false; nranks],
                    started: Instant::now(),
                    deadline: crate::config::value::deadline_after(wait),
                });
                if b.number != number {
                    // A rank ahead of or behind the others: it is absent
                    // from this barrier (and the others from its).
                    continue;
                }
                b.arrived[rank] = true;
                if b.arrived.iter().all(|a| *a) {
                    let mut v = vec![MSG_RELEASE];
                    v.put_u64(number);
                    for c in conns.iter_mut().flatten() {
                        send_to(c, &v);
                    }
                    barrier = None;
                }
                continue;
            }
            Event::Goodbye { rank, .. } => {
                gone[rank] = true;
                continue;
            }
            Event::Eof { rank, .. } => {
                if gone[rank] {
                    continue;
                }
                gone[rank] = true;
                let host = conns[rank]
                    .as_ref()
                    .and(infos.get(rank))
                    .map(|i| i.hostname.clone())
                    .unwrap_or_default();
                (
                    rank,
                    Notice::Lost {
                        rank,
                        detail: format!(
                            "its control connection to the root on {host} closed without goodbye"
                        ),
                    },
                )
            }
            Event::Abort {
                rank,
                notice:
                    Notice::Timeout {
                        origin,
                        waits_on,
                        after_ms,
                        ..
                    },
                ..
            } => {
                let _ = rank;
                stalls.push(Stall {
                    origin,
                    waits_on,
                    after_ms,
                });
                stall_window.get_or_insert_with(|| Instant::now() + STALL_WINDOW);
                continue;
            }
            Event::Abort { rank, notice, .. } => (rank, notice),
            Event::Refused { .. } => continue,
            Event::Registered {
                mut stream, rank, ..
            } => {
                tracing::warn!("oxccl root: rejected late registration of rank {rank}");
                let mut v = vec![MSG_REJECT];
                v.put_str("the communicator is already complete");
                send_to(&mut stream, &v);
                continue;
            }
        };
        if relayed_failure && matches!(notice, Notice::Failed { .. }) {
            continue; // the first cause is the one that matters
        }
        relayed_failure = true;
        watch.record(&notice);
        let msg = notice.encode();
        for (i, c) in conns.iter_mut().enumerate() {
            if i != rank && !gone[i] {
                if let Some(c) = c {
                    send_to(c, &msg);
                }
            }
        }
        watch.relay_done();
    }
}

/// How long the root collects timeout reports before naming the culprit.
const STALL_WINDOW: Duration = Duration::from_millis(300);

/// A monitored barrier the root is collecting arrivals for: the deadline
/// runs from the first arrival.
struct MonitoredBarrier {
    number: u64,
    arrived: Vec<bool>,
    started: Instant,
    deadline: Instant,
}

impl MonitoredBarrier {
    /// The verdict when the deadline passed: who did not arrive.
    fn absent(&self) -> Notice {
        let ranks: Vec<usize> = (0..self.arrived.len())
            .filter(|r| !self.arrived[*r])
            .collect();
        Notice::Absent {
            detail: format!("monitored_barrier #{}", self.number),
            ranks,
            after_ms: self.started.elapsed().as_millis() as u64,
        }
    }
}

/// One rank's timeout report: it waited `after_ms` for `waits_on`
/// (`u32::MAX`: unknown).
#[derive(Clone, Copy, Debug)]
struct Stall {
    origin: usize,
    waits_on: u32,
    after_ms: u64,
}

/// The verdict on a set of timeout reports. Following "waits for" from the
/// first reporter ends either at a rank that did not report waiting (a
/// stopped or hung process: `Stalled`), or back at a rank already on the
/// path (a true deadlock between the ranks of that loop: `Cycle`).
fn stall_verdict(stalls: &[Stall]) -> Notice {
    let waits = |r: usize| {
        stalls
            .iter()
            .find(|s| s.origin == r)
            .map(|s| s.waits_on)
            .filter(|w| *w != u32::MAX)
            .map(|w| w as usize)
    };
    let reporters: Vec<usize> = stalls.iter().map(|s| s.origin).collect();
    let after_ms = stalls.iter().map(|s| s.after_ms).max().unwrap_or(0);
    let first = stalls[0].origin;
    let Some(mut target) = waits(first) else {
        return Notice::Stalled {
            rank: first,
            detail: format!("ranks {reporters:?} timed out"),
            after_ms,
        };
    };
    let mut path = vec![first];
    loop {
        if let Some(at) = path.iter().position(|r| *r == target) {
            let ranks = path[at..].to_vec();
            return Notice::Cycle {
                detail: format!(
                    "ranks {ranks:?} each wait for the next and the last for the first; ranks {reporters:?} timed out"
                ),
                ranks,
                after_ms,
            };
        }
        path.push(target);
        match waits(target) {
            Some(next) => target = next,
            None => break,
        }
    }
    Notice::Stalled {
        rank: target,
        detail: format!(
            "rank {target} stopped making progress (stopped, hung, or not calling this collective); ranks {reporters:?} timed out waiting for it, directly or through each other"
        ),
        after_ms,
    }
}

/// `poll(2)` on one fd; returns true when it is ready.
pub(crate) fn poll_one(fd: RawFd, events: i16, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout_ms) > 0 }
}

// ---------------------------------------------------------------- rank ----

/// A rank's control connection to the root.
pub(crate) struct Control {
    stream: TcpStream,
    buf: Vec<u8>,
    gone: bool,
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
    let mut reg = vec![MSG_REGISTER];
    reg.put_u32(nranks as u32);
    encode_info(&mut reg, me);
    encode_settings(&mut reg, settings);
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
        MSG_TABLE => decode_table(&mut r)?,
        MSG_REJECT => return Err(Error::Bootstrap(r.string(4096)?)),
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
        let mut v = vec![MSG_ABORT];
        v.extend_from_slice(&notice.encode());
        self.send(&v);
    }

    /// Tell the root this rank arrived at monitored barrier `number` and
    /// waits `wait` for the others.
    pub(crate) fn arrive(&mut self, number: u64, wait: Duration) {
        let mut v = vec![MSG_ARRIVE];
        v.put_u64(number);
        v.put_u64(wait.as_millis() as u64);
        self.send(&v);
    }

    /// Tell the root this rank leaves normally.
    pub(crate) fn goodbye(&mut self) {
        self.send(&[MSG_GOODBYE]);
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
                    poll_one(self.stream.as_raw_fd(), libc::POLLOUT, 50);
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

    /// Read whatever arrived, without blocking; the first event, if any.
    /// `RootGone` is reported once; afterwards this returns `None`.
    pub(crate) fn poll(&mut self) -> Option<ControlEvent> {
        if self.gone {
            return None;
        }
        let ev = self.poll_inner();
        if matches!(ev, Some(ControlEvent::RootGone)) {
            self.gone = true;
        }
        ev
    }

    fn poll_inner(&mut self) -> Option<ControlEvent> {
        let mut tmp = [0u8; 4096];
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
                Some(MSG_RELEASE) => {
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
