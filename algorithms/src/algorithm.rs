//! Algorithms as plug-ins: each implements [`Algorithm`] in its own file and
//! has one line in [`REGISTRY`]. The communicator asks [`choose`] which one
//! runs a call (`OXCCL_ALGO` forces one by name); the checker runs every
//! registered algorithm over many rank counts.

use crate::schedule::Schedule;
use crate::spec::{CollSpec, Tuning};

/// A way to run some collectives: which specs it can run, and one rank's
/// schedule for a spec.
pub trait Algorithm: Sync {
    /// Short name, as `OXCCL_ALGO` and `--algo` spell it.
    fn name(&self) -> &'static str;
    /// Whether it can run `spec` at all (the kind, the memory it needs).
    fn supports(&self, spec: &CollSpec) -> bool;
    /// Whether automatic choice takes it for a supported `spec`; the
    /// registry is tried in order, so earlier entries are preferred.
    fn preferred(&self, spec: &CollSpec, tuning: &Tuning) -> bool {
        let _ = (spec, tuning);
        true
    }
    /// The schedule of rank `spec.rank`. Only called when `supports`.
    fn build(&self, spec: &CollSpec) -> Schedule;
}

/// Every algorithm, most preferred first.
pub static REGISTRY: &[&dyn Algorithm] = &[
    &crate::direct::Direct,
    &crate::oneshot::OneShot,
    &crate::single_copy::SingleCopy,
    &crate::copyin::CopyIn,
    &crate::hier::Hier,
    &crate::ring::Ring,
    &crate::chain::Chain,
    &crate::pairwise::Pairwise,
    &crate::dissemination::Dissemination,
    &crate::doubling::Doubling,
    &crate::bruck::Bruck,
    &crate::tree::Tree,
    &crate::dbtree::DoubleTree,
    &crate::halving::Halving,
    &crate::scatter::ScatterGather,
];

/// The algorithm called `name`.
pub fn find(name: &str) -> Option<&'static dyn Algorithm> {
    REGISTRY.iter().copied().find(|a| a.name() == name)
}

/// Every registered name, for messages (`ring, oneshot, ...`).
pub fn names() -> String {
    REGISTRY
        .iter()
        .map(|a| a.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The algorithm that runs `spec`: `forced` when it supports the spec (an
/// algorithm forced for all_reduce leaves the other collectives alone),
/// else the first registered one that supports and prefers it, else the
/// first that supports it. `None` only for kinds no algorithm runs (p2p).
pub fn choose(
    spec: &CollSpec,
    forced: Option<&str>,
    tuning: &Tuning,
) -> Option<&'static dyn Algorithm> {
    if let Some(a) = forced.and_then(find).filter(|a| a.supports(spec)) {
        return Some(a);
    }
    let supported = || REGISTRY.iter().copied().filter(|a| a.supports(spec));
    supported()
        .find(|a| a.preferred(spec, tuning))
        .or_else(|| supported().next())
}
