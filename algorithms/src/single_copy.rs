//! Single-copy all-to-all of plain buffers, for ranks of one host whose
//! kernel lets them read each other's memory ([`CollSpec::plain_reads`]:
//! cross-memory attach, `process_vm_readv`).
//!
//! The schedule is the direct one ([`crate::direct::all_to_all`]): at the
//! first `Sync` every rank publishes where its buffers lie, then copies
//! its block out of every peer's input into its output, and the last
//! `Sync` keeps every input unchanged until no peer reads it. Each byte is
//! moved once, by the kernel, from memory its owner wrote long before;
//! the copy-in ([`crate::copyin`]) moves it twice, through staging the
//! other core has just written. Which wins depends on where the host runs
//! the ranks (docs/PERFORMANCE.md, eleventh round): the kernel's copy is
//! slower than the library's (it pins the peer's pages a few at a time),
//! but a hand-off of freshly written lines between core complexes is
//! slower still.

use crate::algorithm::Algorithm;
use crate::schedule::Schedule;
use crate::spec::{CollSpec, Kind, Tuning};

/// Single copy through the kernel: needs [`CollSpec::plain_reads`].
pub struct SingleCopy;

impl Algorithm for SingleCopy {
    fn name(&self) -> &'static str {
        "singlecopy"
    }

    fn supports(&self, spec: &CollSpec) -> bool {
        spec.plain_reads && spec.direct.is_none() && spec.nranks > 1 && spec.kind == Kind::AllToAll
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
        !spec.in_place && spec.bytes().saturating_mul(spec.nranks) >= tuning.copyin_bytes
    }

    fn build(&self, spec: &CollSpec) -> Schedule {
        crate::direct::all_to_all(spec.rank, spec.nranks, spec.count, spec.in_place)
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
        for n in [2, 3, 4, 8] {
            for count in [1, 1000, 64 << 10, 1 << 20, 16 << 20] {
                for in_place in [false, true] {
                    for shared in [0, 64 << 10] {
                        let plain = CollSpec {
                            in_place,
                            shared,
                            ..CollSpec::new(Kind::AllToAll, 1, n, count / n)
                        };
                        let cma = CollSpec {
                            plain_reads: true,
                            ..plain
                        };
                        let name = |s: &CollSpec| crate::choose(s, None, &t).unwrap().name();
                        let least = if n == 2 {
                            2 * t.copyin_bytes
                        } else {
                            t.copyin_bytes
                        };
                        let want = match !in_place && (count / n) * n * 4 >= least {
                            true => "singlecopy",
                            false => name(&plain),
                        };
                        assert_eq!(
                            name(&cma),
                            want,
                            "{n} ranks, {count} elements, in place {in_place}, shared {shared}"
                        );
                    }
                }
            }
        }
    }
}
