"""Launching test jobs: N ranks of worker.py as separate processes."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, *args, timeout=240, env=None):
    """Run `worker.py ARGS` as ranks 0..world-1; each rank's (exit code,
    RESULT dict or None, stderr)."""
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env or {}))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank of `worker.py {' '.join(map(str, args))}` still running after {timeout} s")
        res = [json.loads(l[7:]) for l in so.splitlines() if l.startswith("RESULT ")]
        out.append((p.returncode, res[0] if res else None, se))
    return out


def ok(ranks):
    """The RESULTs of a job whose ranks all exited 0."""
    for r, (code, res, err) in enumerate(ranks):
        assert code == 0 and res is not None, f"rank {r} exited {code}:\n{err[-4000:]}"
    return [res for _, res, _ in ranks]
