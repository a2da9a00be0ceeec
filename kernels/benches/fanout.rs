//! The owner's work in a registered all_reduce on 4 ranks, in one process:
//! 4 inputs and 4 outputs; 2 threads each own 2 of the 4 segments, combine
//! their segment of every input and write it into every output. Three ways,
//! alternating, on the same buffers:
//!
//! - `copy`: each segment of each input streamed into the same output
//!   (the same bytes read and written: the memory bound),
//! - `split`: `reduce_n` of a 256 KiB piece into a scratch slot, then a
//!   streaming copy of the slot into every output (the push before
//!   `reduce_n_fanout`),
//! - `fused`: `reduce_n_fanout`, streaming.
//!
//! Figures are all_reduce bus bandwidth (2 (n-1)/n × bytes per rank / time),
//! median of the rounds. `cargo bench -p kernels --bench fanout` (add
//! `-- quick` for 64 MiB per buffer instead of 256).

use kernels::{copy::copy_streaming, reduce_n, reduce_n_fanout, Op};
use std::time::Instant;

const RANKS: usize = 4;
const PIECE: usize = (256 << 10) / 4;

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Copy,
    Split,
    Fused,
}

/// Owner `o`'s segment: combine it and write it everywhere, `way`.
///
/// # Safety
/// `ins` and `outs` hold `n` floats each, not overlapping; no other thread
/// touches segment `o`.
unsafe fn own(way: Way, o: usize, n: usize, ins: &[usize], outs: &[usize], slot: &mut [f32]) {
    let seg = n / RANKS;
    let mut at = o * seg;
    while at < (o + 1) * seg {
        let l = PIECE.min((o + 1) * seg - at);
        let s: [*const f32; RANKS] = std::array::from_fn(|k| (ins[k] as *const f32).add(at));
        let d: [*mut f32; RANKS] = std::array::from_fn(|k| (outs[k] as *mut f32).add(at));
        match way {
            Way::Copy => {
                for k in 0..RANKS {
                    copy_streaming(d[k] as *mut u8, s[k] as *const u8, l * 4);
                }
            }
            Way::Split => {
                let v: [&[f32]; RANKS] =
                    std::array::from_fn(|k| std::slice::from_raw_parts(s[k], l));
                reduce_n(Op::Sum, &mut slot[..l], &v);
                for dk in d {
                    copy_streaming(dk as *mut u8, slot.as_ptr() as *const u8, l * 4);
                }
            }
            Way::Fused => reduce_n_fanout(Op::Sum, &d, &s, l, d.len()),
        }
        at += l;
    }
}

fn run(way: Way, n: usize, ins: &[usize], outs: &[usize]) -> f64 {
    let t = Instant::now();
    std::thread::scope(|sc| {
        for th in 0..2 {
            sc.spawn(move || {
                let mut slot = vec![0f32; PIECE];
                for o in [2 * th, 2 * th + 1] {
                    // SAFETY: the buffers hold n floats each; thread th
                    // alone owns segments 2 th and 2 th + 1.
                    unsafe { own(way, o, n, ins, outs, &mut slot) };
                }
            });
        }
    });
    let bytes = (n * 4) as f64;
    2.0 * (RANKS as f64 - 1.0) / RANKS as f64 * bytes / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let n = if quick { 16 << 20 } else { 64 << 20 };
    let ins: Vec<Vec<f32>> = (0..RANKS).map(|k| vec![k as f32; n]).collect();
    // Outputs 64-byte aligned alike, as registered buffers are.
    let mut outs: Vec<Vec<f32>> = (0..RANKS).map(|_| vec![1f32; n + 16]).collect();
    let ip: Vec<usize> = ins.iter().map(|v| v.as_ptr() as usize).collect();
    let op: Vec<usize> = outs
        .iter_mut()
        .map(|v| (v.as_mut_ptr() as usize + 63) & !63)
        .collect();
    let ways = [
        (Way::Copy, "copy"),
        (Way::Split, "split"),
        (Way::Fused, "fused"),
    ];
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    run(Way::Fused, n, &ip, &op); // warm-up: every page touched
    for round in 0..6 {
        for j in 0..ways.len() {
            let j = if round % 2 == 0 {
                j
            } else {
                ways.len() - 1 - j
            };
            got[j].push(run(ways[j].0, n, &ip, &op));
        }
    }
    run(Way::Fused, n, &ip, &op);
    // SAFETY: op[1] points into outs[1], n floats from there.
    let probe = unsafe { *(op[1] as *const f32).add(n / 2 + 1) };
    assert_eq!(probe, 6.0, "the fused result is wrong");
    println!(
        "{} MiB per buffer, {RANKS} inputs and outputs, 2 threads; all_reduce busbw GB/s, median of 6 (min-max):",
        (n * 4) >> 20
    );
    for (j, (_, name)) in ways.iter().enumerate() {
        let v = &mut got[j];
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "  {name:6} {:6.2} ({:.2}-{:.2})",
            (v[2] + v[3]) / 2.0,
            v[0],
            v[5]
        );
    }
}
