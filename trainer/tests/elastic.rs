//! Elastic recovery with restarts: a rank SIGKILLed mid-training under
//! `oxrun --max-restarts 1` (oxccl's launcher, in this process), the job
//! restarted from its last checkpoint, finishing with the state of a run
//! that was never interrupted, bit for bit.

use oxccl::launch::{self, Launch, Output};
use std::time::{Duration, Instant};

const STEPS: u64 = 150;

fn launch(ckpt: &str, metrics: &str, max_restarts: usize) -> Launch {
    Launch {
        nranks: 2,
        program: env!("CARGO_BIN_EXE_trainer").into(),
        args: [
            "--mode",
            "ddp",
            "--steps",
            &STEPS.to_string(),
            "--batch",
            "8",
            "--log-every",
            "50",
            "--checkpoint",
            ckpt,
            "--checkpoint-every",
            "10",
            "--metrics",
            metrics,
        ]
        .map(String::from)
        .to_vec(),
        output: Output::Prefixed,
        kill_after: Duration::from_secs(2),
        env: vec![("OXCCL_TIMEOUT".into(), "60".into())],
        max_restarts,
    }
}

fn lens() -> Vec<usize> {
    // The trainer's default model on its default corpus (vocabulary 29).
    let m = trainer::model::ModelConfig {
        vocab: 29,
        d_model: 64,
        layers: 2,
        heads: 4,
        seq: 32,
    };
    m.layout()
        .iter()
        .map(|u| u.iter().map(|(_, s)| s.iter().product::<usize>()).sum())
        .collect()
}

fn step_of(path: &str) -> Option<u64> {
    trainer::checkpoint::load(path, &lens())
        .ok()
        .map(|s| s.step)
}

/// The trainer processes of the checkpoint `ckpt` (their command lines
/// name it).
fn ranks_of(ckpt: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if pid as u32 != std::process::id() && cmd.contains("--checkpoint") && cmd.contains(ckpt) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_rank_killed_mid_training_is_restarted_and_the_job_ends_as_if_it_had_not_been() {
    let dir = std::env::temp_dir().join(format!("oxccl-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let straight = dir.join("straight.ckpt").display().to_string();
    let killed = dir.join("killed.ckpt").display().to_string();

    let metrics = dir.join("metrics.csv").display().to_string();
    assert_eq!(
        launch::run(&launch(&straight, &metrics, 0)),
        0,
        "uninterrupted run"
    );
    let want = trainer::checkpoint::load(&straight, &lens()).unwrap();
    assert_eq!(want.step, STEPS);

    let run = std::thread::spawn({
        let (killed, metrics) = (killed.clone(), metrics.clone());
        move || launch::run(&launch(&killed, &metrics, 1))
    });
    // Once a checkpoint exists, kill one rank (SIGKILL: no goodbye).
    let t = Instant::now();
    let at = loop {
        if let Some(s) = step_of(&killed).filter(|s| *s >= 20) {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "no checkpoint");
        std::thread::sleep(Duration::from_millis(5));
    };
    let pids = ranks_of(&killed);
    assert_eq!(pids.len(), 2, "the job's ranks: {pids:?}");
    // SAFETY: signalling a process this test's launcher started.
    assert_eq!(unsafe { libc::kill(pids[1], libc::SIGKILL) }, 0);
    assert!(at < STEPS, "killed after the end");
    assert_eq!(run.join().unwrap(), 0, "the restarted job failed");
    // The restart resumed (a run started over would log step 1 twice), and
    // every step was logged.
    let csv = std::fs::read_to_string(&metrics).unwrap();
    let steps: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        steps.iter().filter(|s| **s == 1).count(),
        1,
        "restarted from scratch"
    );
    assert!(
        (1..=STEPS).all(|s| steps.contains(&s)),
        "steps missing: {steps:?}"
    );
    // Resumed from a checkpoint, bit for bit the uninterrupted state.
    let got = trainer::checkpoint::load(&killed, &lens()).unwrap();
    assert_eq!(got.step, STEPS);
    assert!(
        got.params == want.params,
        "parameters differ from the uninterrupted run"
    );
    assert!(got.moments == want.moments, "optimizer state differs");
    std::fs::remove_dir_all(&dir).ok();
}
