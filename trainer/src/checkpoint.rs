//! Save and resume: the full training state in one file (DDP: every rank
//! holds the same state; rank 0 writes). Resuming continues the exact same
//! trajectory, bit for bit.

use crate::optim::Moments;
use crate::train::TrainState;
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"OXTRN001";

fn put(w: &mut Vec<u8>, v: &[f32]) {
    w.extend_from_slice(&(v.len() as u64).to_le_bytes());
    for x in v {
        w.extend_from_slice(&x.to_le_bytes());
    }
}

/// Write `st` to `path` (atomically: a temporary file, then rename).
pub fn save(st: &TrainState, path: &str) -> std::io::Result<()> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&st.step.to_le_bytes());
    b.extend_from_slice(&(st.params.len() as u64).to_le_bytes());
    for (p, m) in st.params.iter().zip(&st.moments) {
        put(&mut b, p);
        put(&mut b, &m.m);
        put(&mut b, &m.v);
    }
    let tmp = format!("{path}.tmp");
    std::fs::File::create(&tmp)?.write_all(&b)?;
    std::fs::rename(tmp, path)
}

/// Read a state written by [`save`]; `expect` is the parameter count per
/// unit of the model being resumed (a different model is an error).
pub fn load(path: &str, expect: &[usize]) -> std::io::Result<TrainState> {
    let bad =
        |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{path}: {m}"));
    let mut b = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut b)?;
    let mut at = 0usize;
    let mut take = |n: usize| -> std::io::Result<&[u8]> {
        let s = b.get(at..at + n).ok_or_else(|| bad("truncated".into()))?;
        at += n;
        Ok(s)
    };
    if take(8)? != MAGIC {
        return Err(bad("not an oxccl trainer checkpoint".into()));
    }
    let step = u64::from_le_bytes(take(8)?.try_into().unwrap());
    let units = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
    if units != expect.len() {
        return Err(bad(format!(
            "{units} parameter units, the model has {}",
            expect.len()
        )));
    }
    let mut vecs = || -> std::io::Result<Vec<f32>> {
        let n = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
        let raw = take(
            n.checked_mul(4)
                .ok_or_else(|| bad("length overflow".into()))?,
        )?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect())
    };
    let mut params = Vec::new();
    let mut moments = Vec::new();
    for (u, &len) in expect.iter().enumerate() {
        let p = vecs()?;
        let m = vecs()?;
        let v = vecs()?;
        if p.len() != len {
            return Err(bad(format!(
                "unit {u} has {} parameters, the model {len}",
                p.len()
            )));
        }
        params.push(p);
        moments.push(Moments { m, v });
    }
    Ok(TrainState {
        step,
        params,
        moments,
    })
}

/// ZeRO-3 (collective): every rank writes its shard to
/// `<path>.step<S>.rank<r>`; once all have, rank 0 writes the manifest
/// `<path>` (rank count, step, unit lengths), which names the step to
/// read, and then each rank removes its shards of earlier steps. A job
/// killed at any point leaves a manifest naming a complete set of shards.
pub fn save_shard(
    st: &crate::zero::ShardState,
    path: &str,
    comm: &oxccl::CoreCommunicator,
) -> std::io::Result<()> {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    let shard = TrainState {
        step: st.step,
        params: st.shards.clone(),
        moments: st.moments.clone(),
    };
    let io = |e: oxccl::Error| std::io::Error::other(e.to_string());
    save(&shard, &shard_file(path, st.step, rank))?;
    comm.barrier().map_err(io)?;
    if rank == 0 {
        let lens: Vec<String> = st.lens.iter().map(|l| l.to_string()).collect();
        let manifest = format!(
            "oxccl-zero3 ranks={nranks} step={} units={}\n",
            st.step,
            lens.join(",")
        );
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, manifest)?;
        std::fs::rename(tmp, path)?;
    }
    comm.barrier().map_err(io)?;
    // Earlier steps' shards of this rank (the manifest no longer names them).
    let p = std::path::Path::new(path);
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let base = p.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    let mine = format!(".rank{rank}");
    let current = format!("{base}.step{}.rank{rank}", st.step);
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let old = name
            .strip_prefix(base)
            .and_then(|r| r.strip_prefix(".step"))
            .and_then(|r| r.strip_suffix(&mine))
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if old && name != current {
            std::fs::remove_file(e.path()).ok();
        }
    }
    Ok(())
}

/// Where rank `rank`'s shard of step `step` of checkpoint `path` lives.
pub fn shard_file(path: &str, step: u64, rank: usize) -> String {
    format!("{path}.step{step}.rank{rank}")
}

/// Read this rank's shard written by [`save_shard`], checking the manifest;
/// saved by another number of ranks, the slices are cut anew (the
/// padding of a unit's last slice is zeros in both layouts).
pub fn load_shard(
    path: &str,
    rank: usize,
    nranks: usize,
    lens: &[usize],
) -> std::io::Result<crate::zero::ShardState> {
    let bad =
        |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{path}: {m}"));
    let manifest = std::fs::read_to_string(path)?;
    let field = |k: &str| {
        manifest
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_string)
    };
    if !manifest.starts_with("oxccl-zero3 ") {
        return Err(bad("not a ZeRO-3 checkpoint manifest".into()));
    }
    let saved_ranks: usize = field("ranks=")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("no rank count".into()))?;
    let units = field("units=").unwrap_or_default();
    let saved: Vec<usize> = units.split(',').filter_map(|v| v.parse().ok()).collect();
    if saved != lens {
        return Err(bad("saved from a different model".into()));
    }
    if saved_ranks == 0 {
        return Err(bad("saved by 0 ranks".into()));
    }
    let saved_step: u64 = field("step=")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("no step".into()))?;
    let file = |k: usize| shard_file(path, saved_step, k);
    let saved_lens: Vec<usize> = lens.iter().map(|l| l.div_ceil(saved_ranks)).collect();
    if saved_ranks == nranks {
        let st = load(&file(rank), &saved_lens)?;
        if st.step != saved_step {
            return Err(bad(format!("shard {rank} is of step {}", st.step)));
        }
        return Ok(crate::zero::ShardState {
            step: st.step,
            shards: st.params,
            moments: st.moments,
            lens: lens.to_vec(),
        });
    }
    // Resharding: this rank's slice of each unit under `nranks` comes from
    // the saved slices it overlaps, read one file at a time (no rank holds
    // more than its new slice and one saved one).
    let mine: Vec<usize> = lens.iter().map(|l| l.div_ceil(nranks)).collect();
    let mut shards: Vec<Vec<f32>> = mine.iter().map(|s| vec![0.0; *s]).collect();
    let mut m: Vec<Vec<f32>> = mine.iter().map(|s| vec![0.0; *s]).collect();
    let mut v = m.clone();
    let mut step = None;
    let mut moments_saved = None;
    for k in 0..saved_ranks {
        // Saved rank k holds [k * saved, (k + 1) * saved) of each unit.
        let overlaps = |u: usize| {
            let (a, b) = (rank * mine[u], ((rank + 1) * mine[u]).min(lens[u]));
            let (c, d) = (k * saved_lens[u], (k + 1) * saved_lens[u]);
            (a.max(c), b.min(d))
        };
        if (0..lens.len()).all(|u| {
            let (lo, hi) = overlaps(u);
            lo >= hi
        }) {
            continue;
        }
        let st = load(&file(k), &saved_lens)?;
        if *step.get_or_insert(saved_step) != st.step {
            return Err(bad(format!("shard {k} is of another step")));
        }
        let has = st.moments.iter().all(|x| !x.m.is_empty());
        if *moments_saved.get_or_insert(has) != has {
            return Err(bad(format!("shard {k} disagrees on optimizer state")));
        }
        for u in 0..lens.len() {
            let (lo, hi) = overlaps(u);
            for i in lo..hi {
                let (to, from) = (i - rank * mine[u], i - k * saved_lens[u]);
                shards[u][to] = st.params[u][from];
                if has {
                    m[u][to] = st.moments[u].m[from];
                    v[u][to] = st.moments[u].v[from];
                }
            }
        }
    }
    let moments = match moments_saved {
        Some(true) => m
            .into_iter()
            .zip(v)
            .map(|(m, v)| Moments { m, v })
            .collect(),
        _ => mine.iter().map(|_| Moments::default()).collect(),
    };
    Ok(crate::zero::ShardState {
        step: step.unwrap_or(0),
        shards,
        moments,
        lens: lens.to_vec(),
    })
}
