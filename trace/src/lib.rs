//! `oxccl-trace`: seeing inside a job. Reads the flight recorder dumps
//! every rank of a failed job writes into `OXCCL_FLIGHT_DIR` ([`flight`])
//! and says what happened ([`why`]); joins the ranks' timeline traces
//! (`OXCCL_TRACE`) into one on rank 0's clock and checks them ([`merge`]).

pub mod flight;
pub mod merge;
pub mod why;

use std::path::{Path, PathBuf};

/// The files `PREFIX*.json` in `dir` with their text; an error naming
/// `what` and the variable `var` that makes them when there are none.
pub(crate) fn read_files(
    dir: &Path,
    prefix: &str,
    what: &str,
    var: &str,
) -> Result<Vec<(PathBuf, String)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for e in entries {
        let path = e
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with(prefix) && name.ends_with(".json")) {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        files.push((path, text));
    }
    if files.is_empty() {
        return Err(format!(
            "no {what} ({prefix}*.json) in {} (set {var} for the job)",
            dir.display()
        ));
    }
    Ok(files)
}
