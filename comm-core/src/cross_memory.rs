//! Whether the kernel's copy between processes pays on this host: measured
//! once, at creation, where the ranks of one host agree on the single copy
//! ([`crate::algorithms::single_copy`]).
//!
//! The single copy moves each byte once, by the kernel
//! (`process_vm_readv`); the copy-in and the ring move it twice, by the
//! library, through shared staging. The kernel pins the source a 4 KiB
//! page at a time, a cost per page that differs by host and kernel more
//! than memory bandwidth does: docs/PERFORMANCE.md, fourteenth and
//! fifteenth rounds, has one host where the kernel's copy ran at 27 % of
//! `memcpy`'s rate at 1 MiB and lost to the copy-in 1.3-2x at every size
//! from 1 to 64 MiB, and an earlier one where it led at several. One
//! kernel pass against two library passes: the single copy is worth
//! choosing where the kernel copies at least half as fast
//! ([`PAYS_FROM`]).
//!
//! Each rank times its own memory read through the kernel, which pins it
//! just as it pins a peer's, against a plain copy of the same bytes; the
//! ranks exchange their shares ([`verdict`]) and all decide alike from
//! the same list ([`single_copy_pays`]).
//!
//! The probe's buffer lies on 4 KiB pages, as callers' buffers do where
//! transparent huge pages are left to `madvise` (this project's host).
//! On huge pages the kernel pins far less a byte and copies at close to
//! `memcpy`'s rate (fourteenth round; 81-101 % at 16-128 MiB in the
//! twenty-sixth, against 22-54 % on 4 KiB pages), so a host that gives
//! large allocations huge pages (`enabled` = `always`) hears "no" from
//! this probe where the callers' large buffers would copy fast. With
//! huge pages under both libraries there, the 2-rank 16 MiB all-to-all's
//! single copy still took 1.25x the copy-in's time (twenty-sixth round),
//! so the verdict stands until a host shows otherwise.

use std::time::{Duration, Instant};

/// Bytes copied each way: enough pages that pinning's cost per page shows
/// as it does in the single copy's calls (on the fifteenth round's host
/// 21-29 % of memcpy's rate at 256 KiB, 24-29 % at 1 MiB, the least
/// all-to-all it is chosen for), few enough to cost a fraction of a
/// millisecond. With 4 ranks on 2 cores, 1 MiB added 4-5 ms to creation
/// (7-10 ms) and this size 2-3 ms: ranks done first spin in the exchange
/// while the rest still time.
const PROBE_BYTES: usize = 256 << 10;

/// Timed copies each way; the least time counts (a copy interrupted by the
/// scheduler says nothing of the host's rate).
const PROBE_REPS: usize = 3;

/// The least share of `memcpy`'s rate (per cent) at which the kernel's
/// copy is preferred: one kernel pass against two of the library's.
pub(crate) const PAYS_FROM: u8 = 50;

/// A rank's word in the creation exchange: it cannot (or will not) read
/// its peers.
pub(crate) const NO_READS: u8 = 0;

/// A rank's word when the single copy is forced on (`OXCCL_CMA=on`): no
/// probe, counted as fast.
pub(crate) const FORCED: u8 = u8::MAX;

/// This rank's word for the exchange: [`NO_READS`], [`FORCED`], or the
/// kernel's measured share of `memcpy`'s rate in per cent, 1 to 254.
pub(crate) fn verdict(reads_ok: bool, forced: bool) -> u8 {
    match (reads_ok, forced) {
        (false, _) => NO_READS,
        (true, true) => FORCED,
        // A kernel that refuses this process its own memory is one whose
        // share is nil: reads of peers succeeded, so take them at the
        // slowest rate rather than fail creation.
        (true, false) => measured_share().unwrap_or(1),
    }
}

/// [`kernel_share`], measured once per process: the host and its kernel
/// do not change between communicators, and a program that splits one
/// into many groups would otherwise pay for it at each.
fn measured_share() -> Option<u8> {
    static SHARE: std::sync::OnceLock<Option<u8>> = std::sync::OnceLock::new();
    *SHARE.get_or_init(kernel_share)
}

/// Whether every rank may read every other (all words nonzero).
pub(crate) fn reads_allowed(words: &[u8]) -> bool {
    words.iter().all(|w| *w != NO_READS)
}

/// Whether the ranks' words say the single copy pays: the lower median
/// share at least [`PAYS_FROM`]. Every rank computes it from the same list.
pub(crate) fn single_copy_pays(words: &[u8]) -> bool {
    let mut w = words.to_vec();
    w.sort_unstable();
    !w.is_empty() && reads_allowed(&w) && w[(w.len() - 1) / 2] >= PAYS_FROM
}

/// The kernel's copy rate as a share of `memcpy`'s, per cent, clamped to
/// 1..=254; `None` when the kernel refuses the read.
fn kernel_share() -> Option<u8> {
    // Both buffers written first: every page is present, as a caller's
    // buffers are (`vec![0; n]` would leave them unmapped).
    let src = vec![1u8; PROBE_BYTES];
    let mut dst = vec![2u8; PROBE_BYTES];
    let pid = std::process::id();
    let kernel = |dst: &mut [u8]| -> Option<Duration> {
        let t = Instant::now();
        // SAFETY: `dst` is `PROBE_BYTES` writable bytes; the source is
        // this process's own live `src`, as long.
        unsafe { crate::sys::read_process(pid, src.as_ptr() as u64, dst.as_mut_ptr(), dst.len()) }
            .ok()?;
        Some(t.elapsed())
    };
    let library = |dst: &mut [u8]| {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        t.elapsed()
    };
    // One of each untimed: the first touches the kernel's paths and the
    // caches cold.
    kernel(&mut dst)?;
    library(&mut dst);
    let (mut k, mut l) = (Duration::MAX, Duration::MAX);
    for _ in 0..PROBE_REPS {
        k = k.min(kernel(&mut dst)?);
        l = l.min(library(&mut dst));
    }
    Some(share(k, l))
}

/// `library / kernel` time in per cent, clamped to 1..=254.
fn share(kernel: Duration, library: Duration) -> u8 {
    let pct = library.as_secs_f64() / kernel.as_secs_f64().max(1e-9) * 100.0;
    pct.round().clamp(1.0, 254.0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_decide_alike_from_the_lower_median() {
        assert!(!single_copy_pays(&[]));
        assert!(single_copy_pays(&[FORCED, FORCED]));
        assert!(single_copy_pays(&[60, 50]));
        assert!(!single_copy_pays(&[60, 49]));
        assert!(!single_copy_pays(&[27, 30, 90, 95]));
        assert!(single_copy_pays(&[27, 50, 90, 95]));
        // Anyone unable to read: no single copy however fast the others.
        assert!(!single_copy_pays(&[FORCED, NO_READS, FORCED]));
        assert!(!reads_allowed(&[FORCED, NO_READS]));
        assert!(reads_allowed(&[1, 254]));
    }

    #[test]
    fn the_share_is_clamped_and_never_says_no_reads_or_forced() {
        let ms = Duration::from_millis;
        assert_eq!(share(ms(4), ms(1)), 25);
        assert_eq!(share(ms(1), ms(1)), 100);
        assert_eq!(share(ms(1), ms(10)), 254);
        assert_eq!(share(ms(1000), ms(1)), 1);
        assert_eq!(share(Duration::ZERO, ms(1)), 254);
    }

    #[test]
    fn this_host_measures_a_share() {
        // Where the kernel lets a process read itself (it does in CI), the
        // probe gives a share, never one of the reserved words.
        if let Some(s) = kernel_share() {
            assert!((1..=254).contains(&s), "{s}");
        }
        assert_ne!(verdict(true, false), NO_READS);
        assert_eq!(verdict(true, true), FORCED);
        assert_eq!(verdict(false, true), NO_READS);
    }
}
