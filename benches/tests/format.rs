//! Every `*_perf` binary, run for a few sizes on 3 local ranks, parsed
//! with a parser written to nccl-tests' format: preamble, header, rows and
//! footer are all there, the columns agree (algbw = bytes / time, busbw =
//! factor x algbw, within print rounding), nothing is wrong; and a
//! deliberately corrupted result is reported and fails the run.

use benches::parse::parse;
use benches::Coll;
use std::process::Command;

fn bin(c: Coll) -> &'static str {
    match c {
        Coll::AllReduce => env!("CARGO_BIN_EXE_all_reduce_perf"),
        Coll::AllGather => env!("CARGO_BIN_EXE_all_gather_perf"),
        Coll::ReduceScatter => env!("CARGO_BIN_EXE_reduce_scatter_perf"),
        Coll::Broadcast => env!("CARGO_BIN_EXE_broadcast_perf"),
        Coll::Reduce => env!("CARGO_BIN_EXE_reduce_perf"),
        Coll::AllToAll => env!("CARGO_BIN_EXE_alltoall_perf"),
        Coll::SendRecv => env!("CARGO_BIN_EXE_sendrecv_perf"),
    }
}

const ALL: [Coll; 7] = [
    Coll::AllReduce,
    Coll::AllGather,
    Coll::ReduceScatter,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::AllToAll,
    Coll::SendRecv,
];

fn run(c: Coll, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin(c))
        .args(args)
        .env("OXCCL_TIMEOUT", "60")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn close(printed: f64, exact: f64) -> bool {
    (printed - exact).abs() <= 0.011 + 0.02 * exact.abs()
}

#[test]
fn every_binary_prints_the_nccl_tests_format_with_consistent_columns() {
    let n = 3;
    for c in ALL {
        let (code, out, err) = run(
            c,
            &[
                "--np", "3", "-b", "1K", "-e", "4M", "-f", "16", "-n", "3", "-w", "1", "-r", "2",
            ],
        );
        assert_eq!(code, 0, "{}: {err}\n{out}", c.program());
        let p = parse(&out).unwrap_or_else(|e| panic!("{}: {e}\n{out}", c.program()));
        assert_eq!(p.program.as_deref(), Some(c.program()));
        assert_eq!(p.concluded.as_deref(), Some(c.program()));
        assert_eq!(p.ranks.len(), n, "{out}");
        assert_eq!(&p.header[..5], &["size", "count", "type", "redop", "root"]);
        assert_eq!(p.header.len(), 13);
        assert_eq!(p.out_of_bounds, Some(0));
        assert_eq!(p.rows.len(), 4, "{out}"); // 1K, 16K, 256K, 4M
        let factor = c.bus_factor(n);
        for r in &p.rows {
            assert_eq!(r.dtype, "float");
            assert_eq!(r.redop, if c.has_op() { "sum" } else { "none" });
            assert_eq!(r.root, if c.has_root() { 2 } else { -1 });
            assert_eq!(r.bytes, r.count * 4);
            for m in [&r.oop, &r.ip] {
                assert_eq!(m.wrong, Some(0), "{}: {out}", c.program());
                let algbw = r.bytes as f64 / m.time_us / 1e3;
                assert!(
                    close(m.algbw, algbw),
                    "{}: algbw {} vs {algbw}",
                    c.program(),
                    m.algbw
                );
                assert!(
                    close(m.busbw, factor * m.algbw),
                    "{}: busbw {} vs {}",
                    c.program(),
                    m.busbw,
                    factor * m.algbw
                );
            }
        }
        let bws: Vec<f64> = p
            .rows
            .iter()
            .flat_map(|r| [r.oop.busbw, r.ip.busbw])
            .collect();
        let avg = bws.iter().sum::<f64>() / bws.len() as f64;
        assert!(close(p.avg_busbw.unwrap(), avg), "{out}");
    }
}

#[test]
fn a_corrupted_result_is_counted_and_fails_the_run() {
    let (code, out, _) = run(
        Coll::AllReduce,
        &[
            "--np",
            "2",
            "-b",
            "64",
            "-e",
            "64K",
            "-f",
            "32",
            "-n",
            "2",
            "--corrupt-rank",
            "1",
        ],
    );
    assert_ne!(code, 0);
    let p = parse(&out).unwrap();
    assert_eq!(p.rows.len(), 3); // 64, 2K, 64K
    for r in &p.rows {
        assert_eq!(r.oop.wrong, Some(1), "{out}");
        assert_eq!(r.ip.wrong, Some(1), "{out}");
    }
    // The same run without the flag passes: the check is what failed.
    let (code, _, _) = run(
        Coll::AllReduce,
        &["--np", "2", "-b", "64", "-e", "64K", "-f", "32", "-n", "2"],
    );
    assert_eq!(code, 0);
}

#[test]
fn all_types_and_ops_check_exactly() {
    let (code, out, err) = run(
        Coll::AllReduce,
        &[
            "--np", "3", "-b", "8", "-e", "8K", "-f", "32", "-n", "1", "-d", "all", "-o", "all",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let p = parse(&out).unwrap();
    assert_eq!(p.rows.len(), 10 * 5 * 3);
    assert!(p
        .rows
        .iter()
        .all(|r| r.oop.wrong == Some(0) && r.ip.wrong == Some(0)));
    let (code, out, _) = run(
        Coll::ReduceScatter,
        &[
            "--np", "2", "-b", "8", "-e", "8K", "-f", "32", "-n", "1", "-d", "all", "-o", "all",
        ],
    );
    assert_eq!(code, 0);
    assert!(parse(&out)
        .unwrap()
        .rows
        .iter()
        .all(|r| r.oop.wrong == Some(0) && r.ip.wrong == Some(0)));
}

#[test]
fn json_csv_and_plot_are_written() {
    let dir = std::env::temp_dir().join(format!("oxccl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (j, c, s) = (dir.join("r.json"), dir.join("r.csv"), dir.join("r.svg"));
    let (code, out, err) = run(
        Coll::AllGather,
        &[
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "4",
            "-n",
            "2",
            "-J",
            j.to_str().unwrap(),
            "--csv",
            c.to_str().unwrap(),
            "--plot",
            s.to_str().unwrap(),
            "--limit",
            "4.4",
            "-c",
            "0",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let p = parse(&out).unwrap();
    assert!(
        p.rows.iter().all(|r| r.oop.wrong.is_none()),
        "-c 0 prints N/A"
    );
    let json = std::fs::read_to_string(&j).unwrap();
    assert!(json.starts_with("{\"version\":2"));
    assert_eq!(json.matches("\"out_of_place\"").count(), 4);
    let csv = std::fs::read_to_string(&c).unwrap();
    assert_eq!(csv.lines().count(), 5);
    let svg = std::fs::read_to_string(&s).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.contains("machine limit"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let (code, _, err) = run(Coll::AllReduce, &["-d", "float128"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown datatype"));
    let (code, _, err) = run(Coll::SendRecv, &["--registered"]);
    assert_eq!(code, 2);
    assert!(err.contains("registered"));
}

/// `-t`/`-g`: several ranks per process, alone and under the launcher,
/// every result checked (the ranks are threads with communicators each).
#[test]
fn ranks_per_process_run_as_threads_and_check_exactly() {
    let (code, out, err) = run(
        Coll::AllReduce,
        &[
            "-g", "3", "-b", "8", "-e", "1M", "-f", "64", "-n", "2", "-o", "all",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("# nThread 1 nGpus 3"), "{out}");
    assert_eq!(out.matches("#  Rank ").count(), 3, "{out}");
    assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
    let (code, out, err) = run(
        Coll::AllGather,
        &[
            "--np", "2", "-t", "2", "-b", "4K", "-e", "64K", "-f", "4", "-n", "2",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("#  Rank ").count(), 4, "{out}");
    assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
}

/// `--trace DIR` on 4 processes: every rank's trace, joined by
/// `oxccl-trace merge`, is valid trace-event JSON with the same number of
/// collective slices for every rank — every call each rank made (the
/// sweep's own, plus the barriers and the reductions of the timings).
#[test]
fn a_traced_run_merges_into_one_timeline_with_every_ranks_calls() {
    let dir = std::env::temp_dir().join(format!("oxccl-perf-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let (code, out, err) = run(
        Coll::AllReduce,
        &[
            "--np", "4", "-b", "1K", "-e", "1M", "-f", "32", "-n", "5", "-w", "1", "--trace", &d,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let traces = oxccl_trace::merge::load(&dir).unwrap();
    assert_eq!(traces.len(), 4);
    let merged = oxccl_trace::merge::merge(&traces);
    let file = dir.join("job.json");
    std::fs::write(&file, merged.to_string()).unwrap();
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let counts = oxccl_trace::merge::check(&back).unwrap();
    let calls: Vec<usize> = (0..4u64)
        .map(|r| counts.slices[&(r, "collective".to_string())])
        .collect();
    // 3 sizes x 2 directions x (1 checked + 1 warm-up + 5 timed) calls of
    // the sweep at least.
    assert!(
        calls.iter().all(|c| *c == calls[0] && *c >= 42),
        "{calls:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `-v`: a breakdown line after every row, from rank 0's trace.
#[test]
fn verbose_rows_say_where_their_calls_spent_their_time() {
    let (code, out, err) = run(
        Coll::AllReduce,
        &[
            "-g", "2", "-b", "1K", "-e", "1M", "-f", "32", "-n", "3", "-v",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("breakdown (rank 0"))
        .collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("send/recv") && l.contains("waiting")),
        "{out}"
    );
}

/// Every dtype and op, 3 ranks, 8 B to 1 MiB, on registered buffers.
const REGISTERED_SWEEP: &[&str] = &[
    "--np",
    "3",
    "-b",
    "8",
    "-e",
    "1M",
    "-f",
    "32",
    "-n",
    "2",
    "-d",
    "all",
    "-o",
    "all",
    "--registered",
];

#[test]
fn registered_gather_broadcast_reduce_scatter_reduce_and_alltoall_check_exactly() {
    for c in [
        Coll::AllGather,
        Coll::Broadcast,
        Coll::ReduceScatter,
        Coll::Reduce,
        Coll::AllToAll,
    ] {
        let (code, out, err) = run(c, &[REGISTERED_SWEEP, &["-r", "2"]].concat());
        assert_eq!(code, 0, "{}: {err}", c.program());
        let p = parse(&out).unwrap();
        assert!(!p.rows.is_empty());
        assert!(
            p.rows
                .iter()
                .all(|r| r.oop.wrong == Some(0) && r.ip.wrong == Some(0)),
            "{out}"
        );
    }
}

#[test]
fn registered_all_reduce_checks_exactly_and_can_fail() {
    let (code, out, err) = run(Coll::AllReduce, REGISTERED_SWEEP);
    assert_eq!(code, 0, "{err}");
    let p = parse(&out).unwrap();
    assert_eq!(p.rows.len(), 10 * 5 * 4);
    assert!(
        p.rows
            .iter()
            .all(|r| r.oop.wrong == Some(0) && r.ip.wrong == Some(0)),
        "{out}"
    );
    let (code, out, _) = run(
        Coll::AllReduce,
        &[
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "2",
            "--registered",
            "--corrupt-rank",
            "0",
        ],
    );
    assert_ne!(code, 0);
    assert!(parse(&out)
        .unwrap()
        .rows
        .iter()
        .all(|r| r.oop.wrong == Some(1)));
}

#[test]
fn hostile_flags_and_variables_are_named_errors_without_panic() {
    let t = std::time::Instant::now();
    for (args, env, named) in [
        (&["-T", "inf"][..], None, "-T"),
        (&["-T", "1e300"][..], None, "-T"),
        (&["--np", "0"][..], None, "--np"),
        (
            &["-b", "8", "-e", "8"][..],
            Some(("OXCCL_TIMEOUT", "1e300")),
            "OXCCL_TIMEOUT",
        ),
        (
            &["-b", "8", "-e", "8"][..],
            Some(("OXCCL_SPIN_US", "1e300")),
            "OXCCL_SPIN_US",
        ),
        (
            &["-b", "8", "-e", "8", "--np", "2"][..],
            Some(("OXCCL_TIMEOUT", "1e19")),
            "OXCCL_TIMEOUT",
        ),
    ] {
        let mut cmd = Command::new(bin(Coll::AllReduce));
        cmd.args(args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {env:?} accepted");
        assert!(!err.contains("panicked"), "{args:?} {env:?}: {err}");
        assert!(err.contains(named), "{args:?} {env:?}: {err}");
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
}

/// The algorithm lines name what the timed calls ran, not the small
/// reductions that combine the figures across ranks afterwards (those run
/// `oneshot`; a 1 MiB all_reduce on one host runs `copyin`).
#[test]
fn algorithm_lines_name_the_timed_calls() {
    let (rc, out, err) = run(
        Coll::AllReduce,
        &[
            "--np", "2", "-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "-c", "1",
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("# Algorithm: copyin for 1048576-1048576 B"),
        "{out}"
    );
}
