"""NCCL's figures on this machine, for oxccl's device runs to be read
beside: torch.distributed all_reduce / all_gather / reduce_scatter /
broadcast of float32 on device memory, 8 B to 1 GiB, with 2 ranks sharing
GPU 0 (oxccl's layout on a one-GPU machine) and, if NCCL refuses that, 1
rank per GPU as far as the machine has GPUs. Prints nccl-tests-style lines
(size, time in us, algbw, busbw in GB/s) per collective and rank count;
a refusal is printed, not hidden."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [8 << k for k in range(0, 28, 2)]  # 8 B .. 512 MiB, x4
SIZES.append(1 << 30)


def busbw(coll, n, algbw):
    if coll == "all_reduce":
        return algbw * 2 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter"):
        return algbw * (n - 1) / n
    return algbw


def rank_main(rank, n, gpus, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # NCCL says why when it refuses or stalls (several ranks on one GPU).
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    torch.cuda.set_device(rank % gpus)
    try:
        dist.init_process_group("nccl", rank=rank, world_size=n)
        lines = []
        for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]:
            for size in SIZES:
                elems = max(size // 4, n)
                elems -= elems % n
                x = torch.ones(elems, device="cuda")
                out = torch.empty(elems, device="cuda")
                if coll == "all_reduce":
                    f = lambda: dist.all_reduce(x)
                elif coll == "all_gather":
                    part = x[: elems // n]
                    f = lambda: dist.all_gather_into_tensor(out, part)
                elif coll == "reduce_scatter":
                    part = out[: elems // n]
                    f = lambda: dist.reduce_scatter_tensor(part, x)
                else:
                    f = lambda: dist.broadcast(x, 0)
                iters = 20 if size >= 64 << 20 else 200 if size >= 1 << 20 else 2000
                for _ in range(5):
                    f()
                torch.cuda.synchronize()
                dist.barrier()
                t = time.perf_counter()
                for _ in range(iters):
                    f()
                torch.cuda.synchronize()
                us = (time.perf_counter() - t) / iters * 1e6
                alg = elems * 4 / us / 1e3
                lines.append(f"{coll} n={n} {elems * 4:>11} B {us:10.2f} us algbw {alg:8.2f} busbw {busbw(coll, n, alg):8.2f} GB/s")
        dist.destroy_process_group()
        if rank == 0:
            q.put("\n".join(lines))
    except Exception as e:  # NCCL refusing two ranks on one GPU, typically
        if rank == 0:
            q.put(f"n={n} on {gpus} GPU(s): refused: {type(e).__name__}: {e}")


def main():
    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {gpus} GPU(s): {torch.cuda.get_device_name(0)}")
    ctx = mp.get_context("spawn")
    ranks = [int(a) for a in sys.argv[1:]] or [2, 4]
    for n in ranks:
        q = ctx.Queue()
        port = 29500 + n
        procs = [ctx.Process(target=rank_main, args=(r, n, gpus, port, q)) for r in range(n)]
        for p in procs:
            p.start()
        try:
            print(q.get(timeout=30), flush=True)
        except Exception:
            print(f"n={n}: no result within 30 s", flush=True)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
