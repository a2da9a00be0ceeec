//! Point-to-point groups: sends and receives posted together.

use crate::schedule::{chunks, Action, BufId, Schedule, Span};

/// One operation of a point-to-point group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pStep {
    /// Send buffer `buf` (of `len` elements) to `peer`.
    Send { peer: usize, buf: BufId, len: usize },
    /// Receive `len` elements from `peer` into buffer `buf`.
    Recv { peer: usize, buf: BufId, len: usize },
}

/// A group of sends and receives that progress together (so a send and a
/// receive posted by both sides never deadlock). A zero-length operation
/// still sends one (empty) message so the pair stays matched.
pub fn p2p(ops: &[P2pStep], chunk: usize) -> Schedule {
    let mut s = Schedule::default();
    for op in ops {
        match *op {
            P2pStep::Send { peer, buf, len } => {
                if len == 0 {
                    s.push(
                        Action::Send {
                            peer,
                            src: Span::new(buf, 0, 0),
                        },
                        &[],
                    );
                }
                for (off, l) in chunks(0, len, chunk) {
                    s.push(
                        Action::Send {
                            peer,
                            src: Span::new(buf, off, l),
                        },
                        &[],
                    );
                }
            }
            P2pStep::Recv { peer, buf, len } => {
                if len == 0 {
                    s.push(
                        Action::Recv {
                            peer,
                            dst: Span::new(buf, 0, 0),
                        },
                        &[],
                    );
                }
                for (off, l) in chunks(0, len, chunk) {
                    s.push(
                        Action::Recv {
                            peer,
                            dst: Span::new(buf, off, l),
                        },
                        &[],
                    );
                }
            }
        }
    }
    s
}
