"""The ``torch.distributed`` backend ``"oxccl"`` for CPU tensors.

A ``c10d`` backend written in Python over the extension's communicator:
torch wraps :class:`OxcclBackend` in a ``ProcessGroup`` and calls its
methods from Python (``dist.all_reduce``) and from C++ (DDP's reducer,
FSDP) alike. Every collective runs on the tensors' own storage: the
extension gets each tensor's address and size, and the :class:`_Work` of
the call keeps the tensors referenced until the call is over. A
non-contiguous tensor runs through a contiguous copy, copied back when the
call completes.

Calls made with ``async_op=False`` run in the calling thread (the
interpreter lock released) and return a completed work; the others are
queued on the communicator, in issue order, and complete in the background.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from ._oxccl import Comm, CommError, UniqueIdHandle

NAME = "oxccl"

# oxccl's data type codes (comm-core's `DataType`) for the types it reduces.
_REDUCIBLE = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.int32: 2,
    torch.int64: 4,
    torch.float16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bfloat16: 9,
}
for _name, _code in (("uint32", 3), ("uint64", 5)):
    if hasattr(torch, _name):
        _REDUCIBLE[getattr(torch, _name)] = _code
_BYTES = 1  # u8: what every non-reducing call moves, whatever the dtype

_SUM, _PROD, _MAX, _MIN, _AVG = 0, 1, 2, 3, 4
_RED = dist.ReduceOp.RedOpType
_OPS = {
    int(_RED.SUM): _SUM,
    int(_RED.PRODUCT): _PROD,
    int(_RED.MAX): _MAX,
    int(_RED.MIN): _MIN,
    int(_RED.AVG): _AVG,
}
# On bool tensors, sum is "any" and product "all" (as Gloo does).
_BOOL_OPS = {_SUM: _MAX, _PROD: _MIN, _MAX: _MAX, _MIN: _MIN}


class OxcclError(dist.DistBackendError):
    """A failed oxccl call: ``kind`` says how (``peer_lost``, ``timeout``,
    ``mismatch``, ``aborted``, ...), ``rank`` which rank of the group it
    blames (``None`` when it blames none)."""

    def __init__(self, message: str, kind: str | None = None, rank: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.rank = rank


def _error(e: CommError) -> OxcclError:
    return OxcclError(str(e), getattr(e, "kind", None), getattr(e, "rank", None))


def _seconds(timeout) -> float | None:
    """torch's timeouts as seconds; zero or negative (its "none") as None."""
    if timeout is None:
        return None
    s = timeout.total_seconds()
    return s if s > 0 else None


def _cpu(t: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"oxccl: {what} must be a tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"oxccl: {what} is on {t.device}; this backend takes CPU tensors")
    if t.is_sparse:
        raise ValueError(f"oxccl: {what} is sparse; this backend takes dense tensors")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of a contiguous tensor's elements."""
    n = t.numel() * t.element_size()
    return (t.data_ptr() if n else 0, n)


class _Plan:
    """What one backend method runs: steps (each `f(wait) -> CallWork|None`),
    the tensors the calls use (kept alive until they are over), the work to
    do after they succeeded (copies back into non-contiguous outputs,
    scatters out of staging), and the tensors the work's result names."""

    def __init__(self, result):
        self.steps = []
        self.names = []  # each step's call, for messages
        self.keep = []
        self.after = []
        self.result = result

    def contiguous(self, t: torch.Tensor, write: bool) -> torch.Tensor:
        """`t` itself when contiguous; else a contiguous copy, copied back
        into `t` after the calls when they write it."""
        if t.is_contiguous():
            self.keep.append(t)
            return t
        c = t.contiguous()
        self.keep.append(c)
        if write:
            self.after.append(lambda: t.copy_(c))
        return c


class _Completer:
    """Settles the futures of pending works, in the order they were asked
    for, on one daemon thread per backend (started on first use).

    Settling a future runs torch's C++ on this thread (the future's
    callbacks, which take and let go of the interpreter lock). A daemon
    thread that asks for the lock once the interpreter is finalizing is
    ended with `pthread_exit`, whose unwinding through those C++ frames
    aborts the process ("terminate called without an active exception":
    a survivor that raised and exited at once did, about one run in ten). So
    at exit (`atexit`, before finalizing) each completer waits for a
    settling in progress and settles none after it."""

    def __init__(self):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._cv = threading.Condition()
        self._completing = False
        self._closing = False
        _completers.add(self)

    def add(self, work: "_Work") -> None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="oxccl-futures", daemon=True
                )
                self._thread.start()
        self._q.put(work)

    def _run(self) -> None:
        while True:
            w = self._q.get()
            w._settle(None, self)

    def complete(self, work: "_Work") -> None:
        """Settle `work`'s future here, unless the interpreter is exiting
        (nobody waits for futures then)."""
        with self._cv:
            if self._closing:
                return
            self._completing = True
        try:
            work._complete()
        finally:
            with self._cv:
                self._completing = False
                self._cv.notify_all()

    def close(self, timeout: float) -> None:
        """Settle no more futures; wait (at most `timeout` s) for the one
        being settled."""
        with self._cv:
            self._closing = True
            self._cv.wait_for(lambda: not self._completing, timeout)


_completers: "weakref.WeakSet[_Completer]" = weakref.WeakSet()


@atexit.register
def _close_completers() -> None:
    for c in list(_completers):
        c.close(timeout=5.0)


def _raise_error(outcome: torch.futures.Future):
    """A work's future is this callback's: the outcome future holds the
    result or the exception as a value, and raising here marks the chained
    future failed in C++. (`Future.set_exception` marks only its Python
    wrapper, which is lost when the future goes through torch's C++, e.g.
    DDP's reducer or `Work.get_future()` on the work torch hands back: the
    error would come back as a value.)"""
    v = outcome.value()
    if isinstance(v, BaseException):
        raise v
    return v


class _Work(_c10d.Work):
    """A call (or several, run as one) of the backend."""

    def __init__(self, backend, calls, plan: _Plan):
        super().__init__()
        self._backend = backend
        self._calls = [c for c in calls if c is not None]
        self._plan = plan
        self._exc: BaseException | None = None
        self._over = False
        self._lock = threading.Lock()  # held by a waiter for the whole wait
        self._flock = threading.Lock()  # the future and `_over`: never held long
        # get_future's future, and the one its outcome is set on (see
        # `_raise_error`).
        self._future: torch.futures.Future | None = None
        self._outcome: torch.futures.Future | None = None
        if not self._calls:
            self._complete()

    def _complete(self) -> None:
        """The calls are over: finish the plan (once), settle the future."""
        after, self._plan.after = self._plan.after, []
        try:
            for f in after if self._exc is None else ():
                f()
        except BaseException as e:  # a copy that fails is this call's error
            self._exc = e
        self._plan.keep = []
        with self._flock:
            self._over = True
            outcome = self._outcome
        if outcome is not None and not outcome.done():
            outcome.set_result(self._plan.result if self._exc is None else self._exc)

    def _settle(self, timeout: float | None, completer: _Completer | None = None) -> bool:
        """Wait for the calls (at most `timeout` seconds each); whether
        they are over (successfully or not). On the completer's thread
        the completer settles the future (see `_Completer`)."""
        with self._lock:
            if self._over:
                return True
            while self._calls:
                try:
                    if not self._calls[0].wait(timeout):
                        return False
                except (CommError, OxcclError) as e:
                    self._exc = e if isinstance(e, OxcclError) else _error(e)
                    self._calls = []
                    break
                self._calls.pop(0)
            if completer is None:
                self._complete()
            else:
                completer.complete(self)
            return True

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        limit = _seconds(timeout)
        if not self._settle(limit):
            # The call cannot be cancelled on this rank alone: abort the
            # communicator so that every rank learns it, rather than let
            # the others wait for this one's deadline.
            self._backend.abort()
            raise OxcclError(
                f"oxccl: {' + '.join(self._plan.names) or 'work'} not complete after "
                f"{limit} s (Work.wait's timeout); the communicator was aborted",
                "timeout",
                None,
            )
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._over or all(c.is_done() for c in self._calls)

    def is_success(self) -> bool:
        return self._over and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._plan.result

    def get_future(self) -> torch.futures.Future:
        # Not under `_lock`: a thread blocked in `wait` must not hold up
        # another that only asks for the future.
        with self._flock:
            if self._future is not None:
                return self._future
            self._outcome = torch.futures.Future()
            self._future = self._outcome.then(_raise_error)
            over = self._over
        if over:
            self._outcome.set_result(self._plan.result if self._exc is None else self._exc)
        else:
            self._backend._completer.add(self)
        return self._future

    def synchronize(self) -> None:
        self.wait()


class _Done(_c10d.Work):
    """A call that completed before its work was made (the fast path of
    blocking calls: the least torch's dispatch costs on top of the call)."""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def get_future(self) -> torch.futures.Future:
        f = torch.futures.Future()
        f.set_result(self._result)
        return f

    def synchronize(self) -> None:
        pass


def _plain(t) -> bool:
    """Whether `t` can go straight to the communicator: a dense,
    contiguous CPU tensor."""
    return t.is_cpu and t.layout == torch.strided and t.is_contiguous()


class _Methods:
    """The backend's methods, on top of torch's `Backend` (the Python path:
    :class:`OxcclBackend`) or of the C++ fast path's `FastBackend` (see
    :func:`backend_class`)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._timeout = timeout
        self._store = store
        seconds = _seconds(timeout) or 1800.0
        key = "oxccl/unique_id"
        if rank == 0:
            uid = UniqueIdHandle.create(seconds)
            store.set(key, str(uid))
        else:
            uid = UniqueIdHandle.parse(store.get(key).decode())
        try:
            self._comm = Comm(uid, rank, size, seconds)
        except CommError as e:
            raise _error(e) from None
        self._completer = _Completer()
        if hasattr(self, "_set_entry"):  # the C++ fast path
            self._set_entry(self, *self._comm.raw_entry())

    # -- what torch asks of every backend ---------------------------------

    def getBackendName(self) -> str:
        return NAME

    @property
    def options(self):
        # Defined here (not inherited) so torch's lookup of a Python
        # backend's options ends here instead of recursing.
        return _c10d.Backend.Options(NAME, self._timeout)

    # torch reads these capability flags through Python attribute lookup;
    # each must be defined here, or the lookup recurses into the base class.
    @property
    def supports_splitting(self) -> bool:
        return True

    @property
    def supports_coalescing(self) -> bool:
        # Sends and receives are posted at once anyway (each `isend` is a
        # group of its own), so `batch_isend_irecv` needs no coalescing.
        return False

    @property
    def supports_shrinking(self) -> bool:
        return False

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    @property
    def _supports_time_estimate(self) -> bool:
        return False

    def split(self, store, ranks, opts):
        """A backend for `ranks` (this group's ranks, in the new order):
        a fresh communicator met through `store` (the new group's)."""
        timeout = opts._timeout if opts is not None else self._timeout
        return type(self)(store, list(ranks).index(self.rank()), len(ranks), timeout)

    def abort(self) -> None:
        self._comm.abort()

    def shutdown(self) -> None:
        pass

    @property
    def comm(self) -> Comm:
        """The oxccl communicator under this backend."""
        return self._comm

    # -- running plans ------------------------------------------------------

    def _run(self, plan: _Plan, opts=None) -> _Work:
        wait = opts is not None and not getattr(opts, "asyncOp", True)
        calls = []
        try:
            for step in plan.steps:
                calls.append(step(wait))
        except CommError as e:
            if calls:  # the queued ones still run: wait for them first
                _Work(self, calls, _Plan(None))._settle(None)
            raise _error(e) from None
        return _Work(self, calls, plan)

    def _coll(self, plan, kind, send, recv, dtype, op=_SUM, root=0):
        c = self._comm
        plan.steps.append(lambda wait: c.collective(kind, send, recv, dtype, op, root, wait))
        plan.names.append(f"{kind} of {max((s[1] for s in (send, recv) if s), default=0)} bytes")

    def _p2p(self, plan, ops):
        c = self._comm
        plan.steps.append(lambda wait: c.p2p(ops, wait))
        plan.names.append(f"{len(ops)} send(s)/recv(s)")

    def _reduction(self, t: torch.Tensor, opts_op) -> tuple[int, int]:
        """(dtype code, op code) for reducing `t` with torch's operator."""
        rtype = opts_op.op if hasattr(opts_op, "op") else opts_op
        op = _OPS.get(int(rtype))
        if op is None:
            raise ValueError(
                f"oxccl: reduction {rtype} is not supported (oxccl reduces with "
                "SUM, PRODUCT, MIN, MAX and AVG)"
            )
        if t.dtype == torch.bool:
            if op not in _BOOL_OPS:
                raise ValueError("oxccl: AVG of bool tensors is not defined")
            return _REDUCIBLE[torch.uint8], _BOOL_OPS[op]
        code = _REDUCIBLE.get(t.dtype)
        if code is None:
            raise ValueError(
                f"oxccl: cannot reduce {t.dtype} (oxccl reduces "
                + ", ".join(str(d) for d in _REDUCIBLE)
                + ", and bool)"
            )
        return code, op

    def _root(self, root: int) -> int:
        if not 0 <= root < self.size():
            raise ValueError(f"oxccl: root {root} is not a rank of this group of {self.size()}")
        return root

    def _peer(self, peer: int, what: str) -> int:
        if not 0 <= peer < self.size():
            raise ValueError(f"oxccl: {what} {peer} is not a rank of this group of {self.size()}")
        return peer

    # -- collectives ----------------------------------------------------------

    def _now(self, kind, send, recv, dtype, op, root, result):
        """Run one collective here and now (the blocking fast path)."""
        try:
            self._comm.collective(kind, send, recv, dtype, op, root, True)
        except CommError as e:
            raise _error(e) from None
        return _Done(result)

    def allreduce(self, tensors, opts=None):
        if opts is not None and not opts.asyncOp and len(tensors) == 1:
            # The common blocking call, without building a plan.
            t = tensors[0]
            dtype, op = _REDUCIBLE.get(t.dtype), _OPS.get(int(opts.reduceOp.op))
            if dtype is not None and op is not None and _plain(t):
                span = (t.data_ptr(), t.numel() * t.element_size())
                return self._now("all_reduce", None, span, dtype, op, 0, tensors)
        opts = opts or _c10d.AllreduceOptions()
        plan = _Plan(tensors)
        for i, t in enumerate(tensors):
            _cpu(t, f"tensor {i}")
            dtype, op = self._reduction(t, opts.reduceOp)
            c = plan.contiguous(t, write=True)
            self._coll(plan, "all_reduce", None, _span(c), dtype, op)
        return self._run(plan, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts or _c10d.AllreduceOptions())

    def broadcast(self, tensors, opts=None):
        if opts is not None and not opts.asyncOp and len(tensors) == 1:
            t, root = tensors[0], opts.rootRank
            if _plain(t) and 0 <= root < self.size():
                span = (t.data_ptr(), t.numel() * t.element_size())
                return self._now("broadcast", None, span, _BYTES, _SUM, root, tensors)
        opts = opts or _c10d.BroadcastOptions()
        root = self._root(opts.rootRank)
        plan = _Plan(tensors)
        for i, t in enumerate(tensors):
            _cpu(t, f"tensor {i}")
            c = plan.contiguous(t, write=self.rank() != root)
            self._coll(plan, "broadcast", None, _span(c), _BYTES, root=root)
        return self._run(plan, opts)

    def reduce(self, tensors, opts=None):
        opts = opts or _c10d.ReduceOptions()
        root = self._root(opts.rootRank)
        plan = _Plan(tensors)
        for i, t in enumerate(tensors):
            _cpu(t, f"tensor {i}")
            dtype, op = self._reduction(t, opts.reduceOp)
            if self.rank() == root:
                c = plan.contiguous(t, write=True)
                self._coll(plan, "reduce", None, _span(c), dtype, op, root)
            else:
                # Out of place into scratch: a non-root's tensor is left as
                # it was (as torch documents for reduce).
                c = plan.contiguous(t, write=False)
                scratch = torch.empty_like(c)
                plan.keep.append(scratch)
                self._coll(plan, "reduce", _span(c), _span(scratch), dtype, op, root)
        return self._run(plan, opts)

    def all_gather_single(self, output, input, opts=None):
        if (
            opts is not None
            and not opts.asyncOp
            and _plain(output)
            and _plain(input)
            and output.dtype == input.dtype
            and output.numel() == input.numel() * self.size()
        ):
            es = input.element_size()
            send = (input.data_ptr(), input.numel() * es)
            recv = (output.data_ptr(), output.numel() * es)
            return self._now("all_gather", send, recv, _BYTES, _SUM, 0, [output])
        opts = opts or _c10d.AllgatherOptions()
        _cpu(output, "output")
        _cpu(input, "input")
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"oxccl: all_gather_into_tensor needs an output of {self.size()} x "
                f"{input.numel()} {input.dtype} elements, got {output.numel()} {output.dtype}"
            )
        plan = _Plan([output])
        i = plan.contiguous(input, write=False)
        o = plan.contiguous(output, write=True)
        self._coll(plan, "all_gather", _span(i), _span(o), _BYTES)
        return self._run(plan, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        plan = _Plan(output_tensors)
        for j, (outs, t) in enumerate(zip(output_tensors, input_tensors)):
            _cpu(t, f"input {j}")
            if len(outs) != self.size():
                raise ValueError(
                    f"oxccl: all_gather needs {self.size()} output tensors, got {len(outs)}"
                )
            for r, o in enumerate(outs):
                _cpu(o, f"output {r}")
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(
                        f"oxccl: all_gather output {r} has {o.numel()} {o.dtype} elements, "
                        f"the input {t.numel()} {t.dtype}"
                    )
            i = plan.contiguous(t, write=False)
            flat = _consecutive(outs)
            if flat is not None:
                # The outputs are one buffer's consecutive parts (chunks of
                # one tensor): a plain all-gather into it.
                plan.keep.append(outs)
                self._coll(plan, "all_gather", _span(i), flat, _BYTES)
            else:
                # Separate tensors: each rank's part goes straight into its
                # output (a group of sends and receives, no staging).
                ops = []
                for r, o in enumerate(outs):
                    c = plan.contiguous(o, write=True)
                    ops.append((True, *_span(i), r))
                    ops.append((False, *_span(c), r))
                self._p2p(plan, ops)
        return self._run(plan, opts)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts or _c10d.AllgatherOptions())

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(self, works, outputs)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        _cpu(output, "output")
        _cpu(input, "input")
        if input.numel() != output.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"oxccl: reduce_scatter_tensor needs an input of {self.size()} x "
                f"{output.numel()} {output.dtype} elements, got {input.numel()} {input.dtype}"
            )
        dtype, op = self._reduction(output, opts.reduceOp)
        plan = _Plan([output])
        i = plan.contiguous(input, write=False)
        o = plan.contiguous(output, write=True)
        self._coll(plan, "reduce_scatter", _span(i), _span(o), dtype, op)
        return self._run(plan, opts)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        plan = _Plan(output_tensors)
        for j, (out, ins) in enumerate(zip(output_tensors, input_lists)):
            _cpu(out, f"output {j}")
            if len(ins) != self.size():
                raise ValueError(
                    f"oxccl: reduce_scatter needs {self.size()} input tensors, got {len(ins)}"
                )
            for r, t in enumerate(ins):
                _cpu(t, f"input {r}")
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError(
                        f"oxccl: reduce_scatter input {r} has {t.numel()} {t.dtype} "
                        f"elements, the output {out.numel()} {out.dtype}"
                    )
            dtype, op = self._reduction(out, opts.reduceOp)
            flat = _consecutive(ins)
            if flat is None:
                # Reduce-scatter reduces across ranks' whole inputs, so the
                # parts must be one buffer: stage separate tensors into one.
                staged = torch.cat([t.reshape(-1) for t in ins])
                plan.keep.append(staged)
                flat = _span(staged)
            else:
                plan.keep.append(ins)
            o = plan.contiguous(out, write=True)
            self._coll(plan, "reduce_scatter", flat, _span(o), dtype, op)
        return self._run(plan, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(self, works, outputs)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(
                f"oxccl: all_to_all needs {n} input and {n} output tensors, got "
                f"{len(input_tensors)} and {len(output_tensors)}"
            )
        plan = _Plan(output_tensors)
        ops = []
        for r, (o, t) in enumerate(zip(output_tensors, input_tensors)):
            _cpu(o, f"output {r}")
            _cpu(t, f"input {r}")
            ops.append((True, *_span(plan.contiguous(t, write=False)), r))
            ops.append((False, *_span(plan.contiguous(o, write=True)), r))
        self._p2p(plan, ops)
        return self._run(plan, opts)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        _cpu(output, "output")
        _cpu(input, "input")
        n = self.size()
        plan = _Plan([output])
        i = plan.contiguous(input, write=False)
        o = plan.contiguous(output, write=True)
        if not output_splits and not input_splits:
            if i.numel() != o.numel() or i.numel() % n or i.dtype != o.dtype:
                raise ValueError(
                    f"oxccl: all_to_all_single without splits needs input and output of "
                    f"the same size, a multiple of {n} elements (got {i.numel()} and {o.numel()})"
                )
            self._coll(plan, "all_to_all", _span(i), _span(o), _BYTES)
            return self._run(plan, opts)
        in_offs = _offsets(i, input_splits, n, "input")
        out_offs = _offsets(o, output_splits, n, "output")
        (ia, _), (oa, _) = _span(i), _span(o)
        ops = []
        for r in range(n):
            ops.append((True, ia + in_offs[r][0], in_offs[r][1], r))
            ops.append((False, oa + out_offs[r][0], out_offs[r][1], r))
        self._p2p(plan, ops)
        return self._run(plan, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.GatherOptions()
        root = self._root(opts.rootRank)
        plan = _Plan(output_tensors)
        for j, t in enumerate(input_tensors):
            _cpu(t, f"input {j}")
            ops = [(True, *_span(plan.contiguous(t, write=False)), root)]
            if self.rank() == root:
                for r, o in enumerate(output_tensors[j]):
                    _cpu(o, f"output {r}")
                    ops.append((False, *_span(plan.contiguous(o, write=True)), r))
            self._p2p(plan, ops)
        return self._run(plan, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ScatterOptions()
        root = self._root(opts.rootRank)
        plan = _Plan(output_tensors)
        for j, o in enumerate(output_tensors):
            _cpu(o, f"output {j}")
            ops = [(False, *_span(plan.contiguous(o, write=True)), root)]
            if self.rank() == root:
                for r, t in enumerate(input_tensors[j]):
                    _cpu(t, f"input {r}")
                    ops.append((True, *_span(plan.contiguous(t, write=False)), r))
            self._p2p(plan, ops)
        return self._run(plan, opts)

    def barrier(self, opts=None):
        c = self._comm
        plan = _Plan([])
        plan.steps.append(lambda wait: c.barrier(wait, None))
        return self._run(plan, opts)

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """A barrier with `opts.timeout` as its deadline: a rank that does
        not arrive is named in the error (on every rank that did)."""
        limit = _seconds(getattr(opts, "timeout", None))
        try:
            self._comm.barrier(True, limit)
        except CommError as e:
            raise _error(e) from None

    # -- point to point -------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        self._peer(dst, "destination")
        return self._one_way(tensors, True, dst)

    def recv(self, tensors, src, tag=0):
        self._peer(src, "source")
        return self._one_way(tensors, False, src)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("oxccl: receiving from any source is not supported; name the source rank")

    def _one_way(self, tensors, is_send, peer):
        plan = _Plan(tensors)
        ops = []
        for i, t in enumerate(tensors):
            _cpu(t, f"tensor {i}")
            c = plan.contiguous(t, write=not is_send)
            ops.append((is_send, *_span(c), peer))
        self._p2p(plan, ops)
        return self._run(plan)


def _consecutive(parts) -> tuple[int, int] | None:
    """(address, bytes) of the buffer `parts` tile in order, when they are
    contiguous tensors laid end to end; None otherwise."""
    if not parts or not all(p.is_contiguous() for p in parts):
        return None
    base, _ = _span(parts[0])
    at = base
    for p in parts:
        a, n = _span(p)
        if n and a != at:
            return None
        at += n
    return (base, at - base)


def _offsets(t, splits, n, what):
    """(byte offset, bytes) of each rank's part of `t` split along dim 0."""
    rows = t.shape[0] if t.dim() else 1
    row_bytes = (t.numel() // rows if rows else 0) * t.element_size()
    if not splits:
        if rows % n:
            raise ValueError(f"oxccl: all_to_all_single {what} of {rows} rows does not split in {n}")
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows or any(s < 0 for s in splits):
        raise ValueError(
            f"oxccl: all_to_all_single {what} splits {list(splits)} do not split {rows} rows "
            f"among {n} ranks"
        )
    out, at = [], 0
    for s in splits:
        out.append((at * row_bytes, s * row_bytes))
        at += s
    return out


def _joined(backend, works, result):
    """One work over several (the coalesced calls)."""
    plan = _Plan(result)
    plan.names = [n for w in works for n in w._plan.names]
    return _Work(backend, [_Part(w) for w in works], plan)


class _Part:
    """A work as one call of another work."""

    def __init__(self, work: _Work):
        self._work = work

    def wait(self, timeout):
        if not self._work._settle(timeout):
            return False
        if self._work._exc is not None:
            raise self._work._exc
        return True

    def is_done(self) -> bool:
        return self._work.is_completed()


class OxcclBackend(_Methods, _c10d.Backend):
    """``torch.distributed`` on oxccl, every call through Python (see the
    module's documentation)."""


_CLASS = None


def backend_class():
    """The class backends are made of: with the C++ fast path when it is
    built (`_fast.py`), blocking calls on plain tensors skip Python."""
    global _CLASS
    if _CLASS is None:
        from . import _fast

        fast = _fast.load()
        if fast is None:
            _CLASS = OxcclBackend
        else:
            _CLASS = type(
                "OxcclFastBackend",
                (_Methods, fast.FastBackend),
                {"__doc__": OxcclBackend.__doc__ + " Blocking calls on plain tensors run in C++."},
            )
    return _CLASS


def _raise_raw(kind: str, rank: int, message: str):
    """The fast path's errors, raised as the Python path raises them."""
    raise OxcclError(message, kind, None if rank < 0 else rank)


def _create(store, rank, size, timeout):
    return backend_class()(store, rank, size, timeout)


def register() -> None:
    """Register the backend with torch (done by ``import oxccl``)."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])
    # oxccl records every call in its own flight recorder (dumped on
    # failures, read by `oxccl-trace why`), as NCCL's backend records its
    # own: torch's generic recorder hook would cost about 9 us per call on
    # top (measured, docs/PERFORMANCE.md). OXCCL_TORCH_FLIGHT_RECORDER=1
    # keeps it.
    own = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(own, set) and os.environ.get("OXCCL_TORCH_FLIGHT_RECORDER", "").strip() != "1":
        own.add(NAME)
