/*
 * How fast the kernel's cross-memory copy (process_vm_readv, what a
 * single copy between processes uses) is against memcpy, on this host.
 *
 *   gcc -O2 -o /tmp/cma-probe scripts/cma-probe.c
 *   /tmp/cma-probe BYTES ITERS 0    # buffers on the allocator's pages
 *   /tmp/cma-probe BYTES ITERS 14   # madvise(MADV_HUGEPAGE) first
 *
 * It reads the process's own memory through the kernel, which pins the
 * source a page at a time just as it does a peer's: 4 KiB pages cost far
 * more per byte than huge ones. docs/PERFORMANCE.md, fourteenth round,
 * has the figures for this project's virtual machines.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s BYTES ITERS MADVICE\n", argv[0]);
    return 2;
  }
  size_t n = strtoul(argv[1], NULL, 0);
  int iters = atoi(argv[2]), advice = atoi(argv[3]);
  size_t align = 2 << 20, len = (n + align - 1) / align * align;
  char *a = aligned_alloc(align, len), *b = aligned_alloc(align, len);
  if (!a || !b) return 1;
  if (advice) {
    madvise(a, len, advice);
    madvise(b, len, advice);
  }
  memset(a, 1, len);
  memset(b, 2, len);
  double t0 = now();
  for (int i = 0; i < iters; i++) {
    struct iovec local = {b, n}, remote = {a, n};
    if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)n) {
      perror("process_vm_readv");
      return 1;
    }
  }
  double t1 = now();
  for (int i = 0; i < iters; i++) {
    memcpy(b, a, n);
    __asm__ volatile("" ::"r"(b) : "memory");
  }
  double t2 = now();
  printf("%zu B: kernel %.1f us (%.1f GB/s), memcpy %.1f us (%.1f GB/s)\n", n,
         (t1 - t0) / iters * 1e6, n * (double)iters / (t1 - t0) / 1e9,
         (t2 - t1) / iters * 1e6, n * (double)iters / (t2 - t1) / 1e9);
  return 0;
}
