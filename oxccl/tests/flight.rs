//! The flight recorder (issue 20): every call leaves a record, a failed
//! call writes every survivor's records into `OXCCL_FLIGHT_DIR`, and
//! `oxccl-trace why` reads them and names what happened.

mod common;

use common::*;
use oxccl::flight::CallState;
use oxccl::prelude::*;
use std::io::BufRead;
use std::time::{Duration, Instant};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-flight-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn every_call_leaves_a_record_of_what_it_was_and_how_it_ended() {
    with_ranks(3, test_config(), |c| {
        let mut x = vec![1.0f32; 1000];
        let mut g = vec![0.0f32; 3000];
        for _ in 0..5 {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        }
        c.all_gather(&x, &mut g).unwrap();
        let r = c.recent_calls();
        assert_eq!(r.len(), 6, "init's own exchanges are forgotten");
        let seqs: Vec<u64> = r.iter().map(|r| r.seq).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
        // (Calls that never slept keep no end time: see `oxccl::flight`.)
        assert!(r.iter().all(|r| r.state == CallState::Done));
        assert_eq!(r[0].seq, 0);
        assert_eq!(r[0].call.kind, oxccl::Kind::AllReduce);
        assert_eq!(r[0].call.count, 1000);
        assert_eq!(r[5].call.kind, oxccl::Kind::AllGather);
        assert!(!r[5].algorithm.is_empty() && r[5].algorithm != "?");
    });
}

#[test]
fn a_mismatch_leaves_every_ranks_dump_and_why_names_the_odd_call() {
    let dir = temp_dir("mismatch");
    let cfg = Config {
        flight_dir: Some(dir.clone()),
        ..test_config()
    };
    with_ranks(3, cfg, |c| {
        let mut x = vec![1.0f32; 64];
        let mut g = vec![0.0f32; 192];
        for _ in 0..3 {
            c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        }
        let r = match c.rank() {
            1 => c.all_gather(&x, &mut g),
            _ => c.all_reduce_in_place(&mut x, ReduceOp::Sum),
        };
        assert!(r.is_err());
    });
    let dumps = oxccl_trace::flight::load(&dir).unwrap();
    assert_eq!(dumps.len(), 3);
    let f = &oxccl_trace::why::why(&dumps)[0];
    eprintln!("{}", f.text);
    let (seq, groups) = f.divergence.clone().expect("a divergence");
    assert_eq!(seq, 3);
    assert_eq!(groups[0].1, [0, 2]);
    assert!(groups[0].0.starts_with("all_reduce(f32 x 64"), "{groups:?}");
    assert_eq!(groups[1].1, [1]);
    assert!(groups[1].0.starts_with("all_gather"), "{groups:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One rank of four stops (SIGSTOP) and another calls the wrong
/// collective at the same call: the three survivors fail (a mismatch, or
/// the deadline waiting for the stopped rank) and leave their dumps; `why`
/// names the odd call and the silent rank.
#[test]
fn a_stalled_rank_and_a_stray_call_are_both_named_from_the_dumps() {
    let dir = temp_dir("astray");
    let (n, staller, strayer, at) = (4, 1, 2, 20);
    let d = dir.to_string_lossy().into_owned();
    let mut kids = spawn_selftest_env(
        n,
        &[
            "astray",
            "4K",
            &staller.to_string(),
            &strayer.to_string(),
            &at.to_string(),
        ],
        "shm",
        2,
        |_| vec![("OXCCL_FLIGHT_DIR", d.clone())],
    );
    let started = Instant::now();
    // Each survivor prints its error and exits; the stopped rank stays.
    let outs: Vec<_> = kids.iter_mut().map(|k| k.stdout.take().unwrap()).collect();
    let mut details = Vec::new();
    for (r, out) in outs.into_iter().enumerate() {
        if r == staller {
            continue;
        }
        let detail = std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("DETAIL"))
            .unwrap_or_else(|| format!("rank {r} printed no error"));
        details.push(detail);
    }
    let took = started.elapsed();
    for k in &kids {
        // SAFETY: signalling our own children.
        unsafe { libc::kill(k.id() as i32, libc::SIGKILL) };
    }
    for mut k in kids {
        let _ = k.wait();
    }
    eprintln!("{details:#?} after {took:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let dumps = oxccl_trace::flight::load(&dir).unwrap();
    let ranks: Vec<usize> = dumps.iter().map(|d| d.rank).collect();
    assert_eq!(
        ranks,
        [0, 2, 3],
        "dumps on every survivor, none from the stopped rank"
    );
    let f = &oxccl_trace::why::why(&dumps)[0];
    eprintln!("{}", f.text);
    let (_, groups) = f.divergence.clone().expect("a divergence");
    assert_eq!(groups[0].1, [0, 3], "{groups:?}");
    assert!(groups[0].0.starts_with("all_reduce"), "{groups:?}");
    assert_eq!(groups[1].1, [strayer], "{groups:?}");
    assert!(groups[1].0.starts_with("all_gather"), "{groups:?}");
    assert_eq!(f.silent, [staller], "{}", f.text);
    assert!(
        f.text
            .contains(&format!("Rank {staller} was never heard from")),
        "{}",
        f.text
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stopped rank alone, on the general path (1 MiB: ring schedules over
/// shared memory): the survivors time out, and `why` follows their waits
/// to the rank that left no dump.
#[test]
fn a_stalled_rank_alone_is_where_every_wait_ends() {
    let dir = temp_dir("stalled");
    let (n, staller) = (4, 3);
    let d = dir.to_string_lossy().into_owned();
    // No rank strays (rank n does not exist).
    let mut kids = spawn_selftest_env(
        n,
        &["astray", "1M", &staller.to_string(), &n.to_string(), "10"],
        "shm",
        2,
        |_| vec![("OXCCL_FLIGHT_DIR", d.clone())],
    );
    let outs: Vec<_> = kids.iter_mut().map(|k| k.stdout.take().unwrap()).collect();
    for (r, out) in outs.into_iter().enumerate().filter(|(r, _)| *r != staller) {
        let detail = std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("DETAIL"));
        eprintln!("rank {r}: {detail:?}");
    }
    for k in &kids {
        // SAFETY: signalling our own children.
        unsafe { libc::kill(k.id() as i32, libc::SIGKILL) };
    }
    for mut k in kids {
        let _ = k.wait();
    }
    let dumps = oxccl_trace::flight::load(&dir).unwrap();
    let f = &oxccl_trace::why::why(&dumps)[0];
    eprintln!("{}", f.text);
    assert_eq!(f.dumped, [0, 1, 2]);
    assert!(f.divergence.is_none(), "{}", f.text);
    assert_eq!(f.silent, [staller], "{}", f.text);
    assert_eq!(f.chain_end, Some(staller), "{}", f.text);
    let _ = std::fs::remove_dir_all(&dir);
}
