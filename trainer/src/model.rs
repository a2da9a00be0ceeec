//! A small decoder-only transformer (GPT-style, pre-norm) in candle.
//!
//! Parameters live as *flat units* — one `Vec<f32>` per group that
//! communication treats as a whole (the embeddings, each block, the head),
//! the layout FSDP/ZeRO use. For a step, each unit's buffer is wrapped into
//! candle `Var`s; after backward, gradients are flattened back the same way.

use crate::data::Rng;
use candle_core::{DType, Device, Result, Tensor, Var, D};

/// Model size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub seq: usize,
}

/// Name and shape of every tensor of one unit.
pub type UnitSpec = Vec<(String, Vec<usize>)>;

impl ModelConfig {
    /// Units in order: embeddings, one per block, head.
    pub fn layout(&self) -> Vec<UnitSpec> {
        let (d, v, t) = (self.d_model, self.vocab, self.seq);
        let p = |n: &str, s: &[usize]| (n.to_string(), s.to_vec());
        let mut units = vec![vec![p("tok_emb", &[v, d]), p("pos_emb", &[t, d])]];
        for _ in 0..self.layers {
            units.push(vec![
                p("ln1_g", &[d]),
                p("ln1_b", &[d]),
                p("w_qkv", &[d, 3 * d]),
                p("b_qkv", &[3 * d]),
                p("w_o", &[d, d]),
                p("b_o", &[d]),
                p("ln2_g", &[d]),
                p("ln2_b", &[d]),
                p("w_fc", &[d, 4 * d]),
                p("b_fc", &[4 * d]),
                p("w_proj", &[4 * d, d]),
                p("b_proj", &[d]),
            ]);
        }
        units.push(vec![
            p("lnf_g", &[d]),
            p("lnf_b", &[d]),
            p("w_head", &[d, v]),
        ]);
        units
    }

    /// Parameters of each unit.
    pub fn unit_lens(&self) -> Vec<usize> {
        self.layout()
            .iter()
            .map(|u| u.iter().map(|(_, s)| s.iter().product::<usize>()).sum())
            .collect()
    }

    /// Parameters in total.
    pub fn parameters(&self) -> usize {
        self.layout()
            .iter()
            .flatten()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

/// Deterministic initial weights (GPT-2 style), one flat buffer per unit.
pub fn init(cfg: &ModelConfig, seed: u64) -> Vec<Vec<f32>> {
    init_units(cfg, seed).collect()
}

/// The same weights, one unit at a time (ZeRO-3 keeps only its shard of
/// each, so no rank ever holds the whole model).
pub fn init_units(cfg: &ModelConfig, seed: u64) -> impl Iterator<Item = Vec<f32>> {
    let mut rng = Rng(seed);
    let layers = cfg.layers;
    cfg.layout().into_iter().map(move |unit| {
        let mut flat = Vec::new();
        for (name, shape) in &unit {
            let n: usize = shape.iter().product();
            let is_gain = name.ends_with("_g");
            let is_bias = name.starts_with("b_") || name.ends_with("_b");
            let scale = if name == "w_proj" || name == "w_o" {
                0.02 / (2.0 * layers as f64).sqrt()
            } else {
                0.02
            };
            flat.extend((0..n).map(|_| {
                if is_gain {
                    1.0
                } else if is_bias {
                    0.0
                } else {
                    (rng.normal() * scale) as f32
                }
            }));
        }
        flat
    })
}

/// Wrap one unit's flat buffer into candle variables.
pub fn unit_vars(spec: &UnitSpec, flat: &[f32], dev: &Device) -> Result<Vec<Var>> {
    let mut off = 0;
    spec.iter()
        .map(|(_, shape)| {
            let n: usize = shape.iter().product();
            let t = Tensor::from_slice(&flat[off..off + n], shape.as_slice(), dev)?;
            off += n;
            Var::from_tensor(&t)
        })
        .collect()
}

/// Flatten the gradients of one unit's variables (zeros where none).
pub fn unit_grads(
    vars: &[Var],
    grads: &candle_core::backprop::GradStore,
    out: &mut Vec<f32>,
) -> Result<()> {
    for v in vars {
        match grads.get(v.as_tensor()) {
            Some(g) => out.extend(g.flatten_all()?.to_vec1::<f32>()?),
            None => out.extend(std::iter::repeat_n(0.0, v.as_tensor().elem_count())),
        }
    }
    Ok(())
}

fn layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
    xn.broadcast_mul(g)?.broadcast_add(b)
}

/// Embeddings: token ids (rows × seq) -> activations (rows, seq, d).
pub fn embed(
    cfg: &ModelConfig,
    p: &[Var],
    ids: &[u32],
    rows: usize,
    dev: &Device,
) -> Result<Tensor> {
    let ids = Tensor::from_slice(ids, (rows * cfg.seq,), dev)?;
    let tok = p[0]
        .as_tensor()
        .index_select(&ids, 0)?
        .reshape((rows, cfg.seq, cfg.d_model))?;
    tok.broadcast_add(p[1].as_tensor())
}

/// Where a block's divided layers meet the rest of the model. In one
/// process (and DDP, ZeRO) nothing is divided: [`Whole`]. Under tensor
/// parallelism ([`crate::tp`]) each of `ranks` ranks holds `1/ranks` of
/// the heads and of the MLP's hidden columns: `enter` precedes a
/// column-parallel layer (Megatron's *f*: identity forward, gradients
/// summed over the group backward) and `leave` follows a row-parallel one
/// (*g*: partial outputs summed forward, identity backward).
pub trait Shards {
    /// Ranks the heads and hidden columns are divided among.
    fn ranks(&self) -> usize;
    fn enter(&self, x: &Tensor) -> Result<Tensor>;
    fn leave(&self, x: &Tensor) -> Result<Tensor>;
}

/// Nothing divided.
pub struct Whole;

impl Shards for Whole {
    fn ranks(&self) -> usize {
        1
    }
    fn enter(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn leave(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
}

/// One transformer block (pre-norm attention + MLP, residual).
pub fn block(cfg: &ModelConfig, p: &[Var], x: &Tensor) -> Result<Tensor> {
    block_sharded(cfg, p, x, &Whole)
}

/// [`block`] on this rank's part of the block: `p` holds the columns of
/// its heads in `w_qkv`/`b_qkv` (of q, k and v each), their rows of
/// `w_o`, its hidden columns of `w_fc`/`b_fc` and rows of `w_proj`; the
/// norms and output biases whole.
pub fn block_sharded(cfg: &ModelConfig, p: &[Var], x: &Tensor, s: &dyn Shards) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let h = cfg.heads / s.ranks();
    let dh = cfg.d_model / cfg.heads;
    let dl = h * dh;
    let w = |i: usize| p[i].as_tensor();
    let a = s.enter(&layer_norm(x, w(0), w(1))?)?;
    let qkv = a.broadcast_matmul(w(2))?.broadcast_add(w(3))?;
    let heads = |i: usize| -> Result<Tensor> {
        qkv.narrow(D::Minus1, i * dl, dl)?
            .reshape((b, t, h, dh))?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
    let scores = (q.matmul(&k.t()?)? / (dh as f64).sqrt())?;
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    let mask = Tensor::from_slice(&mask, (t, t), x.device())?;
    let att = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
    let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, dl))?;
    let y = s.leave(&y.broadcast_matmul(w(4))?)?;
    let x = (x + y.broadcast_add(w(5))?)?;
    let m = s.enter(&layer_norm(&x, w(6), w(7))?)?;
    let m = m.broadcast_matmul(w(8))?.broadcast_add(w(9))?.gelu()?;
    x + s.leave(&m.broadcast_matmul(w(10))?)?.broadcast_add(w(11))?
}

/// Final norm, logits and mean cross-entropy against `targets`.
pub fn head_loss(cfg: &ModelConfig, p: &[Var], x: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let xn = layer_norm(x, p[0].as_tensor(), p[1].as_tensor())?;
    let logits = xn
        .broadcast_matmul(p[2].as_tensor())?
        .reshape((b * t, cfg.vocab))?;
    let y = Tensor::from_slice(targets, (b * t,), x.device())?;
    candle_nn::loss::cross_entropy(&logits, &y)
}

/// Whole forward pass to the mean loss.
pub fn loss(
    cfg: &ModelConfig,
    units: &[Vec<Var>],
    ids: &[u32],
    targets: &[u32],
    rows: usize,
    dev: &Device,
) -> Result<Tensor> {
    loss_sharded(cfg, units, ids, targets, rows, dev, &Whole)
}

/// [`loss`] with the blocks divided as `s` says (embeddings and head whole).
pub fn loss_sharded(
    cfg: &ModelConfig,
    units: &[Vec<Var>],
    ids: &[u32],
    targets: &[u32],
    rows: usize,
    dev: &Device,
    s: &dyn Shards,
) -> Result<Tensor> {
    let batch = Batch {
        ids,
        targets,
        rows,
        dev,
    };
    forward_units(cfg, 0, units, None, &batch, s)
}

/// The rows a forward pass runs on.
pub struct Batch<'a> {
    pub ids: &'a [u32],
    pub targets: &'a [u32],
    pub rows: usize,
    pub dev: &'a Device,
}

/// Units `first..first + units.len()` of the model (a pipeline stage's):
/// from `input` (the previous unit's activations; `None` when the
/// embeddings are among them), to the activations of the last one, or to
/// the mean loss when the head is.
pub fn forward_units(
    cfg: &ModelConfig,
    first: usize,
    units: &[Vec<Var>],
    input: Option<&Tensor>,
    b: &Batch<'_>,
    s: &dyn Shards,
) -> Result<Tensor> {
    let head = cfg.layers + 1;
    let mut x = input.cloned();
    for (k, p) in units.iter().enumerate() {
        let u = first + k;
        let prev = || {
            x.clone()
                .ok_or_else(|| candle_core::Error::Msg(format!("unit {u} run without its input")))
        };
        x = Some(match u {
            0 => embed(cfg, p, b.ids, b.rows, b.dev)?,
            _ if u == head => return head_loss(cfg, p, &prev()?, b.targets),
            _ => block_sharded(cfg, p, &prev()?, s)?,
        });
    }
    x.ok_or_else(|| candle_core::Error::Msg("a stage of no units".into()))
}

/// A scalar tensor's value.
pub fn scalar(t: &Tensor) -> Result<f32> {
    t.to_dtype(DType::F32)?.to_scalar::<f32>()
}
