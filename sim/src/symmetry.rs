//! When simulating one host's ranks stands for all of them.
//!
//! A ring's rank `r + k·P` does what rank `r` does with every peer shifted
//! by `k·P`; recursive halving's rank `r ^ k·P` does what rank `r` does
//! with every peer XORed by `k·P` (`P` and the rank count powers of two,
//! so hosts map onto hosts). If that holds for every rank's schedule (same steps, same
//! dependencies, same actions, peers shifted, spans of the same lengths —
//! offsets may differ) and all hosts are alike, then the simulation of
//! ranks `0..P` with shifted messages standing in for the others gives the
//! exact time of the whole job ([`crate::engine::Ranks::Periodic`]). When
//! the lengths differ by at most one element (a count that does not divide
//! evenly) the result is an approximation within one element per message.

use algorithms::{Action, Algorithm, CollSpec, Schedule, Span};

/// How rank `r` is carried onto rank `r'` standing for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shift {
    /// `r' = (r + s) mod n`.
    Rotate,
    /// `r' = r ^ s`.
    Xor,
}

impl Shift {
    /// Rank `r` carried by `s` among `n` ranks.
    pub fn apply(self, r: usize, s: usize, n: usize) -> usize {
        match self {
            Shift::Rotate => (r + s) % n,
            Shift::Xor => r ^ s,
        }
    }

    /// The `s` that carries `from` onto `to`.
    pub fn between(self, from: usize, to: usize, n: usize) -> usize {
        match self {
            Shift::Rotate => (to + n - from) % n,
            Shift::Xor => from ^ to,
        }
    }
}

/// How well one host's ranks stand for all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Every checked rank is its representative shifted.
    Exact,
    /// Shifted, with span lengths differing by at most one element.
    WithinOneElement,
}

fn peer_of(a: &Action) -> Option<usize> {
    match *a {
        Action::Send { peer, .. }
        | Action::Recv { peer, .. }
        | Action::RecvReduce { peer, .. }
        | Action::CopyFrom { peer, .. }
        | Action::CopyTo { peer, .. } => Some(peer),
        _ => None,
    }
}

fn spans(a: &Action) -> Vec<Span> {
    match *a {
        Action::Send { src, .. } => vec![src],
        Action::Recv { dst, .. } => vec![dst],
        Action::RecvReduce { dst, with, .. } => vec![dst, with],
        Action::Copy { src, dst }
        | Action::CopyFrom { src, dst, .. }
        | Action::CopyTo { src, dst, .. } => vec![src, dst],
        Action::Divide { dst } => vec![dst],
        Action::Reduce { dst, a, b } => vec![dst, a, b],
        Action::Combine {
            dst, input, slots, ..
        } => vec![dst, input, slots],
        Action::ReduceFrom {
            dst,
            src,
            own,
            also,
        } => [Some(dst), Some(src), Some(own), also]
            .into_iter()
            .flatten()
            .collect(),
        Action::ReduceToAll { dst, src, own } => vec![dst, src, own],
        Action::Sync => vec![],
    }
}

/// Dependencies as a set (their order and repeats do not change timing).
fn dep_set(d: &[u32]) -> Vec<u32> {
    let mut v = d.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// Compare the schedule `b` of rank `r` carried by `s` with rank `r`'s `a`.
fn compare(a: &Schedule, b: &Schedule, how: Shift, s: usize, n: usize) -> Result<Fit, String> {
    if a.steps.len() != b.steps.len() {
        return Err(format!("{} steps against {}", b.steps.len(), a.steps.len()));
    }
    let mut fit = Fit::Exact;
    for (i, (x, y)) in a.steps.iter().zip(&b.steps).enumerate() {
        if dep_set(&x.deps) != dep_set(&y.deps)
            || std::mem::discriminant(&x.action) != std::mem::discriminant(&y.action)
        {
            return Err(format!(
                "step {i} differs ({:?} against {:?})",
                y.action, x.action
            ));
        }
        if peer_of(&x.action).map(|p| how.apply(p, s, n)) != peer_of(&y.action) {
            return Err(format!("step {i} talks to another peer"));
        }
        for (s, t) in spans(&x.action).into_iter().zip(spans(&y.action)) {
            if s.buf != t.buf || s.len.abs_diff(t.len) > 1 {
                return Err(format!("step {i} moves other data"));
            }
            if s.len != t.len {
                fit = Fit::WithinOneElement;
            }
        }
    }
    Ok(fit)
}

/// Whether `alg`'s schedules for `spec` (any rank) are periodic with
/// period `p` over `spec.nranks` ranks, rotated or XORed: every
/// representative `0..p` against its carriers by `p`, `2p`, about half the
/// ranks and the last multiple of `p`.
pub fn periodic(alg: &dyn Algorithm, spec: &CollSpec, p: usize) -> Result<(Shift, Fit), String> {
    let n = spec.nranks;
    if p == 0 || !n.is_multiple_of(p) || n == p {
        return Err(format!(
            "period {p} does not divide {n} ranks into several hosts"
        ));
    }
    let mut shifts: Vec<usize> = vec![p, 2 * p, (n / 2) / p * p, n - p];
    shifts.retain(|&s| s > 0 && s < n);
    shifts.sort_unstable();
    shifts.dedup();
    let reps: Vec<Schedule> = (0..p)
        .map(|r| alg.build(&CollSpec { rank: r, ..*spec }))
        .collect();
    let mut why = String::new();
    for how in [Shift::Rotate, Shift::Xor] {
        if how == Shift::Xor && !(n.is_power_of_two() && p.is_power_of_two()) {
            continue;
        }
        match fits(alg, spec, &reps, how, &shifts) {
            Ok(fit) => return Ok((how, fit)),
            Err(e) => why = e,
        }
    }
    Err(why)
}

fn fits(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    reps: &[Schedule],
    how: Shift,
    shifts: &[usize],
) -> Result<Fit, String> {
    let n = spec.nranks;
    let mut fit = Fit::Exact;
    for (r, a) in reps.iter().enumerate() {
        for &s in shifts {
            let other = how.apply(r, s, n);
            let b = alg.build(&CollSpec {
                rank: other,
                ..*spec
            });
            match compare(a, &b, how, s, n) {
                Ok(Fit::WithinOneElement) => fit = Fit::WithinOneElement,
                Ok(Fit::Exact) => {}
                Err(e) => return Err(format!("rank {other} is not rank {r} {how:?}d by {s}: {e}")),
            }
        }
    }
    Ok(fit)
}
