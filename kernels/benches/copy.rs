//! `kernels::copy::copy` against `memcpy` over every placement of the
//! destination relative to the source (16-byte steps across a page), so
//! that a placement-dependent slow path shows as a worst case rather than
//! as noise between runs. Both run alternately on the same buffers; each
//! figure is the fastest of 5 runs.
//!
//! `cargo bench -p kernels --bench copy` (add `-- quick` for 4–16 KiB).

use kernels::copy::copy;
use std::hint::black_box;
use std::time::Instant;

fn time(f: &mut dyn FnMut(), iters: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / iters as f64);
    }
    best
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let sizes: &[usize] = if quick {
        &[4 << 10, 8 << 10, 16 << 10]
    } else {
        &[
            1 << 10,
            2 << 10,
            4 << 10,
            8 << 10,
            16 << 10,
            32 << 10,
            256 << 10,
            1 << 20,
        ]
    };
    let mut mem = vec![1u8; (4 << 20) + 3 * 4096];
    let base = mem.as_mut_ptr();
    let src_at = base.align_offset(4096) + 64;
    println!("# ns per copy; dst - src = size + 4 KiB + d, d = 0, 16, .., 4080");
    println!(
        "{:>9} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "bytes", "memcpy mean", "memcpy worst", "copy mean", "copy worst", "memcpy@16", "copy@16"
    );
    for &n in sizes {
        let iters = (20_000_000 / (n + 400)).max(20);
        let (mut sum, mut worst, mut at16) = ([0.0f64; 2], [0.0f64; 2], [0.0f64; 2]);
        let mut count = 0;
        for d in (0..4096).step_by(if n > 64 << 10 { 208 } else { 16 }) {
            let dst_at = src_at + n.next_multiple_of(4096) + 4096 + d;
            // SAFETY: both ranges lie inside `mem` and do not overlap.
            let (src, dst) = unsafe { (base.add(src_at) as *const u8, base.add(dst_at)) };
            let t = [
                time(
                    &mut || unsafe {
                        std::ptr::copy_nonoverlapping(black_box(src), black_box(dst), n)
                    },
                    iters,
                ),
                time(
                    &mut || unsafe { copy(black_box(dst), black_box(src), n) },
                    iters,
                ),
            ];
            for k in 0..2 {
                sum[k] += t[k];
                worst[k] = worst[k].max(t[k]);
                if d == 16 {
                    at16[k] = t[k];
                }
            }
            count += 1;
        }
        let c = count as f64;
        println!(
            "{n:>9} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>9.1} {:>9.1}",
            sum[0] / c,
            worst[0],
            sum[1] / c,
            worst[1],
            at16[0],
            at16[1]
        );
    }
}
