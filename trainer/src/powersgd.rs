//! PowerSGD (Vogels, Karimireddy and Jaggi, 2019): DDP's gradient average
//! at rank `r` instead of in full. Each 2-D gradient `M` (`n × m`) of a
//! rank becomes two thin factors by one step of power iteration on the
//! average:
//!
//! 1. `M += E` (error feedback: what compression lost last step),
//! 2. `P = M Q` and `P` averaged over the ranks (`n × r` floats),
//! 3. `P` orthonormalised (Gram–Schmidt, the same on every rank),
//! 4. `Q = Mᵀ P` averaged (`m × r` floats),
//! 5. the gradient used is `P Qᵀ`, and `E = M − P Qᵀ`.
//!
//! `Q` is kept from step to step (warm start: the iteration continues
//! rather than restarting), from the same seeded random start on every
//! rank. 1-D tensors (biases, norms) are averaged in full. So a rank sends
//! `(n + m) r` instead of `n m` floats per matrix; every rank ends with the
//! same gradient (every average is an all_reduce, every other step is the
//! same arithmetic on the same numbers), so replicas stay identical.

use crate::data::Rng;
use crate::model::UnitSpec;
use oxccl::{CoreCommunicator, ReduceOp};

/// One tensor of a unit: where it lies in the unit's flat buffer.
struct Tensor {
    unit: usize,
    offset: usize,
    rows: usize,
    cols: usize,
}

/// The compressor's state (persistent across steps on every rank).
pub struct PowerSgd {
    rank: usize,
    matrices: Vec<Tensor>,
    /// Per matrix: `Q` (`cols × rank`, warm) and the error `E`.
    q: Vec<Vec<f32>>,
    err: Vec<Vec<f32>>,
    /// Per unit: the stretches of 1-D tensors (`offset`, `len`).
    vectors: Vec<(usize, usize, usize)>,
}

impl PowerSgd {
    /// For a model of `layout` at rank `rank` (`Q` from `seed`, the same on
    /// every rank).
    pub fn new(layout: &[UnitSpec], rank: usize, seed: u64) -> PowerSgd {
        let mut matrices = Vec::new();
        let mut vectors = Vec::new();
        for (u, spec) in layout.iter().enumerate() {
            let mut offset = 0;
            for (_, shape) in spec {
                let len: usize = shape.iter().product();
                match shape.as_slice() {
                    &[rows, cols] if rank < rows.min(cols) => matrices.push(Tensor {
                        unit: u,
                        offset,
                        rows,
                        cols,
                    }),
                    _ => vectors.push((u, offset, len)),
                }
                offset += len;
            }
        }
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        let q = matrices
            .iter()
            .map(|t| (0..t.cols * rank).map(|_| rng.normal() as f32).collect())
            .collect();
        let err = matrices
            .iter()
            .map(|t| vec![0.0; t.rows * t.cols])
            .collect();
        PowerSgd {
            rank,
            matrices,
            q,
            err,
            vectors,
        }
    }

    /// Floats a rank hands to all_reduce per step (the uncompressed average
    /// would take every parameter's).
    pub fn floats_per_step(&self) -> usize {
        let m: usize = self
            .matrices
            .iter()
            .map(|t| (t.rows + t.cols) * self.rank)
            .sum();
        m + self.vectors.iter().map(|v| v.2).sum::<usize>()
    }

    /// Replace `grads` (by unit, as the model's layout flattens them) with
    /// the compressed average over `comm`'s ranks.
    pub fn all_reduce(
        &mut self,
        comm: &CoreCommunicator,
        grads: &mut [Vec<f32>],
    ) -> oxccl::Result<()> {
        let r = self.rank;
        // Every P in one buffer, one all_reduce; then every Q likewise.
        let p_len: usize = self.matrices.iter().map(|t| t.rows * r).sum();
        let mut ps = vec![0.0f32; p_len];
        let mut at = 0;
        for (k, t) in self.matrices.iter().enumerate() {
            let g = &mut grads[t.unit][t.offset..t.offset + t.rows * t.cols];
            for (x, e) in g.iter_mut().zip(&self.err[k]) {
                *x += e;
            }
            matmul(
                g,
                &self.q[k],
                &mut ps[at..at + t.rows * r],
                t.rows,
                t.cols,
                r,
            );
            at += t.rows * r;
        }
        comm.all_reduce_in_place(ps.as_mut_slice(), ReduceOp::Avg)?;
        let q_len: usize = self.matrices.iter().map(|t| t.cols * r).sum();
        let mut qs = vec![0.0f32; q_len];
        let (mut at_p, mut at_q) = (0, 0);
        for t in &self.matrices {
            let p = &mut ps[at_p..at_p + t.rows * r];
            orthonormalize(p, t.rows, r);
            let g = &grads[t.unit][t.offset..t.offset + t.rows * t.cols];
            matmul_t(g, p, &mut qs[at_q..at_q + t.cols * r], t.rows, t.cols, r);
            at_p += t.rows * r;
            at_q += t.cols * r;
        }
        comm.all_reduce_in_place(qs.as_mut_slice(), ReduceOp::Avg)?;
        let (mut at_p, mut at_q) = (0, 0);
        for (k, t) in self.matrices.iter().enumerate() {
            let (p, q) = (&ps[at_p..at_p + t.rows * r], &qs[at_q..at_q + t.cols * r]);
            let g = &mut grads[t.unit][t.offset..t.offset + t.rows * t.cols];
            for i in 0..t.rows {
                for j in 0..t.cols {
                    let approx: f32 = (0..r).map(|c| p[i * r + c] * q[j * r + c]).sum();
                    self.err[k][i * t.cols + j] = g[i * t.cols + j] - approx;
                    g[i * t.cols + j] = approx;
                }
            }
            self.q[k].copy_from_slice(q);
            at_p += t.rows * r;
            at_q += t.cols * r;
        }
        // The 1-D tensors, in full, in one buffer.
        let mut flat: Vec<f32> = self
            .vectors
            .iter()
            .flat_map(|&(u, o, n)| grads[u][o..o + n].iter().copied())
            .collect();
        comm.all_reduce_in_place(flat.as_mut_slice(), ReduceOp::Avg)?;
        let mut at = 0;
        for &(u, o, n) in &self.vectors {
            grads[u][o..o + n].copy_from_slice(&flat[at..at + n]);
            at += n;
        }
        Ok(())
    }
}

/// `out (n × r) = a (n × m) · b (m × r)`, row-major.
fn matmul(a: &[f32], b: &[f32], out: &mut [f32], n: usize, m: usize, r: usize) {
    for i in 0..n {
        for c in 0..r {
            out[i * r + c] = (0..m).map(|j| a[i * m + j] * b[j * r + c]).sum();
        }
    }
}

/// `out (m × r) = aᵀ (m × n) · p (n × r)`, row-major `a` (`n × m`).
fn matmul_t(a: &[f32], p: &[f32], out: &mut [f32], n: usize, m: usize, r: usize) {
    for j in 0..m {
        for c in 0..r {
            out[j * r + c] = (0..n).map(|i| a[i * m + j] * p[i * r + c]).sum();
        }
    }
}

/// Gram–Schmidt on the `r` columns of `p` (`n × r`, row-major); a column
/// that vanishes stays zero.
fn orthonormalize(p: &mut [f32], n: usize, r: usize) {
    for c in 0..r {
        for d in 0..c {
            let dot: f32 = (0..n).map(|i| p[i * r + c] * p[i * r + d]).sum();
            for i in 0..n {
                p[i * r + c] -= dot * p[i * r + d];
            }
        }
        let norm = (0..n)
            .map(|i| p[i * r + c] * p[i * r + c])
            .sum::<f32>()
            .sqrt();
        if norm > 1e-12 {
            for i in 0..n {
                p[i * r + c] /= norm;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthonormal_columns() {
        let (n, r) = (7, 3);
        let mut rng = Rng(3);
        let mut p: Vec<f32> = (0..n * r).map(|_| rng.normal() as f32).collect();
        orthonormalize(&mut p, n, r);
        for c in 0..r {
            for d in 0..r {
                let dot: f32 = (0..n).map(|i| p[i * r + c] * p[i * r + d]).sum();
                let want = if c == d { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-5, "{c},{d}: {dot}");
            }
        }
    }
}
