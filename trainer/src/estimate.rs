//! `trainer --estimate`: memory per rank of a large model under a layout
//! (tensor × pipeline × data parallel, ZeRO stage, pipeline schedule),
//! by the usual rules of thumb — what this trainer's small runs measure,
//! extrapolated to sizes it cannot run.
//!
//! - **Model states**, mixed-precision Adam: 2 B of fp16 parameters, 2 B
//!   of fp16 gradients and K = 12 B of fp32 master copy, m and v per
//!   parameter (ZeRO paper). Tensor and pipeline parallelism divide all of
//!   it by `t · p` (embeddings and head are counted as evenly spread:
//!   a real first or last stage holds somewhat more); ZeRO stages then
//!   divide the optimizer (1), plus gradients (2), plus parameters (3) by
//!   the data-parallel degree `d`.
//! - **Activations** (Korthikanti et al., 2022, fp16, no recomputation, no
//!   sequence parallelism): per layer and micro-batch of `b` sequences of
//!   `s` tokens, hidden size `h`, `a` heads, `t`-way tensor parallel:
//!   `s b h (10 + 24 / t + 5 a s / (h t))` bytes. A stage holds `L / p`
//!   layers for as many micro-batches as its schedule keeps in flight: all
//!   `m` under GPipe, `p` on the first stage under 1F1B.

use crate::schedule::Schedule;

/// A transformer's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub params: f64,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
}

impl Shape {
    /// Well-known shapes near `params` (LLaMA's 7B, 13B, 70B; GPT-3's
    /// 175B), else layers and hidden size from `params ≈ 12 L h²` with
    /// `h = 128 L` and 128-wide heads.
    pub fn of(params: f64) -> Shape {
        const KNOWN: [(f64, usize, usize, usize); 4] = [
            (7e9, 32, 4096, 32),
            (13e9, 40, 5120, 40),
            (70e9, 80, 8192, 64),
            (175e9, 96, 12288, 96),
        ];
        for (p, layers, hidden, heads) in KNOWN {
            if (params / p - 1.0).abs() < 0.1 {
                return Shape {
                    params,
                    layers,
                    hidden,
                    heads,
                };
            }
        }
        let layers = (params / (12.0 * 128.0 * 128.0)).cbrt().round().max(1.0) as usize;
        let hidden = (128 * layers).max(128);
        Shape {
            params,
            layers,
            hidden,
            heads: hidden / 128,
        }
    }
}

/// A layout and the step's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub t: usize,
    pub p: usize,
    pub d: usize,
    /// ZeRO stage within the data-parallel group (0: plain DDP).
    pub zero: u8,
    pub seq: usize,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    pub schedule: Schedule,
}

/// Bytes one rank holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerRank {
    pub params: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub activations: f64,
}

impl PerRank {
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer + self.activations
    }
}

/// Memory of the busiest rank (the first pipeline stage) under `plan`.
pub fn per_rank(m: &Shape, plan: &Plan) -> PerRank {
    let slice = m.params / (plan.t * plan.p) as f64;
    let d = plan.d as f64;
    let by = |stage: u8| if plan.zero >= stage { d } else { 1.0 };
    let (s, b, h, a, t) = (
        plan.seq as f64,
        plan.micro_batch as f64,
        m.hidden as f64,
        m.heads as f64,
        plan.t as f64,
    );
    let per_layer = s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
    let held = match plan.schedule {
        Schedule::GPipe => plan.micro_batches,
        Schedule::OneFOneB => plan.p.min(plan.micro_batches),
    } as f64;
    PerRank {
        params: 2.0 * slice / by(3),
        grads: 2.0 * slice / by(2),
        optimizer: 12.0 * slice / by(1),
        activations: per_layer * (m.layers as f64 / plan.p as f64) * held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(t: usize, p: usize, d: usize, zero: u8, schedule: Schedule) -> Plan {
        Plan {
            t,
            p,
            d,
            zero,
            seq: 2048,
            micro_batch: 1,
            micro_batches: 16,
            schedule,
        }
    }

    #[test]
    fn model_states_divide_as_the_layout_says() {
        let m = Shape::of(7e9);
        assert_eq!((m.layers, m.hidden, m.heads), (32, 4096, 32));
        let one = per_rank(&m, &plan(1, 1, 1, 0, Schedule::OneFOneB));
        assert_eq!(one.params + one.grads + one.optimizer, 16.0 * 7e9); // 112 GB
        let tp8pp4 = per_rank(&m, &plan(8, 4, 2, 0, Schedule::OneFOneB));
        assert_eq!(
            tp8pp4.params + tp8pp4.grads + tp8pp4.optimizer,
            16.0 * 7e9 / 32.0
        );
        let z3 = per_rank(&m, &plan(8, 4, 2, 3, Schedule::OneFOneB));
        assert_eq!(z3.params + z3.grads + z3.optimizer, 16.0 * 7e9 / 64.0);
        let z1 = per_rank(&m, &plan(1, 1, 4, 1, Schedule::OneFOneB));
        assert_eq!(z1.optimizer, 12.0 * 7e9 / 4.0);
        assert_eq!(z1.params, 2.0 * 7e9);
    }

    #[test]
    fn activations_follow_the_schedule() {
        let m = Shape::of(70e9);
        let g = per_rank(&m, &plan(8, 4, 1, 0, Schedule::GPipe));
        let f = per_rank(&m, &plan(8, 4, 1, 0, Schedule::OneFOneB));
        // GPipe holds all 16 micro-batches, 1F1B's first stage p = 4.
        assert!((g.activations / f.activations - 4.0).abs() < 1e-12);
        // Korthikanti's figure for one layer, s = 2048, b = 1, h = 8192,
        // a = 64, t = 8: s b h (10 + 24/8 + 5 a s / (h t)) bytes.
        let layer = 2048.0 * 8192.0 * (13.0 + 5.0 * 64.0 * 2048.0 / (8192.0 * 8.0));
        assert!((f.activations - layer * 20.0 * 4.0).abs() < 1.0);
    }

    #[test]
    fn other_sizes_get_a_plausible_shape() {
        let m = Shape::of(1e9);
        let p = 12.0 * m.layers as f64 * (m.hidden as f64).powi(2);
        assert!(p > 0.5e9 && p < 2e9, "{m:?}: {p:e}");
    }
}
