//! Asynchronous calls: a [`Work`] handle for a call queued on the
//! communicator's worker thread (one per communicator, started on first use,
//! so calls keep their issue order).
//!
//! A `Work` can be waited on (blocking, with or without a time limit),
//! polled, or `.await`ed: it is a [`Future`] completed by the worker thread,
//! so async frameworks use it from any executor without oxccl depending on
//! an async runtime.

use crate::error::{Error, Result};
use crossbeam_channel::{unbounded, Sender};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

/// The worker thread of one communicator.
#[derive(Default)]
pub(crate) struct Worker {
    tx: Mutex<Option<Sender<Job>>>,
}

impl Worker {
    /// Run `f` on the worker thread, after every job submitted before it.
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        call: &'static str,
        f: impl FnOnce() -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let work = Work::new(call);
        let done = Completer(Some(work.slot.clone()));
        let job: Job = Box::new(move || done.complete(f()));
        let mut tx = self.tx.lock().unwrap();
        if tx.is_none() {
            let (jtx, jrx) = unbounded::<Job>();
            let spawned = std::thread::Builder::new()
                .name("oxccl-worker".into())
                .spawn(move || {
                    for job in jrx {
                        job();
                    }
                });
            if let Err(e) = spawned {
                return Work::done(
                    call,
                    Err(Error::System(format!(
                        "cannot start the worker thread: {e}"
                    ))),
                );
            }
            *tx = Some(jtx);
        }
        // A job that never runs (the worker is gone) is dropped, and its
        // completer reports the call as aborted.
        let _ = tx.as_ref().unwrap().send(job);
        work
    }
}

/// Where a call's result lands, and who is waiting for it.
struct Slot<R> {
    state: Mutex<SlotState<R>>,
    cv: Condvar,
}

struct SlotState<R> {
    result: Option<Result<R>>,
    /// Set once the result was taken (by `wait` or a completed poll).
    taken: bool,
    /// The task to wake when the result lands (`Future::poll`).
    waker: Option<Waker>,
    /// Threads sleeping on the condvar (notifying is a system call even
    /// when nobody sleeps: a small call completed by its own caller pays
    /// nothing).
    sleepers: usize,
}

/// Fills the slot once; dropping it unfilled (a job that never ran) fills
/// it with `Aborted`, so no waiter is left hanging.
pub(crate) struct Completer<R>(Option<Arc<Slot<R>>>);

impl<R> Completer<R> {
    pub(crate) fn complete(mut self, r: Result<R>) {
        if let Some(slot) = self.0.take() {
            slot.fill(r);
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.fill(Err(Error::Aborted {
                by: None,
                world_by: None,
            }));
        }
    }
}

impl<R> Slot<R> {
    fn fill(&self, r: Result<R>) {
        let mut s = self.state.lock().unwrap();
        s.result = Some(r);
        let waker = s.waker.take();
        let sleepers = s.sleepers;
        drop(s);
        if sleepers > 0 {
            self.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A call running in the background. Dropping it does not cancel the call
/// (collectives cannot be cancelled on one rank alone); it still completes.
///
/// Wait for it with [`Work::wait`], check it with [`Work::is_done`], bound
/// the wait with [`Work::wait_timeout`] (a watchdog that gives up on a call
/// then calls `Communicator::abort`, and `wait` returns `Aborted`), or
/// `.await` it.
pub struct Work<R> {
    slot: Arc<Slot<R>>,
    call: &'static str,
}

impl<R> Work<R> {
    fn new(call: &'static str) -> Work<R> {
        Work {
            slot: Arc::new(Slot {
                state: Mutex::new(SlotState {
                    result: None,
                    taken: false,
                    waker: None,
                    sleepers: 0,
                }),
                cv: Condvar::new(),
            }),
            call,
        }
    }

    /// A call completed elsewhere (the point-to-point lane): the handle and
    /// what completes it.
    pub(crate) fn pending(call: &'static str) -> (Work<R>, Completer<R>) {
        let w = Work::new(call);
        let done = Completer(Some(w.slot.clone()));
        (w, done)
    }

    /// A call that finished before it was queued (a bad argument).
    pub(crate) fn done(call: &'static str, r: Result<R>) -> Work<R> {
        let w = Work::new(call);
        w.slot.state.lock().unwrap().result = Some(r);
        w
    }

    /// Block until the call finished; its result (the buffers it owned).
    pub fn wait(self) -> Result<R> {
        let mut s = self.slot.state.lock().unwrap();
        loop {
            if let Some(r) = s.result.take() {
                s.taken = true;
                return r;
            }
            if s.taken {
                return Err(completed_twice(self.call));
            }
            s.sleepers += 1;
            s = self.slot.cv.wait(s).unwrap();
            s.sleepers -= 1;
        }
    }

    /// Wait at most `timeout` for the call to finish; whether it did (then
    /// [`Work::wait`] returns at once). The call itself has no deadline
    /// from this: it runs on until it completes or fails (its own deadline
    /// is the communicator's timeout, or the call's).
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let until = crate::config::value::deadline_after(timeout);
        let mut s = self.slot.state.lock().unwrap();
        loop {
            if s.result.is_some() || s.taken {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s.sleepers += 1;
            s = self.slot.cv.wait_timeout(s, left).unwrap().0;
            s.sleepers -= 1;
        }
    }

    /// Whether the call finished (then `wait` returns at once).
    pub fn is_done(&self) -> bool {
        let s = self.slot.state.lock().unwrap();
        s.result.is_some() || s.taken
    }
}

fn completed_twice(call: &str) -> Error {
    Error::invalid(format!(
        "the result of {call} was already taken (a Work completes once)"
    ))
}

impl<R> Future for Work<R> {
    type Output = Result<R>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R>> {
        let mut s = self.slot.state.lock().unwrap();
        if let Some(r) = s.result.take() {
            s.taken = true;
            return Poll::Ready(r);
        }
        if s.taken {
            return Poll::Ready(Err(completed_twice(self.call)));
        }
        match &mut s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<R> std::fmt::Debug for Work<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.slot.state.lock().unwrap();
        let state = match &s.result {
            Some(Ok(_)) => "done",
            Some(Err(_)) => "failed",
            None if s.taken => "taken",
            None => "running",
        };
        f.debug_struct("Work")
            .field("call", &self.call)
            .field("state", &state)
            .finish()
    }
}
