//! AdamW over flat f32 buffers (decoupled weight decay, bias correction),
//! so the same code steps a full unit (single, DDP) or a shard (ZeRO).

/// Hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> AdamW {
        AdamW {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Moments of one buffer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Moments {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl AdamW {
    /// One update of `params` with `grads`; `t` is the 1-based step.
    pub fn step(&self, t: u64, params: &mut [f32], grads: &[f32], mom: &mut Moments) {
        if mom.m.len() != params.len() {
            mom.m = vec![0.0; params.len()];
            mom.v = vec![0.0; params.len()];
        }
        let bc1 = 1.0 - self.beta1.powi(t as i32);
        let bc2 = 1.0 - self.beta2.powi(t as i32);
        for i in 0..params.len() {
            let g = grads[i];
            mom.m[i] = self.beta1 * mom.m[i] + (1.0 - self.beta1) * g;
            mom.v[i] = self.beta2 * mom.v[i] + (1.0 - self.beta2) * g * g;
            let mh = mom.m[i] / bc1;
            let vh = mom.v[i] / bc2;
            params[i] -= self.lr * (mh / (vh.sqrt() + self.eps) + self.weight_decay * params[i]);
        }
    }
}
