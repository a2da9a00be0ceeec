"""One rank of a test job: `python worker.py SCENARIO [ARGS]`.

Started by `launch()` in conftest.py with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set (as torchrun sets them). Each scenario prints one JSON line
starting with `RESULT ` that the test reads; a failed check raises (the
rank exits non-zero with the traceback on stderr).
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import oxccl

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def init(backend, timeout=60.0):
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))


# -- every operation against Gloo ---------------------------------------------

REDUCIBLE = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
             torch.int8, torch.uint8, torch.int32, torch.int64]
MOVABLE = REDUCIBLE + [torch.bool, torch.int16, torch.complex64, torch.uint32, torch.uint64]
# Types Gloo cannot move, and the type it is compared on instead (same values).
GLOO_LACKS = {torch.int16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]


def data(shape, dtype, seed):
    """Small values every dtype holds, different per rank and seed."""
    g = torch.Generator().manual_seed(seed * 131 + RANK)
    v = torch.randint(1, 4, shape, generator=g)
    if dtype == torch.bool:
        return v > 2
    if dtype == torch.complex64:
        return torch.complex(v.float(), -v.float())
    return v.to(dtype)


def same(a, b, what):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]")
        return
    if a.dtype in (torch.uint32, torch.uint64):
        a, b = a.to(torch.int64), b.to(torch.int64)
    if not torch.equal(a, b):
        raise AssertionError(f"rank {RANK}: {what}: oxccl {a} != gloo {b}")


def both(fn, what):
    """Run fn(group) on Gloo and on oxccl; the tensors it returns must match."""
    want = fn(GLOO)
    got = fn(OX)
    same(got, want, what)


def scenario_ops():
    global GLOO, OX
    init("gloo")
    GLOO = dist.group.WORLD
    OX = dist.new_group(backend="oxccl")
    n, checked = WORLD, 0
    odd = dist.new_group(list(range(WORLD)), backend="oxccl")  # a second group

    for dt in REDUCIBLE:
        for op in OPS:
            if dt in (torch.int8, torch.uint8) and op == dist.ReduceOp.PRODUCT:
                continue  # overflows differently; not a backend property
            x = data((7, 3), dt, 1)

            def ar(g, x=x, op=op):
                t = x.clone()
                dist.all_reduce(t, op=op, group=g)
                return t

            both(ar, f"all_reduce {dt} {op}")

            def red(g, x=x, op=op):
                t = x.clone()
                dist.reduce(t, dst=n - 1, op=op, group=g)
                return t if RANK == n - 1 else x

            both(red, f"reduce {dt} {op}")

            def rs(g, x=x, op=op):
                out = torch.empty(5, dtype=dt)
                dist.reduce_scatter(out, [data((5,), dt, 10 + r) for r in range(n)], op=op, group=g)
                return out

            both(rs, f"reduce_scatter {dt} {op}")

            def rst(g, op=op):
                out = torch.empty(5, dtype=dt)
                dist.reduce_scatter_tensor(out, data((5 * n,), dt, 3), op=op, group=g)
                return out

            both(rst, f"reduce_scatter_tensor {dt} {op}")
            checked += 4

        # AVG: Gloo has none; SUM / n is the answer (floats only, as ints
        # would round).
        if dt.is_floating_point:
            x = data((9,), dt, 4)
            t = x.clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=OX)
            s = x.clone()
            dist.all_reduce(s, group=GLOO)
            same(t, (s.double() / n).to(dt), f"all_reduce AVG {dt}")
            checked += 1

    # bool: sum is any, product is all
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        x = data((8,), torch.bool, 5)
        t = x.clone()
        dist.all_reduce(t, op=op, group=OX)
        ints = x.to(torch.int32)
        dist.all_reduce(ints, op=dist.ReduceOp.SUM, group=GLOO)
        want = ints > 0 if op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX) else ints == n
        same(t, want, f"all_reduce bool {op}")
        checked += 1

    for dt in MOVABLE:
        gloo_ok = dt not in GLOO_LACKS

        def bc(g, dt=dt):
            t = data((6, 2), dt, 6)
            dist.broadcast(t, src=1 % n, group=g)
            return t

        def ag(g, dt=dt):
            out = [torch.empty((3,), dtype=dt) for _ in range(n)]
            dist.all_gather(out, data((3,), dt, 7), group=g)
            return out

        def agt(g, dt=dt):
            out = torch.empty((n * 4,), dtype=dt)
            dist.all_gather_into_tensor(out, data((4,), dt, 8), group=g)
            return out

        def a2a(g, dt=dt):
            out = [torch.empty((2,), dtype=dt) for r in range(n)]
            dist.all_to_all(out, [data((2,), dt, 20 + r) for r in range(n)], group=g)
            return out

        def a2as(g, dt=dt):
            out = torch.empty((n * 2, 3), dtype=dt)
            dist.all_to_all_single(out, data((n * 2, 3), dt, 9), group=g)
            return out

        def a2av(g, dt=dt):
            # uneven: rank r sends r+1+k rows to rank k
            ins = [RANK + 1 + k for k in range(n)]
            outs = [r + 1 + RANK for r in range(n)]
            out = torch.empty((sum(outs), 2), dtype=dt)
            dist.all_to_all_single(out, data((sum(ins), 2), dt, 11), outs, ins, group=g)
            return out

        for fn, what in ((bc, "broadcast"), (ag, "all_gather"), (agt, "all_gather_into_tensor"),
                         (a2a, "all_to_all"), (a2as, "all_to_all_single"),
                         (a2av, "all_to_all_single uneven")):
            if gloo_ok:
                both(fn, f"{what} {dt}")
            else:  # Gloo lacks the type: compared on a wider one, by value
                ref = GLOO_LACKS[dt]
                got = [x.to(ref) for x in _list(fn(OX))]
                same(got, _list(fn(GLOO, dt=ref)), f"{what} {dt}")
            checked += 1

    # non-contiguous tensors, in and out
    base = data((6, 4), torch.float32, 12)
    def nc_ar(g):
        t = base.clone().t()  # transposed view: not contiguous
        dist.all_reduce(t, group=g)
        return t
    both(nc_ar, "all_reduce non-contiguous")
    def nc_ag(g):
        out = torch.zeros((4, n * 3))
        parts = [out[:, 3 * r:3 * r + 3] for r in range(n)]  # strided views
        dist.all_gather(parts, data((4, 3), torch.float32, 13), group=g)
        return out
    both(nc_ag, "all_gather into strided views")
    def nc_bc(g):
        t = torch.zeros((4, 6))[:, ::2]
        if RANK == 0:
            t.copy_(data((4, 3), torch.float32, 14))
        dist.broadcast(t, src=0, group=g)
        return t
    # (Gloo itself gets this one wrong in torch 2.15: a non-root's strided
    # view gets only its first rows; the reference is a contiguous
    # broadcast on Gloo.)
    def c_bc(g):
        t = data((4, 3), torch.float32, 14) if RANK == 0 else torch.zeros((4, 3))
        dist.broadcast(t, src=0, group=g)
        return t
    same(nc_bc(OX), c_bc(GLOO), "broadcast non-contiguous")
    checked += 3

    # point to point, blocking and not, and batched
    def p2p(g):
        right, left = (RANK + 1) % n, (RANK - 1) % n
        a = torch.full((5,), float(RANK))
        b = torch.empty(5)
        if RANK % 2 == 0:
            dist.send(a, right, group=g)
            dist.recv(b, left, group=g)
        else:
            dist.recv(b, left, group=g)
            dist.send(a, right, group=g)
        c = torch.empty(5)
        reqs = [dist.isend(a * 2, right, group=g), dist.irecv(c, left, group=g)]
        for r in reqs:
            r.wait()
        d = torch.empty(3)
        ops = [dist.P2POp(dist.isend, torch.full((3,), RANK * 3.0), right, group=g),
               dist.P2POp(dist.irecv, d, left, group=g)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        return [b, c, d]
    both(p2p, "send/recv, isend/irecv, batch_isend_irecv")
    checked += 1

    # gather / scatter
    def gat(g):
        outs = [torch.empty(2) for _ in range(n)] if RANK == 0 else None
        dist.gather(torch.full((2,), RANK + 0.5), outs, dst=0, group=g)
        return outs if RANK == 0 else []
    def sca(g):
        out = torch.empty(2)
        ins = [torch.full((2,), r * 2.0) for r in range(n)] if RANK == 0 else None
        dist.scatter(out, ins, src=0, group=g)
        return out
    both(gat, "gather")
    both(sca, "scatter")
    checked += 2

    # async works and their futures
    t = torch.ones(1000)
    w = dist.all_reduce(t, async_op=True, group=OX)
    fut = w.get_future()
    assert w.wait() is True
    same(fut.wait()[0], torch.full((1000,), float(n)), "async all_reduce future")
    t2 = torch.ones(10)
    fut2 = dist.all_reduce(t2, async_op=True, group=OX).get_future()
    same(fut2.wait()[0], torch.full((10,), float(n)), "future before wait")
    assert dist.all_reduce(torch.ones(1), async_op=True, group=OX).wait(timedelta(seconds=30))
    checked += 3

    # barrier, monitored barrier, a second group, split_group
    dist.barrier(group=OX)
    dist.monitored_barrier(group=OX, timeout=timedelta(seconds=30))
    t = torch.ones(3)
    dist.all_reduce(t, group=odd)
    same(t, torch.full((3,), float(n)), "a second oxccl group")
    halves = [list(range(0, n, 2)), list(range(1, n, 2))] if n > 1 else [[0]]
    # every rank creates every group, in the same order (torch's rule)
    subs = [dist.new_group(h, backend="oxccl") for h in halves]
    sub = subs[RANK % 2]
    sp = dist.split_group(OX, split_ranks=halves)
    for g in (sub, sp):
        if g is None:
            continue
        t = torch.full((2,), float(RANK))
        dist.all_reduce(t, group=g)
        same(t, torch.full((2,), float(sum(halves[RANK % 2]))), "sub-group all_reduce")
        checked += 1

    # wrong arguments: typed errors, nothing lost
    bad = 0
    for call in (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16), group=OX),
                 lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND, group=OX),
                 lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2), group=OX)):
        try:
            call()
        except ValueError:
            bad += 1
        except Exception as e:
            raise AssertionError(f"a bad call raised {type(e).__name__}: {e}") from e
    assert bad == 3, f"{bad} of 3 bad calls raised ValueError"
    t = torch.ones(4)
    dist.all_reduce(t, group=OX)  # still works after the bad calls
    same(t, torch.full((4,), float(n)), "all_reduce after bad calls")
    backend = type(OX._get_backend(torch.device("cpu"))).__name__
    dist.destroy_process_group()
    result(checked=checked, backend=backend)


def _list(x):
    return x if isinstance(x, list) else [x]


# -- training: DDP and FSDP2, losses per step ---------------------------------

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
        torch.nn.ReLU(), torch.nn.Linear(64, 4),
    )


def batches(steps):
    g = torch.Generator().manual_seed(1000 + RANK)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]


def train(wrap, steps=8):
    net = wrap(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses = []
    for x, y in batches(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / WORLD)
    return losses


def reference_exit(backend):
    """End a Gloo reference run at once, its RESULT printed: PyTorch's
    Gloo teardown at interpreter exit aborts now and then ("terminate
    called without an active exception", a rank of a 4-rank DDP job in
    CI, after destroy_process_group; pytorch/pytorch#190489 reports the
    same abort when it is not called), which is not what these tests
    check.
    oxccl runs exit normally, so their teardown stays tested."""
    if backend == "gloo":
        sys.stderr.flush()
        os._exit(0)


def scenario_ddp(backend):
    init(backend)
    from torch.nn.parallel import DistributedDataParallel as DDP
    losses = train(lambda m: DDP(m))
    dist.destroy_process_group()
    result(losses=losses)
    reference_exit(backend)


def scenario_fsdp(backend):
    init(backend)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        result(skipped=f"no fully_shard: {e}")
        return
    from torch.distributed.device_mesh import init_device_mesh

    def wrap(m):
        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m

    losses = train(wrap)
    dist.destroy_process_group()
    result(losses=losses)
    reference_exit(backend)


# -- failures -------------------------------------------------------------------

def scenario_kill(victim, mode="blocking"):
    """Every rank all-reduces in a loop; `victim` SIGKILLs itself after 20
    calls. The survivors must raise naming it, within seconds. `mode`:
    `blocking` calls, or `async` ones waited for through their futures
    (DDP's way)."""
    victim = int(victim)
    init("oxccl", timeout=120.0)
    t = torch.ones(1 << 12)
    i = 0
    try:
        while True:
            if RANK == victim and i == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            if i == 20:
                t0 = time.monotonic()
            if mode == "async":
                dist.all_reduce(t, async_op=True).get_future().wait()
            else:
                dist.all_reduce(t)
            i += 1
            if i > 20 and time.monotonic() - t0 > 60:
                result(raised=False)
                return
    except Exception as e:
        # Through a future the error is torch's RuntimeError carrying
        # oxccl's message (torch's futures keep no exception type).
        result(raised=True, type=type(e).__name__, kind=getattr(e, "kind", None),
               rank=getattr(e, "rank", None), seconds=time.monotonic() - t0, message=str(e))


def scenario_wait_timeout():
    """Rank 1 arrives 5 s late; rank 0's `Work.wait(timeout=1 s)` raises
    after about 1 s and aborts, and rank 1's call then fails naming rank 0
    as the one that aborted."""
    init("oxccl", timeout=60.0)
    dist.all_reduce(torch.ones(4))
    t0 = time.monotonic()
    try:
        if RANK == 1:
            time.sleep(5)
            dist.all_reduce(torch.ones(4))
        else:
            dist.all_reduce(torch.ones(4), async_op=True).wait(timedelta(seconds=1))
        result(raised=False)
    except oxccl.OxcclError as e:
        result(raised=True, kind=e.kind, rank=e.rank, seconds=time.monotonic() - t0,
               message=str(e))


def scenario_exit_while_settling():
    """Rank 0 leaves while a callback of its future still runs on the
    backend's completer thread (a survivor that raised and exited at once
    is in the same place): the process must exit cleanly. Rank 1 calls
    late, so that the callback is in place before the future settles."""
    init("oxccl", timeout=60.0)
    if RANK == 1:
        time.sleep(0.5)
        dist.all_reduce(torch.ones(4))
        result(done=True)
        return
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future()

    def slow(f):
        # Takes the interpreter lock back a thousand times: one of them
        # falls in the exit, if the exit does not wait for it.
        for _ in range(1000):
            time.sleep(0.001)

    fut.then(slow)
    fut.wait()
    result(done=True)


def scenario_mismatch():
    """Rank 1 all-gathers where the others all-reduce (the same bytes)."""
    init("oxccl", timeout=60.0)
    dist.all_reduce(torch.ones(4))
    try:
        if RANK == 1:
            dist.all_gather_into_tensor(torch.empty(4 * WORLD), torch.ones(4))
        else:
            dist.all_reduce(torch.ones(4))
        result(raised=False)
    except oxccl.OxcclError as e:
        result(raised=True, kind=e.kind, rank=e.rank, message=str(e))


def scenario_late():
    """Rank WORLD-1 never arrives at the second call: the others raise at
    the process group's timeout (3 s), naming it."""
    init("oxccl", timeout=3.0)
    dist.all_reduce(torch.ones(4))
    t0 = time.monotonic()
    if RANK == WORLD - 1:
        time.sleep(8)
        result(raised=None)
        os._exit(0)
    try:
        dist.all_reduce(torch.ones(4))
        result(raised=False)
    except oxccl.OxcclError as e:
        result(raised=True, kind=e.kind, rank=e.rank, seconds=time.monotonic() - t0,
               message=str(e))
    os._exit(0)


if __name__ == "__main__":
    import faulthandler

    # A rank that hangs shows where, then exits (the test fails, not stalls).
    faulthandler.dump_traceback_later(float(os.environ.get("WORKER_HANG_S", "200")), exit=True)
    name, *args = sys.argv[1:]
    globals()["scenario_" + name](*args)
