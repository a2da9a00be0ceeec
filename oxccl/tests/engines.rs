//! The executor with an engine that completes its work later, on another
//! thread, for memory the host engine is told it cannot reach: what a
//! device engine is to the executor, with no device involved (this tests
//! the executor, not CUDA). The "device" is host memory labelled with a
//! memory space of its own; the engine runs the host kernels on a worker
//! thread, in order, now and then after a pause long enough that the
//! executor goes to sleep on the engine's completion fd. Every collective
//! then takes the device path: the engine chosen by the buffers' space,
//! scratch from the engine, messages staged through host slots, copies
//! and reductions completing asynchronously.

mod common;
use common::*;
use oxccl::selftest::{each_call, prepare, verify, Call, Case, TestElem};
use oxccl::{Compute, DataType, DeviceKind, HostCompute, MemorySpace, Region, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The pretend device's memory space.
const SPACE: MemorySpace = MemorySpace::Device {
    kind: DeviceKind::Cuda,
    ordinal: 77,
};

fn host(r: Region) -> Region {
    Region {
        space: MemorySpace::Host,
        ..r
    }
}

enum Job {
    Copy(Region, Region),
    Reduce(DataType, oxccl::compute::Op, Region, Vec<Region>),
    Divide(DataType, Region, usize),
}

/// Work done so far, and a way to wait for more.
struct Done {
    count: Mutex<u64>,
    more: Condvar,
}

struct AsyncEngine {
    jobs: Sender<(u64, Job)>,
    issued: u64,
    done: Arc<Done>,
    completed: Arc<AtomicU64>,
    wake: Arc<OwnedFd>,
    workspace: Vec<u64>,
    /// Times the executor asked for the completion fd (it was about to
    /// sleep on this engine's work).
    sleeps: Arc<AtomicU64>,
}

impl AsyncEngine {
    fn new(sleeps: Arc<AtomicU64>) -> AsyncEngine {
        // SAFETY: eventfd(2) with valid flags; owned at once.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh fd.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let (jobs, rx) = channel::<(u64, Job)>();
        let done = Arc::new(Done {
            count: Mutex::new(0),
            more: Condvar::new(),
        });
        let completed = Arc::new(AtomicU64::new(0));
        let (d, c, w) = (done.clone(), completed.clone(), wake.clone());
        std::thread::spawn(move || {
            let mut cpu = HostCompute::new();
            for (seq, job) in rx {
                // Now and then slow enough for the executor to sleep.
                if seq % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(300));
                }
                let r = match job {
                    Job::Copy(d, s) => cpu.copy(host(d), host(s)),
                    Job::Reduce(t, op, d, srcs) => {
                        let srcs: Vec<Region> = srcs.into_iter().map(host).collect();
                        cpu.reduce(t, op, host(d), &srcs)
                    }
                    Job::Divide(t, d, k) => cpu.divide(t, host(d), k),
                };
                r.expect("host kernels on the worker");
                c.store(seq, Ordering::Release);
                *d.count.lock().unwrap() = seq;
                d.more.notify_all();
                let one = 1u64;
                // SAFETY: 8 bytes to an eventfd.
                unsafe { libc::write(w.as_raw_fd(), &one as *const u64 as *const _, 8) };
            }
        });
        AsyncEngine {
            jobs,
            issued: 0,
            done,
            completed,
            wake,
            workspace: Vec::new(),
            sleeps,
        }
    }

    fn start(&mut self, job: Job) -> Result<oxccl::compute::Pending> {
        self.issued += 1;
        self.jobs.send((self.issued, job)).unwrap();
        Ok(oxccl::compute::Pending(self.issued))
    }

    fn check(&self, r: &Region, host_ok: bool) {
        assert!(
            r.space == SPACE || (host_ok && r.space.is_host()),
            "the engine was given {} memory",
            r.space
        );
    }
}

impl Compute for AsyncEngine {
    fn name(&self) -> &'static str {
        "async-test"
    }
    fn reaches(&self, space: MemorySpace) -> bool {
        space == SPACE
    }
    fn copy(&mut self, dst: Region, src: Region) -> Result<oxccl::compute::Pending> {
        self.check(&dst, true);
        self.check(&src, true);
        self.start(Job::Copy(dst, src))
    }
    fn reduce(
        &mut self,
        dtype: DataType,
        op: oxccl::compute::Op,
        dst: Region,
        srcs: &[Region],
    ) -> Result<oxccl::compute::Pending> {
        self.check(&dst, false);
        srcs.iter().for_each(|s| self.check(s, false));
        self.start(Job::Reduce(dtype, op, dst, srcs.to_vec()))
    }
    fn divide(
        &mut self,
        dtype: DataType,
        dst: Region,
        divisor: usize,
    ) -> Result<oxccl::compute::Pending> {
        self.check(&dst, false);
        self.start(Job::Divide(dtype, dst, divisor))
    }
    fn poll(&mut self, work: oxccl::compute::Pending) -> Result<bool> {
        Ok(self.completed.load(Ordering::Acquire) >= work.0)
    }
    fn completion_fd(&mut self) -> Result<Option<RawFd>> {
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        let mut b = 0u64;
        // SAFETY: 8 bytes from a nonblocking eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), &mut b as *mut u64 as *mut _, 8) };
        Ok(Some(self.wake.as_raw_fd()))
    }
    fn quiesce(&mut self) -> Result<()> {
        let mut n = self.done.count.lock().unwrap();
        while *n < self.issued {
            n = self.done.more.wait(n).unwrap();
        }
        Ok(())
    }
    fn workspace(&mut self, bytes: usize) -> Result<Option<Region>> {
        if self.workspace.len() * 8 < bytes {
            self.workspace.resize(bytes.div_ceil(8), 0);
        }
        Ok(Some(Region {
            space: SPACE,
            addr: self.workspace.as_mut_ptr() as usize,
            len: bytes,
        }))
    }
}

fn device(r: Region) -> Region {
    Region { space: SPACE, ..r }
}

/// One call of the matrix on "device" buffers through the engine.
fn one<T: TestElem>(comm: &oxccl::Communicator, call: &Call) -> std::result::Result<(), String> {
    let (r, n) = (comm.rank(), comm.nranks());
    let p = prepare::<T>(call, r, n);
    let send = p.send.clone();
    let mut recv = p.recv.clone();
    let s = send
        .as_ref()
        .map(|s| device(Region::host(oxccl::as_bytes(&s[..]))));
    let d = device(Region::host_mut(oxccl::as_bytes_mut(&mut recv[..])));
    let what = || call.describe(T::DTYPE, r, n);
    // SAFETY: both vectors live past the call and nothing else uses them.
    unsafe { comm.collective_regions(call.case.kind(), s, d, T::DTYPE, call.op(), call.root) }
        .map_err(|e| format!("{}: {e}", what()))?;
    match verify(call, r, n, &p, &recv) {
        Some(e) => Err(format!("{}: {e}", what())),
        None => Ok(()),
    }
}

fn matrix(n: usize, mixed: bool) {
    let sleeps = Arc::new(AtomicU64::new(0));
    let cfg = |r: usize| match mixed {
        true => host_config(r % 2),
        false => test_config(),
    };
    let counts = [0, 1, 7, n + 1, 100_003];
    for r in with_rank_configs(n, cfg, |comm| {
        comm.add_compute(Box::new(AsyncEngine::new(sleeps.clone())))
            .unwrap();
        each_call(n, &counts, &Case::BUFFERS, |call| {
            one::<f32>(&comm, call)?;
            one::<i32>(&comm, call)?;
            one::<oxccl::bf16>(&comm, call)
        })
    }) {
        r.unwrap();
    }
    // The pauses made executors sleep on the engine's fd (or the test
    // did not test that path).
    assert!(
        sleeps.load(Ordering::Relaxed) > 0,
        "no executor ever slept on the engine"
    );
}

#[test]
fn an_asynchronous_engine_on_its_own_memory_runs_every_collective_3_ranks() {
    matrix(3, false)
}

#[test]
fn an_asynchronous_engine_on_its_own_memory_runs_every_collective_4_ranks_mixed() {
    matrix(4, true)
}
