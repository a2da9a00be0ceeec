//! Should large plain (unregistered) buffers move by single-copy CMA
//! (`process_vm_readv` from the peer's address space) instead of through
//! the shared ring (two copies, the ring itself staying in cache)? This
//! measures the three ways to move 64 MiB from one process's buffer into
//! another's, on this machine:
//!
//! - `memcpy`: one copy in one process (the floor);
//! - `ring`: buffer -> 2 MiB ring -> buffer in 1 MiB pieces (what the shm
//!   transport does; both copies by one thread here);
//! - `cma`: `process_vm_readv` from a forked child's buffer (one copy plus a
//!   system call per 1 MiB piece).
//!
//! `cargo bench -p transport-shm --bench copy_paths`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

const BYTES: usize = 64 << 20;
const PIECE: usize = 1 << 20;

fn paths(c: &mut Criterion) {
    let src = vec![7u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    let mut ring = vec![0u8; 2 * PIECE];
    let mut g = c.benchmark_group("copy_64MiB");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(10);
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.bench_function("memcpy", |b| {
        b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
    });
    g.bench_function("ring", |b| {
        b.iter(|| {
            for (i, piece) in src.chunks(PIECE).enumerate() {
                let slot = &mut ring[(i % 2) * PIECE..(i % 2) * PIECE + piece.len()];
                slot.copy_from_slice(piece);
                dst[i * PIECE..i * PIECE + piece.len()].copy_from_slice(slot);
            }
            black_box(&dst);
        })
    });
    // A child that shares `src` (copy-on-write, never written) and waits.
    let mut fds = [0i32; 2];
    // SAFETY: creating a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only blocks in read(2) and exits; no locks are taken.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut b = [0u8; 1];
        // SAFETY: reading one byte from our pipe, then leaving at once.
        unsafe {
            libc::read(fds[0], b.as_mut_ptr() as *mut libc::c_void, 1);
            libc::_exit(0);
        }
    }
    let remote = src.as_ptr() as usize;
    g.bench_function("cma", |b| {
        b.iter(|| {
            for off in (0..BYTES).step_by(PIECE) {
                let local = libc::iovec {
                    iov_base: dst[off..].as_mut_ptr() as *mut libc::c_void,
                    iov_len: PIECE,
                };
                let rem = libc::iovec {
                    iov_base: (remote + off) as *mut libc::c_void,
                    iov_len: PIECE,
                };
                // SAFETY: reading PIECE bytes of the child's copy of `src` into `dst`.
                let n = unsafe { libc::process_vm_readv(child, &local, 1, &rem, 1, 0) };
                assert_eq!(
                    n,
                    PIECE as isize,
                    "process_vm_readv: {}",
                    std::io::Error::last_os_error()
                );
            }
            black_box(&dst);
        })
    });
    g.finish();
    // SAFETY: releasing and reaping our child.
    unsafe {
        libc::write(fds[1], [0u8].as_ptr() as *const libc::c_void, 1);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
}

criterion_group!(benches, paths);
criterion_main!(benches);
