/* What the C test programs share: the rank's place (from the launcher's
 * RANK and WORLD_SIZE), CHECK (an NCCL call that must succeed, else exit
 * 2), EXPECT (a condition, counted in `failures`), and share_id (rank 0
 * makes the unique id and hands it to the others through a file, where
 * an MPI program would broadcast it). One translation unit per program. */
#ifndef OXCCL_NCCL_TEST_HARNESS_H
#define OXCCL_NCCL_TEST_HARNESS_H
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int failures = 0;
static int rank = 0, nranks = 1;

/* RANK and WORLD_SIZE, as oxrun (and torchrun) set them. */
static void place(void) {
  rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
  nranks = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
}

#define CHECK(call)                                                              \
  do {                                                                           \
    ncclResult_t r_ = (call);                                                    \
    if (r_ != ncclSuccess) {                                                     \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call,              \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                   \
      exit(2);                                                                   \
    }                                                                            \
  } while (0)

/* A failed expectation is printed; after 50 the program stops. */
#define EXPECT(cond, ...)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "rank %d: ", rank);                                        \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      if (++failures > 50) exit(1);                                              \
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

#endif
