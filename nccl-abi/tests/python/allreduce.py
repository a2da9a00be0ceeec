"""ctypes smoke test: load libnccl.so.2 (oxccl's, by LD_LIBRARY_PATH) and run
an all_reduce on host memory, as a Python program with no binding would.
Rank and size from the launcher (RANK, WORLD_SIZE); the unique id goes
through the file sys.argv[1]. Exit status 0 when the result is exact."""
import ctypes
import os
import sys
import time

nccl = ctypes.CDLL("libnccl.so.2")
nccl.ncclGetErrorString.restype = ctypes.c_char_p
nccl.ncclGetLastError.restype = ctypes.c_char_p


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what}: {nccl.ncclGetErrorString(rc).decode()} "
                 f"({nccl.ncclGetLastError(None).decode()})")


rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
path = sys.argv[1]
uid = UniqueId()
if rank == 0:
    check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    with open(path + ".tmp", "wb") as f:
        f.write(bytes(uid))
    os.rename(path + ".tmp", path)
else:
    for _ in range(6000):
        if os.path.exists(path):
            break
        time.sleep(0.01)
    with open(path, "rb") as f:
        ctypes.memmove(ctypes.byref(uid), f.read(128), 128)

comm = ctypes.c_void_p()
check(nccl.ncclCommInitRank(ctypes.byref(comm), n, uid, rank), "ncclCommInitRank")
count = 1000
send = (ctypes.c_float * count)(*[rank + i for i in range(count)])
recv = (ctypes.c_float * count)()
NCCL_FLOAT, NCCL_SUM = 7, 0
check(nccl.ncclAllReduce(send, recv, ctypes.c_size_t(count), NCCL_FLOAT, NCCL_SUM, comm, None),
      "ncclAllReduce")
want = [sum(k + i for k in range(n)) for i in range(count)]
if list(recv) != want:
    sys.exit(f"rank {rank}: all_reduce gave {list(recv)[:4]}..., want {want[:4]}...")
check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
print(f"python ctypes all_reduce OK: rank {rank} of {n}")
