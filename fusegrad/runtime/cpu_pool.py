"""The CPU device's worker threads, in C: a kernel split across threads (its outermost loop in chunks, see
codegen.mark_thread_loop) is started from C instead of through Python's ThreadPoolExecutor.

Handing a chunk to a Python pool and waiting for it costs 30-45 us per kernel (a future, a queue, a condition variable
and a GIL round trip each way); MiniLM at batch 2 x 13 runs 80 kernels of 20-400 us each, so that was a large share
of a TinyJit replay. Here a launch is: the caller stores the job, publishes its chunks and bumps a generation
counter; then the caller and the workers claim chunks one at a time (a compare-and-swap) until none is left, and the
caller spins until all are done. A worker spins on the counter for up to SPIN_NS after its last chunk (kernels
launched back to back find it awake: about a microsecond), then sleeps on a condition variable, so an idle process
uses no CPU. (Yielding the core while spinning, tried too, made launches slower on a loaded machine.) Waking a
sleeping worker takes 30-40 us on the project's VMs, more than many decode kernels take: a launch that waited for it
(chunk i belonged to worker i) made SmolLM2's attention kernels, which follow a few single-threaded ones, take 35-45 us
instead of 3-6. With claiming, the caller runs the chunks a late worker hasn't taken. Each kernel's C source has a
trampoline `<name>_mt` (renderer/cstyle.py) that packs its arguments into a struct on its stack and calls
`fg_pool_run(task, &args, n, bounds)`; the pool runs the task on chunk i = [bounds[i], bounds[i+1]).

One launch at a time: a second thread (or a child process after fork, whose workers don't exist) that finds the pool
busy runs its chunks itself, one after another, so the pool can't deadlock. If the library doesn't compile, kernels
go through the Python pool as before.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import threading
from typing import Any

# a worker spins this long for the next chunk, then sleeps
SPIN_NS = int(os.environ.get("CPU_POOL_SPIN_US", "200")) * 1000

# the loop iterations (codegen.mark_thread_loop's measure) from which a kernel is split across threads when this pool
# launches it: a launch costs about a microsecond, so a kernel of a few microseconds gains. (Through the Python pool,
# 30-45 us a launch, the renderer's default 2^17 holds.) At 2^17 a decode step of SmolLM2 Q4_1 ran its 576 x 576 and
# 192 x 576 matvecs (2^16 and 2^14.4 steps, 30 and 11 us) on one core while the other spun.
MIN_WORK = int(os.environ.get("CPU_POOL_MIN_WORK", str(1 << 14)))

POOL_C = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

typedef void (*fg_task)(void *ctx, int start, int end);
#define FG_MAXW 255

static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;     /* one launch at a time */
static pthread_mutex_t sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cv = PTHREAD_COND_INITIALIZER;
static int sleepers;                                           /* under sleep_mu */
static _Atomic long gen;                                       /* bumped once per launch */
/* the chunk claims of the current launch: generation (low 32 bits) << 32 | chunks << 16 | next unclaimed chunk.
   A claim is a compare-and-swap on all three, so a worker that wakes late, after its launch ended, claims nothing of
   the next one; a successful claim means the launch is still running, so its job fields below are stable. */
static _Atomic long ticket;
static _Atomic int finished;                                   /* chunks of the current launch done */
static fg_task job_fn;
static void *job_ctx;
static int job_bounds[FG_MAXW + 2];
static int nworkers;
static pid_t owner;                                            /* the process the workers belong to */
static long start_gen[FG_MAXW + 1];

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }

/* claim and run chunks of launch g until none is left; returns how many this thread ran */
static int run_chunks(long g) {
  int ran = 0;
  long t = atomic_load_explicit(&ticket, memory_order_acquire);
  for (;;) {
    int i = (int)(t & 0xffff), n = (int)((t >> 16) & 0xffff);
    if ((uint32_t)(t >> 32) != (uint32_t)g || i >= n) return ran;
    if (!atomic_compare_exchange_weak_explicit(&ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire))
      continue;                                      /* t now holds the current ticket */
    job_fn(job_ctx, job_bounds[i], job_bounds[i + 1]);
    atomic_fetch_add_explicit(&finished, 1, memory_order_release);
    ran++;
    t = atomic_load_explicit(&ticket, memory_order_acquire);
  }
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  long seen = start_gen[id];                         /* the generation before the launch that created it */
  for (;;) {
    long g = atomic_load_explicit(&gen, memory_order_acquire);
    if (g == seen) {
      long until = now_ns() + SPIN_NS;
      for (int i = 1; (g = atomic_load_explicit(&gen, memory_order_acquire)) == seen; i++) {
        relax();
        if ((i & 63) == 0 && now_ns() > until) {
          pthread_mutex_lock(&sleep_mu);
          sleepers++;
          while ((g = atomic_load_explicit(&gen, memory_order_acquire)) == seen) pthread_cond_wait(&sleep_cv, &sleep_mu);
          sleepers--;
          pthread_mutex_unlock(&sleep_mu);
          break;
        }
      }
    }
    seen = g;
    run_chunks(g);
  }
  return 0;
}

/* run fn over chunks [bounds[i], bounds[i+1]) for i < n; returns when all are done. The caller and the workers claim
   chunks as they come free, so a launch never waits for a worker to wake: a sleeping worker (idle past SPIN_NS) takes
   tens of microseconds to be scheduled, longer than many decode kernels; the caller runs what it hasn't claimed. */
int fg_pool_run(fg_task fn, void *ctx, int n, const int *bounds) {
  if (n <= 1 || n > FG_MAXW + 1 || pthread_mutex_trylock(&run_mu) != 0) {
    fn(ctx, bounds[0], bounds[n]);                   /* busy (another thread launches), or nothing to split */
    return 0;
  }
  if (owner != getpid()) { nworkers = 0; owner = getpid(); }   /* a forked child has no workers */
  while (nworkers < n - 1) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    start_gen[nworkers + 1] = atomic_load_explicit(&gen, memory_order_relaxed);
    if (pthread_create(&t, &attr, worker, (void *)(intptr_t)(nworkers + 1)) != 0) { pthread_attr_destroy(&attr); break; }
    pthread_attr_destroy(&attr);
    nworkers++;
  }
  long g = atomic_load_explicit(&gen, memory_order_relaxed) + 1;
  job_fn = fn; job_ctx = ctx;
  for (int i = 0; i <= n; i++) job_bounds[i] = bounds[i];
  atomic_store_explicit(&finished, 0, memory_order_relaxed);
  atomic_store_explicit(&ticket, (long)((uint64_t)(uint32_t)g << 32 | (uint64_t)n << 16), memory_order_release);
  atomic_store_explicit(&gen, g, memory_order_release);
  pthread_mutex_lock(&sleep_mu);
  if (sleepers) pthread_cond_broadcast(&sleep_cv);
  pthread_mutex_unlock(&sleep_mu);
  run_chunks(g);
  for (int i = 0; atomic_load_explicit(&finished, memory_order_acquire) < n; i++) {
    if (i < 1024) relax();
    else sched_yield();
  }
  pthread_mutex_unlock(&run_mu);
  return 1;
}
"""


_lock = threading.Lock()


def _after_fork() -> None:   # a child forked while another thread compiled the pool must not inherit a held lock
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def prepare() -> None:
    """Compile (or load) the pool's library in a background thread, while the first graph is scheduled and rendered.
    A process that ends first waits for that thread, so its compile is not lost half-way (the binary reaches the disk
    cache and the next process loads it instead of compiling it again)."""
    global _prepare
    if _prepare is not None: return
    _prepare = threading.Thread(target=pool_run, name="fusegrad-cpu-pool-compile", daemon=True)
    _prepare.start()
    atexit.register(_prepare.join, 120.0)


_prepare: threading.Thread | None = None


def pool_run() -> int | None:
    """The address of fg_pool_run (compiled on first use, cached on disk like kernels), or None when it can't be
    built here (kernels then use the Python pool)."""
    with _lock: return _pool_run()


@functools.cache
def _pool_run() -> int | None:
    from fusegrad.runtime.ops_cpu import cpu_compiler, load_shared_object
    try:
        lib = load_shared_object(cpu_compiler().compile_cached(f"#define SPIN_NS {SPIN_NS}L\n" + POOL_C))
        fn: Any = lib.fg_pool_run
        _keep.append(lib)
        return ctypes.cast(fn, ctypes.c_void_p).value
    except Exception:   # no compiler, no pthreads, a noexec temp dir: the Python pool still works
        return None


_keep: list[Any] = []   # the loaded library stays loaded (its threads run its code)
