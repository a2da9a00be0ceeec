//! Elastic recovery with restarts: a rank SIGKILLed mid-training under
//! `oxrun --max-restarts 1` (oxccl's launcher, in this process), the job
//! restarted from its last checkpoint, finishing with the state of a run
//! that was never interrupted, bit for bit.

use oxccl::launch::{self, Bind, Launch, Output};
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
        bind: Bind::None,
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
    m.unit_lens()
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
    let missing: Vec<u64> = (1..=STEPS).filter(|s| !steps.contains(s)).collect();
    assert!(missing.is_empty(), "steps with no metrics row: {missing:?}");
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

/// The trainer's defaults (`trainer --mode ddp` with `--batch 12`).
fn default_run() -> (trainer::train::TrainConfig, trainer::data::Corpus) {
    let corpus = trainer::data::Corpus::markov(1 ^ 0xda7a, 200_000);
    let cfg = trainer::train::TrainConfig {
        model: trainer::model::ModelConfig {
            vocab: corpus.vocab.len(),
            d_model: 64,
            layers: 2,
            heads: 4,
            seq: 32,
        },
        batch: 12,
        accum: 1,
        seed: 1,
        opt: trainer::optim::AdamW::default(),
        bucket_bytes: 25 << 20,
    };
    (cfg, corpus)
}

#[test]
fn survivors_shrink_the_communicator_and_train_on_when_a_rank_dies() {
    use std::io::Read;
    let dir = std::env::temp_dir().join(format!("oxccl-shrink-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("end.ckpt").display().to_string();
    let metrics = dir.join("metrics.csv").display().to_string();
    let steps = 80;
    // Ranks started by hand, joined through a root this test hosts: a
    // launcher would stop the survivors itself.
    let id = oxccl::UniqueId::serve(
        "127.0.0.1:0".parse().unwrap(),
        oxccl::transport_handshake::Secret::random().unwrap(),
        Duration::from_secs(60),
    )
    .unwrap();
    let mut ranks: Vec<std::process::Child> = (0..4)
        .map(|r| {
            std::process::Command::new(env!("CARGO_BIN_EXE_trainer"))
                .args(["--mode", "ddp", "--batch", "12", "--log-every", "1000"])
                .args(["--steps", &steps.to_string(), "--on-failure", "shrink"])
                .args(["--metrics", &metrics, "--save", &saved])
                .env("OXCCL_RANK", r.to_string())
                .env("OXCCL_WORLD_SIZE", "4")
                .env("OXCCL_UNIQUE_ID", id.to_string())
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env("OXCCL_TIMEOUT", "60")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let t = Instant::now();
    let rows = || {
        std::fs::read_to_string(&metrics)
            .map(|s| s.lines().count().saturating_sub(1))
            .unwrap_or(0)
    };
    while rows() < 20 {
        assert!(t.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    ranks[3].kill().unwrap();
    let killed_after = rows();
    assert!(killed_after < steps as usize, "killed after the end");
    let mut out = Vec::new();
    for (r, k) in ranks.iter_mut().enumerate() {
        let mut text = String::new();
        k.stdout.take().unwrap().read_to_string(&mut text).unwrap();
        k.stderr.take().unwrap().read_to_string(&mut text).unwrap();
        let status = k.wait().unwrap();
        if r < 3 {
            assert!(status.success(), "survivor {r} failed:\n{text}");
        }
        out.push(text);
    }
    assert!(
        out[0].contains("continuing on 3 ranks from step"),
        "rank 0:\n{}",
        out[0]
    );
    for (r, text) in out.iter().enumerate().take(3) {
        assert!(
            text.contains("rank 3"),
            "rank {r} does not name rank 3:\n{text}"
        );
    }
    // The survivors went on to the last step, with the batch over 3 ranks:
    // the trajectory of the single-process run, within rounding (DDP adds
    // the gradients of 4, then 3, ranks in another order than one process).
    let (cfg, corpus) = default_run();
    let lens: Vec<usize> = cfg.model.unit_lens();
    let got = trainer::checkpoint::load(&saved, &lens).unwrap();
    assert_eq!(got.step, steps);
    let mut want = trainer::train::TrainState::new(&cfg);
    for _ in 0..steps {
        trainer::train::step(&cfg, &corpus, &mut want, None).unwrap();
    }
    let rel = got
        .params
        .iter()
        .zip(&want.params)
        .map(|(x, y)| {
            let d: f64 = x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum();
            let n: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum();
            (d.sqrt() / n.sqrt().max(1e-12)) as f32
        })
        .fold(0.0, f32::max);
    eprintln!("4 ranks, rank 3 killed after {killed_after} steps, 3 to step {steps}: relative to single {rel:e}");
    assert!(
        rel <= 1e-4,
        "parameters differ from the single-process run by {rel:e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
