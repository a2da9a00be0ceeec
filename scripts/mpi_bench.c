/* A minimal MPI collective timer for side-by-side comparisons with oxccl's
 * *_perf binaries (same definitions: time per call averaged over ranks,
 * algbw = bytes / time, busbw with nccl-tests' factors).
 * usage: mpirun -np N ./mpi_bench COLL BYTES ITERS
 *   COLL: allreduce, allgather, reducescatter, bcast, reduce, alltoall (BYTES as
 *   nccl-tests' size column counts them: the gathered or scattered whole), or memcpy: every rank copies BYTES
 *   ITERS times at once and rank 0 prints the copy rate of all of them together (the
 *   memory bound of a collective is computed from it). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc < 4) {
    if (rank == 0) fprintf(stderr, "usage: %s allreduce|allgather|reducescatter|bcast|reduce|alltoall|memcpy BYTES ITERS\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const char *coll = argv[1];
  size_t bytes = strtoull(argv[2], NULL, 10);
  int iters = atoi(argv[3]);
  size_t count = bytes / sizeof(float);
  if (strcmp(coll, "allgather") == 0 || strcmp(coll, "reducescatter") == 0 || strcmp(coll, "alltoall") == 0)
    count = count / n * n;
  if (strcmp(coll, "memcpy") == 0) {
    char *src = malloc(bytes), *dst = malloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    memcpy(dst, src, bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++) memcpy(it % 2 ? src : dst, it % 2 ? dst : src, bytes);
    double dt = MPI_Wtime() - t0, worst;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      printf("mpi memcpy %d ranks %zu B: %.2f GB/s copied by all\n", n, bytes, (double)bytes * iters * n / worst / 1e9);
    free(src);
    free(dst);
    MPI_Finalize();
    return 0;
  }
  float *a = malloc(count * sizeof(float) + 64), *b = malloc(count * sizeof(float) + 64);
  for (size_t i = 0; i < count; i++) a[i] = (float)((rank + i) % 4);
  double factor = 1.0;
  for (int it = -2; it < iters; it++) {
    if (it == 0) { MPI_Barrier(MPI_COMM_WORLD); }
    static double t0;
    if (it == 0) t0 = MPI_Wtime();
    if (strcmp(coll, "allreduce") == 0) {
      MPI_Allreduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      factor = 2.0 * (n - 1) / n;
    } else if (strcmp(coll, "allgather") == 0) {
      MPI_Allgather(a, (int)(count / n), MPI_FLOAT, b, (int)(count / n), MPI_FLOAT, MPI_COMM_WORLD);
      factor = (double)(n - 1) / n;
    } else if (strcmp(coll, "reducescatter") == 0) {
      MPI_Reduce_scatter_block(a, b, (int)(count / n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      factor = (double)(n - 1) / n;
    } else if (strcmp(coll, "alltoall") == 0) {
      MPI_Alltoall(a, (int)(count / n), MPI_FLOAT, b, (int)(count / n), MPI_FLOAT, MPI_COMM_WORLD);
      factor = (double)(n - 1) / n;
    } else if (strcmp(coll, "reduce") == 0) {
      MPI_Reduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    } else {
      MPI_Bcast(a, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
    }
    if (it == iters - 1) {
      double dt = (MPI_Wtime() - t0) / iters, sum;
      MPI_Allreduce(&dt, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      dt = sum / n;
      if (rank == 0) {
        double algbw = (double)(count * sizeof(float)) / dt / 1e9;
        printf("mpi %s %d ranks %zu B: %.3f us algbw %.2f busbw %.2f GB/s\n", coll, n, count * sizeof(float), dt * 1e6, algbw, algbw * factor);
      }
    }
  }
  free(a);
  free(b);
  MPI_Finalize();
  return 0;
}
