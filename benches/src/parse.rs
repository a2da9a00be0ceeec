//! A parser for nccl-tests' text output (ours or NVIDIA's): the preamble,
//! the result rows and the footer. Used by the tests to prove the format,
//! and by anyone who wants to post-process saved output.

use crate::report::{Measure, Row};

/// A parsed run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    pub program: Option<String>,
    /// `#  Rank  N ...` lines: (rank, pid, host).
    pub ranks: Vec<(usize, u32, String)>,
    pub rows: Vec<Row>,
    pub out_of_bounds: Option<u64>,
    pub avg_busbw: Option<f64>,
    pub concluded: Option<String>,
    /// Header columns seen (size, count, type, ...).
    pub header: Vec<String>,
}

fn measure(f: &[&str]) -> Result<Measure, String> {
    let num = |s: &str| s.parse::<f64>().map_err(|_| format!("not a number: {s:?}"));
    Ok(Measure {
        time_us: num(f[0])?,
        algbw: num(f[1])?,
        busbw: num(f[2])?,
        wrong: if f[3] == "N/A" {
            None
        } else {
            Some(num(f[3])? as u64)
        },
    })
}

/// Parse the whole output; `Err` names the first line that does not fit.
pub fn parse(text: &str) -> Result<Parsed, String> {
    let mut p = Parsed::default();
    for (no, line) in text.lines().enumerate() {
        let bad = |m: &str| format!("line {}: {m}: {line:?}", no + 1);
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim();
            if let Some(prog) = rest.strip_prefix("Collective test starting:") {
                p.program = Some(prog.trim().to_string());
            } else if let Some(prog) = rest.strip_prefix("Collective test concluded:") {
                p.concluded = Some(prog.trim().to_string());
            } else if rest.starts_with("Rank") {
                let f: Vec<&str> = rest.split_whitespace().collect();
                // Rank N Group G Pid P on HOST device D [..] name
                if f.len() < 8 || f[2] != "Group" || f[4] != "Pid" || f[6] != "on" {
                    return Err(bad("malformed rank line"));
                }
                let rank = f[1].parse().map_err(|_| bad("rank"))?;
                let pid = f[5].parse().map_err(|_| bad("pid"))?;
                p.ranks.push((rank, pid, f[7].to_string()));
            } else if let Some(v) = rest.strip_prefix("Out of bounds values") {
                let v = v
                    .trim_start_matches([' ', ':'])
                    .split_whitespace()
                    .next()
                    .unwrap_or("");
                p.out_of_bounds = Some(v.parse().map_err(|_| bad("out of bounds count"))?);
            } else if let Some(v) = rest.strip_prefix("Avg bus bandwidth") {
                let v = v
                    .trim_start_matches([' ', ':'])
                    .split_whitespace()
                    .next()
                    .unwrap_or("");
                p.avg_busbw = Some(v.parse().map_err(|_| bad("avg bus bandwidth"))?);
            } else if rest.starts_with("size") {
                p.header = rest.split_whitespace().map(String::from).collect();
            }
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 13 {
            return Err(bad(&format!(
                "a result row has 13 fields, this has {}",
                f.len()
            )));
        }
        p.rows.push(Row {
            bytes: f[0].parse().map_err(|_| bad("size"))?,
            count: f[1].parse().map_err(|_| bad("count"))?,
            dtype: f[2].to_string(),
            redop: f[3].to_string(),
            root: f[4].parse().map_err(|_| bad("root"))?,
            oop: measure(&f[5..9]).map_err(|e| bad(&e))?,
            ip: measure(&f[9..13]).map_err(|e| bad(&e))?,
            series: format!("{} {}", f[2], f[3]),
            algorithm: String::new(),
        });
    }
    Ok(p)
}
