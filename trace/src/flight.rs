//! Flight-recorder dumps as the ranks write them (`flight-COMM-rankR.json`,
//! format `oxccl-flight-1`; see `comm_core::flight`), read totally: a file
//! that is not one is an error naming the file and what is wrong.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// One rank's dump of one communicator.
#[derive(Clone, Debug)]
pub struct Dump {
    pub path: PathBuf,
    pub comm: String,
    pub rank: usize,
    pub nranks: usize,
    pub world_rank: usize,
    pub host: String,
    pub pid: u64,
    /// Why it was written (the error, `aborted`, a signal).
    pub reason: String,
    pub calls: Vec<Call>,
}

/// One recorded call.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub seq: u64,
    pub kind: String,
    pub dtype: String,
    pub count: u64,
    pub op: String,
    pub root: u64,
    pub algorithm: String,
    pub issued_us: i64,
    pub started_us: i64,
    pub ended_us: Option<i64>,
    /// `running`, `done` or `failed`.
    pub state: String,
    pub error: Option<String>,
    pub blamed: Option<usize>,
    pub waiting_for: Vec<usize>,
    pub waiting_total: u64,
}

impl Call {
    /// What every rank must agree on: the collective and its shape.
    pub fn signature(&self) -> String {
        let mut s = format!("{}({} x {}", self.kind, self.dtype, self.count);
        if self.op != "none" {
            s += &format!(", {}", self.op);
        }
        if matches!(self.kind.as_str(), "broadcast" | "reduce") {
            s += &format!(", root {}", self.root);
        }
        s + ")"
    }
}

fn field<'a>(v: &'a Value, name: &str, file: &Path) -> Result<&'a Value, String> {
    v.get(name)
        .ok_or_else(|| format!("{}: no field {name:?}", file.display()))
}

fn uint(v: &Value, name: &str, file: &Path) -> Result<u64, String> {
    field(v, name, file)?
        .as_u64()
        .ok_or_else(|| format!("{}: {name:?} is not a whole number", file.display()))
}

fn int(v: &Value, name: &str, file: &Path) -> Result<i64, String> {
    field(v, name, file)?
        .as_i64()
        .ok_or_else(|| format!("{}: {name:?} is not a number", file.display()))
}

fn text(v: &Value, name: &str, file: &Path) -> Result<String, String> {
    field(v, name, file)?
        .as_str()
        .map(String::from)
        .ok_or_else(|| format!("{}: {name:?} is not text", file.display()))
}

fn index(n: u64, name: &str, file: &Path) -> Result<usize, String> {
    usize::try_from(n)
        .ok()
        .filter(|n| *n < 1 << 24)
        .ok_or_else(|| format!("{}: {name:?} = {n} is not a rank", file.display()))
}

/// Parse one dump's text (`path` names it in errors).
pub fn parse(path: &Path, text_: &str) -> Result<Dump, String> {
    let v: Value =
        serde_json::from_str(text_).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let format = text(&v, "format", path)?;
    if format != "oxccl-flight-1" {
        return Err(format!(
            "{}: format {format:?}, not oxccl-flight-1",
            path.display()
        ));
    }
    let rank = index(uint(&v, "rank", path)?, "rank", path)?;
    let nranks = index(uint(&v, "nranks", path)?, "nranks", path)?;
    if rank >= nranks {
        return Err(format!("{}: rank {rank} of {nranks} ranks", path.display()));
    }
    let mut calls = Vec::new();
    let list = field(&v, "calls", path)?
        .as_array()
        .ok_or_else(|| format!("{}: \"calls\" is not a list", path.display()))?;
    for c in list {
        let opt_int = |name: &str| -> Result<Option<i64>, String> {
            match field(c, name, path)? {
                Value::Null => Ok(None),
                x => x
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| format!("{}: {name:?} is not a number", path.display())),
            }
        };
        let waiting_for = field(c, "waiting_for", path)?
            .as_array()
            .ok_or_else(|| format!("{}: \"waiting_for\" is not a list", path.display()))?
            .iter()
            .map(|p| {
                p.as_u64()
                    .ok_or_else(|| format!("{}: a waited-for rank is not a number", path.display()))
                    .and_then(|p| index(p, "waiting_for", path))
            })
            .collect::<Result<Vec<_>, _>>()?;
        calls.push(Call {
            seq: uint(c, "seq", path)?,
            kind: text(c, "kind", path)?,
            dtype: text(c, "dtype", path)?,
            count: uint(c, "count", path)?,
            op: text(c, "op", path)?,
            root: uint(c, "root", path)?,
            algorithm: text(c, "algorithm", path)?,
            issued_us: int(c, "issued_us", path)?,
            started_us: int(c, "started_us", path)?,
            ended_us: opt_int("ended_us")?,
            state: text(c, "state", path)?,
            error: match field(c, "error", path)? {
                Value::Null => None,
                e => Some(
                    e.as_str()
                        .ok_or_else(|| format!("{}: \"error\" is not text", path.display()))?
                        .to_string(),
                ),
            },
            blamed: opt_int("blamed")?
                .map(|b| index(b.max(0) as u64, "blamed", path))
                .transpose()?,
            waiting_for,
            waiting_total: uint(c, "waiting_total", path)?,
        });
    }
    Ok(Dump {
        path: path.to_path_buf(),
        comm: text(&v, "comm", path)?,
        rank,
        nranks,
        world_rank: index(uint(&v, "world_rank", path)?, "world_rank", path)?,
        host: text(&v, "host", path)?,
        pid: uint(&v, "pid", path)?,
        reason: text(&v, "reason", path)?,
        calls,
    })
}

/// Every dump in `dir` (`flight-*.json`), sorted by communicator and rank.
pub fn load(dir: &Path) -> Result<Vec<Dump>, String> {
    let mut dumps = crate::read_files(dir, "flight-", "flight dumps", "OXCCL_FLIGHT_DIR")?
        .iter()
        .map(|(path, text)| parse(path, text))
        .collect::<Result<Vec<_>, _>>()?;
    dumps.sort_by(|a, b| (&a.comm, a.rank).cmp(&(&b.comm, b.rank)));
    Ok(dumps)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"{"format": "oxccl-flight-1", "comm": "00000000000000ab", "rank": 1,
      "nranks": 4, "world_rank": 1, "host": "h", "pid": 7, "reason": "x", "dumped_us": 5,
      "calls": [{"seq": 3, "kind": "all_reduce", "dtype": "f32", "count": 10, "op": "sum",
      "root": 0, "algorithm": "ring", "issued_us": 1, "started_us": 2, "ended_us": null,
      "state": "running", "error": null, "blamed": null, "waiting_for": [2], "waiting_total": 1}]}"#;

    #[test]
    fn a_dump_parses_and_anything_else_is_an_error_naming_the_file() {
        let p = Path::new("d/flight-x-rank1.json");
        let d = parse(p, ONE).unwrap();
        assert_eq!((d.rank, d.nranks, d.calls.len()), (1, 4, 1));
        assert_eq!(d.calls[0].waiting_for, [2]);
        assert_eq!(d.calls[0].signature(), "all_reduce(f32 x 10, sum)");
        for bad in [
            "",
            "[]",
            &ONE.replace("oxccl-flight-1", "other"),
            &ONE.replace("\"rank\": 1", "\"rank\": 9"),
            &ONE.replace("\"waiting_for\": [2]", "\"waiting_for\": [-2]"),
            &ONE.replace("\"seq\": 3", "\"seq\": \"3\""),
            &ONE.replace("\"ended_us\": null", "\"ended_us\": \"later\""),
        ] {
            let e = parse(p, bad).unwrap_err();
            assert!(e.starts_with("d/flight-x-rank1.json"), "{e}");
        }
    }
}
