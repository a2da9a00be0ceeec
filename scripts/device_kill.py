#!/usr/bin/env python3
"""SIGKILL of a rank mid-collective on device memory (scripts/gpu-check).

Starts N ranks of `oxccl-selftest cuda-loop BYTES` (device all_reduce in a
loop, every rank on the one GPU), rank 0 hosting the root (OXCCL_ROOT), kills
rank VICTIM once every rank is running, and checks that every survivor fails
with an error blaming the victim, none hanging. Prints each survivor's time
from the kill to its error. Exit 0 when every survivor named the victim.

  device_kill.py SELFTEST [N] [VICTIM] [BYTES] [MODE]

MODE is `cuda-loop` (default); `loop` runs the same check on host memory
(how the script itself is tested on a machine without a GPU).
"""
import os
import signal
import socket
import subprocess
import sys
import time

exe = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
victim = int(sys.argv[3]) if len(sys.argv) > 3 else 2
size = sys.argv[4] if len(sys.argv) > 4 else "16M"
mode = sys.argv[5] if len(sys.argv) > 5 else "cuda-loop"

s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()

procs = []
for r in range(n):
    env = dict(os.environ, OXCCL_RANK=str(r), OXCCL_WORLD_SIZE=str(n),
               OXCCL_LOCAL_RANK=str(r), OXCCL_ROOT=f"127.0.0.1:{port}",
               OXCCL_SECRET=f"device-kill-{port}", OXCCL_TIMEOUT="30")
    procs.append(subprocess.Popen([exe, mode, size], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, bufsize=1))

running = set()
deadline = time.time() + 120
lines = {r: [] for r in range(n)}
for p in procs:
    os.set_blocking(p.stdout.fileno(), False)


def drain():
    for r, p in enumerate(procs):
        while True:
            try:
                ln = p.stdout.readline()
            except (BlockingIOError, ValueError):
                break
            if not ln:
                break
            lines[r].append(ln.rstrip())
            if ln.startswith("RUNNING"):
                running.add(r)


while len(running) < n and time.time() < deadline:
    drain()
    if any(p.poll() is not None for p in procs):
        break
    time.sleep(0.01)
if len(running) < n:
    print(f"FAIL: only ranks {sorted(running)} started running")
    for r in range(n):
        print(f"rank {r}:", *lines[r][-5:], sep="\n  ")
    for p in procs:
        p.kill()
    sys.exit(1)

time.sleep(0.5)  # mid-loop
kill_ms = time.time() * 1000
procs[victim].send_signal(signal.SIGKILL)
ok = True
for r, p in enumerate(procs):
    if r == victim:
        continue
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        print(f"FAIL: rank {r} hangs 60 s after the kill")
        p.kill()
        ok = False
drain()
for r in range(n):
    if r == victim:
        continue
    err = [ln for ln in lines[r] if ln.startswith("ERROR")]
    detail = [ln for ln in lines[r] if ln.startswith("DETAIL")]
    if not err:
        print(f"FAIL: rank {r} ended without an error line:", *lines[r][-5:], sep="\n  ")
        ok = False
        continue
    _, _, t, blamed = err[0].split()
    took = float(t) - kill_ms
    named = int(blamed) == victim
    ok &= named
    print(f"rank {r}: {'names' if named else 'DOES NOT NAME'} rank {victim} after {took:.0f} ms; {detail[0] if detail else ''}")
print("OK: every survivor named the victim" if ok else "FAIL")
sys.exit(0 if ok else 1)
