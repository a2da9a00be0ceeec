/*
 * How fast one core hands freshly written memory to another.
 *
 *   gcc -O2 -mavx2 -pthread -o /tmp/handoff-probe scripts/handoff-probe.c
 *   /tmp/handoff-probe BYTES ITERS 0   # writer stores through its cache
 *   /tmp/handoff-probe BYTES ITERS 1   # writer streams (non-temporal)
 *
 * A thread on CPU 0 writes BYTES, a thread on CPU 1 copies them out, in
 * turn, ITERS times; then one thread does both on one core. When the two
 * CPUs share a last-level cache the cross-core turn costs about what the
 * same-core one does; when they do not (a guest's vCPUs on two core
 * complexes of the host, whatever the guest's sysfs says), the reader
 * pulls every line out of the writer's cache and the turn costs several
 * times more, and streamed writes (read back from memory) are faster.
 * docs/PERFORMANCE.md, tenth round, has the figures for this project's
 * virtual machine.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t n;
static int iters, streamed;
static char *buf, *dst;
static _Atomic int turn;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void write_buf(int v) {
  if (!streamed) {
    memset(buf, v, n);
    return;
  }
  __m256i x = _mm256_set1_epi8((char)v);
  for (size_t i = 0; i < n; i += 32) _mm256_stream_si256((__m256i *)(buf + i), x);
  _mm_sfence();
}

static void *writer(void *arg) {
  (void)arg;
  pin(0);
  for (int i = 0; i < iters; i++) {
    while (atomic_load(&turn) != 0) {}
    write_buf(i);
    atomic_store(&turn, 1);
  }
  return 0;
}

static void *reader(void *arg) {
  (void)arg;
  pin(1);
  for (int i = 0; i < iters; i++) {
    while (atomic_load(&turn) != 1) {}
    memcpy(dst, buf, n);
    atomic_store(&turn, 0);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s BYTES ITERS STREAMED(0|1)\n", argv[0]);
    return 2;
  }
  n = strtoull(argv[1], 0, 10) / 32 * 32;
  iters = atoi(argv[2]);
  streamed = atoi(argv[3]);
  buf = aligned_alloc(64, n);
  dst = aligned_alloc(64, n);
  memset(buf, 1, n);
  memset(dst, 1, n);
  pthread_t a, b;
  double t = now();
  pthread_create(&a, 0, writer, 0);
  pthread_create(&b, 0, reader, 0);
  pthread_join(a, 0);
  pthread_join(b, 0);
  double cross = (now() - t) / iters;
  t = now();
  for (int i = 0; i < iters; i++) {
    write_buf(i);
    memcpy(dst, buf, n);
  }
  double same = (now() - t) / iters;
  printf("%zu B, writes %s: across cores %.1f us a turn, on one core %.1f us\n", n,
         streamed ? "streamed" : "cached", cross * 1e6, same * 1e6);
  return 0;
}
