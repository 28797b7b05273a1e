/* Threads that never take the process's asynchronous signals. */
#ifndef RADIANCE_THREAD_H
#define RADIANCE_THREAD_H

#include <pthread.h>
#include <signal.h>

/*
 * pthread_create(t, NULL, fn, arg) with every asynchronous signal blocked in
 * the new thread (it inherits the mask in force while it is created; the
 * caller's own mask is restored before return). A signal sent to the
 * process (SIGTERM, SIGINT, SIGHUP from systemd or a user) then never lands
 * on a worker that may sit in a spin or a raw futex wait: under
 * ThreadSanitizer a handler is deferred until its thread next enters the
 * runtime, and a test once saw a daemon that neither logged SIGHUP nor
 * stopped on SIGTERM for 15 s. (The daemon's loop blocks them too and reads
 * them from a signalfd: daemon/server.c, "Signals".)
 * Signals the thread raises itself (faults, abort) stay unblocked.
 * Returns pthread_create's 0 or positive error number.
 */
static inline int rthread_create(pthread_t *t, void *(*fn)(void *), void *arg);

/* Blocks every asynchronous signal in the calling thread (the mask
 * rthread_create gives its threads); the mask before goes to *old. */
static inline void rthread_block_async(sigset_t *old)
{
	sigset_t all;
	sigfillset(&all);
	static const int sync_signals[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS };
	for (size_t i = 0; i < sizeof sync_signals / sizeof sync_signals[0]; i++)
		sigdelset(&all, sync_signals[i]);
	pthread_sigmask(SIG_BLOCK, &all, old);
}

static inline int rthread_create(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t old;
	rthread_block_async(&old);
	int rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

#endif
