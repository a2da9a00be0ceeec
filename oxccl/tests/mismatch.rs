//! The mismatch matrix: ranks disagreeing on the collective, the count, the
//! dtype, the operator, the root, or one rank skipping a call — on TCP,
//! shared memory and registered buffers. Every rank must return
//! `Error::Mismatch` naming the disagreeing rank and both calls (a 10 s
//! timeout turns a hang into a failure of the assertion).

mod common;
use common::*;
use oxccl::prelude::*;
use std::time::{Duration, Instant};

const ODD: usize = 1;

/// Run `normal` on every rank but `ODD`, which runs `odd`; check that all
/// ranks report the mismatch, and that the descriptions contain `want_odd`
/// (the odd rank's call) and `want_normal` (everyone else's).
fn case(
    cfg: Config,
    what: &str,
    want_normal: &str,
    want_odd: &str,
    normal: fn(&Communicator) -> Result<()>,
    odd: fn(&Communicator) -> Result<()>,
) {
    let cfg = Config {
        timeout: Duration::from_secs(10),
        ..cfg
    };
    let t = Instant::now();
    with_ranks(3, cfg, |c| {
        let r = if c.rank() == ODD { odd(&c) } else { normal(&c) };
        match r {
            Err(Error::Mismatch {
                local,
                peer,
                remote,
                ..
            }) => {
                if c.rank() == ODD && local.contains(want_odd) {
                    assert!(
                        remote.contains(want_normal),
                        "{what}: rank {ODD}: {local} / {remote}"
                    );
                    assert_ne!(peer, ODD);
                } else if local.contains(want_normal) {
                    assert!(
                        remote.contains(want_odd),
                        "{what}: rank {}: {local} / {remote}",
                        c.rank()
                    );
                    assert_eq!(peer, ODD, "{what}: rank {} blames {peer}", c.rank());
                } else {
                    // Not in the disagreeing call: the next one when its part
                    // of it had already completed (a broadcast root, a
                    // reduce's non-root, the odd rank among them), or an
                    // earlier one when the news overtook it. Such a rank only
                    // learns that two ranks disagree and cannot tell which is
                    // odd; it must name one of them and its call.
                    assert!(
                        (peer == ODD && remote.contains(want_odd))
                            || (peer != ODD && peer != c.rank() && remote.contains(want_normal)),
                        "{what}: rank {} blames {peer}: {local} / {remote}",
                        c.rank()
                    );
                }
            }
            other => panic!(
                "{what}: rank {} expected a mismatch, got {other:?}",
                c.rank()
            ),
        }
    });
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "{what}: took {:?}",
        t.elapsed()
    );
}

fn all_cases(cfg: Config) {
    case(
        cfg.clone(),
        "collective",
        "all_reduce(count=12, f32, sum)",
        "all_gather(count=4, f32)",
        |c| c.all_reduce_in_place(&mut [1f32; 12], ReduceOp::Sum),
        |c| c.all_gather_in_place(&mut [1f32; 12]),
    );
    case(
        cfg.clone(),
        "count",
        "all_reduce(count=12, f32, sum)",
        "all_reduce(count=13, f32, sum)",
        |c| c.all_reduce_in_place(&mut [1f32; 12], ReduceOp::Sum),
        |c| c.all_reduce_in_place(&mut [1f32; 13], ReduceOp::Sum),
    );
    case(
        cfg.clone(),
        "dtype",
        "all_reduce(count=12, f32, sum)",
        "all_reduce(count=12, i32, sum)",
        |c| c.all_reduce_in_place(&mut [1f32; 12], ReduceOp::Sum),
        |c| c.all_reduce_in_place(&mut [1i32; 12], ReduceOp::Sum),
    );
    case(
        cfg.clone(),
        "op",
        "all_reduce(count=40000, f32, sum)",
        "all_reduce(count=40000, f32, max)",
        |c| c.all_reduce_in_place(&mut vec![1f32; 40000], ReduceOp::Sum),
        |c| c.all_reduce_in_place(&mut vec![1f32; 40000], ReduceOp::Max),
    );
    // From 1 MiB on one host: the copy-in all_reduce, in phases, against
    // another in phases (checked at its first phase) and against a ring
    // exchanging messages (the phased ranks see the other's published call).
    case(
        cfg.clone(),
        "large op",
        "all_reduce(count=300000, f32, sum)",
        "all_reduce(count=300000, f32, max)",
        |c| c.all_reduce_in_place(&mut vec![1f32; 300_000], ReduceOp::Sum),
        |c| c.all_reduce_in_place(&mut vec![1f32; 300_000], ReduceOp::Max),
    );
    case(
        cfg.clone(),
        "large collective",
        "all_reduce(count=300000, f32, sum)",
        "all_gather(count=100000, f32)",
        |c| c.all_reduce_in_place(&mut vec![1f32; 300_000], ReduceOp::Sum),
        |c| c.all_gather_in_place(&mut vec![1f32; 300_000]),
    );
    // From 1 MiB a rank, out of place: the single-copy all_to_all, which
    // reads peers' plain inputs where they lie. A count that differs must
    // be caught at the first phase, before any rank reads past a peer's
    // buffer; and against a copy-in all_reduce (phased too).
    case(
        cfg.clone(),
        "large all_to_all count",
        "all_to_all(count=100000, f32)",
        "all_to_all(count=100001, f32)",
        |c| c.all_to_all(&vec![1f32; 300_000], &mut vec![0f32; 300_000]),
        |c| c.all_to_all(&vec![1f32; 300_003], &mut vec![0f32; 300_003]),
    );
    case(
        cfg.clone(),
        "large all_to_all or all_reduce",
        "all_to_all(count=100000, f32)",
        "all_reduce(count=300000, f32, sum)",
        |c| c.all_to_all(&vec![1f32; 300_000], &mut vec![0f32; 300_000]),
        |c| c.all_reduce_in_place(&mut vec![1f32; 300_000], ReduceOp::Sum),
    );
    case(
        cfg.clone(),
        "root",
        "broadcast(count=8, f64, root=0)",
        "broadcast(count=8, f64, root=2)",
        // The root's own part may finish before anyone checks its message:
        // it learns of the mismatch on its next call.
        |c| {
            c.broadcast_in_place(&mut [1f64; 8], 0)
                .and_then(|_| c.barrier())
        },
        |c| c.broadcast_in_place(&mut [1f64; 8], 2),
    );
    case(
        cfg.clone(),
        "reduce or all_to_all",
        "all_to_all(count=4, f32)",
        "reduce(count=12, f32, sum, root=2)",
        |c| {
            c.all_to_all_in_place(&mut [1f32; 12])
                .and_then(|_| c.barrier())
        },
        // A reduce's non-root reads nothing: it learns of the mismatch on
        // its next call.
        |c| {
            c.reduce_in_place(&mut [1f32; 12], ReduceOp::Sum, 2)
                .and_then(|_| c.barrier())
        },
    );
    case(
        cfg.clone(),
        "skipped call",
        "barrier(count=0, u8) as collective #0",
        "all_reduce(count=4, f32, sum) as collective #0",
        |c| {
            c.barrier()
                .and_then(|_| c.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum))
        },
        |c| c.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum),
    );
}

#[test]
fn mismatch_matrix_tcp() {
    all_cases(tcp_config());
}

#[test]
fn mismatch_matrix_shm() {
    all_cases(test_config());
}

#[test]
fn mismatch_matrix_registered() {
    fn reg(c: &Communicator, len: usize, op: ReduceOp) -> Result<()> {
        let mut b = c.alloc_shared::<f32>(len)?;
        c.all_reduce_in_place(&mut b, op)
    }
    // Registered buffers are addressed by id on every rank: passing
    // another one (of the same size) is a disagreement too.
    fn two(c: &Communicator, first: bool) -> Result<()> {
        let mut a = c.alloc_shared::<f32>(16)?;
        let mut b = c.alloc_shared::<f32>(16)?;
        c.all_reduce_in_place(if first { &mut a } else { &mut b }, ReduceOp::Sum)
    }
    case(
        test_config(),
        "registered buffers",
        "on registered buffers 1/1",
        "on registered buffers 2/2",
        |c| two(c, true),
        |c| two(c, false),
    );
    // A rank passing plain memory runs messages (below the copy-in size)
    // while the others run phases on registered memory.
    case(
        test_config(),
        "registered or plain",
        "on registered buffers 1/1",
        "count=16384",
        |c| reg(c, 16384, ReduceOp::Sum),
        |c| {
            let _registered = c.alloc_shared::<f32>(16384)?;
            c.all_reduce_in_place(&mut vec![1f32; 16384], ReduceOp::Sum)
        },
    );
    case(
        test_config(),
        "registered op",
        "all_reduce(count=16, f32, sum)",
        "all_reduce(count=16, f32, max)",
        |c| reg(c, 16, ReduceOp::Sum),
        |c| reg(c, 16, ReduceOp::Max),
    );
}
