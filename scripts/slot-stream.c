// The small path's broadcast stream between two threads, with a stand-in
// for the frame each side runs per call: how much of the slot hand-off a
// call's own stores expose (docs/PERFORMANCE.md, nineteenth round).
//
// The root, per call: its frame, then (once the receiver has finished the
// call that last used the slot; the receiver says so every 8 calls) one
// 64-byte slot line written and published. The receiver, per call: its
// frame, a wait for the slot's sequence word, a read, a prefetch of the
// next slot. A frame is MULS dependent multiplies (about 4 cycles each)
// and STORES stores to a private 16 KiB ring (a call's stack and records).
//
//   gcc -O2 -march=native -pthread -o /tmp/slot-stream scripts/slot-stream.c
//   /tmp/slot-stream [STORES=8] [MULS=60] [PREFETCH_NEXT=1] [PREFETCHW_AHEAD=0] [CALLS_PER_LINE=1]
//
// Prints nanoseconds per call. Run it beside scripts/handoff-probe.c: the
// cost of many stores shows where the two vCPUs sit on different caches.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEPTH 64
static int STORES = 8, MULS = 60, PREFETCH_NEXT = 1, PREFETCHW_AHEAD = 0, PACK = 1;
static const long CALLS = 1000000;

typedef struct { volatile uint32_t w[16]; } line_t;
static line_t *ring;
static volatile uint32_t finished[16] __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Call s's publication: its own line, or a share of one (CALLS_PER_LINE).
static volatile uint32_t *slot(long s) {
  return &ring[(s / PACK) % DEPTH].w[(s % PACK) * (16 / PACK)];
}

static uint64_t frame(volatile uint64_t *own, long s) {
  uint64_t x = s;
  for (int i = 0; i < MULS; i++) x = x * 6364136223846793005ULL + i;
  for (int i = 0; i < STORES; i++) own[(s * 8 + i) % 2048] = x + i;
  return x;
}

static void *root(void *arg) {
  volatile uint64_t *own = calloc(2048, 8);
  uint32_t seen = 0;
  uint64_t acc = 0;
  for (long s = 0; s < CALLS; s++) {
    acc += frame(own, s);
    if (s >= DEPTH * PACK) {
      uint32_t need = s - DEPTH * PACK + 1;
      while ((int32_t)(seen - need) < 0) seen = finished[0];
    }
    volatile uint32_t *p = slot(s);
    p[1] = 0x1234;
    p[2] = (uint32_t)s;
    if (PACK == 1) { p[3] = 7; p[4] = 8; p[5] = 9; }
    __atomic_store_n(&p[0], (uint32_t)(s + 1), __ATOMIC_RELEASE);
    if (PREFETCHW_AHEAD) __builtin_prefetch((void *)slot(s + PREFETCHW_AHEAD * PACK), 1, 3);
  }
  return (void *)acc;
}

static void *receiver(void *arg) {
  volatile uint64_t *own = calloc(2048, 8);
  uint64_t sum = 0;
  for (long s = 0; s < CALLS; s++) {
    sum += frame(own, s);
    volatile uint32_t *p = slot(s);
    while (__atomic_load_n(&p[0], __ATOMIC_ACQUIRE) != (uint32_t)(s + 1)) __builtin_ia32_pause();
    sum += p[2];
    if (PREFETCH_NEXT) __builtin_prefetch((void *)slot(s + 1), 0, 3);
    if ((s + 1) % 8 == 0) __atomic_store_n(&finished[0], (uint32_t)(s + 1), __ATOMIC_RELEASE);
  }
  return (void *)sum;
}

int main(int argc, char **argv) {
  int *args[] = {&STORES, &MULS, &PREFETCH_NEXT, &PREFETCHW_AHEAD, &PACK};
  for (int i = 1; i < argc && i <= 5; i++) *args[i - 1] = atoi(argv[i]);
  if (PACK != 1 && PACK != 2) { fprintf(stderr, "CALLS_PER_LINE is 1 or 2\n"); return 2; }
  ring = aligned_alloc(4096, DEPTH * 64);
  memset(ring, 0, DEPTH * 64);
  pthread_t a, b;
  double t = now();
  pthread_create(&a, 0, root, 0);
  pthread_create(&b, 0, receiver, 0);
  pthread_join(a, 0);
  pthread_join(b, 0);
  printf("stores %d muls %d prefetch-next %d prefetchw-ahead %d calls/line %d: %.1f ns a call\n",
         STORES, MULS, PREFETCH_NEXT, PREFETCHW_AHEAD, PACK, (now() - t) / CALLS * 1e9);
  return 0;
}
