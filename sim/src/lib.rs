//! `oxccl-sim`: how oxccl's collectives would behave on a cluster you do
//! not have, from the *real* schedules — the same `algorithms` code the
//! runtime executes — run through an event simulation of a topology
//! (hosts × ranks per host) and a cost model (per-message and per-step CPU
//! costs, copy and reduction rates, shared-memory latency, per-host NICs
//! with latency and bandwidth, cores per host or per machine).
//!
//! - [`model`]: the costs, settable one by one or from a profile file;
//! - [`topology`]: hosts and ranks;
//! - [`engine`]: the event simulation of schedules over the model;
//! - [`symmetry`]: when one host's ranks stand exactly for all, which is
//!   what makes a ring of 16 384 ranks cheap to simulate.
//!
//! [`predict`] ties them together for one call.

pub mod engine;
pub mod model;
pub mod symmetry;
pub mod topology;

use algorithms::{Algorithm, CollSpec, Kind};
pub use engine::{Outcome, Ranks};
pub use model::Model;
pub use symmetry::{Fit, Shift};
pub use topology::Topology;

/// One collective call as the benchmarks describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub kind: Kind,
    /// nccl-tests' size: bytes of the largest buffer (all_gather: the
    /// output; reduce_scatter: the input).
    pub bytes: usize,
    /// Bytes per element.
    pub elem: usize,
    /// Bytes per pipelined chunk (`OXCCL_BUFFSIZE`).
    pub chunk_bytes: usize,
    pub root: usize,
}

impl Call {
    /// The spec rank `rank` of `n` builds its schedule from (out of place).
    pub fn spec(&self, rank: usize, n: usize) -> CollSpec {
        let elems = self.bytes / self.elem;
        let count = match self.kind {
            Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => elems / n,
            _ => elems,
        };
        CollSpec {
            root: self.root,
            chunk: (self.chunk_bytes / self.elem).max(1),
            elem_size: self.elem,
            ..CollSpec::new(self.kind, rank, n, count)
        }
    }

    /// The bytes the size column shows (segmented kinds round down to a
    /// multiple of the rank count, as the benchmarks do).
    pub fn shown_bytes(&self, n: usize) -> usize {
        let s = self.spec(0, n);
        match self.kind {
            Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => s.count * n * self.elem,
            _ => s.count * self.elem,
        }
    }

    /// nccl-tests' bus bandwidth factor.
    pub fn bus_factor(&self, n: usize) -> f64 {
        let n = n as f64;
        match self.kind {
            Kind::AllReduce => 2.0 * (n - 1.0) / n,
            Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

/// How a prediction was simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Every rank.
    Full,
    /// One host's ranks standing for all ([`symmetry`]).
    Periodic(Shift, Fit),
}

/// Most steps a full simulation takes on (about 2 GiB of state).
pub const MAX_FULL_STEPS: usize = 40_000_000;

/// Simulate the call `spec` describes (every rank's spec is `spec` with
/// its own rank) run by `alg` on `topo`. One host's ranks are simulated
/// when they stand for all (unless `full`); otherwise every rank, if the
/// job has at most [`MAX_FULL_STEPS`] steps.
pub fn predict(
    m: &Model,
    topo: &Topology,
    alg: &dyn Algorithm,
    spec: &CollSpec,
    full: bool,
) -> Result<(Outcome, How), String> {
    predict_within(m, topo, alg, spec, full, MAX_FULL_STEPS)
}

/// [`predict`] refusing full simulations of more than `max_steps` steps
/// (the tuner predicts inside a call and keeps that small).
pub fn predict_within(
    m: &Model,
    topo: &Topology,
    alg: &dyn Algorithm,
    spec: &CollSpec,
    full: bool,
    max_steps: usize,
) -> Result<(Outcome, How), String> {
    let n = topo.nranks();
    if spec.nranks != n {
        return Err(format!(
            "a call on {} ranks on a topology of {n}",
            spec.nranks
        ));
    }
    // The topology says where ranks are (as the communicator learns it
    // from the peers' host identities).
    let spec = CollSpec {
        rank: 0,
        layout: topo.layout(),
        ..*spec
    };
    let at = |rank| CollSpec { rank, ..spec };
    if !alg.supports(&spec) {
        return Err(format!(
            "{} does not run {} on {n} ranks",
            alg.name(),
            spec.kind.name()
        ));
    }
    let p = topo.per_host;
    if !full && topo.hosts > 1 && topo.is_blocks() && !(m.shared_cores && m.cores > 0) {
        if let Ok((shift, fit)) = symmetry::periodic(alg, &spec, p) {
            let scheds = (0..p).map(|r| alg.build(&at(r))).collect();
            let out = engine::simulate(m, topo, spec.elem_size, scheds, Ranks::Periodic(p, shift))?;
            return Ok((out, How::Periodic(shift, fit)));
        }
    }
    let first = alg.build(&spec);
    let estimate = first.steps.len().saturating_mul(n);
    if estimate > max_steps {
        return Err(format!(
            "{} on {n} ranks is about {estimate} steps, more than this full simulation takes ({max_steps}); \
             its ranks are not periodic by host, so fewer ranks or a larger chunk are needed",
            alg.name()
        ));
    }
    let mut scheds = Vec::with_capacity(n);
    scheds.push(first);
    scheds.extend((1..n).map(|r| alg.build(&at(r))));
    let out = engine::simulate(m, topo, spec.elem_size, scheds, Ranks::All)?;
    Ok((out, How::Full))
}
