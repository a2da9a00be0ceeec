//! Programs written against NCCL, run on this library: the C test suite
//! (`tests/c/collectives.c`) compiled against NVIDIA's own `nccl.h` and
//! linked with `-lnccl` resolving to ours, on 1–5 ranks, and its SIGKILL
//! case (survivors get `ncclRemoteError` naming the dead rank, then shrink
//! it away); NCCL's variables read, oxccl's winning; every symbol of
//! NVIDIA's library exported; a Python `ctypes` program
//! (`tests/python/allreduce.py`) on 3. Programs are started the way `oxrun`
//! starts ranks (`oxccl::launch`).
//!
//! NVIDIA's `nccl.h` comes from the `nvidia-nccl-cu13` wheel and the CUDA
//! headers it includes from `nvidia-cuda-runtime`, `-crt` and `-cccl`
//! (PyPI; no CUDA toolkit): `OXCCL_NCCL_INCLUDE` and `OXCCL_CUDA_INCLUDE`
//! name their include directories. Without them the C test is skipped,
//! unless `OXCCL_REQUIRE_NCCL_H=1` (CI sets it) makes that a failure.

use oxccl::launch::{run, Bind, Launch, Output};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// This build's shared library: beside the test executable in `deps/`
/// (`cargo test` builds it there; the copy one level up is `cargo
/// build`'s, and may be older).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("liboxccl_nccl.so");
    assert!(lib.exists(), "{} is not built", lib.display());
    lib
}

/// A directory where `libnccl.so` and `libnccl.so.2` are ours.
fn link_dir(tmp: &Path) -> PathBuf {
    let d = tmp.join("lib");
    std::fs::create_dir_all(&d).unwrap();
    for name in ["libnccl.so", "libnccl.so.2"] {
        let _ = std::fs::remove_file(d.join(name));
        std::os::unix::fs::symlink(cdylib(), d.join(name)).unwrap();
    }
    d
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-nccl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `nranks` ranks of `program args.. ID_FILE`, as oxrun starts them, with
/// NCCL's variables (read as oxccl's) and `env`.
fn launch(
    nranks: usize,
    program: &str,
    args: &[String],
    lib: &Path,
    tmp: &Path,
    env: &[(&str, &str)],
) -> i32 {
    let id_file = tmp.join(format!("id-{nranks}"));
    let _ = std::fs::remove_file(&id_file);
    let mut args = args.to_vec();
    args.push(id_file.display().to_string());
    run(&Launch {
        nranks,
        program: program.into(),
        args,
        output: Output::Prefixed,
        kill_after: Duration::from_secs(2),
        env: [
            ("LD_LIBRARY_PATH".into(), lib.display().to_string()),
            ("NCCL_SOCKET_IFNAME".into(), "lo".into()),
            ("OXCCL_TIMEOUT".into(), "60".into()),
        ]
        .into_iter()
        .chain(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .collect(),
        max_restarts: 0,
        bind: Bind::None,
    })
}

fn headers() -> Option<(String, String)> {
    let get = |v: &str| std::env::var(v).ok().filter(|d| Path::new(d).is_dir());
    match (get("OXCCL_NCCL_INCLUDE"), get("OXCCL_CUDA_INCLUDE")) {
        (Some(n), Some(c)) if Path::new(&n).join("nccl.h").exists() => Some((n, c)),
        _ => {
            assert!(
                std::env::var("OXCCL_REQUIRE_NCCL_H").as_deref() != Ok("1"),
                "OXCCL_REQUIRE_NCCL_H=1 but OXCCL_NCCL_INCLUDE / OXCCL_CUDA_INCLUDE do not \
                 name directories with nccl.h and cuda_runtime.h"
            );
            None
        }
    }
}

/// The C test suite compiled against NVIDIA's nccl.h and linked to ours
/// (in `tmp`), or `None` (skipped) without the headers.
fn compile_c(tmp: &Path, lib: &Path) -> Option<PathBuf> {
    let Some((nccl_inc, cuda_inc)) = headers() else {
        eprintln!("skipped: NVIDIA's nccl.h not found (see the module documentation)");
        return None;
    };
    let exe = tmp.join("collectives");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/collectives.c");
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-I{nccl_inc}"))
        .arg(format!("-I{cuda_inc}"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lnccl")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

#[test]
fn the_c_test_suite_against_nvidias_nccl_h_on_1_to_5_ranks() {
    let tmp = scratch("c");
    let lib = link_dir(&tmp);
    let Some(exe) = compile_c(&tmp, &lib) else {
        return;
    };
    for n in 1..=5 {
        // NCCL_ALGO=Ring on odd counts: the program reads it back through
        // the parameter API, as oxccl's `ring`.
        let env: &[(&str, &str)] = if n % 2 == 1 {
            &[("NCCL_ALGO", "Ring")]
        } else {
            &[]
        };
        let rc = launch(n, exe.to_str().unwrap(), &[], &lib, &tmp, env);
        assert_eq!(
            rc, 0,
            "the C test suite failed on {n} ranks (its output is above)"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The last of 3 ranks SIGKILLs itself after one all_reduce: each survivor
/// gets `ncclRemoteError` from its next call and from
/// `ncclCommGetAsyncError`, with the dead rank named in `ncclGetLastError`,
/// then shrinks the dead rank away and all_reduces with the other.
/// (Started directly, not by the launcher, which would stop the survivors
/// as soon as one rank died.)
#[test]
fn after_a_peer_is_sigkilled_survivors_get_ncclremoteerror_naming_it() {
    let tmp = scratch("die");
    let lib = link_dir(&tmp);
    let Some(exe) = compile_c(&tmp, &lib) else {
        return;
    };
    let n = 3;
    let id_file = tmp.join("id");
    let kids: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .arg(&id_file)
                .arg("die")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LD_LIBRARY_PATH", &lib)
                .env("OXCCL_SOCKET_IFNAME", "lo")
                .env("OXCCL_TIMEOUT", "30")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, k) in kids.into_iter().enumerate() {
        let out = k.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if r == n - 1 {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(out.status.signal(), Some(9), "rank {r}: {stdout}");
        } else {
            assert!(out.status.success(), "survivor {r}: {stdout}");
            assert!(
                stdout.contains("call 6 async 6 named 1"),
                "survivor {r}: {stdout}"
            );
            assert!(
                stdout.contains(&format!("SHRUNK {r} sum {}", n - 1)),
                "survivor {r} did not shrink and go on: {stdout}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The device program (`tests/c/device.c`: cudaMalloc'd buffers, calls
/// queued on a stream) compiles against NVIDIA's headers; it runs where
/// there is a GPU (`scripts/gpu-check`), not here.
#[test]
fn the_device_program_compiles_against_nvidias_headers() {
    let Some((nccl_inc, cuda_inc)) = headers() else {
        eprintln!("skipped: NVIDIA's nccl.h not found");
        return;
    };
    let tmp = scratch("device");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/device.c");
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-c", "-o"])
        .arg(tmp.join("device.o"))
        .arg(&src)
        .arg(format!("-I{nccl_inc}"))
        .arg(format!("-I{cuda_inc}"))
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Every `nccl*` and `pncclX` symbol NVIDIA's `libnccl.so.2` (the same
/// wheel as `nccl.h`) exports, ours exports too (what cannot be honoured
/// answers `ncclInvalidUsage`; `scripts/nccl-coverage` tells which).
#[test]
fn every_symbol_of_nvidias_library_is_exported() {
    let Some((nccl_inc, _)) = headers() else {
        eprintln!("skipped: NVIDIA's nccl.h not found");
        return;
    };
    let theirs = Path::new(&nccl_inc).join("../lib/libnccl.so.2");
    let syms = |lib: &Path| -> Vec<String> {
        let out = Command::new("nm")
            .arg("-D")
            .arg("--defined-only")
            .arg(lib)
            .output();
        let out = out.expect("nm (binutils) runs");
        assert!(out.status.success(), "nm {}", lib.display());
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
            .filter(|n| n.starts_with("nccl") || n.starts_with("pnccl"))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let (theirs, ours) = (syms(&theirs), syms(&cdylib()));
    assert!(
        theirs.len() >= 97,
        "NVIDIA's library exports {} symbols?",
        theirs.len()
    );
    let missing: Vec<&String> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(missing.is_empty(), "not exported by ours: {missing:?}");
}

/// NCCL's variables under libnccl: one oxccl cannot honour is an error
/// naming it (not ignored), and the `OXCCL_*` name wins when both are set.
#[test]
fn nccl_variables_are_read_and_oxccls_win() {
    let tmp = scratch("env");
    let lib = link_dir(&tmp);
    let Some(exe) = compile_c(&tmp, &lib) else {
        return;
    };
    let one_rank = |env: &[(&str, &str)]| {
        let _ = std::fs::remove_file(tmp.join("id"));
        let mut cmd = Command::new(&exe);
        cmd.arg(tmp.join("id"))
            .env("RANK", "0")
            .env("WORLD_SIZE", "1")
            .env("LD_LIBRARY_PATH", &lib)
            .env("NCCL_SOCKET_IFNAME", "lo")
            .env_remove("OXCCL_ALGO")
            .env_remove("NCCL_ALGO");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let out = one_rank(&[("NCCL_ALGO", "NVLS")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "NCCL_ALGO=NVLS: {err}");
    assert!(
        err.contains("NCCL_ALGO=\"NVLS\"") && err.contains("invalid argument"),
        "{err}"
    );
    let out = one_rank(&[("NCCL_ALGO", "NVLS"), ("OXCCL_ALGO", "ring")]);
    assert!(
        out.status.success(),
        "OXCCL_ALGO set: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_python_ctypes_program_runs_an_all_reduce() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: no python3");
        return;
    }
    let tmp = scratch("py");
    let lib = link_dir(&tmp);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/allreduce.py");
    let rc = launch(
        3,
        "python3",
        &[script.display().to_string()],
        &lib,
        &tmp,
        &[],
    );
    assert_eq!(rc, 0, "the ctypes program failed (its output is above)");
    let _ = std::fs::remove_dir_all(&tmp);
}
