/* The CPU compute pool; see cpu_pool.h. */
#include "cpu_pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "thread.h"

/* How long a worker spins for the next job before it sleeps: long enough to
 * span the gap between two layers of one decode step, short enough not to
 * hold a core that other processes want. */
#define POOL_SPIN_NS 50000

/* One job's description. Two of them alternate, so that a worker still
 * looking at the previous job never reads one being rewritten: the caller
 * rewrites a slot only when no worker is inside it (see worker_main). */
struct job_slot {
	radiance_cpu_task_fn fn;
	void *arg;
	uint32_t count;
	unsigned width;
	atomic_uint next;           /* next task index to claim */
	atomic_uint done;           /* tasks finished */
	atomic_uint inside;         /* workers that may be reading this slot */
};

struct radiance_cpu_pool {
	unsigned threads;
	pthread_t *tids;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned sleepers;          /* under mu */
	atomic_uint_fast64_t gen;   /* the current job's number, bumped (under mu) to publish one */
	uint64_t last;              /* the caller's copy of gen */
	atomic_int stop;
	struct job_slot slot[2];    /* job g is in slot[g % 2] */
};

struct worker_arg {
	struct radiance_cpu_pool *p;
	unsigned index;             /* 0 .. threads - 2 */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void run_tasks(struct job_slot *s)
{
	for (;;) {
		uint32_t t = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
		if (t >= s->count)
			break;
		s->fn(s->arg, t);
		atomic_fetch_add_explicit(&s->done, 1, memory_order_release);
	}
}

static uint64_t wait_job(struct radiance_cpu_pool *p, uint64_t seen)
{
	uint64_t g, start = rclock_ns();
	for (unsigned i = 1;; i++) {
		g = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (g != seen)
			return g;
		cpu_relax();
		if ((i & 63) == 0 && rclock_ns() - start > POOL_SPIN_NS)
			break;
	}
	pthread_mutex_lock(&p->mu);
	p->sleepers++;
	while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
		pthread_cond_wait(&p->cv, &p->mu);
	p->sleepers--;
	pthread_mutex_unlock(&p->mu);
	return g;
}

/* A worker takes part in a job only if it is still the current one once the
 * worker has said it is inside the job's slot; so it never needs to
 * acknowledge a job, and the caller never waits for a worker that is asleep
 * or has lost its core: it runs the tasks no one claimed itself and returns
 * when they are all done. */
static void *worker_main(void *opaque)
{
	struct worker_arg *wa = opaque;
	struct radiance_cpu_pool *p = wa->p;
	const unsigned index = wa->index;
	uint64_t seen = 0;
	free(wa);
	for (;;) {
		seen = wait_job(p, seen);
		if (atomic_load_explicit(&p->stop, memory_order_acquire))
			return NULL;
		struct job_slot *s = &p->slot[seen % 2];
		/* seq_cst, paired with the caller's: either the caller sees this
		 * worker inside before it rewrites the slot, or this load sees
		 * that the job moved on (the caller published the next one before
		 * it looked) */
		atomic_fetch_add(&s->inside, 1);
		if (atomic_load(&p->gen) == seen && index + 1 < s->width)
			run_tasks(s);
		atomic_fetch_sub_explicit(&s->inside, 1, memory_order_release);
	}
}

static void publish(struct radiance_cpu_pool *p)
{
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->gen, ++p->last);
	if (p->sleepers)
		pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int radiance_cpu_pool_create(unsigned threads, struct radiance_cpu_pool **out)
{
	int rc;
	if (threads == 0 || threads > 4096)
		return -EINVAL;
	struct radiance_cpu_pool *p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->threads = threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	atomic_init(&p->gen, 0);
	atomic_init(&p->stop, 0);
	for (int i = 0; i < 2; i++) {
		atomic_init(&p->slot[i].next, 0);
		atomic_init(&p->slot[i].done, 0);
		atomic_init(&p->slot[i].inside, 0);
	}
	p->tids = calloc(threads, sizeof *p->tids);
	if (!p->tids) {
		rc = -ENOMEM;
		goto fail_tids;
	}
	unsigned started;
	for (started = 0; started + 1 < threads; started++) {
		struct worker_arg *wa = malloc(sizeof *wa);
		if (!wa) {
			rc = -ENOMEM;
			goto fail_workers;
		}
		wa->p = p;
		wa->index = started;
		rc = -rthread_create(&p->tids[started], worker_main, wa);
		if (rc < 0) {
			free(wa);
			goto fail_workers;
		}
	}
	*out = p;
	return 0;

fail_workers:
	p->threads = started + 1;
	radiance_cpu_pool_destroy(p);
	return rc;
fail_tids:
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
	return rc;
}

void radiance_cpu_pool_destroy(struct radiance_cpu_pool *p)
{
	if (!p)
		return;
	atomic_store_explicit(&p->stop, 1, memory_order_release);
	publish(p);
	for (unsigned i = 0; i + 1 < p->threads; i++)
		pthread_join(p->tids[i], NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->tids);
	free(p);
}

unsigned radiance_cpu_pool_threads(const struct radiance_cpu_pool *p)
{
	return p ? p->threads : 1;
}

void radiance_cpu_pool_run(struct radiance_cpu_pool *p, unsigned width, uint32_t count,
			   radiance_cpu_task_fn fn, void *arg)
{
	if (!p || p->threads == 1 || width == 1 || count <= 1) {
		for (uint32_t t = 0; t < count; t++)
			fn(arg, t);
		return;
	}
	struct job_slot *s = &p->slot[(p->last + 1) % 2];
	/* a worker that woke for the job two back may still be inside this
	 * slot (it leaves at once: that job is over) */
	while (atomic_load(&s->inside) != 0)
		cpu_relax();
	s->fn = fn;
	s->arg = arg;
	s->count = count;
	s->width = width == 0 || width > p->threads ? p->threads : width;
	atomic_store_explicit(&s->next, 0, memory_order_relaxed);
	atomic_store_explicit(&s->done, 0, memory_order_relaxed);
	publish(p);
	run_tasks(s);
	/* only tasks a worker has claimed can be left */
	while (atomic_load_explicit(&s->done, memory_order_acquire) != count)
		cpu_relax();
}

/* ---- how many threads this process may use -------------------------------- */

/* ceil(quota / period) of one cpu.max file; 0 when unlimited or unreadable. */
static unsigned cpu_max_limit(const char *dir)
{
	char path[4200], line[128], quota[32];
	unsigned long long period;
	snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", dir);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	unsigned limit = 0;
	if (fgets(line, sizeof line, f) && sscanf(line, "%31s %llu", quota, &period) == 2 &&
	    strcmp(quota, "max") != 0 && period > 0) {
		unsigned long long q = strtoull(quota, NULL, 10);
		unsigned long long n = (q + period - 1) / period;
		limit = n == 0 ? 1 : n > 4096 ? 4096 : (unsigned)n;
	}
	fclose(f);
	return limit;
}

/* The smallest cpu.max limit on the way from this process's cgroup (v2, the
 * "0::" line of /proc/self/cgroup) up to the root; 0 when none is set. */
static unsigned cgroup_limit(void)
{
	char line[4096], dir[4096] = "";
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "0::", 3) == 0) {
			line[strcspn(line, "\n")] = 0;
			snprintf(dir, sizeof dir, "%s", line + 3);
			break;
		}
	}
	fclose(f);
	if (dir[0] != '/')
		return 0;
	unsigned best = 0;
	for (;;) {
		unsigned l = cpu_max_limit(strcmp(dir, "/") == 0 ? "" : dir);
		if (l && (!best || l < best))
			best = l;
		char *slash = strrchr(dir, '/');
		if (!slash || slash == dir) {
			if (strcmp(dir, "/") == 0)
				break;
			strcpy(dir, "/");
			continue;
		}
		*slash = 0;
	}
	return best;
}

unsigned radiance_cpu_usable_threads(const char **why)
{
	cpu_set_t set;
	unsigned n = 1;
	const char *w = "default";
	if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
		n = (unsigned)CPU_COUNT(&set);
		w = "sched_getaffinity";
	}
	unsigned c = cgroup_limit();
	if (c && c < n) {
		n = c;
		w = "cgroup cpu.max";
	}
	if (why)
		*why = w;
	return n;
}

void radiance_cpu_model_name(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "re");
	char line[256];
	snprintf(out, len, "cpu");
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "model name", 10) == 0) {
			char *p = strchr(line, ':');
			if (p) {
				p += 1 + strspn(p + 1, " \t");
				p[strcspn(p, "\n")] = 0;
				snprintf(out, len, "%s", p);
			}
			break;
		}
	}
	fclose(f);
}
