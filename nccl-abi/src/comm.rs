//! Communicators: what an `ncclComm_t` is, how one is made (at once, in
//! the background for a non-blocking configuration, or at `ncclGroupEnd`
//! inside a group), the queries, finalize, destroy and abort,
//! `ncclCommGetAsyncError`, `ncclGetVersion`. Creation from a unique id is
//! in [`crate::init`], from another communicator in [`crate::resize`].
//!
//! An `ncclComm_t` is a pointer to an [`ncclComm`] this library allocated;
//! `ncclCommDestroy` and `ncclCommAbort` free it.

use crate::config::CommConfig;
use crate::export;
use crate::result::{code_of, ncclInProgress, ncclSuccess, run, Failure};
use oxccl::{Communicator, Config};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// The NCCL release whose API this is (`NCCL_VERSION_CODE` of 2.32.6).
pub const NCCL_VERSION_CODE: c_int = 23206;

/// A communicator being made, or made (or its failure): shared with the
/// thread that makes it.
#[derive(Default)]
pub(crate) struct Slot {
    made: OnceLock<Result<Communicator, Failure>>,
    lock: Mutex<()>,
    done: Condvar,
}

impl Slot {
    /// The outcome, once there is one.
    pub(crate) fn outcome(&self) -> Option<&Result<Communicator, Failure>> {
        self.made.get()
    }

    fn set(&self, made: Result<Communicator, Failure>) {
        let _ = self.made.set(made);
        let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.done.notify_all();
    }

    /// Block until the communicator is made (or failed).
    pub(crate) fn wait(&self) -> &Result<Communicator, Failure> {
        let mut held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(m) = self.made.get() {
                return m;
            }
            held = self.done.wait(held).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What an `ncclComm_t` points to.
pub struct ncclComm {
    /// The CUDA engine of the device its device-memory calls are on
    /// (made at the first such call). Declared before `slot`: dropped
    /// before the communicator it borrows.
    #[cfg(feature = "cuda")]
    pub(crate) engine: OnceLock<Result<crate::memory::cuda::Engine, Failure>>,
    pub(crate) slot: Arc<Slot>,
    pub(crate) config: CommConfig,
    /// `ncclCommSuspend` .. `ncclCommResume`: calls are refused.
    pub(crate) suspended: AtomicBool,
    /// `ncclCommRevoke`d: calls are refused, the state is quiescent.
    pub(crate) revoked: AtomicBool,
    /// The operators `ncclRedOpCreatePreMulSum` made on it.
    pub(crate) ops: Mutex<crate::redop::Ops>,
    /// The buffers `ncclCommRegister` registered on it.
    pub(crate) registered: Mutex<crate::register::Registry>,
    /// The id `ncclCommGetUniqueId` made for a grow, until it is used.
    pub(crate) grow_id: Mutex<Option<oxccl::UniqueId>>,
}

pub type ncclComm_t = *mut ncclComm;

impl ncclComm {
    /// A handle whose communicator `make` builds: here and now, or on a
    /// thread of its own (a non-blocking configuration, or a group: the
    /// caller must not wait for the other ranks). The second value says
    /// whether it is still being made.
    pub(crate) fn create(
        config: CommConfig,
        background: bool,
        make: impl FnOnce() -> Result<Communicator, Failure> + Send + 'static,
    ) -> Result<(ncclComm_t, Arc<Slot>), Failure> {
        let slot = Arc::new(Slot::default());
        if background {
            let s = slot.clone();
            std::thread::Builder::new()
                .name("oxccl-nccl-init".into())
                .spawn(move || {
                    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
                        .unwrap_or_else(|_| {
                            Err(Failure::new(
                                crate::result::ncclInternalError,
                                "creating the communicator panicked",
                            ))
                        });
                    s.set(made);
                })
                .map_err(|e| {
                    Failure::new(
                        crate::result::ncclSystemError,
                        format!("cannot start a thread to create the communicator: {e}"),
                    )
                })?;
        } else {
            slot.set(Ok(make()?));
        }
        crate::debug::info(&format!(
            "communicator {} {}",
            config.name.as_deref().unwrap_or("(unnamed)"),
            if background {
                "being created"
            } else {
                "created"
            }
        ));
        let handle = Box::into_raw(Box::new(ncclComm {
            #[cfg(feature = "cuda")]
            engine: OnceLock::new(),
            slot: slot.clone(),
            config,
            suspended: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            ops: Mutex::default(),
            registered: Mutex::default(),
            grow_id: Mutex::new(None),
        }));
        Ok((handle, slot))
    }
}

/// The configuration from the environment (`OXCCL_*`, else NCCL's names
/// for the same settings).
pub(crate) fn config() -> Result<Config, Failure> {
    oxccl::nccl_env::honour_nccl_names();
    Ok(Config::from_env()?)
}

/// The handle behind `comm`.
///
/// # Safety
/// `comm` is null or from this library, not destroyed.
pub(crate) unsafe fn handle<'a>(comm: ncclComm_t) -> Result<&'a ncclComm, Failure> {
    // SAFETY: the caller's contract.
    unsafe { comm.as_ref() }.ok_or_else(|| Failure::invalid("comm is NULL"))
}

/// The communicator behind `comm`, ready for calls: made, not suspended,
/// not revoked.
///
/// # Safety
/// `comm` is null or from this library, not destroyed.
pub(crate) unsafe fn get<'a>(comm: ncclComm_t) -> Result<&'a Communicator, Failure> {
    // SAFETY: the caller's contract.
    let h = unsafe { handle(comm) }?;
    if h.suspended.load(Ordering::Acquire) {
        return Err(Failure::usage(
            "the communicator is suspended (ncclCommSuspend): ncclCommResume it first",
        ));
    }
    if h.revoked.load(Ordering::Acquire) {
        return Err(Failure::usage(
            "the communicator was revoked (ncclCommRevoke): shrink, split or destroy it",
        ));
    }
    made(h)
}

/// The communicator of `h` if it is made, whatever its state.
pub(crate) fn made(h: &ncclComm) -> Result<&Communicator, Failure> {
    match h.slot.outcome() {
        None => Err(Failure::invalid(
            "the communicator is still being created (non-blocking): call \
             ncclCommGetAsyncError until it says ncclSuccess before using it",
        )),
        Some(Err(f)) => Err(Failure::new(
            f.code,
            format!("creating this communicator failed: {}", f.message),
        )),
        Some(Ok(c)) => Ok(c),
    }
}

/// The CUDA engine of `comm` for memory of device `ordinal`: made at the
/// first call on device memory; a communicator's calls use one device.
///
/// # Safety
/// `comm` is NULL or from this library, not destroyed.
#[cfg(feature = "cuda")]
pub(crate) unsafe fn engine<'a>(
    comm: ncclComm_t,
    ordinal: u32,
) -> Result<&'a crate::memory::cuda::Engine, Failure> {
    // SAFETY: the caller's contract.
    let h = unsafe { handle(comm) }?;
    let c = made(h)?;
    // SAFETY: the engine lives in the same handle as the communicator's
    // slot and is dropped first (field order).
    let e = h
        .engine
        .get_or_init(|| unsafe { crate::memory::cuda::Engine::attach(c, ordinal) })
        .as_ref()
        .map_err(Clone::clone)?;
    if e.ordinal() != ordinal {
        return Err(Failure::usage(format!(
            "this communicator's calls are on CUDA device {}; this one's buffers are on device {ordinal}",
            e.ordinal()
        )));
    }
    Ok(e)
}

/// Wait for the calls queued on `h`'s device (none without one).
fn drain(h: &ncclComm) -> Result<(), Failure> {
    #[cfg(feature = "cuda")]
    if let Some(Ok(e)) = h.engine.get() {
        return e.drain();
    }
    let _ = h;
    Ok(())
}

/// A non-negative `int` argument as a count.
pub(crate) fn count(name: &str, v: c_int) -> Result<usize, Failure> {
    usize::try_from(v).map_err(|_| Failure::invalid(format!("{name} = {v} is negative")))
}

/// Write `value` to an out-parameter `p` named `name`.
///
/// # Safety
/// `p` is NULL or valid for a write of a `T`.
pub(crate) unsafe fn put<T>(name: &str, p: *mut T, value: T) -> Result<(), Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{name} is NULL")));
    }
    // SAFETY: non-null; the caller's contract.
    unsafe { p.write(value) };
    Ok(())
}

export! {
    /// `ncclGetVersion`: `NCCL_VERSION_CODE` of the API this implements.
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        // SAFETY: the caller gives room for an int.
        run("ncclGetVersion", || unsafe { put("version", version, NCCL_VERSION_CODE) })
    }
}

export! {
    /// `ncclCommFinalize`: every call issued has completed when it returns
    /// (calls on host memory complete before they return; those queued on
    /// a device's streams are waited for); the communicator stays valid
    /// until destroyed.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) {
        run("ncclCommFinalize", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            if h.revoked.load(Ordering::Acquire) {
                return Err(Failure::usage("ncclCommFinalize after ncclCommRevoke"));
            }
            drain(h)
        })
    }
}

export! {
    /// `ncclCommDestroy`: free the communicator (peers see a clean
    /// departure, not a crash). One still being created is waited for.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) {
        run("ncclCommDestroy", || {
            if comm.is_null() {
                return Err(Failure::invalid("comm is NULL"));
            }
            // SAFETY: from this library (Box::into_raw), not destroyed.
            let h = unsafe { Box::from_raw(comm) };
            h.slot.wait();
            // Queued calls end before the communicator goes (their
            // failures were reported through ncclCommGetAsyncError).
            let _ = drain(&h);
            drop(h);
            Ok(())
        })
    }
}

export! {
    /// `ncclCommAbort`: stop every call in flight on every rank (they
    /// return an error naming this abort) and free the communicator. One
    /// still being created is let go: its thread drops it when done.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) {
        run("ncclCommAbort", || {
            if comm.is_null() {
                return Err(Failure::invalid("comm is NULL"));
            }
            // SAFETY: from this library (Box::into_raw), not destroyed.
            let h = unsafe { Box::from_raw(comm) };
            if let Some(Ok(c)) = h.slot.outcome() {
                c.abort();
            }
            Ok(())
        })
    }
}

export! {
    /// `ncclCommCount`: the number of ranks.
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) {
        run("ncclCommCount", || {
            // SAFETY: the caller's contract.
            let c = made(unsafe { handle(comm) }?)?;
            // SAFETY: the caller gives room for an int.
            unsafe { put("count", count, c.nranks() as c_int) }
        })
    }
}

export! {
    /// `ncclCommUserRank`: this rank.
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) {
        run("ncclCommUserRank", || {
            // SAFETY: the caller's contract.
            let c = made(unsafe { handle(comm) }?)?;
            // SAFETY: the caller gives room for an int.
            unsafe { put("rank", rank, c.rank() as c_int) }
        })
    }
}

/// `cudaCpuDeviceId`: CUDA's number for "the host".
pub const CUDA_CPU_DEVICE_ID: c_int = -1;

export! {
    /// `ncclCommCuDevice`: the CUDA device of the communicator's memory:
    /// `cudaCpuDeviceId` (-1), the host, for calls on host memory.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) {
        run("ncclCommCuDevice", || {
            // SAFETY: the caller's contract.
            made(unsafe { handle(comm) }?)?;
            // SAFETY: the caller gives room for an int.
            unsafe { put("device", device, CUDA_CPU_DEVICE_ID) }
        })
    }
}

export! {
    /// `ncclCommGetAsyncError`: `ncclInProgress` while the communicator is
    /// being created, then `ncclSuccess` while it is sound, else the code
    /// of the failure that broke it (its creation, a peer lost, an abort, a
    /// timeout), found without a call in flight; `ncclCommGetLastError`
    /// has the text.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut crate::result::ncclResult_t) {
        run("ncclCommGetAsyncError", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            let code = match h.slot.outcome() {
                None => ncclInProgress,
                Some(Err(f)) => {
                    crate::result::remember(&format!("creating the communicator failed: {}", f.message));
                    f.code
                }
                Some(Ok(_)) if h.revoked.load(Ordering::Acquire) => ncclSuccess,
                Some(Ok(c)) => c.async_error().map_or(ncclSuccess, |e| {
                    crate::result::remember(&e.to_string());
                    code_of(&e)
                }),
            };
            // SAFETY: the caller gives room for a result.
            unsafe { put("asyncError", asyncError, code) }
        })
    }
}
