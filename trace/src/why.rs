//! `oxccl-trace why`: what happened to a job, from its ranks' flight
//! dumps. Per communicator:
//!
//! - the first call where the ranks disagree (a different collective,
//!   type, size, operator or root), naming the odd ranks and what each
//!   side called;
//! - the silent ranks: those that left no dump although their peers'
//!   last calls waited for them (stopped, killed, or stuck outside oxccl);
//! - the wait-for chain of the last calls, followed to its end;
//! - the stragglers: per call every rank finished, the last to start it
//!   and by how much;
//! - the evidence: the records the findings rest on.

use crate::flight::{Call, Dump};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Calls that ranks made at one sequence number: each signature with the
/// ranks that called it, the largest group first.
pub type Groups = Vec<(String, Vec<usize>)>;

/// What the dumps of one communicator say.
#[derive(Debug, Default)]
pub struct Finding {
    pub comm: String,
    pub nranks: usize,
    /// Ranks that left a dump.
    pub dumped: Vec<usize>,
    /// The first call ranks disagree on: its number, and each signature
    /// with the ranks that called it (the largest group first).
    pub divergence: Option<(u64, Groups)>,
    /// Ranks without a dump that others waited for (or blamed).
    pub silent: Vec<usize>,
    /// Each dumped rank's last call's waits: (rank, its call, the peers).
    pub waits: Vec<(usize, u64, Vec<usize>)>,
    /// Where the wait-for chain ends (the rank every wait leads to).
    pub chain_end: Option<usize>,
    /// (call, its last rank to start, by how many microseconds), worst first.
    pub stragglers: Vec<(u64, usize, i64)>,
    /// The paragraph and its evidence lines.
    pub text: String,
}

/// Analyse every communicator in `dumps`.
pub fn why(dumps: &[Dump]) -> Vec<Finding> {
    let mut by_comm: BTreeMap<&str, Vec<&Dump>> = BTreeMap::new();
    for d in dumps {
        by_comm.entry(&d.comm).or_default().push(d);
    }
    by_comm
        .into_iter()
        .map(|(comm, ds)| analyse(comm, &ds))
        .collect()
}

fn ranks_text(r: &[usize]) -> String {
    match r {
        [one] => format!("rank {one}"),
        _ => format!(
            "ranks {}",
            r.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn evidence(d: &Dump, c: &Call) -> String {
    let mut s = format!(
        "  rank {} ({} pid {}) #{} {} [{}] {}",
        d.rank,
        d.host,
        d.pid,
        c.seq,
        c.signature(),
        c.algorithm,
        c.state
    );
    if let Some(end) = c.ended_us {
        let _ = write!(s, " after {} us", end.saturating_sub(c.started_us));
    }
    if c.waiting_total > 0 {
        let _ = write!(
            s,
            ", waiting for {}{}",
            ranks_text(&c.waiting_for),
            match c.waiting_total as usize > c.waiting_for.len() {
                true => format!(
                    " (+{} more)",
                    c.waiting_total as usize - c.waiting_for.len()
                ),
                false => String::new(),
            }
        );
    }
    if let Some(e) = &c.error {
        let _ = write!(s, ": {e}");
    }
    s
}

fn analyse(comm: &str, ds: &[&Dump]) -> Finding {
    let nranks = ds.iter().map(|d| d.nranks).max().unwrap_or(0);
    let dumped: Vec<usize> = ds.iter().map(|d| d.rank).collect();
    let mut f = Finding {
        comm: comm.to_string(),
        nranks,
        dumped: dumped.clone(),
        ..Finding::default()
    };
    let mut proof: Vec<String> = Vec::new();

    // The first call whose signature differs between ranks.
    let seqs: BTreeSet<u64> = ds
        .iter()
        .flat_map(|d| d.calls.iter().map(|c| c.seq))
        .collect();
    for &seq in &seqs {
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for d in ds {
            if let Some(c) = d.calls.iter().find(|c| c.seq == seq) {
                groups.entry(c.signature()).or_default().push(d.rank);
            }
        }
        if groups.len() > 1 {
            let mut g: Groups = groups.into_iter().collect();
            g.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1.cmp(&b.1)));
            for d in ds {
                if let Some(c) = d.calls.iter().find(|c| c.seq == seq) {
                    proof.push(evidence(d, c));
                }
            }
            f.divergence = Some((seq, g));
            break;
        }
    }

    // The last call of each rank and what it waited for (its recorded
    // waits, else the rank its error blames).
    let mut edges: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for d in ds {
        let Some(c) = d.calls.iter().rev().find(|c| c.state != "done") else {
            continue;
        };
        let mut on = c.waiting_for.clone();
        if on.is_empty() {
            on.extend(c.blamed.filter(|b| *b != d.rank));
        }
        if !on.is_empty() {
            f.waits.push((d.rank, c.seq, on.clone()));
            edges.insert(d.rank, on);
        }
        if f.divergence.as_ref().map(|(s, _)| *s) != Some(c.seq) {
            proof.push(evidence(d, c));
        }
    }
    let has_dump = |r: usize| dumped.contains(&r);
    let waited: BTreeSet<usize> = edges.values().flatten().copied().collect();
    f.silent = (0..nranks)
        .filter(|r| !has_dump(*r) && waited.contains(r))
        .collect();
    // Follow the chain from every waiting rank: where do the waits end?
    let mut ends: BTreeMap<usize, usize> = BTreeMap::new();
    for &start in edges.keys() {
        let (mut at, mut seen) = (start, BTreeSet::new());
        while let Some(next) = edges.get(&at).and_then(|n| n.first()) {
            if !seen.insert(at) {
                break;
            }
            at = *next;
        }
        *ends.entry(at).or_default() += 1;
    }
    f.chain_end = ends
        .into_iter()
        .max_by_key(|(r, n)| (*n, !has_dump(*r), usize::MAX - r))
        .map(|(r, _)| r);

    // Stragglers: per call that every dumped rank finished alike, the last
    // to start it.
    for &seq in &seqs {
        let starts: Vec<(usize, i64)> = ds
            .iter()
            .filter_map(|d| {
                d.calls
                    .iter()
                    .find(|c| c.seq == seq && c.state == "done")
                    .map(|c| (d.rank, c.started_us))
            })
            .collect();
        if starts.len() == ds.len() && starts.len() > 1 {
            let first = starts.iter().map(|s| s.1).min().unwrap();
            let (late, at) = starts.iter().max_by_key(|s| s.1).copied().unwrap();
            f.stragglers.push((seq, late, at.saturating_sub(first)));
        }
    }
    f.stragglers
        .sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    f.stragglers.truncate(5);

    // The paragraph.
    let mut t = String::new();
    let missing: Vec<usize> = (0..nranks).filter(|r| !has_dump(*r)).collect();
    let _ = write!(
        t,
        "communicator {comm}: {nranks} ranks; dumps from {}",
        ranks_text(&dumped)
    );
    if !missing.is_empty() {
        let _ = write!(t, "; none from {}", ranks_text(&missing));
    }
    t.push_str(".\n");
    match &f.divergence {
        Some((seq, g)) => {
            let _ = write!(t, "First divergence at call #{seq}: ");
            let (common, rest) = g.split_first().unwrap();
            for (sig, ranks) in rest {
                let _ = write!(t, "{} called {sig}; ", ranks_text(ranks));
            }
            let _ = writeln!(t, "{} called {}.", ranks_text(&common.1), common.0);
        }
        None => t.push_str("Every call recorded on more than one rank agrees on every rank.\n"),
    }
    for &s in &f.silent {
        let waiting: Vec<usize> = f
            .waits
            .iter()
            .filter(|w| w.2.contains(&s))
            .map(|w| w.0)
            .collect();
        let calls: BTreeSet<u64> = f
            .waits
            .iter()
            .filter(|w| w.2.contains(&s))
            .map(|w| w.1)
            .collect();
        let _ = writeln!(
            t,
            "Rank {s} was never heard from: it left no dump (stopped, killed, or stuck outside oxccl), and {} waited for it in call {}.",
            ranks_text(&waiting),
            calls.iter().map(|c| format!("#{c}")).collect::<Vec<_>>().join(", ")
        );
    }
    if !f.waits.is_empty() {
        let chain: Vec<String> = f
            .waits
            .iter()
            .map(|(r, seq, on)| format!("{r} -> {} (#{seq})", ranks_text(on)))
            .collect();
        let _ = write!(t, "Waits of the last calls: {}", chain.join("; "));
        match f.chain_end {
            Some(e) => {
                let _ = writeln!(t, "; they end at rank {e}.");
            }
            None => t.push_str(".\n"),
        }
    }
    if !f.stragglers.is_empty() {
        t.push_str("Stragglers (last rank to start a call, behind the first):");
        for (seq, r, lag) in &f.stragglers {
            let _ = write!(t, " #{seq} rank {r} +{lag} us;");
        }
        t.pop();
        t.push_str(".\n");
    }
    if !proof.is_empty() {
        t.push_str("Evidence:\n");
        for p in &proof {
            t.push_str(p);
            t.push('\n');
        }
    }
    f.text = t;
    f
}
