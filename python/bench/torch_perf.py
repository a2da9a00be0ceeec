"""torch.distributed on Gloo and on oxccl, measured in one run.

    python python/bench/torch_perf.py --np 2 [--ops all_reduce,all_gather,broadcast]
        [-b 8] [-e 256M] [-f 8 | --sizes 8,1K,1M,256M] [--rounds 3] [--target-s 0.25]

Starts `--np` ranks on this host (or runs as one rank under torchrun when
RANK is set). Every rank makes a Gloo group and an oxccl group; for each
operation and size the two are timed alternately, `--rounds` times, each
time for enough iterations to fill `--target-s` (at least 5, at most
20 000), after a warm-up of the same length. The columns follow nccl-tests:
time is the median over rounds of the slowest rank's mean per call, algbw
is bytes / time, busbw scales algbw as nccl-tests does; #wrong counts
elements of a checked call that differ from the expected result. The last
column is Gloo's time over oxccl's.

all_gather is `all_gather_into_tensor` (one output tensor, as nccl-tests'
all_gather) and sizes are per rank's output for all_gather, as in
nccl-tests.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import oxccl  # noqa: F401  (registers the backend)

MAX_ITERS = 20_000


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def human(n):
    return f"{n:>12}"


class Op:
    """One operation at one size, on one group: `run()` is a call."""

    def __init__(self, name, nbytes, n, rank, group):
        self.name, self.n, self.rank, self.group = name, n, rank, group
        count = max(1, nbytes // 4)
        self.count = count
        if name == "all_reduce":
            self.buf = torch.full((count,), float(rank + 1))
            self.run = lambda: dist.all_reduce(self.buf, group=group)
            self.factor = 2 * (n - 1) / n
        elif name == "all_gather":
            per = max(1, count // n)
            self.count = per * n
            self.inp = torch.full((per,), float(rank))
            self.buf = torch.empty(per * n)
            self.run = lambda: dist.all_gather_into_tensor(self.buf, self.inp, group=group)
            self.factor = (n - 1) / n
        elif name == "broadcast":
            self.buf = torch.full((count,), float(rank))
            self.run = lambda: dist.broadcast(self.buf, src=0, group=group)
            self.factor = 1.0
        else:
            raise SystemExit(f"unknown operation {name}")

    def wrong(self):
        """Elements of one fresh call that differ from the expected result."""
        n, r = self.n, self.rank
        if self.name == "all_reduce":
            self.buf.fill_(float(r + 1))
            self.run()
            want = torch.full_like(self.buf, n * (n + 1) / 2)
        elif self.name == "all_gather":
            self.buf.fill_(-1.0)
            self.run()
            want = torch.arange(n, dtype=torch.float32).repeat_interleave(self.buf.numel() // n)
        else:
            self.buf.fill_(float(r))
            self.run()
            want = torch.zeros_like(self.buf)
        return int((self.buf != want).sum())


def timed(op, iters, sync):
    dist.barrier(group=sync)
    t0 = time.perf_counter()
    for _ in range(iters):
        op.run()
    dt = (time.perf_counter() - t0) / iters
    t = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sync)
    return t.item()


def iterations(op, target, sync):
    """Iterations that fill `target` seconds (agreed by all ranks)."""
    est = timed(op, 3, sync)
    if est < 1e-3:  # the first calls are cold: estimate again on more
        est = timed(op, 200, sync)
    n = torch.tensor([min(MAX_ITERS, max(5, int(target / max(est, 1e-9))))])
    dist.broadcast(n, src=0, group=sync)
    return int(n.item())


def rank_main(args):
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "oxccl": dist.new_group(backend="oxccl")}
    sync = dist.new_group(backend="gloo")  # timing bookkeeping, off the measured groups
    sizes, s = [], args.b
    while s <= args.e:
        sizes.append(s)
        s *= args.f
    if args.sizes:
        sizes = [parse_size(x) for x in args.sizes.split(",")]
    if rank == 0:
        print(f"# torch {torch.__version__}, {n} ranks, {args.rounds} alternating rounds, "
              f"{args.target_s} s per measurement")
    for name in args.ops.split(","):
        if rank == 0:
            print(f"#\n# {name}  (float32; time in us, bandwidth in GB/s)")
            print(f"# {'size':>10} {'count':>11} {'type':>6} {'redop':>5} {'root':>4} | "
                  f"{'gloo time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} | "
                  f"{'oxccl time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} | {'x gloo':>7}")
        for size in sizes:
            ops = {b: Op(name, size, n, rank, g) for b, g in groups.items()}
            iters = {b: iterations(o, args.target_s, sync) for b, o in ops.items()}
            for b, o in ops.items():  # warm-up
                timed(o, iters[b], sync)
            times = {b: [] for b in ops}
            for _ in range(args.rounds):
                for b, o in ops.items():
                    times[b].append(timed(o, iters[b], sync))
            cols = []
            for b, o in ops.items():
                t = statistics.median(times[b])
                nbytes = o.count * 4
                algbw = nbytes / t / 1e9
                wrong = torch.tensor([o.wrong()])
                dist.all_reduce(wrong, group=sync)
                cols.append(f"{t * 1e6:>10.2f} {algbw:>7.3f} {algbw * o.factor:>7.3f} "
                            f"{int(wrong.item()):>6}")
            speed = statistics.median(times["gloo"]) / statistics.median(times["oxccl"])
            if rank == 0:
                o = ops["oxccl"]
                redop = "sum" if name == "all_reduce" else "none"
                root = "0" if name == "broadcast" else "-1"
                print(f"  {o.count * 4:>10} {o.count:>11} {'float':>6} {redop:>5} {root:>4} | "
                      f"{cols[0]} | {cols[1]} | {speed:>7.1f}", flush=True)
            del ops
    dist.destroy_process_group()


def launch(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.np), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, *sys.argv], env=env))
    return max(abs(p.wait()) for p in procs)


def run(args, rank_main):
    """`rank_main(args)` as one rank under a launcher (RANK set), else
    start `args.np` ranks of the running script and exit with the worst
    status."""
    if "RANK" in os.environ:
        rank_main(args)
    else:
        sys.exit(launch(args))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2, help="ranks to start (without torchrun)")
    p.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    p.add_argument("-b", type=parse_size, default=8, help="smallest size in bytes (8, 1K, 4M)")
    p.add_argument("-e", type=parse_size, default=256 << 20, help="largest size in bytes")
    p.add_argument("-f", type=int, default=8, help="size factor between rows")
    p.add_argument("--sizes", default="", help="explicit sizes instead of -b/-e/-f (8,1K,1M)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target-s", type=float, default=0.25)
    run(p.parse_args(), rank_main)


if __name__ == "__main__":
    main()
