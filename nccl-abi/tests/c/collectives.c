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
 * ncclCommGetAsyncError, with the dead rank named in ncclGetLastError. */
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;
static int rank, nranks;

#define CHECK(call)                                                              \
  do {                                                                           \
    ncclResult_t r_ = (call);                                                    \
    if (r_ != ncclSuccess) {                                                     \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call,              \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                   \
      exit(2);                                                                   \
    }                                                                            \
  } while (0)

#define EXPECT(cond, ...)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "rank %d: ", rank);                                        \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      failures++;                                                                \
    }                                                                            \
  } while (0)

static void share_id(const char *path, ncclUniqueId *id) {
  if (rank == 0) {
    CHECK(ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0) { perror(tmp); exit(2); }
    if (rename(tmp, path) != 0) { perror(path); exit(2); }
  } else {
    for (int i = 0;; i++) {
      FILE *f = fopen(path, "rb");
      if (f) {
        size_t got = fread(id, sizeof *id, 1, f);
        fclose(f);
        if (got == 1) break;
      }
      if (i > 6000) { fprintf(stderr, "rank %d: no unique id in %s\n", rank, path); exit(2); }
      usleep(10000);
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s ID_FILE\n", argv[0]); return 2; }
  rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
  nranks = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
  int version = 0;
  CHECK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);

  ncclUniqueId id;
  share_id(argv[1], &id);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  if (argc > 2 && strcmp(argv[2], "die") == 0) {
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
    CHECK(ncclCommAbort(comm));
    return r == ncclRemoteError && async == ncclRemoteError && named ? 0 : 1;
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

  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  free(in); free(out); free(din); free(dout);
  if (failures == 0) printf("nccl C test OK: rank %d of %d\n", rank, nranks);
  return failures == 0 ? 0 : 1;
}
