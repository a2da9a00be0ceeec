/* A C program written against NVIDIA's nccl.h, as users write them: every
 * collective on host memory (oxccl's extension: a NULL stream, complete on
 * return), in and out of place, every element checked exactly, then bad
 * calls and their codes. Rank and size come from the launcher (RANK,
 * WORLD_SIZE); rank 0 makes the unique id and hands it to the others
 * through the file argv[1] (where an MPI program would broadcast it).
 * Exit status 0 when everything held.
 *
 * With argv[2] = "die": after one all_reduce the last rank SIGKILLs itself;
 * every other rank must see ncclRemoteError from its next (grouped) calls and from
 * ncclCommGetAsyncError, with the dead rank named in ncclGetLastError, then
 * shrink it away (ncclCommShrink, NCCL_SHRINK_ABORT) and all_reduce again. */
#include "harness.h"
#include <signal.h>
#include <string.h>

/* A non-blocking creation: its result, then polled until it is made. */
static void made(ncclResult_t r, ncclComm_t comm, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress) {
    fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, what, ncclGetErrorString(r), ncclGetLastError(NULL));
    exit(2);
  }
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) usleep(1000);
  }
  if (state != ncclSuccess) {
    fprintf(stderr, "rank %d: %s ended in %d: %s\n", rank, what, state, ncclGetLastError(comm));
    exit(2);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s ID_FILE\n", argv[0]); return 2; }
  place();
  int version = 0;
  CHECK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);

  ncclUniqueId id;
  share_id(argv[1], &id);
  ncclComm_t comm;
  int die = argc > 2 && strcmp(argv[2], "die") == 0;
  if (die) {
    CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  } else {
    /* Non-blocking creation: ncclInProgress (or done already), polled. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "c-suite";
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    EXPECT(r == ncclInProgress || r == ncclSuccess, "non-blocking init returned %d", r);
    ncclResult_t state = ncclInProgress;
    int x = 0;
    CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress)
      EXPECT(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL) == ncclInvalidArgument,
             "a call on a communicator still being created");
    while (state == ncclInProgress) {
      usleep(1000);
      CHECK(ncclCommGetAsyncError(comm, &state));
    }
    EXPECT(state == ncclSuccess, "non-blocking init ended in %d: %s", state, ncclGetLastError(comm));
  }
  if (die) {
    int32_t x = 1, y = 0;
    CHECK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
    if (rank == nranks - 1) raise(SIGKILL);
    ncclResult_t r = ncclSuccess;
    /* In a group: its failure must reach ncclCommGetAsyncError by the time
     * ncclGroupEnd returns, as a plain call's does. */
    for (int i = 0; i < 1000000 && r == ncclSuccess; i++) {
      CHECK(ncclGroupStart());
      CHECK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
      r = ncclGroupEnd();
    }
    const char *why = ncclGetLastError(comm);
    char dead[32];
    snprintf(dead, sizeof dead, "rank %d", nranks - 1);
    int named = strstr(why, dead) != NULL;
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(comm, &async));
    printf("SURVIVOR %d call %d async %d named %d: %s\n", rank, r, async, named, why);
    /* Recover: the survivors shrink the dead rank away and go on. */
    int gone = nranks - 1, sum = 0;
    ncclComm_t small;
    CHECK(ncclCommShrink(comm, &gone, 1, &small, NULL, NCCL_SHRINK_ABORT));
    CHECK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, small, NULL));
    printf("SHRUNK %d sum %d\n", rank, sum);
    CHECK(ncclCommDestroy(small));
    CHECK(ncclCommAbort(comm));
    return r == ncclRemoteError && async == ncclRemoteError && named && sum == nranks - 1 ? 0 : 1;
  }

  int n = -1, me = -1;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &me));
  EXPECT(n == nranks && me == rank, "count %d rank %d", n, me);

  const size_t c = 1031; /* not a multiple of any rank count */
  int32_t *in = malloc(nranks * c * sizeof(int32_t));
  int32_t *out = malloc((nranks < 2 ? 2 : nranks) * c * sizeof(int32_t)); /* the group uses 2c */
  double *din = malloc(c * sizeof(double)), *dout = malloc(c * sizeof(double));

  /* all_reduce: int32 sum out of place, double max in place */
  for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank * 100000 + i);
  CHECK(ncclAllReduce(in, out, c, ncclInt32, ncclSum, comm, NULL));
  for (size_t i = 0; i < c; i++) {
    int32_t want = 0;
    for (int k = 0; k < nranks; k++) want += (int32_t)(k * 100000 + i);
    EXPECT(out[i] == want, "all_reduce[%zu] = %d, want %d", i, out[i], want);
  }
  for (size_t i = 0; i < c; i++) din[i] = rank + i * 0.5;
  CHECK(ncclAllReduce(din, din, c, ncclFloat64, ncclMax, comm, NULL));
  for (size_t i = 0; i < c; i++)
    EXPECT(din[i] == (nranks - 1) + i * 0.5, "all_reduce max in place[%zu] = %g", i, din[i]);

  /* broadcast from the last rank; bcast in place from rank 0 */
  int root = nranks - 1;
  for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank * 7 + i);
  CHECK(ncclBroadcast(in, out, c, ncclInt32, root, comm, NULL));
  for (size_t i = 0; i < c; i++) EXPECT(out[i] == (int32_t)(root * 7 + i), "broadcast[%zu] = %d", i, out[i]);
  for (size_t i = 0; i < c; i++) din[i] = rank == 0 ? i * 2.0 : -1.0;
  CHECK(ncclBcast(din, c, ncclDouble, 0, comm, NULL));
  for (size_t i = 0; i < c; i++) EXPECT(din[i] == i * 2.0, "bcast[%zu] = %g", i, din[i]);

  /* reduce to the last rank (recvbuff NULL elsewhere) */
  for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank + i);
  CHECK(ncclReduce(in, rank == root ? out : NULL, c, ncclInt32, ncclSum, root, comm, NULL));
  if (rank == root)
    for (size_t i = 0; i < c; i++) {
      int32_t want = 0;
      for (int k = 0; k < nranks; k++) want += (int32_t)(k + i);
      EXPECT(out[i] == want, "reduce[%zu] = %d, want %d", i, out[i], want);
    }

  /* all_gather out of place and in place */
  for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank * 100000 + i);
  CHECK(ncclAllGather(in, out, c, ncclInt32, comm, NULL));
  for (int k = 0; k < nranks; k++)
    for (size_t i = 0; i < c; i++)
      EXPECT(out[k * c + i] == (int32_t)(k * 100000 + i), "all_gather[%d][%zu] = %d", k, i, out[k * c + i]);
  memset(out, 0, nranks * c * sizeof(int32_t));
  memcpy(out + rank * c, in, c * sizeof(int32_t));
  CHECK(ncclAllGather(out + rank * c, out, c, ncclInt32, comm, NULL));
  for (int k = 0; k < nranks; k++)
    for (size_t i = 0; i < c; i++)
      EXPECT(out[k * c + i] == (int32_t)(k * 100000 + i), "all_gather in place[%d][%zu]", k, i);

  /* reduce_scatter out of place and in place */
  for (size_t i = 0; i < nranks * c; i++) in[i] = (int32_t)(rank + i);
  CHECK(ncclReduceScatter(in, out, c, ncclInt32, ncclSum, comm, NULL));
  for (size_t i = 0; i < c; i++) {
    int32_t want = 0;
    for (int k = 0; k < nranks; k++) want += (int32_t)(k + rank * c + i);
    EXPECT(out[i] == want, "reduce_scatter[%zu] = %d, want %d", i, out[i], want);
  }
  CHECK(ncclReduceScatter(in, in + rank * c, c, ncclInt32, ncclSum, comm, NULL));
  for (size_t i = 0; i < c; i++) EXPECT(in[rank * c + i] == out[i], "reduce_scatter in place[%zu]", i);

  /* all_to_all: block j of rank r is r * 100000 + j * c + i */
  for (size_t i = 0; i < nranks * c; i++) in[i] = (int32_t)(rank * 100000 + i);
  CHECK(ncclAlltoAll(in, out, c, ncclInt32, comm, NULL));
  for (int k = 0; k < nranks; k++)
    for (size_t i = 0; i < c; i++)
      EXPECT(out[k * c + i] == (int32_t)(k * 100000 + rank * c + i), "all_to_all[%d][%zu]", k, i);

  /* a group: a ring exchange of send/recv with a collective in the middle */
  {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank * 1000 + i);
    memset(out, 0, 2 * c * sizeof(int32_t));
    CHECK(ncclGroupStart());
    CHECK(ncclRecv(out, c, ncclInt32, prev, comm, NULL));
    CHECK(ncclAllReduce(in, out + c, c, ncclInt32, ncclMax, comm, NULL));
    CHECK(ncclSend(in, c, ncclInt32, next, comm, NULL));
    CHECK(ncclGroupEnd());
    for (size_t i = 0; i < c; i++) {
      EXPECT(out[i] == (int32_t)(prev * 1000 + i), "recv[%zu] = %d", i, out[i]);
      EXPECT(out[c + i] == (int32_t)((nranks - 1) * 1000 + i), "group all_reduce[%zu] = %d", i, out[c + i]);
    }
    EXPECT(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  }

  /* buffers from ncclMemAlloc */
  {
    float *a = NULL, *b = NULL;
    CHECK(ncclMemAlloc((void **)&a, c * sizeof(float)));
    CHECK(ncclMemAlloc((void **)&b, c * sizeof(float)));
    for (size_t i = 0; i < c; i++) a[i] = (float)(rank + 1);
    CHECK(ncclAllReduce(a, b, c, ncclFloat32, ncclSum, comm, NULL));
    for (size_t i = 0; i < c; i++)
      EXPECT(b[i] == (float)(nranks * (nranks + 1) / 2), "ncclMemAlloc'd all_reduce[%zu] = %g", i, b[i]);
    CHECK(ncclMemFree(a));
    CHECK(ncclMemFree(b));
  }

  /* gather to the last rank and scatter from rank 0, out of place and in place */
  {
    int groot = nranks - 1;
    for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank * 100000 + i);
    memset(out, 0, nranks * c * sizeof(int32_t));
    CHECK(ncclGather(in, out, c, ncclInt32, groot, comm, NULL));
    if (rank == groot)
      for (int k = 0; k < nranks; k++)
        for (size_t i = 0; i < c; i++)
          EXPECT(out[k * c + i] == (int32_t)(k * 100000 + i), "gather[%d][%zu] = %d", k, i, out[k * c + i]);
    memset(out, 0, nranks * c * sizeof(int32_t));
    int32_t *mine = rank == groot ? out + groot * c : in;
    if (rank == groot) memcpy(mine, in, c * sizeof(int32_t));
    CHECK(ncclGatherConfig(mine, out, c, ncclInt32, groot, comm, NULL, NULL));
    if (rank == groot)
      for (int k = 0; k < nranks; k++)
        for (size_t i = 0; i < c; i++)
          EXPECT(out[k * c + i] == (int32_t)(k * 100000 + i), "gather in place[%d][%zu]", k, i);

    for (size_t i = 0; i < nranks * c; i++) in[i] = rank == 0 ? (int32_t)(7 * i) : -1;
    CHECK(ncclScatter(in, out, c, ncclInt32, 0, comm, NULL));
    for (size_t i = 0; i < c; i++)
      EXPECT(out[i] == (int32_t)(7 * (rank * c + i)), "scatter[%zu] = %d", i, out[i]);
    int32_t *dst = rank == 0 ? in : out; /* in place at the root: recvbuff = sendbuff + 0 */
    CHECK(ncclScatterConfig(in, dst, c, ncclInt32, 0, comm, NULL, NULL));
    for (size_t i = 0; i < c; i++)
      EXPECT(dst[i] == (int32_t)(7 * (rank * c + i)), "scatter in place[%zu] = %d", i, dst[i]);
  }

  /* PreMulSum: a scalar read at creation, and one read at each call */
  {
    float *f = malloc(nranks * c * sizeof(float)), *g = malloc(nranks * c * sizeof(float));
    float half = 0.5f;
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, &half, ncclFloat32, ncclScalarHostImmediate, comm));
    half = 100.0f; /* read already: no effect */
    for (size_t i = 0; i < c; i++) f[i] = (float)(2 * (rank + 1) + i);
    CHECK(ncclAllReduce(f, g, c, ncclFloat32, op, comm, NULL));
    for (size_t i = 0; i < c; i++) {
      float want = 0;
      for (int k = 0; k < nranks; k++) want += (float)(k + 1) + 0.5f * (float)i;
      EXPECT(g[i] == want, "premulsum all_reduce[%zu] = %g, want %g", i, g[i], want);
      EXPECT(f[i] == (float)(2 * (rank + 1) + i), "premulsum changed its send buffer");
    }
    EXPECT(ncclAllReduce(din, dout, c, ncclFloat64, op, comm, NULL) == ncclInvalidArgument,
           "an operator used with another type");
    CHECK(ncclRedOpDestroy(op, comm));
    EXPECT(ncclAllReduce(f, g, c, ncclFloat32, op, comm, NULL) == ncclInvalidArgument, "a destroyed operator");

    double scale = 3.0;
    ncclRedOp_t dop;
    CHECK(ncclRedOpCreatePreMulSum(&dop, &scale, ncclFloat64, ncclScalarDevice, comm));
    for (int round = 0; round < 2; round++) {
      scale = round == 0 ? 3.0 : -2.0; /* read when the call runs */
      for (size_t i = 0; i < nranks * c; i++) din[i % c] = (double)(rank + i % c);
      CHECK(ncclAllReduce(din, din, c, ncclFloat64, dop, comm, NULL)); /* in place */
      for (size_t i = 0; i < c; i++) {
        double want = 0;
        for (int k = 0; k < nranks; k++) want += scale * (double)(k + i);
        EXPECT(din[i] == want, "premulsum in place round %d [%zu] = %g, want %g", round, i, din[i], want);
      }
    }
    CHECK(ncclRedOpDestroy(dop, comm));
    free(f); free(g);
  }

  /* per-call configurations */
  {
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    cc.userProfilerTag = 42;
    for (size_t i = 0; i < c; i++) in[i] = (int32_t)(rank + i);
    CHECK(ncclAllReduceConfig(in, out, c, ncclInt32, ncclSum, comm, NULL, &cc));
    EXPECT(out[0] == nranks * (nranks - 1) / 2, "all_reduce with a config: %d", out[0]);
    cc.algSelection = "ring";
    EXPECT(ncclAllReduceConfig(in, out, c, ncclInt32, ncclSum, comm, NULL, &cc) == ncclInvalidUsage,
           "a forced per-call algorithm");
    EXPECT(strstr(ncclGetLastError(comm), "per call") != NULL, "last error: %s", ncclGetLastError(comm));
    cc.forceAlgSelection = 0; /* a hint: the automatic choice stands */
    CHECK(ncclAllReduceConfig(in, out, c, ncclInt32, ncclSum, comm, NULL, &cc));
    ncclCollConfig_t junk;
    memset(&junk, 0, sizeof junk);
    EXPECT(ncclBroadcastConfig(in, out, c, ncclInt32, 0, comm, NULL, &junk) == ncclInvalidArgument,
           "an uninitialized config");
  }

  /* registration, properties, suspend / resume, parameters */
  {
    void *handle = NULL;
    CHECK(ncclCommRegister(comm, in, c * sizeof(int32_t), &handle));
    CHECK(ncclAllReduce(in, out, c, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclCommDeregister(comm, handle));
    EXPECT(ncclCommDeregister(comm, handle) == ncclInvalidArgument, "deregistering twice");
    int dev = 0;
    CHECK(ncclCommCuDevice(comm, &dev));
    EXPECT(dev == -1, "device %d (cudaCpuDeviceId is -1)", dev);
    uint64_t v = 7;
    CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
    CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
    EXPECT(v == 1, "suspended stat %llu", (unsigned long long)v);
    EXPECT(ncclAllReduce(in, out, c, ncclInt32, ncclSum, comm, NULL) == ncclInvalidUsage, "a call while suspended");
    CHECK(ncclCommResume(comm));
    CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &v));
    EXPECT(v == 0, "GPU memory %llu", (unsigned long long)v);
    const char *algo = NULL;
    int len = -1;
    CHECK(ncclParamGetParameter("NCCL_ALGO", &algo, &len));
    EXPECT(strcmp(algo, getenv("NCCL_ALGO") ? "ring" : "") == 0, "NCCL_ALGO read as %s", algo);
    EXPECT(ncclParamGetParameter("NCCL_NVLS_ENABLE", &algo, &len) == ncclInvalidArgument, "an unknown parameter");
    ncclWindow_t win;
    EXPECT(ncclCommWindowRegister(comm, in, 4096, &win, NCCL_WIN_DEFAULT) == ncclInvalidUsage, "windows");
    EXPECT(strstr(ncclGetLastError(comm), "window") != NULL, "last error: %s", ncclGetLastError(comm));
  }

  /* split, non-blocking: even and odd ranks */
  {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t half;
    ncclResult_t r = ncclCommSplit(comm, rank % 2, -rank, &half, &config);
    made(r, half, "non-blocking split");
    int hn = 0, hr = 0, sum = 0, one = rank;
    CHECK(ncclCommCount(half, &hn));
    CHECK(ncclCommUserRank(half, &hr));
    int members = (nranks + (rank % 2 == 0)) / 2;
    EXPECT(hn == members && hr == members - 1 - rank / 2, "split: rank %d of %d", hr, hn);
    CHECK(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, half, NULL));
    int want = 0;
    for (int k = rank % 2; k < nranks; k += 2) want += k;
    EXPECT(sum == want, "split all_reduce %d, want %d", sum, want);
    CHECK(ncclCommDestroy(half));
  }

  /* bad calls: codes and texts, and the communicator still works */
  EXPECT(ncclAllReduce(in, out, c, ncclFloat8e4m3, ncclSum, comm, NULL) == ncclInvalidArgument, "float8");
  EXPECT(strstr(ncclGetLastError(comm), "float8") != NULL, "last error: %s", ncclGetLastError(comm));
  EXPECT(ncclAllReduce(in, out, c, ncclInt32, ncclSum, NULL, NULL) == ncclInvalidArgument, "NULL comm");
  EXPECT(ncclBroadcast(in, out, c, ncclInt32, nranks, comm, NULL) == ncclInvalidArgument, "bad root");
  EXPECT(ncclAllReduce(in, out, c, ncclInt32, ncclSum, comm, (cudaStream_t)0x10) == ncclInvalidUsage, "stream");
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error %d", async);
  CHECK(ncclAllReduce(in, out, 1, ncclInt32, ncclSum, comm, NULL));

  /* shrink: every rank but the last goes on without it */
  if (nranks > 1) {
    int last = nranks - 1;
    if (rank != last) {
      ncclComm_t small;
      int one = 1, sum = 0;
      /* inherits the parent's configuration: non-blocking */
      ncclResult_t r = ncclCommShrink(comm, &last, 1, &small, NULL, NCCL_SHRINK_DEFAULT);
      made(r, small, "shrink");
      CHECK(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, small, NULL));
      EXPECT(sum == nranks - 1, "shrunk all_reduce %d", sum);
      CHECK(ncclCommDestroy(small));
    }
  }


  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  free(in); free(out); free(din); free(dout);
  if (failures == 0) printf("nccl C test OK: rank %d of %d\n", rank, nranks);
  return failures == 0 ? 0 : 1;
}
