//! Fuzzing on stable Rust: every decoder of outside bytes (`comm_core::fuzz`)
//! gets the committed corpus (`fuzz/corpus/<target>/`, valid messages and
//! known-bad ones) and then a deterministic mutation loop (bit flips, byte
//! sets, truncations, splices, huge length fields) seeded from it. Nothing
//! may panic, and no single allocation during decoding may exceed 2 MiB,
//! whatever a length field says. The same targets run under libFuzzer with
//! `cargo +nightly fuzz run <target>` in `fuzz/`.

use comm_core::fuzz::{run, Rng, TARGETS};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Records the largest single allocation.
struct Tracking;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LARGEST.fetch_max(n, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Tracking = Tracking;

const ALLOC_BOUND: usize = 2 << 20;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .flatten()
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "empty corpus for {target}");
    v
}

fn mutate(r: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[r.below(seeds.len())].clone();
    for _ in 0..1 + r.below(4) {
        match r.below(6) {
            0 if !d.is_empty() => {
                let i = r.below(d.len());
                d[i] ^= 1 << r.below(8);
            }
            1 if !d.is_empty() => {
                let i = r.below(d.len());
                d[i] = r.next_u64() as u8;
            }
            2 => {
                let keep = r.below(d.len() + 1);
                d.truncate(keep);
            }
            3 => {
                let other = seeds[r.below(seeds.len())].clone();
                let at = r.below(d.len() + 1);
                let from = r.below(other.len() + 1);
                d.splice(at..at, other[from..].iter().copied());
            }
            4 if d.len() >= 4 => {
                // A huge little-endian length field somewhere.
                let i = r.below(d.len() - 3);
                d[i..i + 4].copy_from_slice(&(u32::MAX - r.below(1000) as u32).to_le_bytes());
            }
            _ => {
                let extra = r.below(64);
                for _ in 0..extra {
                    let b = r.next_u64() as u8;
                    d.push(b);
                }
            }
        }
    }
    d
}

/// Iterations per target (CI: the default; more with OXCCL_FUZZ_ITERS).
fn iterations() -> usize {
    std::env::var("OXCCL_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

#[test]
fn decoders_survive_corpus_and_mutations_with_bounded_allocations() {
    let iters = iterations();
    for (t, target) in TARGETS.iter().enumerate() {
        let seeds = corpus(target);
        for s in &seeds {
            run(target, s);
        }
        let mut rng = Rng(0x5eed_0000 + t as u64);
        for _ in 0..iters {
            let d = mutate(&mut rng, &seeds);
            LARGEST.store(0, Ordering::Relaxed);
            let input_len = d.len();
            run(target, &d);
            let big = LARGEST.load(Ordering::Relaxed);
            assert!(
                big <= ALLOC_BOUND.max(2 * input_len),
                "{target}: one allocation of {big} bytes from {input_len} input bytes"
            );
        }
        eprintln!(
            "fuzz {target}: {} corpus inputs, {iters} mutations",
            seeds.len()
        );
    }
}

/// The committed corpus holds today's encodings: every seed generated from
/// the current formats must be there, byte for byte (a format change
/// without a refreshed corpus fails here). `OXCCL_WRITE_CORPUS=1` rewrites
/// the seeds; commit the result.
#[test]
fn committed_corpus_matches_the_current_formats() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let write = std::env::var("OXCCL_WRITE_CORPUS").is_ok();
    for (target, name, bytes) in comm_core::fuzz::seeds() {
        let path = root.join(target).join(&name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with OXCCL_WRITE_CORPUS=1)", path.display()));
        assert_eq!(
            committed,
            bytes,
            "{} is stale: run with OXCCL_WRITE_CORPUS=1 and commit",
            path.display()
        );
    }
}
