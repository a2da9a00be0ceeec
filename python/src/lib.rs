//! `oxccl._oxccl`: the communicator for Python, on raw memory.
//!
//! The Python package (`oxccl/`) owns everything torch-shaped: it turns
//! tensors into (address, bytes) pairs, keeps them alive while a call
//! runs, and maps torch's dtypes and operators to the codes used here.
//! This module only wires those pairs to the communicator's untyped entry
//! points ([`CoreCommunicator::collective_regions`] and groups of
//! point-to-point regions) and turns its errors into one Python exception
//! type that carries the blamed rank. Every blocking call releases the
//! interpreter lock.

use oxccl::{
    Communicator, Config, DataType, Error, Kind, MemorySpace, ReduceOp, Region, UniqueId, Work,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

create_exception!(
    _oxccl,
    CommError,
    PyRuntimeError,
    "A failed oxccl call: `kind` names the failure (peer_lost, timeout, \
     mismatch, ...), `rank` the rank it blames (None when none)."
);

/// The Python exception for an oxccl error, with `kind` and `rank` set.
fn py_err(e: Error) -> PyErr {
    let kind = error_kind(&e);
    let rank = e.blamed_rank();
    let err = CommError::new_err(e.to_string());
    Python::attach(|py| {
        let v = err.value(py);
        // Setting attributes on a fresh exception instance cannot fail in
        // a way worth more than the message itself.
        let _ = v.setattr("kind", kind);
        let _ = v.setattr("rank", rank);
    });
    err
}

/// A short, stable name for each kind of error (Python code branches on it).
fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_) => "invalid_argument",
        Error::PeerLost { .. } => "peer_lost",
        Error::Timeout { .. } => "timeout",
        Error::WaitCycle { .. } => "wait_cycle",
        Error::Absent { .. } => "absent",
        Error::Mismatch { .. } => "mismatch",
        Error::Aborted { .. } => "aborted",
        Error::Remote { .. } => "remote",
        Error::Bootstrap(_) => "bootstrap",
        Error::Handshake(_) => "handshake",
        Error::Transport { .. } => "transport",
        Error::Protocol(_) => "protocol",
        Error::Config(_) => "config",
        Error::System(_) => "system",
        Error::Device { .. } => "device",
        Error::Unsupported(_) => "unsupported",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

fn invalid(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

fn seconds(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            invalid(format!(
                "{what} must be a positive number of seconds, not {s}"
            ))
        })
}

// The decoders below serve both entries: Python's (a `ValueError` through
// `arg`) and C's (the error's text in `RawError`).

fn dtype(code: u8) -> Result<DataType, Error> {
    DataType::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| Error::invalid(format!("no oxccl data type has code {code}")))
}

fn reduce_op(code: u8) -> Result<ReduceOp, Error> {
    ReduceOp::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| Error::invalid(format!("no oxccl reduction has code {code}")))
}

fn kind(name: &str) -> PyResult<Kind> {
    Kind::COLLECTIVES
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| invalid(format!("no oxccl collective is called {name:?}")))
}

/// Host memory at `addr` of `len` bytes (a tensor's storage).
fn region(addr: usize, len: usize) -> Result<Region, Error> {
    if addr == 0 && len > 0 {
        return Err(Error::invalid(format!(
            "a buffer of {len} bytes at address 0"
        )));
    }
    Ok(Region {
        space: MemorySpace::Host,
        addr: if len == 0 { Region::EMPTY.addr } else { addr },
        len,
    })
}

/// An argument error for Python: a `ValueError` with the error's text.
fn arg(e: Error) -> PyErr {
    invalid(e.to_string())
}

/// How ranks find each other: `oxccl1:<secret>@<address>`. Made by one
/// rank (which then hosts the rendezvous root) and passed to the others
/// as text, e.g. through torch's store.
#[pyclass(frozen, module = "oxccl._oxccl")]
struct UniqueIdHandle {
    id: UniqueId,
}

#[pymethods]
impl UniqueIdHandle {
    /// Start a rendezvous root on this host; ranks must join within
    /// `timeout` seconds.
    #[staticmethod]
    fn create(timeout: f64) -> PyResult<UniqueIdHandle> {
        let mut cfg = Config::from_env().map_err(py_err)?;
        cfg.timeout = seconds(timeout, "timeout")?;
        let id = UniqueId::with_config(&cfg).map_err(py_err)?;
        Ok(UniqueIdHandle { id })
    }

    /// Parse the text another rank published.
    #[staticmethod]
    fn parse(text: &str) -> PyResult<UniqueIdHandle> {
        let id = text.parse().map_err(py_err)?;
        Ok(UniqueIdHandle { id })
    }

    fn __str__(&self) -> String {
        self.id.to_string()
    }
}

/// One rank's communicator. Calls run in issue order; the memory of a call
/// must stay valid and untouched until it completes (the Python layer keeps
/// the tensors referenced by the call's `Work`).
#[pyclass(frozen, module = "oxccl._oxccl")]
struct Comm {
    comm: Arc<Communicator>,
    /// The id, kept so the root this rank may host lives as long as it.
    _id: UniqueId,
}

/// A point-to-point operation of a group: `(is_send, address, bytes, peer)`.
type P2pOp = (bool, usize, usize, usize);

#[pymethods]
impl Comm {
    /// Join as `rank` of `size` with the given id; every call's deadline is
    /// `timeout` seconds (the process group's timeout).
    #[new]
    fn new(
        py: Python<'_>,
        id: &UniqueIdHandle,
        rank: usize,
        size: usize,
        timeout: f64,
    ) -> PyResult<Comm> {
        let mut cfg = Config::from_env().map_err(py_err)?;
        cfg.timeout = seconds(timeout, "timeout")?;
        let id = id.id.clone();
        let comm = py
            .detach(|| Communicator::init_with_config(&id, rank, size, cfg))
            .map_err(py_err)?;
        Ok(Comm {
            comm: Arc::new(comm),
            _id: id,
        })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    #[getter]
    fn size(&self) -> usize {
        self.comm.nranks()
    }

    /// Run collective `kind` (`all_reduce`, `all_gather`, `reduce_scatter`,
    /// `broadcast`, `reduce`, `all_to_all`) on `(address, bytes)` buffers
    /// of `dtype` elements; `send=None` is in place. With `wait`, the call
    /// runs here and returns `None`; otherwise it is queued and a `CallWork`
    /// comes back.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind_name, send, recv, dtype_code, op_code, root, wait))]
    fn collective(
        &self,
        py: Python<'_>,
        kind_name: &str,
        send: Option<(usize, usize)>,
        recv: (usize, usize),
        dtype_code: u8,
        op_code: u8,
        root: usize,
        wait: bool,
    ) -> PyResult<Option<CallWork>> {
        let kind = kind(kind_name)?;
        let send = send.map(|(a, n)| region(a, n)).transpose().map_err(arg)?;
        let recv = region(recv.0, recv.1).map_err(arg)?;
        let dtype = dtype(dtype_code).map_err(arg)?;
        let op = reduce_op(op_code).map_err(arg)?;
        let comm = &self.comm;
        if wait {
            // SAFETY: the Python layer passes the storage of tensors it
            // holds for the whole call (this call returns when it is over).
            py.detach(|| unsafe { comm.collective_regions(kind, send, recv, dtype, op, root) })
                .map_err(py_err)?;
            return Ok(None);
        }
        // SAFETY: the Python layer keeps the tensors referenced by the
        // returned work until it completed.
        let w = unsafe {
            comm.collective_regions_async(
                kind,
                send,
                recv,
                dtype,
                op,
                root,
                Box::new(|| Ok(())),
                Box::new(|_| {}),
            )
        };
        Ok(Some(CallWork::new(w)))
    }

    /// Sends and receives of raw bytes as one group (all posted at once, so
    /// any pairing order completes): `ops` are `(is_send, address, bytes,
    /// peer)`; a rank may send to itself.
    fn p2p(&self, py: Python<'_>, ops: Vec<P2pOp>, wait: bool) -> PyResult<Option<CallWork>> {
        let mut regions = Vec::with_capacity(ops.len());
        for (is_send, addr, len, peer) in ops {
            regions.push((is_send, region(addr, len).map_err(arg)?, peer));
        }
        let add = move |g: &mut oxccl::Group<'_>| {
            for &(is_send, r, peer) in &regions {
                // SAFETY: as for `collective`: the tensors stay referenced
                // until the group completed.
                unsafe { g.p2p_region(is_send, r, DataType::U8, peer) }?;
            }
            Ok(())
        };
        if wait {
            py.detach(|| self.comm.group(add)).map_err(py_err)?;
            return Ok(None);
        }
        let w = self.comm.group_async((), move |g, _| add(g));
        Ok(Some(CallWork::new(w)))
    }

    /// A barrier (queued unless `wait`), with its own deadline of
    /// `timeout` seconds when given: a rank that does not arrive in time
    /// is named in the error.
    #[pyo3(signature = (wait, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        wait: bool,
        timeout: Option<f64>,
    ) -> PyResult<Option<CallWork>> {
        let limit = timeout.map(|t| seconds(t, "timeout")).transpose()?;
        let comm = match limit {
            Some(d) => &self.comm.with_timeout(d),
            None => &*self.comm,
        };
        if wait {
            py.detach(|| comm.barrier()).map_err(py_err)?;
            return Ok(None);
        }
        Ok(Some(CallWork::new(comm.barrier_async())))
    }

    /// `(function, communicator)` addresses for callers in C or C++ that
    /// run blocking collectives without Python (the torch backend's fast
    /// path): the function is [`oxccl_py_collective`]; the communicator
    /// stays valid while this `Comm` lives.
    fn raw_entry(&self) -> (usize, usize) {
        (
            oxccl_py_collective as *const () as usize,
            Arc::as_ptr(&self.comm) as usize,
        )
    }

    /// Fail every pending and later call of this communicator, on every
    /// rank (each survivor learns that this rank aborted).
    fn abort(&self) {
        self.comm.abort();
    }

    /// Write the flight recorder's last calls to a JSON file in `dir`
    /// (what `oxccl-trace why` reads); the file's path.
    fn dump_recent_calls(&self, dir: std::path::PathBuf, reason: &str) -> PyResult<String> {
        let path = self.comm.dump_recent_calls(&dir, reason).map_err(py_err)?;
        Ok(path.display().to_string())
    }
}

/// A queued call. `wait` blocks (without the interpreter lock) until it is
/// over and raises its error; the outcome is kept, so every later `wait`
/// and `is_done` answers the same.
#[pyclass(frozen, module = "oxccl._oxccl")]
struct CallWork {
    state: Mutex<WorkState>,
}

enum WorkState {
    Pending(Work<()>),
    Done(Option<Error>),
}

impl CallWork {
    fn new(w: Work<()>) -> CallWork {
        CallWork {
            state: Mutex::new(WorkState::Pending(w)),
        }
    }
}

#[pymethods]
impl CallWork {
    /// Wait at most `timeout` seconds (`None`: until it is over). True when
    /// the call is over (raising its error if it failed), False when the
    /// time ran out first (the call goes on).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let limit = timeout.map(|t| seconds(t, "timeout")).transpose()?;
        py.detach(|| {
            let mut st = self.state.lock().unwrap();
            if let WorkState::Pending(w) = &*st {
                if let Some(d) = limit {
                    if !w.wait_timeout(d) {
                        return Ok(false);
                    }
                }
                let WorkState::Pending(w) = std::mem::replace(&mut *st, WorkState::Done(None))
                else {
                    unreachable!("matched as pending above")
                };
                *st = WorkState::Done(w.wait().err());
            }
            match &*st {
                WorkState::Done(Some(e)) => Err(e.clone()),
                _ => Ok(true),
            }
        })
        .map_err(py_err)
    }

    /// Whether the call is over (then `wait` returns at once).
    /// Never blocks: while another thread waits on the call (holding its
    /// state), the outcome is not recorded yet and the answer is "not yet".
    fn is_done(&self) -> bool {
        match self.state.try_lock().as_deref() {
            Ok(WorkState::Pending(w)) => w.is_done(),
            Ok(WorkState::Done(_)) => true,
            Err(std::sync::TryLockError::WouldBlock) => false,
            Err(std::sync::TryLockError::Poisoned(_)) => true,
        }
    }
}

/// A failed raw call's error, for C callers (NUL-terminated texts,
/// truncated to fit).
#[repr(C)]
pub struct RawError {
    /// `CommError.kind`'s value.
    pub kind: [u8; 32],
    /// The blamed rank, or -1.
    pub rank: i64,
    /// The error's message.
    pub message: [u8; 1024],
}

fn copy_text(dst: &mut [u8], text: &str) {
    let n = text.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&text.as_bytes()[..n]);
    dst[n] = 0;
}

/// Run a blocking collective for C callers: `comm` from
/// `Comm.raw_entry`, `kind` a collective's name code (1: all_reduce, 2:
/// all_gather, 3: reduce_scatter, 4: broadcast, 5: reduce, 6: all_to_all),
/// `send` null for in place, codes as `Comm.collective`'s. 0 on success;
/// -1 with `err` filled on failure. Never unwinds.
///
/// # Safety
/// `comm` must come from `raw_entry` of a live `Comm`; the buffers must be
/// valid for their lengths for the whole call and touched by nothing else;
/// `err` must point to a writable `RawError`.
#[no_mangle]
pub unsafe extern "C" fn oxccl_py_collective(
    comm: *const Communicator,
    kind: u8,
    send: *const u8,
    send_len: usize,
    recv: *mut u8,
    recv_len: usize,
    dtype_code: u8,
    op_code: u8,
    root: usize,
    err: *mut RawError,
) -> i32 {
    let run = || -> Result<(), Error> {
        let kind = oxccl::Kind::from_code(kind)
            .filter(|k| Kind::COLLECTIVES.contains(k) && *k != Kind::Barrier)
            .ok_or_else(|| Error::invalid(format!("no collective has code {kind}")))?;
        let (dtype, op) = (dtype(dtype_code)?, reduce_op(op_code)?);
        let send = match send.is_null() {
            true => None,
            false => Some(region(send as usize, send_len)?),
        };
        let recv = region(recv as usize, recv_len)?;
        // SAFETY: the caller's contract: a live communicator, valid buffers.
        unsafe { (*comm).collective_regions(kind, send, recv, dtype, op, root) }
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(())) => 0,
        outcome => {
            let e = match outcome {
                Ok(Err(e)) => e,
                _ => Error::invalid("oxccl panicked in a raw collective (a bug: please report it)"),
            };
            // SAFETY: the caller's contract: `err` is writable.
            let out = unsafe { &mut *err };
            copy_text(&mut out.kind, error_kind(&e));
            out.rank = e.blamed_rank().map_or(-1, |r| r as i64);
            copy_text(&mut out.message, &e.to_string());
            -1
        }
    }
}

#[pymodule]
fn _oxccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<UniqueIdHandle>()?;
    m.add_class::<Comm>()?;
    m.add_class::<CallWork>()?;
    m.add("CommError", m.py().get_type::<CommError>())?;
    Ok(())
}
