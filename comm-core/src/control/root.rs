//! The root's decisions, as a state machine with no I/O (as quinn-proto
//! keeps protocol state apart from sockets): every connection thread's
//! report is an [`Event`], every deadline a call of [`Root::on_timer`], and
//! what the root does about them comes back as [`Action`]s — answers to
//! send, a failure to relay, the door to close. The threads and sockets
//! that feed it live in [`super::bootstrap`]; the tests below drive it with
//! random jobs delivered in random orders.
//!
//! Phases: *registering* (collect every rank's registration; anything that
//! makes the job unable to start fails every rank at once, naming the
//! cause), *setup failed* (tell late ranks the same, for a while), and
//! *running* (relay the first cause of a failure to every survivor, answer
//! timeout reports with a verdict naming the rank everybody waits for, run
//! monitored barriers) until every rank has left.

use super::message::{settings_differ, Settings};
use super::notice::Notice;
use crate::transport::PeerInfo;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A connection to the root, numbered by the accept loop in order of
/// arrival, so that what a rejected duplicate says is never taken for what
/// the real rank says.
pub(crate) type ConnId = u64;

/// After a failed setup, how long the root keeps telling late ranks why.
pub(crate) const LATE_REJECT_WINDOW: Duration = Duration::from_secs(30);

/// How long the root collects timeout reports before naming the culprit.
pub(crate) const STALL_WINDOW: Duration = Duration::from_millis(300);

/// How long the root holds a rank's `abort()` before relaying it. An abort
/// names no cause: it is usually a reaction (a watchdog that saw another
/// communicator lose a rank). When the death behind it reaches this root
/// too, in this moment, the death is relayed and the abort is its
/// consequence — so every survivor blames the dead rank, not the rank that
/// reacted first.
pub(crate) const ABORT_GRACE: Duration = Duration::from_millis(100);

/// What a connection thread reports.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// Connection `conn` passed the handshake and registered as `rank` of
    /// `nranks` (the decoder checked `rank < nranks`).
    Registered {
        conn: ConnId,
        rank: usize,
        nranks: usize,
        info: PeerInfo,
        settings: Settings,
    },
    /// The rank failed, for this reason.
    Abort {
        conn: ConnId,
        rank: usize,
        notice: Notice,
    },
    /// The rank leaves normally.
    Goodbye { conn: ConnId, rank: usize },
    /// Arrived at monitored barrier `barrier`, waiting `wait`.
    Arrive {
        conn: ConnId,
        rank: usize,
        barrier: u64,
        wait: Duration,
    },
    /// The connection ended (without goodbye, if none came before).
    Eof { conn: ConnId, rank: usize },
    /// A connection claiming `rank` of `nranks` failed the handshake for
    /// another communicator (a different secret or unique id).
    Refused {
        rank: usize,
        nranks: usize,
        from: SocketAddr,
    },
}

/// What the root tells ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Everyone registered: the peer table, indexed by rank.
    Table(Vec<PeerInfo>),
    /// The job cannot start (or this connection may not join), and why.
    Reject(String),
    /// Every rank arrived at this monitored barrier.
    Release(u64),
}

/// What the root does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send `reply` on each of these connections.
    Send { to: Vec<ConnId>, reply: Reply },
    /// Relay a failure to these connections. The first relay is the job's
    /// first failure (a launcher hosting the root reports it).
    Relay { to: Vec<ConnId>, notice: Notice },
    /// Close this connection (after what was sent on it).
    Close(ConnId),
    /// Everyone is here: accept no more connections.
    CloseDoor,
    /// Setup failed and every rank that could be told was told (or the
    /// late window passed).
    SetupOver,
}

/// The root of one communicator.
#[derive(Debug)]
pub(crate) struct Root {
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    Registering(Registering),
    SetupFailed(SetupFailed),
    Running(Running),
    Done,
}

impl Root {
    /// A root waiting up to `init_timeout` from `now` for every rank.
    pub(crate) fn new(now: Instant, init_timeout: Duration) -> Root {
        Root {
            phase: Phase::Registering(Registering {
                init_timeout,
                deadline: crate::config::value::deadline_after_from(now, init_timeout),
                nranks: 0,
                conn_of: Vec::new(),
                infos: Vec::new(),
                reference: None,
                refused: Vec::new(),
                offenders: Vec::new(),
            }),
        }
    }

    /// Every rank has left (or setup failed and the root is finished).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// When [`Root::on_timer`] is next due, if ever.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Registering(r) => Some(r.deadline),
            Phase::SetupFailed(s) => Some(s.until),
            Phase::Running(r) => [
                r.stall_window,
                r.barrier.as_ref().map(|b| b.deadline),
                r.held_abort.as_ref().map(|h| h.until),
            ]
            .into_iter()
            .flatten()
            .min(),
            Phase::Done => None,
        }
    }

    /// One report from a connection thread.
    pub(crate) fn on_event(&mut self, now: Instant, ev: Event) -> Vec<Action> {
        let mut out = Vec::new();
        let next = match &mut self.phase {
            Phase::Registering(r) => r.on_event(now, ev, &mut out),
            Phase::SetupFailed(s) => s.on_event(ev, &mut out),
            Phase::Running(r) => r.on_event(now, ev, &mut out),
            Phase::Done => {
                // Finished: a straggler's registration still hears no.
                if let Event::Registered { conn, .. } = ev {
                    reject(&mut out, conn, "the communicator has finished");
                }
                None
            }
        };
        self.enter(next, now, &mut out);
        out
    }

    /// Deadlines that passed by `now`.
    pub(crate) fn on_timer(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        let next = match &mut self.phase {
            Phase::Registering(r) => r.on_timer(now, &mut out),
            Phase::SetupFailed(s) => (s.until <= now).then_some(Phase::Done),
            Phase::Running(r) => r.on_timer(now, &mut out),
            Phase::Done => None,
        };
        self.enter(next, now, &mut out);
        out
    }

    fn enter(&mut self, next: Option<Phase>, now: Instant, out: &mut Vec<Action>) {
        let Some(mut next) = next else { return };
        // A failed setup is over at once when nobody is left to tell, or
        // when its window has already passed (the init timeout fired).
        if let Phase::SetupFailed(s) = &next {
            if s.everyone_told() || s.until <= now {
                next = Phase::Done;
            }
        }
        if matches!(next, Phase::Done) && !matches!(self.phase, Phase::Running(_)) {
            out.push(Action::SetupOver);
        }
        self.phase = next;
    }
}

fn reject(out: &mut Vec<Action>, conn: ConnId, why: &str) {
    out.push(Action::Send {
        to: vec![conn],
        reply: Reply::Reject(why.to_string()),
    });
    out.push(Action::Close(conn));
}

/// Collecting registrations.
#[derive(Debug)]
struct Registering {
    init_timeout: Duration,
    deadline: Instant,
    /// The world size, from the first registration (0 before).
    nranks: usize,
    /// Each rank's connection, once registered.
    conn_of: Vec<Option<ConnId>>,
    infos: Vec<Option<PeerInfo>>,
    /// The first registrant's settings: everyone else must match them.
    reference: Option<(usize, Settings)>,
    /// Ranks refused for another secret, until we know the job's shape.
    refused: Vec<(usize, usize, SocketAddr)>,
    /// Registrations turned away for a wrong world size: (rank, connection).
    offenders: Vec<(usize, ConnId)>,
}

impl Registering {
    fn on_event(&mut self, now: Instant, ev: Event, out: &mut Vec<Action>) -> Option<Phase> {
        let fatal = match ev {
            Event::Registered {
                conn,
                rank,
                nranks: n,
                info,
                settings,
            } => {
                if self.nranks == 0 {
                    self.nranks = n;
                    self.conn_of = vec![None; n];
                    self.infos = vec![None; n];
                }
                if n != self.nranks {
                    self.offenders.push((rank, conn));
                    Some(format!(
                        "rank {rank} says the world has {n} ranks, the ranks before it say {} (OXCCL_WORLD_SIZE or the launcher's size differs)",
                        self.nranks
                    ))
                } else if rank >= n {
                    reject(out, conn, "rank out of range");
                    None
                } else if self.infos[rank].is_some() {
                    // Not fatal: a second process claiming a rank that is
                    // already here (a stray restart) is turned away alone.
                    reject(out, conn, &format!("rank {rank} is already registered"));
                    None
                } else {
                    let differs = match &self.reference {
                        Some((r0, s0)) => settings_differ((*r0, s0), (rank, &settings)),
                        None => {
                            self.reference = Some((rank, settings));
                            None
                        }
                    };
                    self.infos[rank] = Some(info);
                    self.conn_of[rank] = Some(conn);
                    differs
                }
            }
            Event::Refused { rank, nranks, from } => {
                self.refused.push((rank, nranks, from));
                None
            }
            Event::Eof { conn, rank }
            | Event::Goodbye { conn, rank }
            | Event::Arrive { conn, rank, .. }
            | Event::Abort { conn, rank, .. } => self
                .is_rank(conn, rank)
                .then(|| format!("rank {rank} left during bootstrap")),
        };
        if let Some(why) = fatal.or_else(|| self.refused_rank()) {
            return Some(self.fail(now, why, out));
        }
        let registered = self.conn_of.iter().flatten().count();
        if self.nranks == 0 || registered < self.nranks {
            return None;
        }
        // Everyone is here: the door closes (nobody may join a running job).
        let conns: Vec<ConnId> = self.conn_of.iter().flatten().copied().collect();
        let infos: Vec<PeerInfo> = self.infos.drain(..).flatten().collect();
        out.push(Action::CloseDoor);
        out.push(Action::Send {
            to: conns.clone(),
            reply: Reply::Table(infos.clone()),
        });
        Some(Phase::Running(Running {
            hosts: infos.into_iter().map(|i| i.hostname).collect(),
            gone: vec![false; conns.len()],
            aborted: vec![false; conns.len()],
            conn_of: conns,
            relayed_failure: false,
            held_abort: None,
            stalls: Vec::new(),
            stall_window: None,
            barrier: None,
        }))
    }

    fn on_timer(&mut self, now: Instant, out: &mut Vec<Action>) -> Option<Phase> {
        if now < self.deadline {
            return None;
        }
        let missing: Vec<usize> = (0..self.nranks)
            .filter(|r| self.infos[*r].is_none())
            .collect();
        let why = if self.nranks == 0 {
            format!(
                "no rank reached the root within {:.0} s (OXCCL_TIMEOUT)",
                self.init_timeout.as_secs_f64()
            )
        } else {
            format!(
                "ranks {missing:?} of {} did not reach the root within {:.0} s (OXCCL_TIMEOUT)",
                self.nranks,
                self.init_timeout.as_secs_f64()
            )
        };
        // The deadline for late ranks has passed too: the root is done.
        Some(self.fail(now, why, out))
    }

    /// Whether `conn` is the registered connection of `rank`.
    fn is_rank(&self, conn: ConnId, rank: usize) -> bool {
        self.conn_of.get(rank).copied().flatten() == Some(conn)
    }

    /// A rank of this job's shape refused for another secret, while the
    /// rank it claims has not registered: it stands for that rank.
    fn refused_rank(&self) -> Option<String> {
        let (r, n, from) = self
            .refused
            .iter()
            .find(|(r, _, _)| *r < self.nranks && self.infos[*r].is_none())?;
        Some(if *n != self.nranks {
            format!(
                "rank {r} (connecting from {from}) was refused: it believes the world has {n} ranks, the others {} (OXCCL_WORLD_SIZE or the launcher's size differs; with an address rendezvous that also changes the job secret)",
                self.nranks
            )
        } else {
            format!(
                "rank {r} (connecting from {from}) was refused: it uses another secret or unique id (OXCCL_SECRET / OXCCL_UNIQUE_ID / MASTER_ADDR must be the same on every rank)"
            )
        })
    }

    /// The job cannot start: tell every connection why.
    fn fail(&mut self, now: Instant, why: String, out: &mut Vec<Action>) -> Phase {
        let to: Vec<ConnId> = self
            .conn_of
            .iter()
            .flatten()
            .copied()
            .chain(self.offenders.iter().map(|(_, c)| *c))
            .collect();
        let told = (0..self.nranks)
            .filter(|r| self.infos[*r].is_some())
            .chain(self.refused.iter().map(|(r, _, _)| *r))
            .chain(self.offenders.iter().map(|(r, _)| *r))
            .collect();
        if !to.is_empty() {
            out.push(Action::Send {
                to,
                reply: Reply::Reject(why.clone()),
            });
        }
        Phase::SetupFailed(SetupFailed {
            why,
            nranks: self.nranks,
            told,
            until: self.deadline.min(now + LATE_REJECT_WINDOW),
        })
    }
}

/// Setup failed: ranks that register late are told why too (they would
/// otherwise wait for a table that never comes), until every rank has been
/// told (refused ranks were told at their handshake) or the window ends.
#[derive(Debug)]
struct SetupFailed {
    why: String,
    nranks: usize,
    told: Vec<usize>,
    until: Instant,
}

impl SetupFailed {
    fn on_event(&mut self, ev: Event, out: &mut Vec<Action>) -> Option<Phase> {
        match ev {
            Event::Registered { conn, rank, .. } => {
                out.push(Action::Send {
                    to: vec![conn],
                    reply: Reply::Reject(self.why.clone()),
                });
                self.told.push(rank);
            }
            Event::Refused { rank, .. } => self.told.push(rank),
            _ => {}
        }
        self.everyone_told().then_some(Phase::Done)
    }

    fn everyone_told(&self) -> bool {
        self.nranks > 0 && (0..self.nranks).all(|r| self.told.contains(&r))
    }
}

/// The job runs: relay failures until every rank has left.
#[derive(Debug)]
struct Running {
    conn_of: Vec<ConnId>,
    hosts: Vec<String>,
    gone: Vec<bool>,
    /// Ranks that called `abort()`: their connection ending is no news.
    aborted: Vec<bool>,
    /// A failure was relayed: later `Failed` notices are consequences.
    relayed_failure: bool,
    /// The first `abort()`, while no failure was relayed: relayed at the
    /// end of its grace unless a cause comes first ([`ABORT_GRACE`]).
    held_abort: Option<HeldAbort>,
    /// Timeouts are collected for a moment, then answered with a verdict
    /// naming the rank everybody waits for (a stopped or hung process).
    stalls: Vec<Stall>,
    stall_window: Option<Instant>,
    /// The monitored barrier in progress, if any.
    barrier: Option<MonitoredBarrier>,
}

/// A rank's abort, waiting out [`ABORT_GRACE`].
#[derive(Debug)]
struct HeldAbort {
    rank: usize,
    notice: Notice,
    until: Instant,
}

impl Running {
    fn nranks(&self) -> usize {
        self.conn_of.len()
    }

    /// The connections of ranks still here, but `except`.
    fn live(&self, except: Option<usize>) -> Vec<ConnId> {
        (0..self.nranks())
            .filter(|r| !self.gone[*r] && Some(*r) != except)
            .map(|r| self.conn_of[r])
            .collect()
    }

    fn relay(&mut self, notice: Notice, except: Option<usize>, out: &mut Vec<Action>) {
        out.push(Action::Relay {
            to: self.live(except),
            notice,
        });
    }

    fn on_event(&mut self, now: Instant, ev: Event, out: &mut Vec<Action>) -> Option<Phase> {
        let (conn, rank) = match &ev {
            Event::Refused { .. } => return None, // after setup, only logged
            Event::Registered { conn, rank, .. } => {
                let why = if *rank >= self.nranks() {
                    "rank out of range"
                } else {
                    "the communicator is already complete"
                };
                reject(out, *conn, why);
                return None;
            }
            Event::Abort { conn, rank, .. }
            | Event::Goodbye { conn, rank }
            | Event::Arrive { conn, rank, .. }
            | Event::Eof { conn, rank } => (*conn, *rank),
        };
        if self.conn_of.get(rank) != Some(&conn) {
            return None; // a rejected stranger, not the rank itself
        }
        let notice = match ev {
            Event::Arrive { barrier, wait, .. } => {
                self.arrive(now, rank, barrier, wait, out);
                return None;
            }
            Event::Goodbye { .. } => {
                self.gone[rank] = true;
                return self.all_gone();
            }
            Event::Eof { .. } => {
                if self.gone[rank] {
                    return None;
                }
                self.gone[rank] = true;
                if self.aborted[rank] {
                    // A rank that aborted left: its abort (held, relayed,
                    // or the consequence of a cause relayed) explains why.
                    return self.all_gone();
                }
                Notice::Lost {
                    rank,
                    detail: format!(
                        "its control connection to the root on {} closed without goodbye",
                        self.hosts[rank]
                    ),
                }
            }
            Event::Abort {
                notice:
                    Notice::Timeout {
                        origin,
                        waits_on,
                        after_ms,
                        ..
                    },
                ..
            } => {
                self.stalls.push(Stall {
                    origin,
                    waits_on,
                    after_ms,
                });
                self.stall_window.get_or_insert(now + STALL_WINDOW);
                return None;
            }
            Event::Abort {
                notice: notice @ Notice::Failed { aborted: true, .. },
                ..
            } => {
                self.aborted[rank] = true;
                if !self.relayed_failure && self.held_abort.is_none() {
                    self.held_abort = Some(HeldAbort {
                        rank,
                        notice,
                        until: now + ABORT_GRACE,
                    });
                }
                return None;
            }
            Event::Abort { notice, .. } => notice,
            Event::Registered { .. } | Event::Refused { .. } => return None,
        };
        // The first cause is the one that matters: a failure reported
        // after one was relayed is a consequence of it.
        if !(self.relayed_failure && matches!(notice, Notice::Failed { .. })) {
            self.relay_cause(notice, Some(rank), out);
        }
        self.all_gone()
    }

    fn arrive(
        &mut self,
        now: Instant,
        rank: usize,
        number: u64,
        wait: Duration,
        out: &mut Vec<Action>,
    ) {
        let nranks = self.nranks();
        let b = self.barrier.get_or_insert_with(|| MonitoredBarrier {
            number,
            arrived: vec![false; nranks],
            started: now,
            deadline: crate::config::value::deadline_after_from(now, wait),
        });
        if b.number != number {
            // A rank ahead of or behind the others: it is absent from this
            // barrier (and the others from its).
            return;
        }
        b.arrived[rank] = true;
        if b.arrived.iter().all(|a| *a) {
            self.barrier = None;
            out.push(Action::Send {
                to: self.live(None),
                reply: Reply::Release(number),
            });
        }
    }

    /// Relay a cause of the job's failure: later `Failed` notices are its
    /// consequences, and so is an abort still held (an abort is held only
    /// while no cause was relayed).
    fn relay_cause(&mut self, notice: Notice, except: Option<usize>, out: &mut Vec<Action>) {
        self.held_abort = None;
        self.relayed_failure = true;
        self.relay(notice, except, out);
    }

    fn on_timer(&mut self, now: Instant, out: &mut Vec<Action>) -> Option<Phase> {
        if let Some(h) = self.held_abort.take_if(|h| h.until <= now) {
            self.relay_cause(h.notice, Some(h.rank), out);
        }
        if self.stall_window.is_some_and(|t| t <= now) {
            self.stall_window = None;
            if !self.stalls.is_empty() {
                let verdict = stall_verdict(&self.stalls);
                self.stalls.clear();
                self.relay_cause(verdict, None, out);
            }
        }
        if let Some(b) = self.barrier.take_if(|b| b.deadline <= now) {
            self.relay_cause(b.absent(now), None, out);
        }
        None
    }

    fn all_gone(&self) -> Option<Phase> {
        self.gone.iter().all(|g| *g).then_some(Phase::Done)
    }
}

/// A monitored barrier the root is collecting arrivals for: the deadline
/// runs from the first arrival.
#[derive(Debug)]
struct MonitoredBarrier {
    number: u64,
    arrived: Vec<bool>,
    started: Instant,
    deadline: Instant,
}

impl MonitoredBarrier {
    /// The verdict when the deadline passed: who did not arrive.
    fn absent(&self, now: Instant) -> Notice {
        let ranks: Vec<usize> = (0..self.arrived.len())
            .filter(|r| !self.arrived[*r])
            .collect();
        Notice::Absent {
            detail: format!("monitored_barrier #{}", self.number),
            ranks,
            after_ms: now.saturating_duration_since(self.started).as_millis() as u64,
        }
    }
}

/// One rank's timeout report: it waited `after_ms` for `waits_on`
/// (`u32::MAX`: unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stall {
    pub origin: usize,
    pub waits_on: u32,
    pub after_ms: u64,
}

/// The verdict on a set of timeout reports (at least one). Following
/// "waits for" from the first reporter ends either at a rank that did not
/// report waiting (a stopped or hung process: `Stalled`), or back at a rank
/// already on the path (a true deadlock between the ranks of that loop:
/// `Cycle`).
pub(crate) fn stall_verdict(stalls: &[Stall]) -> Notice {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::Rng;
    use std::collections::{HashMap, HashSet};

    fn info(rank: usize) -> PeerInfo {
        PeerInfo {
            rank,
            hostname: format!("host{rank}"),
            host_id: 7,
            pid: 100 + rank as u32,
            addrs: Vec::new(),
            rescue: None,
            hosts_root: rank == 0,
            cpus: vec![1],
            llc: None,
        }
    }

    fn settings(buffsize: &str) -> Settings {
        vec![
            ("OXCCL_NSOCKS".into(), "2".into()),
            ("OXCCL_BUFFSIZE".into(), buffsize.into()),
        ]
    }

    fn registered(conn: ConnId, rank: usize, nranks: usize, s: Settings) -> Event {
        Event::Registered {
            conn,
            rank,
            nranks,
            info: info(rank),
            settings: s,
        }
    }

    fn stall(origin: usize, waits_on: u32) -> Stall {
        Stall {
            origin,
            waits_on,
            after_ms: 1000 + origin as u64,
        }
    }

    // ---------------------------------------------------- stall verdict --

    #[test]
    fn stall_verdict_names_the_end_of_the_chain_of_waits() {
        // 0 waits for 1, 1 for 2, 2 did not report: 2 is stopped.
        let v = stall_verdict(&[stall(0, 1), stall(1, 2)]);
        assert!(
            matches!(
                v,
                Notice::Stalled {
                    rank: 2,
                    after_ms: 1001,
                    ..
                }
            ),
            "{v:?}"
        );
        // Reports in any order: the chain is followed from the first.
        let v = stall_verdict(&[stall(1, 2), stall(3, 1), stall(0, 3)]);
        assert!(matches!(v, Notice::Stalled { rank: 2, .. }), "{v:?}");
        // A reporter that does not know whom it waits for is itself named.
        let v = stall_verdict(&[stall(4, u32::MAX), stall(0, 4)]);
        assert!(matches!(v, Notice::Stalled { rank: 4, .. }), "{v:?}");
        // Waiting for a rank that did not report, which waits for nobody known.
        let v = stall_verdict(&[stall(0, 5)]);
        assert!(matches!(v, Notice::Stalled { rank: 5, .. }), "{v:?}");
    }

    #[test]
    fn stall_verdict_names_a_cycle_of_waits() {
        let v = stall_verdict(&[stall(0, 1), stall(1, 2), stall(2, 1)]);
        match v {
            Notice::Cycle { ranks, .. } => assert_eq!(ranks, vec![1, 2]),
            other => panic!("expected a cycle, got {other:?}"),
        }
        let v = stall_verdict(&[stall(3, 3)]);
        assert!(
            matches!(v, Notice::Cycle { ref ranks, .. } if ranks == &[3]),
            "{v:?}"
        );
    }

    // ------------------------------------------------- fixed sequences --

    #[test]
    fn a_setup_failure_is_told_to_late_ranks_and_then_over() {
        let t0 = Instant::now();
        let mut root = Root::new(t0, Duration::from_secs(600));
        assert!(root
            .on_event(t0, registered(1, 0, 3, settings("4M")))
            .is_empty());
        let out = root.on_event(t0, registered(2, 1, 3, settings("8M")));
        match &out[..] {
            [Action::Send {
                to,
                reply: Reply::Reject(why),
            }] => {
                assert_eq!(to, &vec![1, 2]);
                assert!(
                    why.contains("OXCCL_BUFFSIZE") && why.contains("8M"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Rank 2 comes late: told the same, and with everyone told the root is over.
        let out = root.on_event(t0, registered(3, 2, 3, settings("4M")));
        assert!(matches!(&out[0], Action::Send { to, reply: Reply::Reject(_) } if to == &vec![3]));
        assert_eq!(out.last(), Some(&Action::SetupOver));
        assert!(root.is_done());
    }

    #[test]
    fn a_missing_rank_fails_setup_at_the_init_timeout() {
        let t0 = Instant::now();
        let mut root = Root::new(t0, Duration::from_secs(5));
        root.on_event(t0, registered(1, 1, 2, settings("4M")));
        assert_eq!(root.next_wake(), Some(t0 + Duration::from_secs(5)));
        assert!(root.on_timer(t0 + Duration::from_secs(4)).is_empty());
        let out = root.on_timer(t0 + Duration::from_secs(5));
        match &out[..] {
            [Action::Send {
                reply: Reply::Reject(why),
                ..
            }, Action::SetupOver] => assert!(why.contains("ranks [0] of 2"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(root.is_done());
    }

    // ------------------------------------------------------ abort grace --

    /// A running root of three ranks (connection `r + 1` is rank `r`).
    fn running3(t0: Instant) -> Root {
        let mut root = Root::new(t0, Duration::from_secs(5));
        for r in 0..3 {
            root.on_event(t0, registered(r as ConnId + 1, r, 3, settings("4M")));
        }
        assert!(matches!(root.phase, Phase::Running(_)));
        root
    }

    fn abort_by(rank: usize) -> Event {
        Event::Abort {
            conn: rank as ConnId + 1,
            rank,
            notice: Notice::Failed {
                origin: rank,
                aborted: true,
                message: "abort()".into(),
            },
        }
    }

    #[test]
    fn an_abort_is_relayed_after_its_grace() {
        let t0 = Instant::now();
        let mut root = running3(t0);
        assert!(root.on_event(t0, abort_by(1)).is_empty());
        assert_eq!(root.next_wake(), Some(t0 + ABORT_GRACE));
        assert!(root.on_timer(t0 + ABORT_GRACE / 2).is_empty());
        let out = root.on_timer(t0 + ABORT_GRACE);
        assert_eq!(
            out,
            vec![Action::Relay {
                to: vec![1, 3],
                notice: Notice::Failed {
                    origin: 1,
                    aborted: true,
                    message: "abort()".into()
                }
            }]
        );
        // The aborted rank leaving is no news; nor is a second abort.
        assert!(root.on_event(t0, abort_by(2)).is_empty());
        let eof = Event::Eof { conn: 2, rank: 1 };
        assert!(root.on_event(t0 + ABORT_GRACE, eof).is_empty());
        assert_eq!(root.next_wake(), None);
    }

    #[test]
    fn a_death_within_an_abort_s_grace_is_the_cause() {
        // Rank 1's watchdog aborts because another communicator lost rank
        // 2; rank 2's death reaches this root a moment later.
        let t0 = Instant::now();
        let mut root = running3(t0);
        assert!(root.on_event(t0, abort_by(1)).is_empty());
        // Rank 1 leaves: its abort explains it, and it stays held.
        assert!(root
            .on_event(t0, Event::Eof { conn: 2, rank: 1 })
            .is_empty());
        let later = t0 + ABORT_GRACE / 2;
        let out = root.on_event(later, Event::Eof { conn: 3, rank: 2 });
        match &out[..] {
            [Action::Relay {
                to,
                notice: Notice::Lost { rank: 2, .. },
            }] => assert_eq!(to, &vec![1]),
            other => panic!("{other:?}"),
        }
        // The abort is dropped: a consequence.
        assert_eq!(root.next_wake(), None);
        assert!(root.on_timer(t0 + ABORT_GRACE).is_empty());
    }

    // ------------------------------------- random jobs, random orders --

    /// What one connection received.
    #[derive(Clone, Debug, PartialEq)]
    enum Got {
        Table(Vec<PeerInfo>),
        Reject(String),
        Notice(Notice),
        Release(u64),
    }

    /// What a rank's process does after setup.
    #[derive(Clone, Copy, Debug)]
    enum Fate {
        /// Runs every barrier, says goodbye, exits.
        Normal,
        /// Dies (connection closes) after this many barriers.
        Crash(usize),
        /// Fails with an error after this many barriers.
        Fails(usize),
        /// Stops (SIGSTOP) after this many barriers: sends nothing more.
        Stops(usize),
        /// Times out after this many barriers, waiting for this rank.
        TimesOut(usize, usize),
        /// Calls `abort()` after this many barriers (a reaction to
        /// something the root does not see, or to a cause it will see).
        Aborts(usize),
    }

    /// One connection of the job: a rank (or a stranger claiming one).
    struct Conn {
        id: ConnId,
        rank: usize,
        nranks: usize,
        settings: Settings,
        fate: Fate,
        /// Registered, a table or rejection received, the barriers passed.
        sent_registration: bool,
        done: bool,
        barriers: usize,
        failed: bool,
        aborted: bool,
        said_goodbye: bool,
    }

    struct Sim {
        rng: Rng,
        now: Instant,
        root: Root,
        nranks: usize,
        barriers: usize,
        conns: Vec<Conn>,
        got: HashMap<ConnId, Vec<Got>>,
        closed: HashSet<ConnId>,
        ended: HashSet<ConnId>,
        /// Ranks registered so far, in delivery order (conn per rank).
        winner: HashMap<usize, ConnId>,
        /// A refused rank that stands for a rank not (yet) registered once
        /// the root knows the job's shape: setup must fail.
        refused_first: bool,
        refused: Option<usize>,
        table_sent: bool,
        setup_over: usize,
        door_closed: bool,
        relays: Vec<(Notice, Vec<ConnId>)>,
        /// Every failure event delivered after setup, in order (an
        /// aborted rank's connection ending is not one); and the number
        /// delivered when the first relay went out.
        failures: Vec<Notice>,
        failures_at_first_relay: Option<usize>,
        arrived: HashMap<u64, HashSet<usize>>,
        left_during_setup: bool,
        /// A registration that must fail setup was delivered before the
        /// table: a world size differing from the first registrant's, or
        /// new rank's settings differing from the first registrant's.
        fatal_registration: bool,
        first_registrant: Option<(usize, Settings)>,
        init_deadline: Instant,
        deadline_passed_in_setup: bool,
        log: Vec<String>,
    }

    impl Sim {
        fn apply(&mut self, actions: Vec<Action>) {
            for a in actions {
                self.log.push(format!("  -> {a:?}"));
                match a {
                    Action::Send { to, reply } => {
                        let g = match reply {
                            Reply::Table(t) => {
                                self.table_sent = true;
                                Got::Table(t)
                            }
                            Reply::Reject(w) => Got::Reject(w),
                            Reply::Release(n) => {
                                let all = self.arrived.get(&n).map_or(0, |s| s.len());
                                assert_eq!(
                                    all, self.nranks,
                                    "release {n} before every rank arrived"
                                );
                                Got::Release(n)
                            }
                        };
                        for c in to {
                            if !matches!(g, Got::Reject(_)) {
                                assert!(
                                    !self.ended.contains(&c),
                                    "{g:?} sent to ended connection {c}"
                                );
                            }
                            self.got.entry(c).or_default().push(g.clone());
                        }
                    }
                    Action::Relay { to, notice } => {
                        for c in &to {
                            assert!(!self.ended.contains(c), "relay to ended connection {c}");
                            self.got
                                .entry(*c)
                                .or_default()
                                .push(Got::Notice(notice.clone()));
                        }
                        if self.relays.is_empty() {
                            self.failures_at_first_relay = Some(self.failures.len());
                        }
                        self.relays.push((notice, to));
                    }
                    Action::Close(c) => {
                        self.closed.insert(c);
                    }
                    Action::CloseDoor => {
                        assert!(!self.door_closed, "door closed twice");
                        self.door_closed = true;
                    }
                    Action::SetupOver => self.setup_over += 1,
                }
            }
        }

        /// The next event connection `i` can send now, if any (causality:
        /// nothing before its table, one barrier after the other, nothing
        /// after it was rejected but its connection ending).
        fn next_event(&mut self, i: usize) -> Option<Event> {
            let c = &self.conns[i];
            if c.done {
                return None;
            }
            let (id, rank) = (c.id, c.rank);
            if !c.sent_registration {
                return Some(registered(id, rank, c.nranks, c.settings.clone()));
            }
            let got = self.got.get(&id).cloned().unwrap_or_default();
            let eof = Event::Eof { conn: id, rank };
            if got.iter().any(|g| matches!(g, Got::Reject(_))) || c.failed || c.said_goodbye {
                return Some(eof);
            }
            let failing = matches!(c.fate, Fate::Fails(k) | Fate::Aborts(k) if k == c.barriers);
            if got.iter().any(|g| matches!(g, Got::Notice(_))) && !(failing && self.rng.chance(50))
            {
                // The call failed: the process ends, politely or not
                // (unless its own failure was already on the way).
                return Some(if self.rng.chance(50) {
                    Event::Goodbye { conn: id, rank }
                } else {
                    eof
                });
            }
            if !got.iter().any(|g| matches!(g, Got::Table(_))) {
                // Waiting for the table; a rank that dies early dies anyway.
                return matches!(c.fate, Fate::Crash(0)).then_some(eof);
            }
            let released = got.iter().filter(|g| matches!(g, Got::Release(_))).count();
            if released < c.barriers {
                return None; // waiting at a barrier
            }
            let at = c.barriers;
            let ev = match c.fate {
                Fate::Crash(k) if k == at => eof,
                Fate::Stops(k) if k == at => return None,
                Fate::Fails(k) if k == at => Event::Abort {
                    conn: id,
                    rank,
                    notice: Notice::Failed {
                        origin: rank,
                        aborted: false,
                        message: format!("rank {rank} failed"),
                    },
                },
                Fate::Aborts(k) if k == at => Event::Abort {
                    conn: id,
                    rank,
                    notice: Notice::Failed {
                        origin: rank,
                        aborted: true,
                        message: "abort()".into(),
                    },
                },
                Fate::TimesOut(k, on) if k == at => Event::Abort {
                    conn: id,
                    rank,
                    notice: Notice::Timeout {
                        origin: rank,
                        waiting_for: format!("rank {on}"),
                        after_ms: 1000,
                        waits_on: on as u32,
                    },
                },
                _ if at < self.barriers => Event::Arrive {
                    conn: id,
                    rank,
                    barrier: at as u64,
                    wait: Duration::from_secs(1),
                },
                _ => Event::Goodbye { conn: id, rank },
            };
            Some(ev)
        }

        /// Deliver one event of connection `i` (from `next_event`).
        fn deliver(&mut self, i: usize, ev: Event) {
            let id = self.conns[i].id;
            let rank = self.conns[i].rank;
            let is_winner = self.winner.get(&rank) == Some(&id);
            match &ev {
                Event::Registered {
                    nranks, settings, ..
                } => {
                    self.conns[i].sent_registration = true;
                    if !self.table_sent {
                        let (n0, s0) = self
                            .first_registrant
                            .get_or_insert_with(|| (*nranks, settings.clone()))
                            .clone();
                        if *nranks != n0 {
                            self.fatal_registration = true;
                        } else if !self.winner.contains_key(&rank) {
                            self.fatal_registration |= *settings != s0;
                            self.winner.insert(rank, id);
                        }
                    }
                }
                Event::Arrive { barrier, .. } => {
                    self.conns[i].barriers += 1;
                    if is_winner {
                        self.arrived.entry(*barrier).or_default().insert(rank);
                    }
                }
                Event::Abort { notice, .. } => {
                    self.conns[i].failed = true;
                    if is_winner && self.table_sent && !matches!(notice, Notice::Timeout { .. }) {
                        self.failures.push(notice.clone());
                    }
                    if matches!(notice, Notice::Failed { aborted: true, .. }) {
                        self.conns[i].aborted = true;
                    }
                    if matches!(notice, Notice::Timeout { .. }) {
                        self.conns[i].failed = false;
                        self.conns[i].fate = Fate::Stops(usize::MAX); // waits for a verdict
                    }
                }
                Event::Eof { .. } | Event::Goodbye { .. } => {
                    if matches!(ev, Event::Eof { .. })
                        && is_winner
                        && self.table_sent
                        && !self.ended.contains(&id)
                        && !self.conns[i].aborted
                    {
                        self.failures.push(Notice::Lost {
                            rank,
                            detail: format!(
                                "its control connection to the root on host{rank} closed without goodbye"
                            ),
                        });
                    }
                    if is_winner && !self.table_sent {
                        self.left_during_setup = true;
                    }
                    self.ended.insert(id);
                    self.conns[i].said_goodbye = true;
                    if matches!(ev, Event::Eof { .. }) {
                        self.conns[i].done = true;
                    }
                }
                Event::Refused { .. } => {}
            }
            self.note_refused();
            self.log.push(format!("{ev:?}"));
            let stranger = !is_winner && !matches!(ev, Event::Registered { .. });
            let out = self.root.on_event(self.now, ev);
            if stranger && self.table_sent {
                assert!(out.is_empty(), "a stranger's event caused {out:?}");
            }
            self.apply(out);
        }

        /// The root judges a refused rank once it knows the job's shape.
        fn note_refused(&mut self) {
            if let Some(r) = self.refused {
                if !self.table_sent
                    && self.first_registrant.is_some()
                    && !self.winner.contains_key(&r)
                {
                    self.refused_first = true;
                }
            }
        }

        fn tick(&mut self, by: Duration) {
            self.now += by;
            if !self.table_sent && self.now >= self.init_deadline {
                self.deadline_passed_in_setup = true;
            }
            if self.root.next_wake().is_some_and(|t| t <= self.now) {
                self.log.push(format!("timer at +{by:?}"));
                let out = self.root.on_timer(self.now);
                self.apply(out);
            }
        }
    }

    /// One random job: ranks, strangers, settings and fates; then every
    /// event delivered in a random order that respects causality.
    fn run_job(seed: u64) {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let nranks = 1 + rng.below(8);
        let barriers = rng.below(4);
        let t0 = Instant::now();
        let mut conns = Vec::new();
        let setup_fault = rng.below(8);
        for rank in 0..nranks {
            let fate = match rng.below(10) {
                0 => Fate::Crash(rng.below(barriers + 1)),
                1 => Fate::Fails(rng.below(barriers + 1)),
                2 => Fate::Stops(rng.below(barriers + 1)),
                3 => Fate::TimesOut(rng.below(barriers + 1), rng.below(nranks)),
                4 => Fate::Aborts(rng.below(barriers + 1)),
                _ => Fate::Normal,
            };
            conns.push(Conn {
                id: rank as ConnId + 1,
                rank,
                nranks,
                settings: settings("4M"),
                fate,
                sent_registration: false,
                done: false,
                barriers: 0,
                failed: false,
                aborted: false,
                said_goodbye: false,
            });
        }
        let victim = rng.below(nranks);
        let mut never_registers = false;
        let mut refused = None;
        match setup_fault {
            0 => conns[victim].nranks = nranks + 1,
            1 => conns[victim].settings = settings("8M"),
            2 => refused = Some(victim),
            3 if nranks > 1 => never_registers = true,
            _ => {}
        }
        if never_registers {
            conns[victim].done = true;
        }
        // Strangers: a second process claiming a rank.
        for k in 0..rng.below(3) {
            let rank = rng.below(nranks);
            conns.push(Conn {
                id: 100 + k as ConnId,
                rank,
                nranks,
                settings: settings("4M"),
                fate: Fate::Crash(0),
                sent_registration: false,
                done: false,
                barriers: 0,
                failed: false,
                aborted: false,
                said_goodbye: false,
            });
        }
        let mut sim = Sim {
            rng: Rng(rng.next_u64() | 1),
            now: t0,
            root: Root::new(t0, Duration::from_secs(5)),
            nranks,
            barriers,
            conns,
            got: HashMap::new(),
            closed: HashSet::new(),
            ended: HashSet::new(),
            winner: HashMap::new(),
            refused_first: false,
            refused: None,
            table_sent: false,
            setup_over: 0,
            door_closed: false,
            relays: Vec::new(),
            failures: Vec::new(),
            failures_at_first_relay: None,
            arrived: HashMap::new(),
            left_during_setup: false,
            fatal_registration: false,
            first_registrant: None,
            init_deadline: t0 + Duration::from_secs(5),
            deadline_passed_in_setup: false,
            log: Vec::new(),
        };
        let mut refused_pending = refused;
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 10_000, "seed {seed}: no end");
            if let Some(r) = refused_pending.filter(|_| rng.chance(20)) {
                refused_pending = None;
                sim.refused = Some(r);
                sim.note_refused();
                let ev = Event::Refused {
                    rank: r,
                    nranks,
                    from: "127.0.0.1:9".parse().unwrap(),
                };
                sim.log.push(format!("{ev:?}"));
                let out = sim.root.on_event(sim.now, ev);
                sim.apply(out);
                continue;
            }
            let ready: Vec<(usize, Event)> = (0..sim.conns.len())
                .filter_map(|i| sim.next_event(i).map(|e| (i, e)))
                .collect();
            if !ready.is_empty() && !rng.chance(10) {
                let (i, ev) = ready[rng.below(ready.len())].clone();
                sim.deliver(i, ev);
                continue;
            }
            if ready.is_empty() && refused_pending.is_none() {
                match sim.root.next_wake() {
                    Some(t) if t <= sim.now + Duration::from_secs(60) => {
                        let by = t.saturating_duration_since(sim.now);
                        sim.tick(by);
                    }
                    _ => break, // stuck for good: processes are killed below
                }
            } else {
                sim.tick(Duration::from_millis(rng.below(400) as u64));
            }
        }
        // The end: every process still there is killed.
        for i in 0..sim.conns.len() {
            if sim.conns[i].sent_registration && !sim.conns[i].done {
                let (conn, rank) = (sim.conns[i].id, sim.conns[i].rank);
                sim.deliver(i, Event::Eof { conn, rank });
            }
        }
        // A setup that failed finishes within its window.
        sim.tick(LATE_REJECT_WINDOW + Duration::from_secs(5));
        let ctx = format!(
            "seed {seed}: {nranks} ranks, {barriers} barriers, setup fault {setup_fault}, log:\n{}",
            sim.log.join("\n")
        );
        check(&sim, &ctx);
    }

    fn check(sim: &Sim, ctx: &str) {
        let setup_fails = sim.fatal_registration
            || sim.refused_first
            || sim.left_during_setup
            || sim.deadline_passed_in_setup
            || sim.winner.len() < sim.nranks;
        assert!(sim.root.is_done(), "{ctx}\nroot not done");
        let winners: HashSet<ConnId> = sim.winner.values().copied().collect();
        let got = |c: ConnId| sim.got.get(&c).cloned().unwrap_or_default();
        if !sim.table_sent {
            assert!(setup_fails, "{ctx}\nno table for a job that could start");
            assert_eq!(
                sim.setup_over, 1,
                "{ctx}\nsetup over told {} times",
                sim.setup_over
            );
            assert!(sim.relays.is_empty(), "{ctx}\nrelay without a job");
            // Every connection that registered heard no, exactly once.
            for c in sim.conns.iter().filter(|c| c.sent_registration) {
                let rejects = got(c.id)
                    .iter()
                    .filter(|g| matches!(g, Got::Reject(_)))
                    .count();
                assert_eq!(rejects, 1, "{ctx}\nconnection {} got {:?}", c.id, got(c.id));
            }
            return;
        }
        assert!(!setup_fails, "{ctx}\na table despite a fatal setup fault");
        assert!(sim.door_closed && sim.setup_over == 0, "{ctx}");
        // Exactly one connection per rank got the table, first; the others no.
        for c in &sim.conns {
            let g = got(c.id);
            if winners.contains(&c.id) {
                assert!(
                    matches!(&g[0], Got::Table(t) if t.len() == sim.nranks && t.iter().enumerate().all(|(i, p)| p.rank == i)),
                    "{ctx}\nrank conn {} got {g:?}",
                    c.id
                );
                assert_eq!(
                    g.iter().filter(|x| matches!(x, Got::Table(_))).count(),
                    1,
                    "{ctx}"
                );
            } else if c.sent_registration {
                assert_eq!(
                    g,
                    vec![Got::Reject(
                        g.first()
                            .map(|x| match x {
                                Got::Reject(w) => w.clone(),
                                _ => String::new(),
                            })
                            .unwrap_or_default()
                    )],
                    "{ctx}\nstranger {} got {g:?}",
                    c.id
                );
                assert!(
                    sim.closed.contains(&c.id),
                    "{ctx}\nstranger {} not closed",
                    c.id
                );
            }
        }
        // The first relay is the first cause delivered (an abort only when
        // no other cause came before it was relayed), unless a verdict (a
        // timer) came first; each rank's first notice is that relay.
        let is_abort = |n: &Notice| matches!(n, Notice::Failed { aborted: true, .. });
        if let Some((first, to)) = sim.relays.first() {
            let before = &sim.failures[..sim.failures_at_first_relay.unwrap()];
            let cause = before.iter().find(|n| !is_abort(n));
            let verdict = matches!(
                first,
                Notice::Stalled { .. } | Notice::Cycle { .. } | Notice::Absent { .. }
            );
            if verdict {
                assert!(cause.is_none(), "{ctx}\na verdict relayed after {cause:?}");
            } else {
                assert_eq!(
                    Some(first),
                    cause.or(before.first()),
                    "{ctx}\nfirst relay is not the first cause"
                );
            }
            for c in to {
                let n = got(*c).into_iter().find(|g| matches!(g, Got::Notice(_)));
                assert_eq!(
                    n,
                    Some(Got::Notice(first.clone())),
                    "{ctx}\nconnection {c}'s first notice"
                );
            }
        } else {
            // An abort is dropped only when nobody was left to tell.
            assert!(
                sim.failures.iter().all(is_abort),
                "{ctx}\na failure was never relayed"
            );
        }
        // A failure reported after another was relayed is a consequence.
        for (n, _) in sim.relays.iter().skip(1) {
            assert!(
                !matches!(n, Notice::Failed { .. }),
                "{ctx}\nsecond cause relayed: {n:?}"
            );
        }
        // Each barrier is released at most once per rank.
        for c in winners {
            let g = got(c);
            for b in 0..sim.barriers as u64 {
                assert!(
                    g.iter().filter(|x| **x == Got::Release(b)).count() <= 1,
                    "{ctx}"
                );
            }
        }
    }

    #[test]
    fn random_jobs_in_random_orders_keep_the_root_s_promises() {
        let runs: u64 = std::env::var("OXCCL_ROOT_SIM_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000);
        for seed in 0..runs {
            run_job(seed);
        }
    }
}
