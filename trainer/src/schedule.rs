//! Pipeline schedules: the order in which a stage runs the forward (`F`)
//! and backward (`B`) passes of a step's micro-batches. Pure: the
//! trainer follows them ([`crate::pp`]), the tests check them against a
//! simulated pipeline.
//!
//! - **GPipe**: every forward, then every backward. Simple; a stage holds
//!   the activations of all `m` micro-batches at once.
//! - **1F1B** (PipeDream-flush, Megatron's default): stage `s` of `p`
//!   runs `p - s - 1` forwards to fill the pipeline, then alternates one
//!   forward and one backward, then drains. Same bubble, `(p - 1) / (m + p
//!   - 1)` of the step when every pass takes the same time, but a stage
//!   holds at most `p - s` micro-batches' activations.

/// A pass of one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward(usize),
    Backward(usize),
}

/// Which schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    GPipe,
    OneFOneB,
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Schedule, String> {
        match s {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" => Ok(Schedule::OneFOneB),
            other => Err(format!("schedule {other:?}: use gpipe or 1f1b")),
        }
    }
}

/// The passes stage `s` of `p` runs, in order, for `m` micro-batches.
pub fn passes(schedule: Schedule, s: usize, p: usize, m: usize) -> Vec<Pass> {
    let mut v = Vec::with_capacity(2 * m);
    match schedule {
        Schedule::GPipe => {
            v.extend((0..m).map(Pass::Forward));
            v.extend((0..m).map(Pass::Backward));
        }
        Schedule::OneFOneB => {
            let warm = (p - s - 1).min(m);
            v.extend((0..warm).map(Pass::Forward));
            for i in 0..m - warm {
                v.push(Pass::Forward(warm + i));
                v.push(Pass::Backward(i));
            }
            v.extend((m - warm..m).map(Pass::Backward));
        }
    }
    v
}

/// Most micro-batches whose activations a stage holds at once (forward
/// done, backward not yet) under `passes`.
pub fn peak_in_flight(passes: &[Pass]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for p in passes {
        match p {
            Pass::Forward(_) => {
                live += 1;
                peak = peak.max(live);
            }
            Pass::Backward(_) => live -= 1,
        }
    }
    peak
}

/// The bubble theory gives: the share of a step a stage idles when every
/// forward and backward of a micro-batch takes the same time.
pub fn ideal_bubble(p: usize, m: usize) -> f64 {
    (p as f64 - 1.0) / (m as f64 + p as f64 - 1.0)
}

/// Run the schedule on a simulated pipeline where a forward takes 1 unit
/// of time and a backward `b` units, a forward of stage `s > 0` needs the
/// same micro-batch's forward of `s - 1` finished and a backward of stage
/// `s < p - 1` the backward of `s + 1`, each stage runs its passes in
/// order, one at a time. The step's length, or `None` if the stages wait
/// on each other forever (a deadlock).
pub fn simulate(schedule: Schedule, p: usize, m: usize, b: f64) -> Option<f64> {
    let plans: Vec<Vec<Pass>> = (0..p).map(|s| passes(schedule, s, p, m)).collect();
    simulate_plans(&plans, m, b)
}

/// [`simulate`] of any plan per stage.
fn simulate_plans(plans: &[Vec<Pass>], m: usize, b: f64) -> Option<f64> {
    let p = plans.len();
    let mut next = vec![0usize; p];
    let mut free_at = vec![0.0f64; p];
    // When each stage finished each pass (None: not yet).
    let mut fwd = vec![vec![None::<f64>; m]; p];
    let mut bwd = vec![vec![None::<f64>; m]; p];
    loop {
        let mut progressed = false;
        for s in 0..p {
            let Some(&pass) = plans[s].get(next[s]) else {
                continue;
            };
            let (ready, cost) = match pass {
                Pass::Forward(i) => (if s == 0 { Some(0.0) } else { fwd[s - 1][i] }, 1.0),
                Pass::Backward(i) => (if s == p - 1 { fwd[s][i] } else { bwd[s + 1][i] }, b),
            };
            if let Some(r) = ready {
                let done = free_at[s].max(r) + cost;
                free_at[s] = done;
                match pass {
                    Pass::Forward(i) => fwd[s][i] = Some(done),
                    Pass::Backward(i) => bwd[s][i] = Some(done),
                }
                next[s] += 1;
                progressed = true;
            }
        }
        if next.iter().zip(plans).all(|(n, pl)| *n == pl.len()) {
            return Some(free_at.iter().cloned().fold(0.0, f64::max));
        }
        if !progressed {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_runs_each_pass_once_forward_first() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for p in 1..=4 {
                for m in 1..=8 {
                    for s in 0..p {
                        let v = passes(schedule, s, p, m);
                        assert_eq!(v.len(), 2 * m);
                        for i in 0..m {
                            let f = v.iter().position(|x| *x == Pass::Forward(i)).unwrap();
                            let b = v.iter().position(|x| *x == Pass::Backward(i)).unwrap();
                            assert!(f < b, "{schedule:?} p={p} m={m} s={s}: {v:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_fewer_activations_and_neither_deadlocks() {
        for p in 1..=4 {
            for m in 1..=16 {
                for s in 0..p {
                    assert_eq!(peak_in_flight(&passes(Schedule::GPipe, s, p, m)), m);
                    assert_eq!(
                        peak_in_flight(&passes(Schedule::OneFOneB, s, p, m)),
                        (p - s).min(m)
                    );
                }
                // With backward = forward, both take (m + p - 1) * 2 units:
                // the bubble of theory.
                for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
                    let t = simulate(schedule, p, m, 1.0).expect("deadlock");
                    let busy = 2.0 * m as f64;
                    let bubble = 1.0 - busy / t;
                    assert!(
                        (bubble - ideal_bubble(p, m)).abs() < 1e-9,
                        "{schedule:?} p={p} m={m}: {bubble} vs {}",
                        ideal_bubble(p, m)
                    );
                }
            }
        }
    }

    #[test]
    fn a_schedule_that_waits_on_itself_is_caught() {
        // Stage 0 starting with a backward waits for stage 1's backward,
        // which waits for its forward, which waits for stage 0's.
        let plans = [
            vec![Pass::Backward(0), Pass::Forward(0)],
            vec![Pass::Forward(0), Pass::Backward(0)],
        ];
        assert_eq!(simulate_plans(&plans, 1, 1.0), None);
        let good = [plans[1].clone(), plans[1].clone()];
        assert_eq!(simulate_plans(&good, 1, 1.0), Some(4.0));
    }
}
