//! Asynchronous calls: a [`Work`] handle for a call queued on the
//! communicator's worker thread (one per communicator, started on first use,
//! so calls keep their issue order).

use crate::error::{Error, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::sync::Mutex;

type Job = Box<dyn FnOnce() + Send>;

/// The worker thread of one communicator.
#[derive(Default)]
pub(crate) struct Worker {
    tx: Mutex<Option<Sender<Job>>>,
}

impl Worker {
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (rtx, rrx) = bounded(1);
        let job: Job = Box::new(move || {
            let _ = rtx.send(f());
        });
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
                let (etx, erx) = bounded(1);
                let _ = etx.send(Err(Error::Config(format!(
                    "cannot start the worker thread: {e}"
                ))));
                return Work {
                    rx: erx,
                    result: Mutex::new(None),
                };
            }
            *tx = Some(jtx);
        }
        let _ = tx.as_ref().unwrap().send(job);
        Work {
            rx: rrx,
            result: Mutex::new(None),
        }
    }
}

/// A call running in the background. Dropping it does not cancel the call
/// (collectives cannot be cancelled on one rank alone); it still completes.
pub struct Work<R> {
    rx: Receiver<Result<R>>,
    result: Mutex<Option<Result<R>>>,
}

impl<R> Work<R> {
    /// Block until the call finished; its result (the buffers it owned).
    pub fn wait(self) -> Result<R> {
        if let Some(r) = self.result.into_inner().unwrap() {
            return r;
        }
        self.rx
            .recv()
            .unwrap_or_else(|_| Err(Error::Aborted { by: None }))
    }

    /// Whether the call finished (then `wait` returns at once).
    pub fn is_done(&self) -> bool {
        let mut slot = self.result.lock().unwrap();
        if slot.is_some() {
            return true;
        }
        match self.rx.try_recv() {
            Ok(r) => {
                *slot = Some(r);
                true
            }
            Err(crossbeam_channel::TryRecvError::Empty) => false,
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                *slot = Some(Err(Error::Aborted { by: None }));
                true
            }
        }
    }
}
