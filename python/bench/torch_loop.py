"""A tight loop of 8-byte calls on an oxccl group, per rank: what torch's
dispatch and the sharing of cores cost, apart from any comparison.

    python python/bench/torch_loop.py --np 2 [--op all_reduce|broadcast|raw|raw+torch]
        [--calls 10000] [--rounds 5]
    taskset -c 0 python python/bench/torch_loop.py --np 2   # two ranks on one core

Starts `--np` ranks on this host (or runs as one rank under torchrun when
RANK is set), makes an oxccl group and times `--rounds` rounds of
`--calls` calls after a warm-up, printing rank 0's microseconds per call
for each round. `--op raw` calls the Rust extension directly
(`Comm.collective`, no torch dispatch); `raw+torch` adds four small
`torch.add` calls to each (torch's own code between two calls, without
`torch.distributed`).
"""

import argparse
import time

import torch
import torch.distributed as dist

import oxccl  # noqa: F401  (registers the backend)
from torch_perf import run  # the same rank launcher (this directory)

_F32 = 7  # the extension's code for float32
_SUM = 0


def rank_main(args):
    dist.init_process_group("gloo")
    g = dist.new_group(backend="oxccl")
    t = torch.ones(2)
    comm = g._get_backend(torch.device("cpu")).comm
    span = (t.data_ptr(), t.nbytes)
    u, v = torch.ones(2), torch.ones(2)

    def raw():
        comm.collective("all_reduce", None, span, _F32, _SUM, 0, True)

    def raw_torch():
        for _ in range(4):
            torch.add(u, 1, out=v)
        raw()

    call = {
        "all_reduce": lambda: dist.all_reduce(t, group=g),
        "broadcast": lambda: dist.broadcast(t, src=0, group=g),
        "raw": raw,
        "raw+torch": raw_torch,
    }[args.op]
    for _ in range(args.calls // 5):
        call()
    per_call = []
    for _ in range(args.rounds):
        dist.barrier(group=g)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        per_call.append((time.perf_counter() - t0) / args.calls * 1e6)
    if dist.get_rank() == 0:
        print(f"{args.op}, {dist.get_world_size()} ranks, us per call:",
              " ".join(f"{x:.1f}" for x in per_call), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2, help="ranks to start (without torchrun)")
    p.add_argument("--op", default="all_reduce", choices=["all_reduce", "broadcast", "raw", "raw+torch"])
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    run(p.parse_args(), rank_main)


if __name__ == "__main__":
    main()
