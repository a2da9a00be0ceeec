//! Fault-injection matrix: {TCP, shm} x {all_reduce, all_gather,
//! reduce_scatter, broadcast, send/recv} x {kill rank 0 (the root), a middle
//! rank, the last rank} x {early in the call, mid-transfer}. Four ranks run
//! the collective in a loop (`oxccl-selftest fault`); the victim SIGKILLs
//! itself. Every survivor must fail with `PeerLost` naming the victim,
//! within 5 s of its death; the worst detection time per transport is
//! printed.

mod common;
use std::io::{BufRead, BufReader};
use std::time::Duration;

const N: usize = 4;

fn case(transport: &str, kind: &str, victim: usize, when: &str) -> u128 {
    // Early deaths use small messages (the others wait inside the call);
    // mid-transfer deaths use large ones (data is flowing when it happens).
    let bytes = if when == "early" { "64K" } else { "32M" };
    let victim_s = victim.to_string();
    let mut kids =
        common::spawn_selftest(N, &["fault", kind, bytes, &victim_s, when], transport, 60);
    let outs: Vec<Vec<String>> = kids
        .iter_mut()
        .map(|k| {
            BufReader::new(k.stdout.take().unwrap())
                .lines()
                .map_while(Result::ok)
                .collect()
        })
        .collect();
    for mut k in kids {
        let _ = k.wait();
    }
    let ctx = format!("{transport} {kind} victim {victim} {when}");
    let died: u128 = outs[victim]
        .iter()
        .find_map(|l| {
            l.strip_prefix("DYING ")
                .map(|r| r.split_whitespace().nth(1).unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| {
            panic!(
                "{ctx}: the victim did not report its death: {:?}",
                outs[victim]
            )
        });
    let mut worst = 0;
    for (r, lines) in outs.iter().enumerate().filter(|(r, _)| *r != victim) {
        let err = lines
            .iter()
            .find(|l| l.starts_with("ERROR"))
            .unwrap_or_else(|| panic!("{ctx}: rank {r} reported no error: {lines:?}"));
        let f: Vec<&str> = err.split_whitespace().collect();
        let at: u128 = f[2].parse().unwrap();
        let blamed: i64 = f[3].parse().unwrap();
        let detail = lines
            .iter()
            .find(|l| l.starts_with("DETAIL"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(f[4], "PeerLost", "{ctx}: rank {r} got {detail}");
        assert_eq!(
            blamed, victim as i64,
            "{ctx}: rank {r} blamed rank {blamed}: {detail}"
        );
        let took = at.saturating_sub(died);
        assert!(took < 5000, "{ctx}: rank {r} took {took} ms");
        worst = worst.max(took);
    }
    worst
}

fn matrix(transport: &str) {
    let mut worst = 0;
    for kind in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "send_recv",
    ] {
        for victim in [0, N / 2, N - 1] {
            for when in ["early", "mid"] {
                let t = case(transport, kind, victim, when);
                eprintln!("{transport} {kind:>14} victim {victim} {when:>5}: every survivor reported PeerLost({victim}); slowest after {t} ms");
                worst = worst.max(t);
            }
        }
    }
    eprintln!("{transport}: worst detection time over 30 cases: {worst} ms");
}

#[test]
fn fault_matrix_tcp() {
    matrix("tcp");
}

#[test]
fn fault_matrix_shm() {
    matrix("shm");
}

/// A stopped peer (SIGSTOP) cannot be told from a slow one until the
/// deadline: every survivor must fail with `Timeout` naming it (directly or
/// as relayed by the rank that timed out first) once the configured timeout
/// passes, and none may hang.
#[test]
fn a_stopped_peer_is_a_timeout_naming_it_on_every_survivor() {
    for transport in ["tcp", "shm"] {
        let mut kids = common::spawn_selftest(N, &["loop", "1M"], transport, 2);
        let mut readers = common::wait_running(&mut kids);
        let victim = 2;
        let stopped_at = std::time::Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(kids[victim].id() as i32, libc::SIGSTOP) };
        for (r, reader) in readers.iter_mut().enumerate().filter(|(r, _)| *r != victim) {
            let detail = reader
                .find(|l| l.as_ref().map(|l| l.starts_with("DETAIL")).unwrap_or(true))
                .unwrap()
                .unwrap();
            let took = stopped_at.elapsed();
            assert!(
                detail.contains("Timeout") && detail.contains(&format!("rank {victim}")),
                "{transport}: rank {r}: {detail}"
            );
            assert!(
                took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
                "{transport}: rank {r} after {took:?}"
            );
            eprintln!(
                "{transport}: rank {r} reported the stopped rank {victim} after {:.2} s: {detail}",
                took.as_secs_f64()
            );
        }
        for k in &kids {
            // SAFETY: signalling our own children.
            unsafe { libc::kill(k.id() as i32, libc::SIGKILL) };
        }
        for mut k in kids {
            let _ = k.wait();
        }
    }
}
