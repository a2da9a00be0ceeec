//! The tuner: a call's algorithm chosen by predicted time.
//!
//! With a cost model (`OXCCL_TUNER_PROFILE`, [`crate::config::Config::tuner`])
//! the algorithm of a call that none is forced for is the one `oxccl-sim`
//! predicts fastest — the same schedules, run in simulated time on this
//! job's hosts (ranks grouped by host identity) under that model. Every
//! rank predicts alike (the model is one of the settings ranks must share,
//! the peer table is the same everywhere, the simulation is deterministic),
//! so every rank picks the same algorithm without a message.
//!
//! Choices are made per call shape with the count rounded up to a power of
//! two, once, and kept: the first call of a shape pays the simulations
//! (microseconds to milliseconds for tens of ranks), later ones a lookup.
//! Calls on registered buffers (the `direct` algorithm), one-rank calls and
//! barriers keep the registry's rules, as does a shape no candidate could
//! be simulated for.

use algorithms::{Algorithm, CollSpec, Kind, Tuning, REGISTRY};
use oxccl_sim::{Model, Topology};
use std::collections::HashMap;

/// Most steps the tuner simulates for one candidate (tens of MB of state,
/// well under a second): it predicts inside the first call of a shape, so
/// a candidate too large to simulate is skipped rather than stalling it.
const MAX_STEPS: usize = 1_000_000;

/// A call shape as the tuner keys its choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    kind: Kind,
    /// The count rounded up to a power of two.
    bucket: usize,
    elem_size: usize,
    root: usize,
    avg: bool,
    in_place: bool,
    chunk: usize,
}

/// The model, the job's hosts and the choices made so far.
#[derive(Debug)]
pub(crate) struct Tuner {
    model: Model,
    topo: Topology,
    chosen: HashMap<Shape, Option<&'static str>>,
}

impl Tuner {
    /// A tuner for ranks on hosts `host_ids` (one entry per rank).
    pub(crate) fn new(model: Model, host_ids: &[u64]) -> Result<Tuner, String> {
        Ok(Tuner {
            model,
            topo: Topology::from_hosts(host_ids)?,
            chosen: HashMap::new(),
        })
    }

    /// The algorithm for `spec`: `forced` when it runs the spec, else the
    /// predicted fastest (cached per shape), else the registry's rules.
    pub(crate) fn choose(
        &mut self,
        spec: &CollSpec,
        forced: Option<&str>,
        tuning: &Tuning,
    ) -> Option<&'static dyn Algorithm> {
        let rules = || algorithms::choose(spec, forced, tuning);
        if forced
            .and_then(algorithms::find)
            .is_some_and(|a| a.supports(spec))
            || spec.direct.is_some()
            || spec.nranks < 2
            || spec.count == 0
            || spec.kind == Kind::Barrier
        {
            return rules();
        }
        let shape = Shape {
            kind: spec.kind,
            bucket: spec.count.next_power_of_two(),
            elem_size: spec.elem_size,
            root: spec.root,
            avg: spec.avg,
            in_place: spec.in_place,
            chunk: spec.chunk,
        };
        let name = match self.chosen.get(&shape) {
            Some(name) => *name,
            None => {
                let name = self.predict(spec, &shape);
                self.chosen.insert(shape, name);
                name
            }
        };
        name.and_then(algorithms::find)
            .filter(|a| a.supports(spec))
            .or_else(rules)
    }

    /// Simulate every algorithm that runs the shape; the fastest (the
    /// registry's order breaks ties).
    fn predict(&self, spec: &CollSpec, shape: &Shape) -> Option<&'static str> {
        let probe = CollSpec {
            rank: 0,
            count: shape.bucket,
            ..*spec
        };
        let mut times = Vec::new();
        for alg in REGISTRY
            .iter()
            .filter(|a| a.supports(&probe) && a.supports(spec))
        {
            match oxccl_sim::predict_within(&self.model, &self.topo, *alg, &probe, false, MAX_STEPS)
            {
                Ok((out, _)) => times.push((alg.name(), out.time)),
                Err(e) => tracing::debug!("oxccl: tuner: {} not predicted: {e}", alg.name()),
            }
        }
        let best = times
            .iter()
            .copied()
            .reduce(|b, x| if x.1 < b.1 { x } else { b })?;
        let others: Vec<String> = times
            .iter()
            .filter(|(n, _)| *n != best.0)
            .map(|(n, t)| format!("{n} {:.1}", t * 1e6))
            .collect();
        tracing::info!(
            "oxccl: tuner: {} of {} B on {} ranks ({} hosts): {} (predicted {:.1} us; {} us)",
            spec.kind.name(),
            shape.bucket * spec.elem_size,
            spec.nranks,
            self.topo.hosts,
            best.0,
            best.1 * 1e6,
            if others.is_empty() {
                "no other candidate".into()
            } else {
                others.join(", ")
            }
        );
        Some(best.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: Kind, n: usize, bytes: usize) -> CollSpec {
        CollSpec {
            chunk: 1 << 18,
            ..CollSpec::new(kind, 0, n, bytes / 4)
        }
    }

    /// Slow links between hosts, fast memory: logarithmic algorithms win
    /// small calls, the ring wins large ones — and a forced algorithm,
    /// registered buffers and one-rank calls keep the rules.
    #[test]
    fn predicted_time_decides_and_forcing_still_wins() {
        let model = Model {
            alpha: 50e-6,
            nic_rate: 1.25e9,
            ..Model::default()
        };
        let hosts: Vec<u64> = (0..16).map(|r| r / 2).collect();
        let mut t = Tuner::new(model, &hosts).unwrap();
        let tuning = Tuning::default();
        let small = t
            .choose(&spec(Kind::AllReduce, 16, 64), None, &tuning)
            .unwrap();
        assert!(
            ["halving", "dbtree", "oneshot"].contains(&small.name()),
            "64 B over 50 us links: {}",
            small.name()
        );
        assert_ne!(small.name(), "ring");
        let large = t
            .choose(&spec(Kind::AllReduce, 16, 64 << 20), None, &tuning)
            .unwrap();
        assert_eq!(large.name(), "ring", "64 MiB over 10 Gbit/s NICs");
        let forced = t
            .choose(&spec(Kind::AllReduce, 16, 64), Some("ring"), &tuning)
            .unwrap();
        assert_eq!(forced.name(), "ring");
        let one = Tuner::new(Model::default(), &[0]).unwrap().choose(
            &spec(Kind::AllReduce, 1, 64),
            None,
            &tuning,
        );
        assert_eq!(
            one.map(|a| a.name()),
            algorithms::choose(&spec(Kind::AllReduce, 1, 64), None, &tuning).map(|a| a.name())
        );
        // The choice is cached per shape: a count in the same bucket asks
        // for no new simulation.
        let before = t.chosen.len();
        t.choose(&spec(Kind::AllReduce, 16, 60), None, &tuning);
        assert_eq!(t.chosen.len(), before);
    }
}
