//! Training steps: single process, or DDP over an oxccl communicator.
//!
//! DDP: every rank holds the whole model and takes its own rows of each
//! global batch; after the last micro-step's backward, gradients are
//! flattened unit by unit from the head backwards (the order backward
//! produces them) into buckets, and each full bucket's `all_reduce(Avg)` is
//! launched asynchronously at once, so communication overlaps the remaining
//! flattening. Gradient accumulation (`accum` micro-steps) communicates only
//! on the last one. Every rank applies the same averaged gradients to the
//! same parameters, so replicas stay bitwise identical.

use crate::data::Corpus;
use crate::model::{self, ModelConfig};
use crate::optim::{AdamW, Moments};
use candle_core::Device;
use oxccl::{Communicator, CoreCommunicator, ReduceOp, Work};
use std::time::Instant;

/// What a run does, identical on every rank.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelConfig,
    /// Rows (sequences) in the global batch of one step.
    pub batch: usize,
    /// Micro-steps per step.
    pub accum: usize,
    pub seed: u64,
    pub opt: AdamW,
    /// DDP bucket size in bytes (~25 MB like PyTorch by default).
    pub bucket_bytes: usize,
}

/// Everything that changes during training (and goes into a checkpoint).
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    pub step: u64,
    pub params: Vec<Vec<f32>>,
    pub moments: Vec<Moments>,
}

impl TrainState {
    /// The optimizer's step with `grads` (by unit, as `params`).
    pub fn apply(&mut self, opt: &AdamW, grads: &[Vec<f32>]) {
        self.step += 1;
        for ((p, g), m) in self
            .params
            .iter_mut()
            .zip(grads)
            .zip(self.moments.iter_mut())
        {
            opt.step(self.step, p, g, m);
        }
    }

    /// Fresh state from the seeded initialisation.
    pub fn new(cfg: &TrainConfig) -> TrainState {
        let params = model::init(&cfg.model, cfg.seed);
        let moments = params.iter().map(|_| Moments::default()).collect();
        TrainState {
            step: 0,
            params,
            moments,
        }
    }
}

/// Figures of one step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStats {
    /// Mean loss over the global batch.
    pub loss: f32,
    /// Tokens this rank processed.
    pub tokens: usize,
    pub seconds: f64,
    /// Time spent waiting for communication.
    pub comm_seconds: f64,
    /// Bytes of gradients this rank handed to collectives (DDP; 0 where
    /// not counted).
    pub comm_bytes: usize,
}

/// Errors of a training step.
#[derive(Debug)]
pub enum TrainError {
    Model(candle_core::Error),
    Comm(oxccl::Error),
    Config(String),
}

impl std::fmt::Display for TrainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrainError::Model(e) => write!(f, "model: {e}"),
            TrainError::Comm(e) => write!(f, "communication: {e}"),
            TrainError::Config(m) => write!(f, "configuration: {m}"),
        }
    }
}

impl std::error::Error for TrainError {}

impl From<candle_core::Error> for TrainError {
    fn from(e: candle_core::Error) -> Self {
        TrainError::Model(e)
    }
}

impl From<oxccl::Error> for TrainError {
    fn from(e: oxccl::Error) -> Self {
        TrainError::Comm(e)
    }
}

/// Local rows of rank `rank` of `n` in micro-step `micro` of `accum`.
pub(crate) fn rows(
    batch: usize,
    rank: usize,
    n: usize,
    micro: usize,
    accum: usize,
) -> std::ops::Range<usize> {
    let per_rank = batch / n;
    let per_micro = per_rank / accum;
    let start = rank * per_rank + micro * per_micro;
    start..start + per_micro
}

/// Check that the batch splits evenly.
pub fn validate(cfg: &TrainConfig, nranks: usize) -> Result<(), TrainError> {
    if cfg.accum == 0 || !cfg.batch.is_multiple_of(nranks * cfg.accum) {
        return Err(TrainError::Config(format!(
            "batch {} must be a multiple of ranks ({nranks}) x accumulation steps ({})",
            cfg.batch, cfg.accum
        )));
    }
    if !cfg.model.d_model.is_multiple_of(cfg.model.heads) {
        return Err(TrainError::Config(format!(
            "d_model {} is not divisible by {} heads",
            cfg.model.d_model, cfg.model.heads
        )));
    }
    Ok(())
}

/// How DDP averages gradients across ranks.
pub enum Averaging<'a> {
    /// In full, in buckets of `bucket_bytes` (launched as they fill).
    Full,
    /// Compressed at PowerSGD's rank (its state persists across steps).
    PowerSgd(&'a mut crate::powersgd::PowerSgd),
}

/// One optimizer step: single-process when `comm` is None (or has one
/// rank), DDP otherwise.
pub fn step(
    cfg: &TrainConfig,
    corpus: &Corpus,
    st: &mut TrainState,
    comm: Option<&Communicator>,
) -> Result<StepStats, TrainError> {
    step_averaging(cfg, corpus, st, comm, Averaging::Full)
}

/// [`step`], DDP averaging as `avg` says.
pub fn step_averaging(
    cfg: &TrainConfig,
    corpus: &Corpus,
    st: &mut TrainState,
    comm: Option<&Communicator>,
    avg: Averaging<'_>,
) -> Result<StepStats, TrainError> {
    let t0 = Instant::now();
    let (rank, n) = comm.map_or((0, 1), |c| (c.rank(), c.nranks()));
    validate(cfg, n)?;
    let dev = Device::Cpu;
    let layout = cfg.model.layout();
    let mut grads: Vec<Vec<f32>> = st.params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut local_loss = 0.0f32;
    let mut tokens = 0;
    for micro in 0..cfg.accum {
        let r = rows(cfg.batch, rank, n, micro, cfg.accum);
        let (x, y) = corpus.batch(cfg.seed, st.step, r.clone(), cfg.model.seq);
        let vars: Vec<Vec<candle_core::Var>> = layout
            .iter()
            .zip(&st.params)
            .map(|(spec, flat)| model::unit_vars(spec, flat, &dev))
            .collect::<Result<_, _>>()?;
        let loss = model::loss(&cfg.model, &vars, &x, &y, r.len(), &dev)?;
        local_loss += model::scalar(&loss)? / cfg.accum as f32;
        tokens += x.len();
        let g = loss.backward()?;
        accumulate(&vars, &g, &mut grads, cfg.accum)?;
    }
    let mut comm_seconds = 0.0;
    let mut loss = local_loss;
    let mut comm_bytes = 0;
    if let Some(c) = comm.filter(|c| c.nranks() > 1) {
        let tc = Instant::now();
        match avg {
            Averaging::Full => {
                all_reduce_buckets(c, &mut grads, cfg.bucket_bytes)?;
                comm_bytes = 4 * grads.iter().map(Vec::len).sum::<usize>();
            }
            Averaging::PowerSgd(p) => {
                p.all_reduce(c, &mut grads)?;
                comm_bytes = 4 * p.floats_per_step();
            }
        }
        let mut l = [local_loss];
        c.all_reduce_in_place(&mut l, ReduceOp::Avg)?;
        loss = l[0];
        comm_seconds = tc.elapsed().as_secs_f64();
    }
    st.apply(&cfg.opt, &grads);
    Ok(StepStats {
        loss,
        tokens,
        seconds: t0.elapsed().as_secs_f64(),
        comm_seconds,
        comm_bytes,
    })
}

/// Add one micro-step's gradients of every unit's `vars`, divided by
/// `accum`, to `grads`.
pub(crate) fn accumulate(
    vars: &[Vec<candle_core::Var>],
    g: &candle_core::backprop::GradStore,
    grads: &mut [Vec<f32>],
    accum: usize,
) -> candle_core::Result<()> {
    for (u, vs) in vars.iter().enumerate() {
        let mut flat = Vec::with_capacity(grads[u].len());
        model::unit_grads(vs, g, &mut flat)?;
        for (acc, v) in grads[u].iter_mut().zip(flat) {
            *acc += v / accum as f32;
        }
    }
    Ok(())
}

/// Where a stretch of a bucket came from: (unit, offset, length).
type Piece = (usize, usize, usize);

/// Average `grads` across ranks in buckets of about `bucket_bytes`,
/// launched from the last unit backwards as soon as each bucket is full.
pub(crate) fn all_reduce_buckets(
    c: &CoreCommunicator,
    grads: &mut [Vec<f32>],
    bucket_bytes: usize,
) -> oxccl::Result<()> {
    let cap = (bucket_bytes / 4).max(1);
    // (unit, offset, len) pieces of each launched bucket.
    let mut inflight: Vec<(Vec<Piece>, Work<Vec<f32>>)> = Vec::new();
    let mut bucket: Vec<f32> = Vec::with_capacity(cap);
    let mut pieces = Vec::new();
    for u in (0..grads.len()).rev() {
        let mut off = 0;
        while off < grads[u].len() {
            let take = (cap - bucket.len()).min(grads[u].len() - off);
            bucket.extend_from_slice(&grads[u][off..off + take]);
            pieces.push((u, off, take));
            off += take;
            if bucket.len() == cap {
                let full = std::mem::replace(&mut bucket, Vec::with_capacity(cap));
                inflight.push((
                    std::mem::take(&mut pieces),
                    c.all_reduce_async(full, ReduceOp::Avg),
                ));
            }
        }
    }
    if !bucket.is_empty() {
        inflight.push((pieces, c.all_reduce_async(bucket, ReduceOp::Avg)));
    }
    for (pieces, work) in inflight {
        let data = work.wait()?;
        let mut at = 0;
        for (u, off, len) in pieces {
            grads[u][off..off + len].copy_from_slice(&data[at..at + len]);
            at += len;
        }
    }
    Ok(())
}

/// After a step failed because a peer did (DDP): the survivors'
/// communicator without the rank the error blames (every survivor's error
/// names the same one), and the replicas made equal again, so training
/// continues with the batch spread over fewer ranks. A survivor may have
/// finished the failed step (the dead rank had sent all it had to) while
/// others did not: every replica takes the state of the lowest step.
pub fn shrink_and_agree(
    comm: &Communicator,
    err: &oxccl::Error,
    st: &mut TrainState,
    cfg: &TrainConfig,
) -> Result<Communicator, TrainError> {
    let dead = err.blamed_rank().ok_or_else(|| {
        TrainError::Config(format!(
            "cannot continue without the failed rank: the error names none ({err})"
        ))
    })?;
    let survivors = comm.shrink(&[dead])?;
    validate(cfg, survivors.nranks())?;
    agree(&survivors, st)?;
    Ok(survivors)
}

/// Make every replica's state the one of the lowest step (the lowest rank
/// holding it broadcasts it).
pub fn agree(c: &CoreCommunicator, st: &mut TrainState) -> Result<(), TrainError> {
    let mut lowest = [st.step];
    c.all_reduce_in_place(&mut lowest, ReduceOp::Min)?;
    let mut root = [match st.step == lowest[0] {
        true => c.rank() as u64,
        false => u64::MAX,
    }];
    c.all_reduce_in_place(&mut root, ReduceOp::Min)?;
    let root = root[0] as usize;
    for (p, m) in st.params.iter_mut().zip(st.moments.iter_mut()) {
        // Moments not made yet are zeros to AdamW: send them as such.
        if m.m.len() != p.len() {
            m.m = vec![0.0; p.len()];
            m.v = vec![0.0; p.len()];
        }
        c.broadcast_in_place(p.as_mut_slice(), root)?;
        c.broadcast_in_place(m.m.as_mut_slice(), root)?;
        c.broadcast_in_place(m.v.as_mut_slice(), root)?;
    }
    st.step = lowest[0];
    Ok(())
}
