/*
 * The CPU backend's compute pool: a fixed set of worker threads, made once,
 * that run one parallel job at a time with the calling thread taking part.
 *
 * A job is `count` independent tasks; each thread claims the next task index
 * with an atomic counter, so a core another process steals from simply runs
 * fewer tasks. The caller waits only for tasks a worker has claimed, never
 * for a worker that has not woken or has lost its core: it runs the
 * unclaimed tasks itself. Nothing is allocated per job.
 *
 * Threading: create, run and destroy all come from one thread (the backend's
 * executor thread); run is not reentrant. Workers spin briefly after a job
 * (decode layers come back to back) and then sleep on a condition variable.
 */
#ifndef RADIANCE_CPU_POOL_H
#define RADIANCE_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

struct radiance_cpu_pool;

/* fn(arg, task) for task in [0, count): called once per task, from any
 * thread of the pool (the caller counts as one). Must not call back into the
 * pool. */
typedef void (*radiance_cpu_task_fn)(void *arg, uint32_t task);

/* Threads this process may run on: the CPUs of sched_getaffinity(), capped by
 * the cgroup v2 cpu.max quota (quota / period, rounded up) of this process's
 * cgroup and every ancestor. At least 1. *why (may be NULL) gets a short
 * static string naming what set it ("affinity", "cgroup cpu.max"). */
unsigned radiance_cpu_usable_threads(const char **why);

/* The CPU's model name ("model name" of /proc/cpuinfo) into out, or "cpu"
 * where there is none (e.g. most ARM kernels). */
void radiance_cpu_model_name(char *out, size_t len);

/* Creates a pool of `threads` threads in all: threads - 1 workers plus the
 * caller of radiance_cpu_pool_run. threads 0 is refused (-EINVAL); the caller
 * resolves "auto" with radiance_cpu_usable_threads(). 0, -EINVAL, -ENOMEM or
 * the pthread_create error (negated); nothing is left running on failure. */
int radiance_cpu_pool_create(unsigned threads, struct radiance_cpu_pool **out);

/* Joins every worker and frees the pool. NULL is a no-op. */
void radiance_cpu_pool_destroy(struct radiance_cpu_pool *p);

/* Threads of the pool (workers + caller); 1 for a NULL pool. */
unsigned radiance_cpu_pool_threads(const struct radiance_cpu_pool *p);

/* Runs fn(arg, 0..count-1) on at most `width` threads (0: all; a NULL pool:
 * the caller alone) and returns when every task has finished (a worker may
 * still be on its way out of the job then; it touches none of its tasks). */
void radiance_cpu_pool_run(struct radiance_cpu_pool *p, unsigned width, uint32_t count,
			   radiance_cpu_task_fn fn, void *arg);

#endif
