//! DDP equals single-process training: same global batch, same seed,
//! parameters agree within 1e-5 (relative) after 10 steps with 2 and 4
//! ranks; gradient accumulation (K = 2) equals the unaccumulated run; and a
//! stop-and-resume from a checkpoint is bit-identical to an uninterrupted run.

use oxccl::{Communicator, Config, UniqueId};
use std::time::Duration;
use trainer::data::Corpus;
use trainer::model::ModelConfig;
use trainer::optim::AdamW;
use trainer::train::{step, TrainConfig, TrainState};

fn cfg(accum: usize) -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            vocab: 29,
            d_model: 32,
            layers: 2,
            heads: 4,
            seq: 16,
        },
        batch: 8,
        accum,
        seed: 7,
        opt: AdamW::default(),
        // Small buckets: several per step, so bucketing is exercised.
        bucket_bytes: 16 << 10,
    }
}

fn corpus() -> Corpus {
    Corpus::markov(3, 20_000)
}

fn single(cfg: &TrainConfig, steps: u64) -> (TrainState, Vec<f32>) {
    let c = corpus();
    let mut st = TrainState::new(cfg);
    let losses = (0..steps)
        .map(|_| step(cfg, &c, &mut st, None).unwrap().loss)
        .collect();
    (st, losses)
}

/// Run `f` on `n` ranks (threads) of a fresh communicator on loopback.
fn with_comms<R: Send>(n: usize, f: impl Fn(Communicator, usize) -> R + Sync) -> Vec<R> {
    let comm_cfg = Config {
        socket_ifname: Some("lo".into()),
        timeout: Duration::from_secs(120),
        ..Config::default()
    };
    let id = UniqueId::with_config(&comm_cfg).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, comm_cfg, f) = (&id, comm_cfg.clone(), &f);
                s.spawn(move || {
                    f(
                        Communicator::init_with_config(id, r, n, comm_cfg).unwrap(),
                        r,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn ddp(cfg: &TrainConfig, n: usize, steps: u64) -> Vec<(TrainState, Vec<f32>)> {
    with_comms(n, |comm, _| {
        let c = corpus();
        let mut st = TrainState::new(cfg);
        let losses = (0..steps)
            .map(|_| step(cfg, &c, &mut st, Some(&comm)).unwrap().loss)
            .collect();
        (st, losses)
    })
}

/// Relative difference ||a - b|| / ||b|| of each parameter unit (the
/// embeddings, each block, the head), the largest over units.
fn max_rel(a: &TrainState, b: &TrainState) -> f32 {
    a.params
        .iter()
        .zip(&b.params)
        .map(|(x, y)| {
            let d: f64 = x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum();
            let n: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum();
            (d.sqrt() / n.sqrt().max(1e-12)) as f32
        })
        .fold(0.0, f32::max)
}

/// Largest elementwise |a - b| (reported, not asserted: Adam turns
/// last-bit differences of near-zero gradients into lr-sized steps).
fn max_abs(a: &TrainState, b: &TrainState) -> f32 {
    a.params
        .iter()
        .flatten()
        .zip(b.params.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn ddp_on_2_and_4_ranks_matches_single_process() {
    let c = cfg(1);
    let want = single(&c, 10);
    assert!(want.1[9] < want.1[0], "loss must fall: {:?}", want.1);
    for n in [2, 4] {
        assert_matches(&format!("DDP {n} ranks"), &ddp(&c, n, 10), &want);
    }
}

#[test]
fn gradient_accumulation_matches_the_unaccumulated_run() {
    let (plain, _) = single(&cfg(1), 10);
    let (accum, _) = single(&cfg(2), 10);
    let rel = max_rel(&accum, &plain);
    assert!(rel <= 1e-5, "single, K=2: {rel:e}");
    let ddp2 = ddp(&cfg(2), 2, 10);
    let rel = max_rel(&ddp2[0].0, &plain);
    assert!(rel <= 1e-5, "DDP 2 ranks, K=2: {rel:e}");
}

#[test]
fn resume_from_a_checkpoint_is_bit_identical() {
    let c = cfg(1);
    let data = corpus();
    let (straight, _) = single(&c, 10);
    let mut st = TrainState::new(&c);
    for _ in 0..5 {
        step(&c, &data, &mut st, None).unwrap();
    }
    let path = std::env::temp_dir().join(format!("oxccl-trainer-{}.ckpt", std::process::id()));
    let path = path.to_str().unwrap();
    trainer::checkpoint::save(&st, path).unwrap();
    let sizes: Vec<usize> = st.params.iter().map(|p| p.len()).collect();
    let mut resumed = trainer::checkpoint::load(path, &sizes).unwrap();
    assert_eq!(resumed, st);
    for _ in 0..5 {
        step(&c, &data, &mut resumed, None).unwrap();
    }
    assert_eq!(resumed.params, straight.params, "resumed run diverged");
    assert_eq!(resumed.moments, straight.moments);
    // A checkpoint of another model is refused.
    assert!(trainer::checkpoint::load(path, &sizes[1..]).is_err());
    std::fs::remove_file(path).ok();
}

fn zero3(
    cfg: &TrainConfig,
    n: usize,
    steps: u64,
) -> Vec<(Vec<Vec<f32>>, Vec<f32>, trainer::zero::Memory)> {
    with_comms(n, |comm, r| {
        let c = corpus();
        let mut st = trainer::zero::ShardState::new(cfg, r, n);
        let mut mem = trainer::zero::Memory::default();
        let losses = (0..steps)
            .map(|_| {
                let (s, m) = trainer::zero::step(cfg, &c, &mut st, &comm).unwrap();
                mem = m;
                s.loss
            })
            .collect();
        (trainer::zero::gather_full(&st, &comm).unwrap(), losses, mem)
    })
}

#[test]
fn zero3_matches_ddp_and_shards_its_memory() {
    let c = cfg(1);
    let single_bytes = 4 * 4 * c.model.parameters(); // params + grads + m + v, f32
    for n in [2, 4] {
        let want = ddp(&c, n, 10);
        let got = zero3(&c, n, 10);
        let want_state = &want[0].0;
        for (r, (params, losses, mem)) in got.iter().enumerate() {
            let st = TrainState {
                step: 10,
                params: params.clone(),
                moments: want_state.moments.clone(),
            };
            let rel = max_rel(&st, want_state);
            assert!(
                rel <= 1e-5,
                "ZeRO-3 {n} ranks, rank {r}: parameters differ from DDP by {rel:e}"
            );
            for (a, b) in losses.iter().zip(&want[0].1) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "ZeRO-3 {n} ranks: loss {a} vs {b}"
                );
            }
            // Persistent bytes at most 1/N of the single-process figure plus padding
            // (fewer than N elements per unit, times 4 buffers of 4 bytes).
            let padding = 4 * 4 * n * c.model.layout().len();
            assert!(
                mem.persistent() <= single_bytes / n + padding,
                "rank {r}: {} bytes vs {}/{n}",
                mem.persistent(),
                single_bytes
            );
            assert!(
                mem.peak_gathered > 0 && mem.peak_gathered < single_bytes / 4,
                "rank {r}: gathered peak {}",
                mem.peak_gathered
            );
        }
        eprintln!(
            "ZeRO-3 {n} ranks vs DDP after 10 steps: relative {:e}; per-rank persistent {} B of {} B single ({:.3}), peak gathered {} B",
            max_rel(&TrainState { step: 10, params: got[0].0.clone(), moments: want_state.moments.clone() }, want_state),
            got[0].2.persistent(),
            single_bytes,
            got[0].2.persistent() as f64 / single_bytes as f64,
            got[0].2.peak_gathered
        );
    }
}

#[test]
fn zero3_with_accumulation_matches_the_unaccumulated_run() {
    let (plain, _) = single(&cfg(1), 10);
    let got = zero3(&cfg(2), 2, 10);
    let st = TrainState {
        step: 10,
        params: got[0].0.clone(),
        moments: plain.moments.clone(),
    };
    let rel = max_rel(&st, &plain);
    assert!(rel <= 1e-5, "ZeRO-3 2 ranks, K=2: {rel:e}");
}

#[test]
fn zero3_resume_from_sharded_checkpoint_is_bit_identical() {
    let c = cfg(1);
    let n = 2;
    let path = std::env::temp_dir().join(format!("oxccl-zero3-{}.ckpt", std::process::id()));
    let path = path.to_str().unwrap().to_string();
    with_comms(n, |comm, r| {
        let data = corpus();
        let mut straight = trainer::zero::ShardState::new(&c, r, n);
        for _ in 0..10 {
            trainer::zero::step(&c, &data, &mut straight, &comm).unwrap();
        }
        let mut st = trainer::zero::ShardState::new(&c, r, n);
        for _ in 0..5 {
            trainer::zero::step(&c, &data, &mut st, &comm).unwrap();
        }
        trainer::checkpoint::save_shard(&st, &path, &comm).unwrap();
        let mut resumed = trainer::checkpoint::load_shard(&path, r, n, &st.lens).unwrap();
        assert_eq!(resumed, st);
        for _ in 0..5 {
            trainer::zero::step(&c, &data, &mut resumed, &comm).unwrap();
        }
        assert_eq!(resumed, straight, "rank {r}: resumed run diverged");
        let mut other = st.lens.clone();
        other[0] += 1;
        assert!(
            trainer::checkpoint::load_shard(&path, r, n, &other).is_err(),
            "another model's checkpoint accepted"
        );
    });
    for f in [
        path.clone(),
        trainer::checkpoint::shard_file(&path, 5, 0),
        trainer::checkpoint::shard_file(&path, 5, 1),
    ] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn ddp_resume_from_checkpoint_is_bit_identical() {
    let c = cfg(1);
    let n = 2;
    let straight = ddp(&c, n, 10);
    let path = std::env::temp_dir().join(format!("oxccl-ddp-{}.ckpt", std::process::id()));
    let path = path.to_str().unwrap().to_string();
    let resumed: Vec<TrainState> = with_comms(n, |comm, r| {
        let data = corpus();
        let mut st = TrainState::new(&c);
        for _ in 0..5 {
            step(&c, &data, &mut st, Some(&comm)).unwrap();
        }
        if r == 0 {
            trainer::checkpoint::save(&st, &path).unwrap();
        }
        comm.barrier().unwrap();
        let sizes: Vec<usize> = st.params.iter().map(|p| p.len()).collect();
        let mut st = trainer::checkpoint::load(&path, &sizes).unwrap();
        for _ in 0..5 {
            step(&c, &data, &mut st, Some(&comm)).unwrap();
        }
        st
    });
    for (r, st) in resumed.iter().enumerate() {
        assert_eq!(
            st.params, straight[r].0.params,
            "rank {r}: resumed DDP run diverged"
        );
        assert_eq!(st.moments, straight[r].0.moments);
    }
    std::fs::remove_file(path).ok();
}

/// `T × D` ranks: tensor-parallel groups of `t`; every rank's whole model
/// (gathered from its group) and losses.
fn tensor_parallel(
    cfg: &TrainConfig,
    n: usize,
    t: usize,
    steps: u64,
) -> Vec<(TrainState, Vec<f32>)> {
    with_comms(n, |comm, _| {
        let g = trainer::pp::Layout::split(&comm, t, 1).unwrap();
        let tp = g.tp.as_ref().unwrap();
        let c = corpus();
        let mut st = trainer::tp::init_state(cfg, tp.rank(), t);
        let losses = (0..steps)
            .map(|_| {
                trainer::tp::step(cfg, &c, &mut st, tp, Some(&g.dp))
                    .unwrap()
                    .loss
            })
            .collect();
        (
            trainer::tp::gather_state(&cfg.model, &st, tp).unwrap(),
            losses,
        )
    })
}

#[test]
fn tensor_parallel_matches_single_process() {
    for accum in [1, 2] {
        let c = cfg(accum);
        let want = single(&c, 10);
        // (ranks, tensor-parallel group): TP 2, TP 4 (one head each), and
        // TP 2 x DP 2.
        for (n, t) in [(2, 2), (4, 4), (4, 2)] {
            let got = tensor_parallel(&c, n, t, 10);
            let what = format!("TP {t} x DP {} (accum {accum})", n / t);
            assert_matches(&what, &got, &want);
        }
    }
}

#[test]
fn tensor_parallel_refuses_what_does_not_divide() {
    let c = cfg(1);
    let errs = with_comms(3, |comm, _| {
        // 3 ranks do not form groups of 2; 4 heads do not divide by 3.
        let groups = trainer::pp::Layout::split(&comm, 2, 1)
            .err()
            .map(|e| e.to_string());
        let g = trainer::pp::Layout::split(&comm, 3, 1).unwrap();
        let tp = g.tp.as_ref().unwrap();
        let mut st = trainer::tp::init_state(&c, tp.rank(), 3);
        let heads = trainer::tp::step(&c, &corpus(), &mut st, tp, Some(&g.dp))
            .err()
            .map(|e| e.to_string());
        (groups, heads)
    });
    for (groups, heads) in errs {
        assert!(groups
            .unwrap()
            .contains("do not divide into tensor-parallel groups of 2"));
        assert!(heads.unwrap().contains("needs a multiple of 3 heads"));
    }
}

#[test]
fn tensor_parallel_resumes_a_whole_checkpoint_and_hands_it_back() {
    let c = cfg(1);
    let data = corpus();
    let (straight, _) = single(&c, 10);
    let mut st = TrainState::new(&c);
    for _ in 0..5 {
        step(&c, &data, &mut st, None).unwrap();
    }
    // Single-process state, 5 steps -> TP 2 for 3 steps -> TP 4 for 2
    // (each through the whole state, as a checkpoint holds it).
    let after_tp2 = with_comms(2, |comm, r| {
        let tp = std::sync::Arc::new(comm);
        let mut mine = trainer::tp::shard_state(&c.model, &st, r, 2);
        // Parts and whole convert both ways bit for bit.
        assert_eq!(trainer::tp::gather_state(&c.model, &mine, &tp).unwrap(), st);
        for _ in 0..3 {
            trainer::tp::step(&c, &data, &mut mine, &tp, None).unwrap();
        }
        trainer::tp::gather_state(&c.model, &mine, &tp).unwrap()
    });
    let after_tp4 = with_comms(4, |comm, r| {
        let tp = std::sync::Arc::new(comm);
        let mut mine = trainer::tp::shard_state(&c.model, &after_tp2[0], r, 4);
        for _ in 0..2 {
            trainer::tp::step(&c, &data, &mut mine, &tp, None).unwrap();
        }
        trainer::tp::gather_state(&c.model, &mine, &tp).unwrap()
    });
    for got in &after_tp4 {
        assert_eq!(got.step, 10);
        let rel = max_rel(got, &straight);
        assert!(rel <= 1e-5, "single 5 -> TP 2 -> TP 4: {rel:e}");
    }
}

/// `t × p × (n / t p)` ranks through the pipeline's step: every rank's
/// whole model (gathered) and losses.
fn layout_run(
    cfg: &TrainConfig,
    n: usize,
    (t, p, m): (usize, usize, usize),
    schedule: trainer::schedule::Schedule,
    steps: u64,
) -> Vec<(TrainState, Vec<f32>)> {
    use trainer::pp;
    with_comms(n, |comm, _| {
        let l = pp::Layout::split(&comm, t, p).unwrap();
        let c = corpus();
        let mut st = pp::init_state(cfg, l.part(), t, l.stage(), p);
        let losses = (0..steps)
            .map(|_| {
                pp::step(cfg, &c, &mut st, &pp::Parallel::of(&l, m, schedule))
                    .unwrap()
                    .0
                    .loss
            })
            .collect();
        (pp::gather_state(&cfg.model, &st, &l).unwrap(), losses)
    })
}

fn assert_matches(what: &str, got: &[(TrainState, Vec<f32>)], want: &(TrainState, Vec<f32>)) {
    for (r, (st, losses)) in got.iter().enumerate() {
        let rel = max_rel(st, &want.0);
        assert!(
            rel <= 1e-5,
            "{what}, rank {r}: parameters differ by {rel:e}"
        );
        assert_eq!(
            st.params, got[0].0.params,
            "{what}: rank {r} diverged from rank 0"
        );
        for (a, b) in losses.iter().zip(&want.1) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{what}: loss {a} vs {b}"
            );
        }
    }
    eprintln!(
        "{what} vs single after 10 steps: relative (per unit, L2) {:e}, largest elementwise {:e}",
        max_rel(&got[0].0, &want.0),
        max_abs(&got[0].0, &want.0)
    );
}

#[test]
fn pipeline_parallel_matches_single_process() {
    use trainer::schedule::Schedule;
    let c = cfg(1);
    let want = single(&c, 10);
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        for m in [1, 2, 4] {
            let got = layout_run(&c, 2, (1, 2, m), schedule, 10);
            assert_matches(&format!("PP 2 {schedule:?} M={m}"), &got, &want);
        }
    }
    // Four stages of one block each.
    let mut deep = cfg(1);
    deep.model.layers = 4;
    let want = single(&deep, 10);
    let got = layout_run(&deep, 4, (1, 4, 4), Schedule::OneFOneB, 10);
    assert_matches("PP 4 OneFOneB M=4", &got, &want);
}

#[test]
fn three_d_parallel_2x2x2_matches_single_process() {
    use trainer::schedule::Schedule;
    let c = cfg(1);
    let want = single(&c, 10);
    let got = layout_run(&c, 8, (2, 2, 2), Schedule::OneFOneB, 10);
    assert_matches("TP 2 x PP 2 x DP 2 (1F1B, M=2)", &got, &want);
}

#[test]
fn zero3_checkpoint_of_4_ranks_resumes_on_2_and_8() {
    let c = cfg(1);
    let path = std::env::temp_dir().join(format!("oxccl-reshard-{}.ckpt", std::process::id()));
    let path = path.to_str().unwrap().to_string();
    let data = corpus();
    // 4 ranks: 5 steps, saved, then 5 more (the uninterrupted run).
    let four = with_comms(4, |comm, r| {
        let mut st = trainer::zero::ShardState::new(&c, r, 4);
        for _ in 0..5 {
            trainer::zero::step(&c, &data, &mut st, &comm).unwrap();
        }
        trainer::checkpoint::save_shard(&st, &path, &comm).unwrap();
        let at5 = trainer::zero::gather_full(&st, &comm).unwrap();
        for _ in 0..5 {
            trainer::zero::step(&c, &data, &mut st, &comm).unwrap();
        }
        (at5, trainer::zero::gather_full(&st, &comm).unwrap())
    });
    let (at5, want) = four[0].clone();
    let lens: Vec<usize> = at5.iter().map(Vec::len).collect();
    for n in [2, 8] {
        let got = with_comms(n, |comm, r| {
            let mut st = trainer::checkpoint::load_shard(&path, r, n, &lens).unwrap();
            assert_eq!(st.step, 5);
            // Cut anew, nothing lost: the same model, bit for bit.
            let whole = trainer::zero::gather_full(&st, &comm).unwrap();
            assert_eq!(whole, at5, "{n} ranks: resharded parameters differ");
            for _ in 0..5 {
                trainer::zero::step(&c, &data, &mut st, &comm).unwrap();
            }
            trainer::zero::gather_full(&st, &comm).unwrap()
        });
        // The same trajectory within rounding: averaging gradients over 2
        // or 8 ranks adds the same numbers in another order.
        for params in got {
            let a = TrainState {
                step: 10,
                params,
                moments: Vec::new(),
            };
            let b = TrainState {
                step: 10,
                params: want.clone(),
                moments: Vec::new(),
            };
            let rel = max_rel(&a, &b);
            assert!(rel <= 1e-5, "saved by 4, resumed by {n}: {rel:e}");
            eprintln!(
                "ZeRO-3 saved by 4 ranks, resumed by {n}: relative {rel:e} after 5 more steps"
            );
        }
    }
    for f in std::iter::once(path.clone())
        .chain((0..4).map(|r| trainer::checkpoint::shard_file(&path, 5, r)))
    {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn powersgd_averages_low_rank_gradients_exactly() {
    use trainer::powersgd::PowerSgd;
    // One unit of one 12 x 10 matrix and one bias of 5.
    let layout = vec![vec![
        ("w".to_string(), vec![12, 10]),
        ("b".to_string(), vec![5]),
    ]];
    let got = with_comms(3, |comm, r| {
        // Rank r's gradient: A B_r (A shared, 12 x 2): the average has rank 2.
        let a: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let b: Vec<f32> = (0..20).map(|i| ((i * (r + 2)) % 9) as f32 - 4.0).collect();
        let mut g = vec![0.0f32; 125];
        for i in 0..12 {
            for j in 0..10 {
                g[i * 10 + j] = (0..2).map(|c| a[i * 2 + c] * b[c * 10 + j]).sum();
            }
        }
        for k in 0..5 {
            g[120 + k] = (r * 5 + k) as f32;
        }
        let mine = g.clone();
        let mut p = PowerSgd::new(&layout, 2, 9);
        assert_eq!(p.floats_per_step(), (12 + 10) * 2 + 5);
        let mut grads = vec![g];
        p.all_reduce(&comm, &mut grads).unwrap();
        (mine, grads.remove(0))
    });
    let mean: Vec<f32> = (0..125)
        .map(|i| got.iter().map(|(m, _)| m[i]).sum::<f32>() / 3.0)
        .collect();
    for (r, (_, avg)) in got.iter().enumerate() {
        // Every rank holds the same average, bit for bit ...
        assert_eq!(avg, &got[0].1, "rank {r}");
        // ... which is the exact mean (rank 2 captures a rank-2 matrix).
        for i in 0..125 {
            assert!(
                (avg[i] - mean[i]).abs() <= 1e-4 * mean[i].abs().max(1.0),
                "element {i}: {} vs {}",
                avg[i],
                mean[i]
            );
        }
    }
}

#[test]
fn powersgd_ddp_trains_on_fewer_bytes() {
    use trainer::powersgd::PowerSgd;
    use trainer::train::{step_averaging, Averaging};
    let c = cfg(1);
    let (_, plain) = single(&c, 30);
    let got = with_comms(2, |comm, _| {
        let data = corpus();
        let mut st = TrainState::new(&c);
        let mut p = PowerSgd::new(&c.model.layout(), 4, c.seed);
        let stats: Vec<_> = (0..30)
            .map(|_| {
                step_averaging(&c, &data, &mut st, Some(&comm), Averaging::PowerSgd(&mut p))
                    .unwrap()
            })
            .collect();
        (st, stats)
    });
    let full_bytes = 4 * c.model.parameters();
    let (st0, stats) = &got[0];
    assert_eq!(st0.params, got[1].0.params, "replicas diverged");
    let bytes = stats[0].comm_bytes;
    assert!(bytes * 2 < full_bytes, "{bytes} of {full_bytes} bytes");
    let (first, last) = (stats[0].loss, stats[29].loss);
    assert!(last < first - 0.5, "loss {first} -> {last}");
    eprintln!(
        "PowerSGD rank 4, 2 ranks: {bytes} of {full_bytes} gradient bytes per step; loss after 30 steps {last:.4} (uncompressed single {:.4})",
        plain[29]
    );
}

#[test]
fn powersgd_error_feedback_returns_what_compression_dropped() {
    use trainer::powersgd::PowerSgd;
    // A full-rank 16 x 16 gradient compressed at rank 1, the same every
    // step: one step keeps a rank-1 part, but error feedback sends the
    // rest later, so the sum of what was applied approaches the sum of the
    // gradients (without it, the same share would be lost every step).
    let layout = vec![vec![("w".to_string(), vec![16, 16])]];
    let got = with_comms(2, |comm, r| {
        let g: Vec<f32> = (0..256)
            .map(|i| (((i * 37 + r * 11) % 23) as f32 - 11.0) / 7.0)
            .collect();
        let mut p = PowerSgd::new(&layout, 1, 5);
        let mut applied = vec![0.0f32; 256];
        let mut errors = Vec::new();
        for k in 1..=40 {
            let mut grads = vec![g.clone()];
            p.all_reduce(&comm, &mut grads).unwrap();
            for (a, x) in applied.iter_mut().zip(&grads[0]) {
                *a += x;
            }
            errors.push((k, applied.clone()));
        }
        (g, errors)
    });
    let mean: Vec<f32> = (0..256)
        .map(|i| (got[0].0[i] + got[1].0[i]) / 2.0)
        .collect();
    let rel = |k: usize, applied: &[f32]| -> f32 {
        let d: f32 = applied
            .iter()
            .zip(&mean)
            .map(|(a, m)| (a - k as f32 * m).powi(2))
            .sum();
        let n: f32 = mean.iter().map(|m| (k as f32 * m).powi(2)).sum();
        (d / n).sqrt()
    };
    let steps = &got[0].1;
    let (first, last) = (rel(steps[0].0, &steps[0].1), rel(steps[39].0, &steps[39].1));
    eprintln!("PowerSGD rank 1 on a full-rank 16x16 gradient: relative error of the applied sum after 1 step {first:.3}, after 40 {last:.3}");
    assert!(first > 0.3, "rank 1 should lose much in one step: {first}");
    assert!(
        last < first / 4.0,
        "error feedback did not return the rest: {first} -> {last}"
    );
}
