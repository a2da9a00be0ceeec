//! ZeRO-3: parameters, gradients and AdamW state sharded over the ranks.
//!
//! Each rank owns `1/N` of every unit's flat parameters (padded to a
//! multiple of `N`). A step runs the forward unit by unit: all-gather the
//! unit (the next unit's gather is already in flight: prefetch), compute,
//! keep only the unit's *input* activation, free the gathered copy. Backward
//! walks the units in reverse: gather again, recompute the unit's forward
//! from its saved input with gradients on (activation checkpointing),
//! backpropagate the incoming gradient, reduce-scatter the unit's gradients
//! to their owners (asynchronously) and free everything full-sized. Each
//! rank then steps AdamW on its shard only.

use crate::data::Corpus;
use crate::model::{self, ModelConfig};
use crate::optim::Moments;
use crate::train::{StepStats, TrainConfig, TrainError, TrainState};
use candle_core::{Device, Tensor, Var};
use oxccl::{Communicator, ReduceOp, Work};
use std::time::Instant;

/// One rank's shard of the training state.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardState {
    pub step: u64,
    /// This rank's slice of each unit (padded).
    pub shards: Vec<Vec<f32>>,
    pub moments: Vec<Moments>,
    /// True length of each unit.
    pub lens: Vec<usize>,
}

/// Bytes a rank holds, by kind (f32 everywhere in this trainer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Memory {
    pub params: usize,
    pub grads: usize,
    pub optimizer: usize,
    /// Largest total of gathered (full-unit) parameter and gradient buffers
    /// alive at once during the step.
    pub peak_gathered: usize,
}

impl Memory {
    /// Parameters + gradients + optimizer state.
    pub fn persistent(&self) -> usize {
        self.params + self.grads + self.optimizer
    }
}

fn shard_len(len: usize, n: usize) -> usize {
    len.div_ceil(n)
}

impl ShardState {
    /// This rank's shard of a full state (initialisation, tests).
    pub fn from_full(full: &TrainState, rank: usize, n: usize) -> ShardState {
        let mut shards = Vec::new();
        let mut moments = Vec::new();
        for (u, p) in full.params.iter().enumerate() {
            let s = shard_len(p.len(), n);
            let take = |v: &[f32]| -> Vec<f32> {
                (rank * s..(rank + 1) * s)
                    .map(|i| v.get(i).copied().unwrap_or(0.0))
                    .collect()
            };
            shards.push(take(p));
            let m = &full.moments[u];
            moments.push(if m.m.is_empty() {
                Moments::default()
            } else {
                Moments {
                    m: take(&m.m),
                    v: take(&m.v),
                }
            });
        }
        ShardState {
            step: full.step,
            shards,
            moments,
            lens: full.params.iter().map(|p| p.len()).collect(),
        }
    }

    /// Fresh sharded state: each unit is initialised, sliced and dropped in
    /// turn, so no rank ever holds the whole model.
    pub fn new(cfg: &TrainConfig, rank: usize, n: usize) -> ShardState {
        let mut shards = Vec::new();
        let mut lens = Vec::new();
        for unit in crate::model::init_units(&cfg.model, cfg.seed) {
            let s = shard_len(unit.len(), n);
            shards.push(
                (rank * s..(rank + 1) * s)
                    .map(|i| unit.get(i).copied().unwrap_or(0.0))
                    .collect(),
            );
            lens.push(unit.len());
        }
        let moments = shards.iter().map(|_| Moments::default()).collect();
        ShardState {
            step: 0,
            shards,
            moments,
            lens,
        }
    }

    /// Bytes held between steps.
    pub fn memory(&self) -> Memory {
        let p: usize = self.shards.iter().map(|s| s.len() * 4).sum();
        Memory {
            params: p,
            grads: p,
            optimizer: 2 * p,
            peak_gathered: 0,
        }
    }
}

/// An out-of-place async call's (send, recv) buffers.
type Pair = Work<(Vec<f32>, Vec<f32>)>;

/// Gathered unit: padded full buffer cut to its true length.
fn gathered(work: Pair, len: usize) -> oxccl::Result<Vec<f32>> {
    let (_, mut v) = work.wait()?;
    v.truncate(len);
    Ok(v)
}

/// One ZeRO-3 optimizer step. Returns the step's figures and the memory
/// this rank used.
pub fn step(
    cfg: &TrainConfig,
    corpus: &Corpus,
    st: &mut ShardState,
    comm: &Communicator,
) -> Result<(StepStats, Memory), TrainError> {
    let t0 = Instant::now();
    let (rank, n) = (comm.rank(), comm.nranks());
    crate::train::validate(cfg, n)?;
    let dev = Device::Cpu;
    let layout = cfg.model.layout();
    let units = layout.len();
    let mcfg: &ModelConfig = &cfg.model;
    let mut shard_grads: Vec<Vec<f32>> = st.shards.iter().map(|s| vec![0.0; s.len()]).collect();
    let mut mem = st.memory();
    let mut live = 0usize; // gathered bytes alive now
    let mut note = |delta: isize, mem: &mut Memory| {
        live = (live as isize + delta) as usize;
        mem.peak_gathered = mem.peak_gathered.max(live);
    };
    let mut local_loss = 0.0f32;
    let mut tokens = 0;
    let mut comm_seconds = 0.0;
    let gather = |u: usize| {
        let shard = st.shards[u].clone();
        let full = vec![0.0f32; shard.len() * n];
        comm.all_gather_async(shard, full)
    };
    for micro in 0..cfg.accum {
        let per_rank = cfg.batch / n;
        let per_micro = per_rank / cfg.accum;
        let rows = rank * per_rank + micro * per_micro..rank * per_rank + (micro + 1) * per_micro;
        let (x_ids, y_ids) = corpus.batch(cfg.seed, st.step, rows.clone(), mcfg.seq);
        tokens += x_ids.len();
        // Forward, keeping only each unit's input; the next gather is in flight.
        let mut inputs: Vec<Tensor> = Vec::with_capacity(units);
        let mut next = Some(gather(0));
        let mut x: Option<Tensor> = None;
        for (u, spec) in layout.iter().enumerate().take(units - 1) {
            let tc = Instant::now();
            let full = gathered(next.take().unwrap(), st.lens[u])?;
            comm_seconds += tc.elapsed().as_secs_f64();
            note((full.len() * 4) as isize, &mut mem);
            next = Some(gather(u + 1)); // prefetch
            let vars = model::unit_vars(spec, &full, &dev)?;
            let y = if u == 0 {
                model::embed(mcfg, &vars, &x_ids, rows.len(), &dev)?
            } else {
                let xin = x.take().unwrap();
                inputs.push(xin.clone());
                model::block(mcfg, &vars, &xin)?
            };
            x = Some(y.detach());
            note(-((full.len() * 4) as isize), &mut mem);
        }
        // Head: loss and the gradient flowing back into the last block.
        let tc = Instant::now();
        let head_full = gathered(next.take().unwrap(), st.lens[units - 1])?;
        comm_seconds += tc.elapsed().as_secs_f64();
        note((head_full.len() * 4) as isize, &mut mem);
        let head_vars = model::unit_vars(&layout[units - 1], &head_full, &dev)?;
        let xl = Var::from_tensor(&x.take().unwrap())?;
        let loss = model::head_loss(mcfg, &head_vars, xl.as_tensor(), &y_ids)?;
        local_loss += model::scalar(&loss)? / cfg.accum as f32;
        let g = loss.backward()?;
        let mut g_out = g
            .get(xl.as_tensor())
            .ok_or_else(|| TrainError::Config("no gradient reached the head input".into()))?
            .clone();
        let mut pending: Vec<(usize, Pair)> = Vec::new();
        let mut scatter = |u: usize,
                           vars: &[Var],
                           g: &candle_core::backprop::GradStore,
                           mem: &mut Memory,
                           note: &mut dyn FnMut(isize, &mut Memory)|
         -> Result<(), TrainError> {
            let mut flat = Vec::with_capacity(st.shards[u].len() * n);
            model::unit_grads(vars, g, &mut flat)?;
            flat.resize(st.shards[u].len() * n, 0.0);
            note((flat.len() * 4) as isize, mem);
            let bytes = flat.len() * 4;
            let shard = vec![0.0f32; st.shards[u].len()];
            pending.push((u, comm.reduce_scatter_async(flat, shard, ReduceOp::Avg)));
            note(-(bytes as isize), mem);
            Ok(())
        };
        scatter(units - 1, &head_vars, &g, &mut mem, &mut note)?;
        drop(head_vars);
        note(-((head_full.len() * 4) as isize), &mut mem);
        // Blocks in reverse, recomputed from their saved inputs.
        let mut next = Some(gather(units - 2));
        for u in (1..units - 1).rev() {
            let tc = Instant::now();
            let full = gathered(next.take().unwrap(), st.lens[u])?;
            comm_seconds += tc.elapsed().as_secs_f64();
            note((full.len() * 4) as isize, &mut mem);
            next = Some(gather(u - 1));
            let vars = model::unit_vars(&layout[u], &full, &dev)?;
            let xin = Var::from_tensor(&inputs[u - 1])?;
            let y = model::block(mcfg, &vars, xin.as_tensor())?;
            let s = (y * &g_out)?.sum_all()?;
            let g = s.backward()?;
            g_out = g
                .get(xin.as_tensor())
                .ok_or_else(|| TrainError::Config("no gradient reached a block input".into()))?
                .clone();
            scatter(u, &vars, &g, &mut mem, &mut note)?;
            note(-((full.len() * 4) as isize), &mut mem);
        }
        // Embeddings.
        let tc = Instant::now();
        let full = gathered(next.take().unwrap(), st.lens[0])?;
        comm_seconds += tc.elapsed().as_secs_f64();
        note((full.len() * 4) as isize, &mut mem);
        let vars = model::unit_vars(&layout[0], &full, &dev)?;
        let x0 = model::embed(mcfg, &vars, &x_ids, rows.len(), &dev)?;
        let s = (x0 * &g_out)?.sum_all()?;
        let g = s.backward()?;
        scatter(0, &vars, &g, &mut mem, &mut note)?;
        note(-((full.len() * 4) as isize), &mut mem);
        let tc = Instant::now();
        for (u, work) in pending {
            let (_, shard) = work.wait()?;
            for (acc, v) in shard_grads[u].iter_mut().zip(shard) {
                *acc += v / cfg.accum as f32;
            }
        }
        comm_seconds += tc.elapsed().as_secs_f64();
    }
    let mut l = [local_loss];
    comm.all_reduce_in_place(&mut l, ReduceOp::Avg)?;
    st.step += 1;
    for ((p, g), m) in st
        .shards
        .iter_mut()
        .zip(&shard_grads)
        .zip(st.moments.iter_mut())
    {
        cfg.opt.step(st.step, p, g, m);
    }
    Ok((
        StepStats {
            loss: l[0],
            tokens,
            seconds: t0.elapsed().as_secs_f64(),
            comm_seconds,
            comm_bytes: 0,
        },
        mem,
    ))
}

/// The full parameters, gathered from every rank's shard (tests, export).
pub fn gather_full(st: &ShardState, comm: &Communicator) -> oxccl::Result<Vec<Vec<f32>>> {
    st.shards
        .iter()
        .zip(&st.lens)
        .map(|(s, &len)| {
            let mut full = vec![0.0; s.len() * comm.nranks()];
            comm.all_gather(s, &mut full)?;
            full.truncate(len);
            Ok(full)
        })
        .collect()
}
