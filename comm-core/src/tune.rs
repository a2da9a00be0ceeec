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
//! The chunk size (how finely a call is pipelined) is chosen with it: the
//! communicator's (`OXCCL_BUFFSIZE`, or the one its ranks agreed on) and
//! [`CHUNK_DIVISORS`] finer ones
//! down to [`MIN_CHUNK_BYTES`] are tried for every algorithm; the tuner
//! never goes above the configured size.
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

/// The chunk sizes tried: the configured one divided by these.
pub const CHUNK_DIVISORS: [usize; 3] = [1, 4, 16];

/// No finer chunk than this is tried (bytes): per-message costs would
/// dominate.
pub const MIN_CHUNK_BYTES: usize = 16 << 10;

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
    chosen: HashMap<Shape, Option<Choice>>,
}

/// What the tuner chose for a shape: an algorithm (by name) and the chunk
/// (elements) it runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Choice {
    name: &'static str,
    chunk: usize,
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

    /// The algorithm for `spec` and the chunk (elements) to build its
    /// schedule with: `forced` when it runs the spec, else the predicted
    /// fastest pair (cached per shape), else the registry's rules (with
    /// the spec's chunk).
    pub(crate) fn choose(
        &mut self,
        spec: &CollSpec,
        forced: Option<&str>,
        tuning: &Tuning,
    ) -> Option<(&'static dyn Algorithm, usize)> {
        let rules = || algorithms::choose(spec, forced, tuning).map(|a| (a, spec.chunk));
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
        let choice = match self.chosen.get(&shape) {
            Some(c) => *c,
            None => {
                let c = self.predict(spec, &shape);
                self.chosen.insert(shape, c);
                c
            }
        };
        choice
            .and_then(|c| Some((algorithms::find(c.name)?, c.chunk)))
            .filter(|(a, _)| a.supports(spec))
            .or_else(rules)
    }

    /// The chunks tried for a call of `count` elements chunked by `chunk`:
    /// the configured one, then finer ones down to [`MIN_CHUNK_BYTES`]
    /// (none at or above the count: those are one chunk, as is the first).
    fn chunks(spec: &CollSpec, count: usize) -> Vec<usize> {
        let min = (MIN_CHUNK_BYTES / spec.elem_size.max(1)).max(1);
        let mut v = vec![spec.chunk];
        for d in CHUNK_DIVISORS {
            let c = spec.chunk / d;
            if c >= min && c < count && !v.contains(&c) {
                v.push(c);
            }
        }
        v
    }

    /// Simulate every algorithm that runs the shape with every chunk tried;
    /// the fastest (the registry's order, then the larger chunk, breaks
    /// ties).
    fn predict(&self, spec: &CollSpec, shape: &Shape) -> Option<Choice> {
        let probe = CollSpec {
            rank: 0,
            count: shape.bucket,
            ..*spec
        };
        let mut times: Vec<(Choice, f64)> = Vec::new();
        for alg in REGISTRY
            .iter()
            .filter(|a| a.supports(&probe) && a.supports(spec))
        {
            for chunk in Self::chunks(spec, shape.bucket) {
                let at = CollSpec { chunk, ..probe };
                match oxccl_sim::predict_within(
                    &self.model,
                    &self.topo,
                    *alg,
                    &at,
                    false,
                    MAX_STEPS,
                ) {
                    Ok((out, _)) => times.push((
                        Choice {
                            name: alg.name(),
                            chunk,
                        },
                        out.time,
                    )),
                    Err(e) => tracing::debug!(
                        "oxccl: tuner: {} (chunk {} B) not predicted: {e}",
                        alg.name(),
                        chunk * spec.elem_size
                    ),
                }
            }
        }
        let best = times
            .iter()
            .copied()
            .reduce(|b, x| if x.1 < b.1 { x } else { b })?;
        // The others: each algorithm's best.
        let mut others: Vec<(&str, f64)> = Vec::new();
        for (c, t) in times.iter().filter(|(c, _)| c.name != best.0.name) {
            match others.iter_mut().find(|(n, _)| *n == c.name) {
                Some(o) => o.1 = o.1.min(*t),
                None => others.push((c.name, *t)),
            }
        }
        let others: Vec<String> = others
            .iter()
            .map(|(n, t)| format!("{n} {:.1}", t * 1e6))
            .collect();
        tracing::info!(
            "oxccl: tuner: {} of {} B on {} ranks ({} hosts): {} in chunks of {} B (predicted {:.1} us; {} us)",
            spec.kind.name(),
            shape.bucket * spec.elem_size,
            spec.nranks,
            self.topo.hosts,
            best.0.name,
            best.0.chunk * spec.elem_size,
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

    /// A call on `n` ranks, 2 per host in blocks.
    fn spec(kind: Kind, n: usize, bytes: usize) -> CollSpec {
        CollSpec {
            chunk: 1 << 18,
            layout: algorithms::Layout::of_hosts(&(0..n).map(|r| r / 2).collect::<Vec<_>>()),
            ..CollSpec::new(kind, 0, n, bytes / 4)
        }
    }

    /// Slow links between hosts, fast memory: logarithmic algorithms win
    /// small calls, bandwidth-optimal ones (the ring, or the hierarchical
    /// one that runs rings) large ones — and a forced algorithm, registered
    /// buffers and one-rank calls keep the rules.
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
        let name = |c: Option<(&'static dyn Algorithm, usize)>| c.unwrap().0.name();
        let small = name(t.choose(&spec(Kind::AllReduce, 16, 64), None, &tuning));
        assert!(
            ["halving", "dbtree", "oneshot", "hier"].contains(&small),
            "64 B over 50 us links: {small}"
        );
        let large = name(t.choose(&spec(Kind::AllReduce, 16, 64 << 20), None, &tuning));
        assert!(
            ["ring", "hier"].contains(&large),
            "64 MiB over 10 Gbit/s NICs: {large}"
        );
        let forced = t.choose(&spec(Kind::AllReduce, 16, 64), Some("ring"), &tuning);
        assert_eq!(name(forced), "ring");
        assert_eq!(
            forced.unwrap().1,
            1 << 18,
            "a forced algorithm keeps the chunk"
        );
        let one = Tuner::new(Model::default(), &[0]).unwrap().choose(
            &spec(Kind::AllReduce, 1, 64),
            None,
            &tuning,
        );
        assert_eq!(
            one.map(|a| a.0.name()),
            algorithms::choose(&spec(Kind::AllReduce, 1, 64), None, &tuning).map(|a| a.name())
        );
        // The choice is cached per shape: a count in the same bucket asks
        // for no new simulation.
        let before = t.chosen.len();
        t.choose(&spec(Kind::AllReduce, 16, 60), None, &tuning);
        assert_eq!(t.chosen.len(), before);
    }

    /// The chunk is tuned too: never above the configured one, never below
    /// the floor, and finer where the model says pipelining pays — a tree
    /// forwards a chunk only once it has all of it, so with one 4 MiB
    /// chunk its levels run one after another.
    #[test]
    fn chunks_are_chosen_within_bounds_and_finer_where_pipelining_pays() {
        let hosts: Vec<u64> = (0..16).map(|r| r / 2).collect();
        let mut t = Tuner::new(Model::default(), &hosts).unwrap();
        let tuning = Tuning::default();
        for bytes in [64usize, 64 << 10, 1 << 20, 16 << 20] {
            let s = CollSpec {
                chunk: 1 << 20,
                ..spec(Kind::AllReduce, 16, bytes)
            };
            let (alg, chunk) = t.choose(&s, None, &tuning).unwrap();
            assert!(alg.supports(&s));
            assert!(chunk <= 1 << 20, "{bytes} B: chunk {chunk}");
            assert!(
                chunk == 1 << 20 || chunk * 4 >= MIN_CHUNK_BYTES,
                "{bytes} B: chunk {chunk}"
            );
        }
        let tree = CollSpec {
            chunk: 1 << 20,
            ..spec(Kind::Broadcast, 16, 16 << 20)
        };
        let (alg, chunk) = t.choose(&tree, None, &tuning).unwrap();
        assert!(
            chunk < 1 << 20,
            "{} broadcast of 16 MiB: chunk {chunk}",
            alg.name()
        );
    }
}
