//! Tensor parallelism, Megatron-style: the ranks of a tensor-parallel group
//! (`T` of them, a split communicator) each hold `1/T` of every block —
//! the q, k and v columns of `heads / T` heads and the matching rows of the
//! attention's output projection, `4 d / T` hidden columns of the MLP's
//! first layer and the matching rows of its second — and run the block on
//! their part: the column-parallel layers need nothing from the others,
//! the row-parallel ones leave partial sums that one `all_reduce` per
//! sub-block completes (forward), and the gradient reaching a sub-block's
//! input is summed the same way (backward). Two all_reduces of `rows ×
//! seq × d` floats per block each way.
//!
//! Stated simplification: the embeddings, the final norm and the head are
//! whole on every rank of the group (not vocabulary-parallel); with this
//! trainer's character vocabularies they are a small share of the model.
//! Every rank of the group computes them on the same inputs, so their
//! gradients are bitwise equal and need no communication.
//!
//! With data parallelism (`T × D` ranks): the `D` groups take different
//! rows of each batch and average their gradients as DDP does, over the
//! communicator of the ranks holding the same part (see
//! [`crate::pp::Layout`], which also adds pipeline stages).

use crate::data::Corpus;
use crate::model::{self, ModelConfig, Shards, UnitSpec};
use crate::optim::Moments;
use crate::train::{StepStats, TrainConfig, TrainError, TrainState};
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use oxccl::{Communicator, CoreCommunicator, ReduceOp};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How one tensor of a unit is divided among a group's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every rank holds all of it.
    Whole,
    /// Along dimension `dim`, in `groups` equal blocks (q, k and v of
    /// `w_qkv` are three), each cut into `T` equal parts; rank `r` holds
    /// part `r` of every block.
    Cut { dim: usize, groups: usize },
}

/// The split of the tensor named `name` (names of [`ModelConfig::layout`]).
pub fn split_of(name: &str) -> Split {
    match name {
        "w_qkv" => Split::Cut { dim: 1, groups: 3 },
        "b_qkv" => Split::Cut { dim: 0, groups: 3 },
        "w_fc" => Split::Cut { dim: 1, groups: 1 },
        "b_fc" | "w_o" | "w_proj" => Split::Cut { dim: 0, groups: 1 },
        _ => Split::Whole,
    }
}

/// The stretches `(offset, len)` of a row-major tensor of `shape` that
/// rank `r` of `t` holds, in the order it stores them.
fn stretches(shape: &[usize], split: Split, r: usize, t: usize) -> Vec<(usize, usize)> {
    let n: usize = shape.iter().product();
    match split {
        Split::Whole => vec![(0, n)],
        Split::Cut { dim, groups } => {
            let outer: usize = shape[..dim].iter().product();
            let inner: usize = shape[dim + 1..].iter().product();
            let block = shape[dim] / groups;
            let part = block / t;
            let mut v = Vec::with_capacity(outer * groups);
            for o in 0..outer {
                for g in 0..groups {
                    let at = (o * shape[dim] + g * block + r * part) * inner;
                    v.push((at, part * inner));
                }
            }
            v
        }
    }
}

/// The shapes rank-local tensors of `spec` have with `t` ranks.
pub fn local_spec(spec: &UnitSpec, t: usize) -> UnitSpec {
    spec.iter()
        .map(|(name, shape)| {
            let mut s = shape.clone();
            if let Split::Cut { dim, .. } = split_of(name) {
                s[dim] /= t;
            }
            (name.clone(), s)
        })
        .collect()
}

/// Rank `r`'s part of one unit's flat buffer `full`.
pub fn shard_unit(spec: &UnitSpec, full: &[f32], r: usize, t: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(full.len() / t);
    let mut base = 0;
    for (name, shape) in spec {
        for (at, len) in stretches(shape, split_of(name), r, t) {
            out.extend_from_slice(&full[base + at..base + at + len]);
        }
        base += shape.iter().product::<usize>();
    }
    out
}

/// The unit whose parts, by rank, are `parts` (whole tensors from rank 0).
pub fn unshard_unit(spec: &UnitSpec, parts: &[&[f32]]) -> Vec<f32> {
    let t = parts.len();
    let total: usize = spec.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let mut full = vec![0.0; total];
    let mut read = vec![0usize; t];
    let mut base = 0;
    for (name, shape) in spec {
        let split = split_of(name);
        for (r, part) in parts.iter().enumerate() {
            for (at, len) in stretches(shape, split, r, t) {
                if split == Split::Whole && r > 0 {
                    read[r] += len; // every rank's copy is the same
                    continue;
                }
                full[base + at..base + at + len].copy_from_slice(&part[read[r]..read[r] + len]);
                read[r] += len;
            }
        }
        base += shape.iter().product::<usize>();
    }
    full
}

/// Whether `cfg` divides among `t` ranks: whole heads per rank.
pub fn validate(cfg: &ModelConfig, t: usize) -> Result<(), TrainError> {
    if t == 0 || !cfg.heads.is_multiple_of(t) {
        return Err(TrainError::Config(format!(
            "tensor parallelism over {t} ranks needs a multiple of {t} heads (the model has {})",
            cfg.heads
        )));
    }
    Ok(())
}

/// This rank's part of the initial weights (one unit whole at a time).
pub fn init_state(cfg: &TrainConfig, r: usize, t: usize) -> TrainState {
    init_units_of(cfg, r, t, 0..cfg.model.layout().len())
}

/// [`init_state`] of the units `units` only (a pipeline stage's): every
/// unit is drawn in turn (the seeded stream runs through all of them) and
/// dropped unless it is one of them, so no rank holds the whole model.
pub(crate) fn init_units_of(
    cfg: &TrainConfig,
    r: usize,
    t: usize,
    units: Range<usize>,
) -> TrainState {
    let params: Vec<Vec<f32>> = model::init_units(&cfg.model, cfg.seed)
        .zip(cfg.model.layout())
        .enumerate()
        .filter(|(u, _)| units.contains(u))
        .map(|(_, (full, spec))| shard_unit(&spec, &full, r, t))
        .collect();
    let moments = params.iter().map(|_| Moments::default()).collect();
    TrainState {
        step: 0,
        params,
        moments,
    }
}

/// Rank `r`'s part of a whole state (a checkpoint of any run: single,
/// DDP, or tensor-parallel at any `T`).
pub fn shard_state(cfg: &ModelConfig, full: &TrainState, r: usize, t: usize) -> TrainState {
    shard_units_of(cfg, full, r, t, 0..full.params.len())
}

/// [`shard_state`] of the units `units` only (a pipeline stage's).
pub(crate) fn shard_units_of(
    cfg: &ModelConfig,
    full: &TrainState,
    r: usize,
    t: usize,
    units: Range<usize>,
) -> TrainState {
    let layout = cfg.layout();
    let part = |v: &[f32], u: usize| match v.is_empty() {
        true => Vec::new(), // moments before the first step
        false => shard_unit(&layout[u], v, r, t),
    };
    let moments = |u: usize| match full.moments.get(u) {
        Some(m) => Moments {
            m: part(&m.m, u),
            v: part(&m.v, u),
        },
        None => Moments::default(),
    };
    TrainState {
        step: full.step,
        params: units.clone().map(|u| part(&full.params[u], u)).collect(),
        moments: units.map(moments).collect(),
    }
}

/// The whole state from every rank's part (collective over `tp`).
pub fn gather_state(
    cfg: &ModelConfig,
    st: &TrainState,
    tp: &CoreCommunicator,
) -> oxccl::Result<TrainState> {
    gather_units_of(&cfg.layout(), st, tp)
}

/// [`gather_state`] of a state holding the units `specs` (a stage's).
pub(crate) fn gather_units_of(
    specs: &[UnitSpec],
    st: &TrainState,
    tp: &CoreCommunicator,
) -> oxccl::Result<TrainState> {
    let (m, v): (Vec<Vec<f32>>, Vec<Vec<f32>>) = st
        .moments
        .iter()
        .map(|x| (x.m.clone(), x.v.clone()))
        .unzip();
    let m = gather_units(specs, &m, tp)?;
    let v = gather_units(specs, &v, tp)?;
    Ok(TrainState {
        step: st.step,
        params: gather_units(specs, &st.params, tp)?,
        moments: m
            .into_iter()
            .zip(v)
            .map(|(m, v)| Moments { m, v })
            .collect(),
    })
}

/// Whole units from every rank's parts `mine` (empty stays empty).
fn gather_units(
    specs: &[UnitSpec],
    mine: &[Vec<f32>],
    tp: &CoreCommunicator,
) -> oxccl::Result<Vec<Vec<f32>>> {
    let t = tp.nranks();
    specs
        .iter()
        .zip(mine)
        .map(|(spec, mine)| {
            if mine.is_empty() {
                return Ok(Vec::new());
            }
            let mut all = vec![0.0f32; mine.len() * t];
            tp.all_gather(mine.as_slice(), all.as_mut_slice())?;
            let parts: Vec<&[f32]> = all.chunks(mine.len()).collect();
            Ok(unshard_unit(spec, &parts))
        })
        .collect()
}

/// The group's collectives inside the autograd graph ([`Shards`]), with
/// the time they take.
struct Group {
    comm: Arc<Communicator>,
    nanos: Arc<AtomicU64>,
}

impl Group {
    fn sum(&self, v: &mut [f32]) -> candle_core::Result<()> {
        let t = Instant::now();
        let r = self.comm.all_reduce_in_place(v, ReduceOp::Sum);
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r.map_err(candle_core::Error::wrap)
    }
}

/// A contiguous f32 tensor's elements.
fn f32s<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => Err(candle_core::Error::Msg(
            "tensor parallelism takes contiguous f32 tensors".into(),
        )),
    }
}

/// Megatron's *f*: identity forward; backward, the gradient summed over
/// the group (each rank's part of the next layer contributed a share).
struct Enter(Arc<Group>);

impl CustomOp1 for Enter {
    fn name(&self) -> &'static str {
        "tp-enter"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(f32s(s, l)?.to_vec()), l.shape().clone()))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let mut v = grad.flatten_all()?.to_vec1::<f32>()?;
        self.0.sum(&mut v)?;
        Tensor::from_vec(v, grad.shape(), grad.device()).map(Some)
    }
}

/// Megatron's *g*: forward, the partial outputs summed over the group;
/// identity backward.
struct Leave(Arc<Group>);

impl CustomOp1 for Leave {
    fn name(&self) -> &'static str {
        "tp-leave"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let mut v = f32s(s, l)?.to_vec();
        self.0.sum(&mut v)?;
        Ok((CpuStorage::F32(v), l.shape().clone()))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.clone()))
    }
}

/// The tensor-parallel group as the model sees it ([`Shards`]).
pub(crate) struct Divided(Arc<Group>);

impl Divided {
    pub(crate) fn new(comm: Arc<Communicator>) -> Divided {
        Divided(Arc::new(Group {
            comm,
            nanos: Arc::new(AtomicU64::new(0)),
        }))
    }

    /// Seconds spent in the group's all_reduces so far.
    pub(crate) fn seconds(&self) -> f64 {
        self.0.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

impl Shards for Divided {
    fn ranks(&self) -> usize {
        self.0.comm.nranks()
    }
    fn enter(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1(Enter(self.0.clone()))
    }
    fn leave(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1(Leave(self.0.clone()))
    }
}

/// One optimizer step on this rank's part (`st`, from [`init_state`]):
/// the group `tp` runs each block together on the same rows; `dp` (if
/// more than one rank) averages gradients across groups like DDP. (The
/// pipeline's step with one stage, `accum` micro-batches.)
pub fn step(
    cfg: &TrainConfig,
    corpus: &Corpus,
    st: &mut TrainState,
    tp: &Arc<Communicator>,
    dp: Option<&CoreCommunicator>,
) -> Result<StepStats, TrainError> {
    let par = crate::pp::Parallel {
        tp: Some(tp),
        pp: None,
        dp,
        micro_batches: cfg.accum,
        schedule: crate::schedule::Schedule::OneFOneB,
    };
    crate::pp::step(cfg, corpus, st, &par).map(|(s, _)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_element_once_and_reassemble() {
        let cfg = ModelConfig {
            vocab: 5,
            d_model: 8,
            layers: 1,
            heads: 4,
            seq: 3,
        };
        for spec in cfg.layout() {
            let n: usize = spec.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
            let full: Vec<f32> = (0..n).map(|i| i as f32).collect();
            for t in [1, 2, 4] {
                let parts: Vec<Vec<f32>> = (0..t).map(|r| shard_unit(&spec, &full, r, t)).collect();
                let local: usize = local_spec(&spec, t)
                    .iter()
                    .map(|(_, s)| s.iter().product::<usize>())
                    .sum();
                assert!(parts.iter().all(|p| p.len() == local), "t={t}");
                let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
                assert_eq!(unshard_unit(&spec, &refs), full, "t={t}");
            }
        }
        // Rank 1 of 2 holds q, k and v columns of heads 2 and 3.
        let w = [("w_qkv".to_string(), vec![1, 24])];
        let full: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let want: Vec<f32> = [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]
            .map(|i| i as f32)
            .to_vec();
        assert_eq!(shard_unit(&w.to_vec(), &full, 1, 2), want);
    }
}
