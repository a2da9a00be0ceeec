//! Why a job is failing, as the control plane relays it between ranks: one
//! structured [`Notice`] per cause, so that every rank reports the same
//! kind of error the detecting rank saw and a launcher can name the
//! culprit. Encoding and a total decoder live here; turning a notice into a
//! rank's error lives in [`super::failure`].

use crate::config::vars::MAX_RANKS;
use crate::error::{Error, Result};
use crate::wire::{Put, Reader};

/// The control message carrying a notice (see [`super::message`]).
pub(crate) const MSG_NOTICE: u8 = 12;

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
