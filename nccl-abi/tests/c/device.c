/* NCCL's usual program on device memory, against oxccl's libnccl built
 * with the cuda feature: cudaMalloc'd buffers, a stream per rank, calls
 * queued on it, results checked after cudaStreamSynchronize, every
 * element exactly. Ranks share GPU 0 (the device machine has one). Rank
 * and size from the launcher (RANK, WORLD_SIZE); rank 0 hands the unique
 * id to the others through the file argv[1]. Needs a GPU: run by
 * scripts/gpu-check, compiled there with nvcc (or cc -lcudart).
 * Exit status 0 when everything held. */
#include "harness.h"
#include <cuda_runtime.h>
#include <string.h>

#define CUDA(call)                                                               \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                     \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                   \
    }                                                                            \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s ID_FILE\n", argv[0]); return 2; }
  place();
  CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclUniqueId id;
  share_id(argv[1], &id);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  const size_t c = (1 << 20) + 7; /* 4 MiB of floats and a ragged end */
  size_t bytes = (size_t)nranks * c * sizeof(float);
  float *h = malloc(bytes), *want = malloc(bytes), *d_in, *d_out;
  CUDA(cudaMalloc((void **)&d_in, bytes));
  CUDA(cudaMalloc((void **)&d_out, bytes));

  /* all_reduce, out of place, queued on the stream */
  for (size_t i = 0; i < c; i++) h[i] = (float)((rank + 1) * (i % 1000));
  CUDA(cudaMemcpyAsync(d_in, h, c * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(ncclAllReduce(d_in, d_out, c, ncclFloat32, ncclSum, comm, stream));
  CUDA(cudaMemcpyAsync(h, d_out, c * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < c; i++) {
    float w = (float)(nranks * (nranks + 1) / 2) * (float)(i % 1000);
    EXPECT(h[i] == w, "all_reduce[%zu] = %g, want %g", i, h[i], w);
  }

  /* all_reduce in place, max */
  for (size_t i = 0; i < c; i++) h[i] = (float)(rank * 3 + i % 7);
  CUDA(cudaMemcpyAsync(d_in, h, c * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(ncclAllReduce(d_in, d_in, c, ncclFloat32, ncclMax, comm, stream));
  CUDA(cudaMemcpyAsync(h, d_in, c * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < c; i++)
    EXPECT(h[i] == (float)((nranks - 1) * 3 + i % 7), "all_reduce max[%zu] = %g", i, h[i]);

  /* all_gather and reduce_scatter */
  for (size_t i = 0; i < c; i++) h[i] = (float)(rank * 1000 + i % 997);
  CUDA(cudaMemcpyAsync(d_in, h, c * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(ncclAllGather(d_in, d_out, c, ncclFloat32, comm, stream));
  CUDA(cudaMemcpyAsync(h, d_out, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA(cudaStreamSynchronize(stream));
  for (int k = 0; k < nranks; k++)
    for (size_t i = 0; i < c; i++)
      EXPECT(h[k * c + i] == (float)(k * 1000 + i % 997), "all_gather[%d][%zu] = %g", k, i, h[k * c + i]);
  for (size_t i = 0; i < (size_t)nranks * c; i++) h[i] = (float)(rank + i % 13);
  CUDA(cudaMemcpyAsync(d_in, h, bytes, cudaMemcpyHostToDevice, stream));
  CHECK(ncclReduceScatter(d_in, d_out, c, ncclFloat32, ncclSum, comm, stream));
  CUDA(cudaMemcpyAsync(h, d_out, c * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < c; i++) {
    float w = 0;
    for (int k = 0; k < nranks; k++) w += (float)(k + (rank * c + i) % 13);
    EXPECT(h[i] == w, "reduce_scatter[%zu] = %g, want %g", i, h[i], w);
  }

  /* broadcast from the last rank */
  for (size_t i = 0; i < c; i++) h[i] = (float)(rank * 5 + i % 11);
  CUDA(cudaMemcpyAsync(d_in, h, c * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(ncclBroadcast(d_in, d_out, c, ncclFloat32, nranks - 1, comm, stream));
  CUDA(cudaMemcpyAsync(h, d_out, c * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < c; i++)
    EXPECT(h[i] == (float)((nranks - 1) * 5 + i % 11), "broadcast[%zu] = %g", i, h[i]);

  /* a ring of send/recv in a group, and gather to rank 0 */
  {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    for (size_t i = 0; i < c; i++) h[i] = (float)(rank * 100 + i % 17);
    CUDA(cudaMemcpyAsync(d_in, h, c * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(ncclGroupStart());
    CHECK(ncclSend(d_in, c, ncclFloat32, next, comm, stream));
    CHECK(ncclRecv(d_out, c, ncclFloat32, prev, comm, stream));
    CHECK(ncclGroupEnd());
    CUDA(cudaMemcpyAsync(h, d_out, c * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < c; i++)
      EXPECT(h[i] == (float)(prev * 100 + i % 17), "recv[%zu] = %g", i, h[i]);
    for (size_t i = 0; i < c; i++) h[i] = (float)(rank * 100 + i % 19);
    CUDA(cudaMemcpyAsync(d_in, h, c * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(ncclGather(d_in, d_out, c, ncclFloat32, 0, comm, stream));
    CUDA(cudaMemcpyAsync(h, d_out, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA(cudaStreamSynchronize(stream));
    if (rank == 0)
      for (int k = 0; k < nranks; k++)
        for (size_t i = 0; i < c; i++)
          EXPECT(h[k * c + i] == (float)(k * 100 + i % 19), "gather[%d][%zu] = %g", k, i, h[k * c + i]);
  }

  /* many calls in a row, synchronized once at the end */
  CUDA(cudaMemsetAsync(d_in, 0, c * sizeof(float), stream));
  for (int i = 0; i < 50; i++) CHECK(ncclAllReduce(d_in, d_in, c, ncclFloat32, ncclSum, comm, stream));
  CUDA(cudaMemcpyAsync(h, d_in, sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaStreamSynchronize(stream));
  EXPECT(h[0] == 0.0f, "50 queued all_reduces of zeros: %g", h[0]);

  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error %d: %s", async, ncclGetLastError(comm));
  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  CUDA(cudaFree(d_in));
  CUDA(cudaFree(d_out));
  free(h);
  free(want);
  if (failures == 0) printf("nccl device test OK: rank %d of %d\n", rank, nranks);
  return failures == 0 ? 0 : 1;
}
