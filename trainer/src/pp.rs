//! Pipeline parallelism, and the step every parallel layout shares
//! (tensor × pipeline × data, "3D").
//!
//! The model's units (embeddings, blocks, head) are divided into `p`
//! consecutive stages, one per rank of the pipeline group: blocks as
//! evenly as possible, the embeddings with the first, the head with the
//! last. A step's rows (this data-parallel rank's) are cut into `m`
//! micro-batches; each stage runs their forward and backward passes in the
//! order its [`Schedule`] gives, receiving a micro-batch's activations
//! from the stage before (blocking `recv`), sending its own to the next
//! (`send_async`: the point-to-point lane moves them whatever this rank
//! does meanwhile), and the same backwards with gradients. A stage keeps
//! each micro-batch's autograd graph from its forward to its backward:
//! that is the activation memory the schedule decides.
//!
//! Inside a stage the blocks may be divided among a tensor-parallel group
//! ([`crate::tp`]); each of its ranks exchanges the (whole) activations
//! with the rank of the same part in the neighbouring stages. Across
//! data-parallel replicas, gradients are averaged as DDP does.

use crate::data::Corpus;
use crate::model::{self, Batch, ModelConfig, Shards, UnitSpec, Whole};
use crate::optim::Moments;
use crate::schedule::{passes, peak_in_flight, Pass, Schedule};
use crate::tp::{self, Divided};
use crate::train::{self, StepStats, TrainConfig, TrainError, TrainState};
use candle_core::{Device, Tensor, Var};
use oxccl::{Communicator, CoreCommunicator, ReduceOp, Work};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// The units stage `s` of `p` holds (of a model of `layers` blocks).
pub fn stage_units(layers: usize, s: usize, p: usize) -> Range<usize> {
    let start = if s == 0 { 0 } else { 1 + s * layers / p };
    let end = if s + 1 == p {
        layers + 2
    } else {
        1 + (s + 1) * layers / p
    };
    start..end
}

/// Whether `cfg` divides into `p` stages of at least one block each.
pub fn validate(cfg: &ModelConfig, p: usize) -> Result<(), TrainError> {
    if p == 0 || cfg.layers < p {
        return Err(TrainError::Config(format!(
            "{p} pipeline stages need at least {p} blocks (the model has {})",
            cfg.layers
        )));
    }
    Ok(())
}

/// The communicators of a `T × P × D` layout. Job rank `w` is part `w %
/// T` of its tensor-parallel group (neighbours: the most traffic on the
/// closest ranks), stage `(w / T) % P` of its pipeline and replica `w /
/// (T P)`.
pub struct Layout {
    pub t: usize,
    pub p: usize,
    pub d: usize,
    /// The ranks holding the other parts of this rank's blocks (`None`
    /// when `t` is 1).
    pub tp: Option<Arc<Communicator>>,
    /// This rank's pipeline: rank `s` is stage `s`.
    pub pp: Communicator,
    /// The ranks holding the same part of the same stage.
    pub dp: Communicator,
}

impl Layout {
    /// Split `world` into a `t × p × (n / (t p))` layout (collective).
    pub fn split(world: &Communicator, t: usize, p: usize) -> Result<Layout, TrainError> {
        let n = world.nranks();
        if t == 0 || p == 0 || !n.is_multiple_of(t * p) {
            return Err(TrainError::Config(format!(
                "{n} ranks do not divide into tensor-parallel groups of {t} times {p} pipeline stages"
            )));
        }
        let w = world.rank();
        let (part, stage, replica) = (w % t, (w / t) % p, w / (t * p));
        let key = w as i64;
        let tp = world.split((w / t) as u32, key)?;
        let pp = world.split((part + t * replica) as u32, key)?;
        let dp = world.split((part + t * stage) as u32, key)?;
        Ok(Layout {
            t,
            p,
            d: n / (t * p),
            tp: (t > 1).then(|| Arc::new(tp)),
            pp,
            dp,
        })
    }

    /// This rank's stage.
    pub fn stage(&self) -> usize {
        self.pp.rank()
    }

    /// This rank's part of its stage's blocks.
    pub fn part(&self) -> usize {
        self.tp.as_ref().map_or(0, |c| c.rank())
    }
}

/// This rank's units (stage `s` of `p`, part `r` of `t`) of the initial
/// weights (one unit whole at a time).
pub fn init_state(cfg: &TrainConfig, r: usize, t: usize, s: usize, p: usize) -> TrainState {
    tp::init_units_of(cfg, r, t, stage_units(cfg.model.layers, s, p))
}

/// This rank's part of a whole state (a checkpoint of any layout).
pub fn shard_state(
    cfg: &ModelConfig,
    whole: &TrainState,
    r: usize,
    t: usize,
    s: usize,
    p: usize,
) -> TrainState {
    tp::shard_units_of(cfg, whole, r, t, stage_units(cfg.layers, s, p))
}

/// The whole state from every rank's part (collective over the layout's
/// tensor-parallel group and pipeline; every rank gets it).
pub fn gather_state(cfg: &ModelConfig, st: &TrainState, l: &Layout) -> oxccl::Result<TrainState> {
    let layout = cfg.layout();
    // Whole units of this stage (from the tensor-parallel parts) ...
    let stage = match &l.tp {
        Some(tp) => tp::gather_units_of(&layout[stage_units(cfg.layers, l.stage(), l.p)], st, tp)?,
        None => st.clone(),
    };
    // ... then every stage's, broadcast by the stage holding them (no
    // moments before the first step, on every rank alike).
    let mut whole = TrainState {
        step: st.step,
        params: Vec::new(),
        moments: Vec::new(),
    };
    for s in 0..l.p {
        for (k, u) in stage_units(cfg.layers, s, l.p).enumerate() {
            let len: usize = layout[u]
                .iter()
                .map(|(_, sh)| sh.iter().product::<usize>())
                .sum();
            let get = |v: Option<&Vec<f32>>| -> oxccl::Result<Vec<f32>> {
                let mut buf = match (s == l.stage(), v) {
                    (true, Some(v)) => v.clone(),
                    _ => vec![0.0; len],
                };
                l.pp.broadcast_in_place(buf.as_mut_slice(), s)?;
                Ok(buf)
            };
            whole.params.push(get(stage.params.get(k))?);
            whole.moments.push(match st.step {
                0 => Moments::default(),
                _ => Moments {
                    m: get(stage.moments.get(k).map(|m| &m.m))?,
                    v: get(stage.moments.get(k).map(|m| &m.v))?,
                },
            });
        }
    }
    Ok(whole)
}

/// What a pipelined step measured on this rank.
#[derive(Clone, Copy, Debug, Default)]
pub struct PipeStats {
    /// Seconds of forward and backward computation (the rest of the step
    /// is waiting: the bubble, and communication).
    pub busy_seconds: f64,
    /// Most micro-batches whose activations were held at once.
    pub peak_in_flight: usize,
}

/// A micro-batch between its forward and its backward.
struct InFlight {
    vars: Vec<Vec<Var>>,
    /// The received activations, as a variable (their gradient goes back).
    input: Option<Var>,
    /// The stage's output (activations, or the loss on the last stage).
    out: Tensor,
}

/// How a step runs: the groups (any may be absent: one rank) and the
/// pipeline's micro-batches.
pub struct Parallel<'a> {
    pub tp: Option<&'a Arc<Communicator>>,
    pub pp: Option<&'a CoreCommunicator>,
    pub dp: Option<&'a CoreCommunicator>,
    pub micro_batches: usize,
    pub schedule: Schedule,
}

impl<'a> Parallel<'a> {
    /// Every group of `l`.
    pub fn of(l: &'a Layout, micro_batches: usize, schedule: Schedule) -> Parallel<'a> {
        Parallel {
            tp: l.tp.as_ref(),
            pp: Some(&l.pp),
            dp: Some(&l.dp),
            micro_batches,
            schedule,
        }
    }
}

/// One optimizer step on this rank's units (`st`, from [`init_state`]).
pub fn step(
    cfg: &TrainConfig,
    corpus: &Corpus,
    st: &mut TrainState,
    par: &Parallel<'_>,
) -> Result<(StepStats, PipeStats), TrainError> {
    let t0 = Instant::now();
    let (s, p) = par.pp.map_or((0, 1), |c| (c.rank(), c.nranks()));
    let t = par.tp.map_or(1, |c| c.nranks());
    let (dr, dn) = par.dp.map_or((0, 1), |c| (c.rank(), c.nranks()));
    let m = par.micro_batches;
    validate(&cfg.model, p)?;
    tp::validate(&cfg.model, t)?;
    if m == 0 || !cfg.batch.is_multiple_of(dn * m) {
        return Err(TrainError::Config(format!(
            "batch {} must be a multiple of data-parallel replicas ({dn}) x micro-batches ({m})",
            cfg.batch
        )));
    }
    let divided = par.tp.map(|c| Divided::new(c.clone()));
    let shards: &dyn Shards = match &divided {
        Some(d) => d,
        None => &Whole,
    };
    let units = stage_units(cfg.model.layers, s, p);
    let specs: Vec<UnitSpec> = cfg.model.layout()[units.clone()]
        .iter()
        .map(|u| tp::local_spec(u, t))
        .collect();
    if st.params.len() != specs.len() {
        return Err(TrainError::Config(format!(
            "stage {s} of {p} holds {} units; the state has {}",
            specs.len(),
            st.params.len()
        )));
    }
    let dev = Device::Cpu;
    let (rows_m, seq, d) = (cfg.batch / dn / m, cfg.model.seq, cfg.model.d_model);
    let mut grads: Vec<Vec<f32>> = st.params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut held: Vec<Option<InFlight>> = (0..m).map(|_| None).collect();
    let mut sends: Vec<Work<Vec<f32>>> = Vec::new();
    let plan = passes(par.schedule, s, p, m);
    let (mut busy, mut loss, mut tokens) = (0.0f64, 0.0f32, 0usize);
    let recv = |from: usize| -> Result<Tensor, TrainError> {
        let mut buf = vec![0.0f32; rows_m * seq * d];
        par.pp
            .expect("a neighbour")
            .recv(buf.as_mut_slice(), from)?;
        Ok(Tensor::from_vec(buf, (rows_m, seq, d), &dev)?)
    };
    for pass in &plan {
        match *pass {
            Pass::Forward(i) => {
                let input = match s {
                    0 => None,
                    _ => Some(Var::from_tensor(&recv(s - 1)?)?),
                };
                let tb = Instant::now();
                let r = train::rows(cfg.batch, dr, dn, i, m);
                let (ids, targets) = corpus.batch(cfg.seed, st.step, r.clone(), seq);
                tokens += ids.len() / (t * p);
                let vars: Vec<Vec<Var>> = specs
                    .iter()
                    .zip(&st.params)
                    .map(|(spec, flat)| model::unit_vars(spec, flat, &dev))
                    .collect::<Result<_, _>>()?;
                let batch = Batch {
                    ids: &ids,
                    targets: &targets,
                    rows: r.len(),
                    dev: &dev,
                };
                let x = input.as_ref().map(|v| v.as_tensor());
                let out = model::forward_units(&cfg.model, units.start, &vars, x, &batch, shards)?;
                if s + 1 < p {
                    let act = out.flatten_all()?.to_vec1::<f32>()?;
                    busy += tb.elapsed().as_secs_f64();
                    sends.push(par.pp.expect("a neighbour").send_async(act, s + 1));
                } else {
                    loss += model::scalar(&out)? / m as f32;
                    busy += tb.elapsed().as_secs_f64();
                }
                held[i] = Some(InFlight { vars, input, out });
            }
            Pass::Backward(i) => {
                let f = held[i].take().expect("a forward before its backward");
                let g = if s + 1 < p {
                    let dy = recv(s + 1)?;
                    let tb = Instant::now();
                    // d(sum(y * dy))/dy = dy: the next stage's gradient.
                    let g = (&f.out * dy)?.sum_all()?.backward()?;
                    busy += tb.elapsed().as_secs_f64();
                    g
                } else {
                    let tb = Instant::now();
                    let g = f.out.backward()?;
                    busy += tb.elapsed().as_secs_f64();
                    g
                };
                let tb = Instant::now();
                train::accumulate(&f.vars, &g, &mut grads, m)?;
                let dx = match &f.input {
                    Some(v) => Some(match g.get(v.as_tensor()) {
                        Some(dx) => dx.flatten_all()?.to_vec1::<f32>()?,
                        None => vec![0.0; rows_m * seq * d],
                    }),
                    None => None,
                };
                busy += tb.elapsed().as_secs_f64();
                if let Some(dx) = dx {
                    sends.push(par.pp.expect("a neighbour").send_async(dx, s - 1));
                }
            }
        }
    }
    for w in sends {
        w.wait()?;
    }
    let tc = Instant::now();
    // The loss is the last stage's; every rank reports it.
    let mut l = [loss];
    if let Some(c) = par.pp.filter(|_| p > 1) {
        c.broadcast_in_place(&mut l, p - 1)?;
    }
    if let Some(c) = par.dp.filter(|c| c.nranks() > 1) {
        train::all_reduce_buckets(c, &mut grads, cfg.bucket_bytes)?;
        c.all_reduce_in_place(&mut l, ReduceOp::Avg)?;
    }
    // Tensor-parallel all_reduces ran inside the passes (and count there
    // as busy too).
    let comm_seconds = tc.elapsed().as_secs_f64() + divided.as_ref().map_or(0.0, Divided::seconds);
    st.apply(&cfg.opt, &grads);
    Ok((
        StepStats {
            loss: l[0],
            tokens,
            seconds: t0.elapsed().as_secs_f64(),
            comm_seconds,
            comm_bytes: 0,
        },
        PipeStats {
            busy_seconds: busy,
            peak_in_flight: peak_in_flight(&plan),
        },
    ))
}
