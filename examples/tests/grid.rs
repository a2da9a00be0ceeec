//! The 2x2 grid example under `oxrun -n 4`: it trains and checks every
//! result; with world rank 3 SIGKILLed mid-step, every survivor's report
//! blames world rank 3 (not a rank number of one of its groups).

use std::path::PathBuf;
use std::process::Command;

/// `oxrun`, built by the `oxccl` package into this profile's directory
/// (built here first when this package's tests run alone).
fn oxrun() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("oxrun");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "oxccl", "--bin", "oxrun"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo build of oxrun");
        assert!(status.success(), "building oxrun failed");
    }
    path
}

fn run_grid(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(oxrun())
        .args(["-n", "4", "--kill-after", "20", "--"])
        .arg(env!("CARGO_BIN_EXE_grid"))
        .args(args)
        .env("OXCCL_TIMEOUT", "60")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_grid_trains_with_exact_results() {
    let (code, out, err) = run_grid(&["--steps", "10"]);
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..4 {
        assert!(
            out.contains(&format!("[{r}] OK world rank {r}: 10 steps, last loss 42")),
            "rank {r}:\n{out}\n{err}"
        );
    }
}

#[test]
fn every_survivor_blames_the_killed_world_rank() {
    let (code, out, err) = run_grid(&["--steps", "1000", "--die", "3:5"]);
    assert_ne!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("rank 3") && err.contains("killed by signal 9"),
        "oxrun's report:\n{err}"
    );
    for r in 0..3 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] FAILED")))
            .unwrap_or_else(|| panic!("no report from rank {r}:\n{out}\n{err}"));
        assert!(
            line.contains(&format!("FAILED world rank {r}: blamed world rank 3:")),
            "{line}\n{out}"
        );
    }
}
