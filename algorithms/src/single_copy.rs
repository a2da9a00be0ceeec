//! Single-copy all-to-all and all-gather of plain buffers, for ranks of
//! one host whose kernel lets them read each other's memory
//! ([`CollSpec::plain_reads`]: cross-memory attach, `process_vm_readv`).
//!
//! The schedules are the direct ones ([`crate::direct::all_to_all`],
//! [`crate::direct::all_gather`]): at the first `Sync` every rank
//! publishes where its buffers lie, then copies its block (all-to-all) or
//! every peer's contribution (all-gather) out of the peers' buffers into
//! its output, and the last `Sync` keeps every buffer unchanged until no
//! peer reads it. Each byte is moved once, by the kernel, from memory its
//! owner wrote long before; the copy-in ([`crate::copyin`]) and the ring
//! move it twice, through staging the other core has just written. Which
//! wins depends on where the host runs the ranks (docs/PERFORMANCE.md,
//! eleventh and thirteenth rounds): the kernel's copy is slower than the
//! library's (it pins the peer's pages a few at a time), but a hand-off
//! of freshly written lines between cores that share no cache is slower
//! still.

use crate::algorithm::Algorithm;
use crate::schedule::Schedule;
use crate::spec::{CollSpec, Kind, Tuning};

/// The least all-gather output (bytes) the single copy is preferred for
/// (below it the kernel's fixed cost per read shows: 1.2-1.9x the ring's
/// time at 16-32 KiB in a shared cache).
const SHORTEST_GATHER: usize = 64 << 10;

/// Single copy through the kernel: needs [`CollSpec::plain_reads`].
pub struct SingleCopy;

impl Algorithm for SingleCopy {
    fn name(&self) -> &'static str {
        "singlecopy"
    }

    fn supports(&self, spec: &CollSpec) -> bool {
        spec.plain_reads
            && spec.direct.is_none()
            && spec.nranks > 1
            && matches!(spec.kind, Kind::AllToAll | Kind::AllGather)
    }

    fn preferred(&self, spec: &CollSpec, tuning: &Tuning) -> bool {
        // Out of place, from the copy-in's threshold (an all-to-all's
        // count is per peer: compare what each rank sends). Medians of 3
        // alternating runs against the build before (docs/PERFORMANCE.md,
        // eleventh round), new / old time: 4 ranks 0.77-0.90 at 2-8 and
        // 128-256 MiB, 0.97-1.27 at 16-64 MiB (the old build's control
        // 0.99-1.22 there); 2 ranks 0.67-0.93 at 2-16 and 128-256 MiB,
        // 0.98-1.03 at 32-64. At 1 MiB it is level with Open MPI's own
        // single copy and steady (2 ranks, eight alternating runs: 112-124
        // µs, Open MPI 104-125) where the pairwise exchange swings with the
        // ranks' placement (87-223), as the copy-in does on 4 ranks (it
        // fell to 1.76x Open MPI's time in one run). In place the peers'
        // blocks go through scratch, a second copy: 1.7-2.7x the copy-in's
        // in-place time on 4 ranks (1 / 16 MiB).
        //
        // An all-gather's (count per rank too), on 2 ranks, from 64 KiB
        // of output until the copy-in takes over: level with Open MPI's
        // time whichever way the host places the two vCPUs, where the
        // ring is 0.8-1.0x it when they share a cache and 1.4-1.8x when
        // they do not (the ring hands each block across through staging
        // just written). Out of place, µs, ring / single copy / Open MPI,
        // six alternating rounds (thirteenth round): shared cache
        // 5.7-6.1 / 6.6-10.5 / 6.2-6.6 at 64 KiB, 73-91 / 79-106 / 83-92
        // at 1 MiB; split 11.9-13.0 / 8.4-8.6 / 7.9-8.4, 182 / 102-107 /
        // 103-104. In place likewise (it reads the peer's output), 1 MiB:
        // 57-62 / 81-94 shared, 152-155 / 77-96 split. On 4 ranks (two a
        // core) it lost in 16 of 18 size-rounds from 16 KiB to 16 MiB, in
        // both placements.
        //
        // Only where the kernel's copy pays ([`Tuning::single_copy`]): on
        // a host where it ran at 27 % of memcpy's rate the copy-in was
        // 1.3-2x faster at every size above and the ring 1.2-2x faster
        // for these all-gathers (fifteenth round).
        if !tuning.single_copy {
            return false;
        }
        let out = spec.bytes().saturating_mul(spec.nranks);
        match spec.kind {
            Kind::AllGather => {
                spec.nranks == 2
                    && out >= SHORTEST_GATHER
                    && out < tuning.copyin_gather_bytes(spec.nranks)
            }
            _ => !spec.in_place && out >= tuning.copyin_bytes,
        }
    }

    fn build(&self, spec: &CollSpec) -> Schedule {
        let (rank, n, count, in_place) = (spec.rank, spec.nranks, spec.count, spec.in_place);
        match spec.kind {
            Kind::AllGather => crate::direct::all_gather(rank, n, count, in_place),
            _ => crate::direct::all_to_all(rank, n, count, in_place),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads of peers' plain buffers change the choice only where the
    /// single copy is preferred: never as the fallback of a call nothing
    /// else prefers.
    #[test]
    fn the_single_copy_is_chosen_only_where_preferred() {
        let t = Tuning::default();
        for kind in [Kind::AllToAll, Kind::AllGather] {
            for n in [2, 3, 4, 8] {
                for count in [
                    1,
                    1000,
                    16 << 10,
                    64 << 10,
                    (1 << 20) - 64,
                    1 << 20,
                    16 << 20,
                ] {
                    for in_place in [false, true] {
                        for shared in [0, 64 << 10] {
                            let plain = CollSpec {
                                in_place,
                                shared,
                                ..CollSpec::new(kind, 1, n, count / n)
                            };
                            let cma = CollSpec {
                                plain_reads: true,
                                ..plain
                            };
                            let name = |s: &CollSpec| crate::choose(s, None, &t).unwrap().name();
                            let bytes = (count / n) * n * 4;
                            let preferred = match kind {
                                Kind::AllGather => n == 2 && (64 << 10..4 << 20).contains(&bytes),
                                _ if n == 2 => bytes >= 2 * t.copyin_bytes,
                                _ => bytes >= t.copyin_bytes,
                            };
                            let want = match (kind == Kind::AllGather || !in_place) && preferred {
                                true => "singlecopy",
                                false => name(&plain),
                            };
                            assert_eq!(
                                name(&cma),
                                want,
                                "{kind:?}, {n} ranks, {count} elements, in place {in_place}, shared {shared}"
                            );
                            // Where the kernel's copy does not pay, reads
                            // change nothing.
                            let slow = Tuning {
                                single_copy: false,
                                ..t
                            };
                            assert_eq!(
                                crate::choose(&cma, None, &slow).unwrap().name(),
                                name(&plain),
                                "slow kernel: {kind:?}, {n} ranks, {count} elements"
                            );
                        }
                    }
                }
            }
        }
    }
}
