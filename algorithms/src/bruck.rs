//! Bruck's all_to_all for small messages: `ceil(log2 n)` rounds of one
//! message each instead of `n - 1`, for any rank count.
//!
//! Rank `r` first rotates its blocks into scratch, `tmp[j] = input[r + j]`
//! (mod n). In round `k` (distance `d = 2^k`) it packs every block `tmp[j]`
//! with bit `k` of `j` set, sends the pack to `r + d` and unpacks the pack
//! from `r - d` into the same positions. Afterwards `tmp[j]` holds what rank
//! `r - j` had for `r`, so `output[i] = tmp[r - i]`. Packing costs local
//! copies of about half the data per round: worth it where each message
//! costs a latency, not bandwidth.

use crate::schedule::{chunks, Action, Schedule, Span, INPUT, OUTPUT, SCRATCH};

/// Bruck all_to_all of `count` elements to and from every rank; in place,
/// `INPUT` and `OUTPUT` are one buffer (read whole into scratch first).
pub fn all_to_all(rank: usize, n: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::default();
    let c = count;
    let tmp = |j: usize| Span::new(SCRATCH, j * c, c);
    // Rotate: tmp[0..n-r] = input[r..n], tmp[n-r..n] = input[0..r].
    let mut rotate = vec![s.push(
        Action::Copy {
            src: Span::new(INPUT, rank * c, (n - rank) * c),
            dst: Span::new(SCRATCH, 0, (n - rank) * c),
        },
        &[],
    )];
    if rank > 0 {
        rotate.push(s.push(
            Action::Copy {
                src: Span::new(INPUT, 0, rank * c),
                dst: Span::new(SCRATCH, (n - rank) * c, rank * c),
            },
            &[],
        ));
    }
    // The step that last wrote each tmp block.
    let mut writer: Vec<u32> = (0..n).map(|j| rotate[usize::from(j >= n - rank)]).collect();
    let mut scratch = n * c;
    let mut dist = 1;
    while dist < n {
        let picked: Vec<usize> = (0..n).filter(|j| j & dist != 0).collect();
        let len = picked.len() * c;
        let (pack, unpack) = (scratch, scratch + len);
        scratch += 2 * len;
        // Pack, then send the pack.
        let packed: Vec<u32> = picked
            .iter()
            .enumerate()
            .map(|(i, &j)| {
                s.push(
                    Action::Copy {
                        src: tmp(j),
                        dst: Span::new(SCRATCH, pack + i * c, c),
                    },
                    &[writer[j]],
                )
            })
            .collect();
        for (off, l) in chunks(pack, len, chunk) {
            s.push(
                Action::Send {
                    peer: (rank + dist) % n,
                    src: Span::new(SCRATCH, off, l),
                },
                &packed,
            );
        }
        // Receive the peer's pack, then unpack it where this rank's came
        // from (after it was packed: the block is overwritten).
        let recvd: Vec<(usize, usize, u32)> = chunks(unpack, len, chunk)
            .map(|(off, l)| {
                let i = s.push(
                    Action::Recv {
                        peer: (rank + n - dist) % n,
                        dst: Span::new(SCRATCH, off, l),
                    },
                    &[],
                );
                (off, l, i)
            })
            .collect();
        for (i, &j) in picked.iter().enumerate() {
            let (lo, hi) = (unpack + i * c, unpack + (i + 1) * c);
            let mut deps: Vec<u32> = recvd
                .iter()
                .filter(|(off, l, _)| *off < hi && lo < off + l)
                .map(|r| r.2)
                .collect();
            deps.push(packed[i]);
            writer[j] = s.push(
                Action::Copy {
                    src: Span::new(SCRATCH, lo, c),
                    dst: tmp(j),
                },
                &deps,
            );
        }
        dist *= 2;
    }
    // output[i] = tmp[r - i]; in place, only once the input was read whole.
    for i in 0..n {
        let j = (rank + n - i) % n;
        let mut deps = rotate.clone();
        deps.push(writer[j]);
        s.push(
            Action::Copy {
                src: tmp(j),
                dst: Span::new(OUTPUT, i * c, c),
            },
            &deps,
        );
    }
    s.scratch = scratch;
    s
}

/// Bruck's all_to_all: `ceil(log2 n)` messages per rank, for small
/// messages (never chosen automatically yet: `OXCCL_ALGO=bruck`).
pub struct Bruck;

impl crate::Algorithm for Bruck {
    fn name(&self) -> &'static str {
        "bruck"
    }
    fn supports(&self, s: &crate::CollSpec) -> bool {
        s.kind == crate::Kind::AllToAll && s.direct.is_none()
    }
    fn preferred(&self, _: &crate::CollSpec, _: &crate::Tuning) -> bool {
        false
    }
    fn build(&self, s: &crate::CollSpec) -> Schedule {
        all_to_all(s.rank, s.nranks, s.count, s.chunk)
    }
}
