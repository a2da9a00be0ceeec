//! "A warm communicator allocates nothing per call", measured: a counting
//! global allocator counts the allocations each rank's own thread makes
//! (blocking calls run on the caller's thread) over many warm calls of
//! every collective, on plain host buffers and on registered buffers.

mod common;

use common::*;
use oxccl::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-
// initialised thread-local Cell, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        System.realloc(p, l, n)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// Allocations of this thread during `calls` runs of `f` after 3 warm-ups.
fn per_call(calls: u64, mut f: impl FnMut()) -> u64 {
    for _ in 0..3 {
        f();
    }
    let before = allocs();
    for _ in 0..calls {
        f();
    }
    allocs() - before
}

fn every_collective(c: &Communicator, shared: bool) -> Vec<(String, u64)> {
    let n = c.nranks();
    let mut out = Vec::new();
    // Sizes: the small path, and large (on shared memory copy-in, on TCP
    // the ring: several chunks or pieces).
    for len in [8usize, 1 << 20] {
        let mut a = vec![1.0f32; len];
        let b = vec![1.0f32; len];
        let mut g = vec![0.0f32; len * n];
        let mut s = c.alloc_shared::<f32>(len).unwrap();
        let mut sg = c.alloc_shared::<f32>(len * n).unwrap();
        let mut run =
            |name: &str, f: &mut dyn FnMut()| out.push((format!("{name} {len}"), per_call(50, f)));
        if shared {
            run("direct all_reduce", &mut || {
                c.all_reduce_in_place(&mut s, ReduceOp::Sum).unwrap()
            });
            run("direct all_gather", &mut || {
                c.all_gather_in_place(&mut sg).unwrap()
            });
            run("direct reduce_scatter", &mut || {
                c.reduce_scatter_in_place(&mut sg, ReduceOp::Avg).unwrap()
            });
            run("direct broadcast", &mut || {
                c.broadcast_in_place(&mut s, 1).unwrap()
            });
            // 8 floats: the small-message path; 1 Mi: the direct one.
            let path = if len == 8 { "small" } else { "direct" };
            assert_eq!(c.last_algorithm(), Some(path));
            continue;
        }
        run("all_reduce", &mut || {
            c.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap()
        });
        run("all_reduce avg out of place", &mut || {
            c.all_reduce(&b, &mut a, ReduceOp::Avg).unwrap()
        });
        run("all_gather", &mut || c.all_gather(&b, &mut g).unwrap());
        run("reduce_scatter", &mut || {
            c.reduce_scatter(&g, &mut a, ReduceOp::Sum).unwrap()
        });
        run("broadcast", &mut || {
            c.broadcast_in_place(&mut a, 0).unwrap()
        });
        run("reduce", &mut || {
            c.reduce(&b, &mut a, ReduceOp::Max, 1).unwrap()
        });
        run("all_to_all", &mut || c.all_to_all_in_place(&mut g).unwrap());
        run("barrier", &mut || c.barrier().unwrap());
    }
    out
}

#[test]
fn a_warm_communicator_allocates_nothing_per_call() {
    for (cfg, shared) in [
        (test_config(), false),
        (tcp_config(), false),
        (test_config(), true),
    ] {
        let per_rank = with_ranks(3, cfg, |c| every_collective(&c, shared));
        for (r, counts) in per_rank.iter().enumerate() {
            for (what, k) in counts {
                assert_eq!(
                    *k, 0,
                    "rank {r}: {what}: {k} allocations in 50 warm calls (shared {shared})"
                );
            }
        }
    }
}
