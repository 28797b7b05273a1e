/* Daemon logging to stderr; see log.h. */
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum rlog_level current = RADIANCE_LOG_INFO;
static int journal = -1;   /* stderr is the journal: unknown until first use */

static const char *const names[] = { "silent", "error", "warn", "info", "debug" };
/* syslog priorities for sd-daemon's "<N>" prefixes: err, warning, info, debug */
static const int priorities[] = { 3, 3, 4, 6, 7 };

void rlog_init(enum rlog_level level)
{
	current = level;
}

enum rlog_level rlog_get_level(void)
{
	return current;
}

int rlog_level_parse(const char *s)
{
	for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	if (strcmp(s, "warning") == 0)
		return RADIANCE_LOG_WARN;
	return -1;
}

const char *rlog_level_name(enum rlog_level level)
{
	return (unsigned)level < sizeof names / sizeof names[0] ? names[level] : "?";
}

void rlog_write(enum rlog_level level, const char *file, int line, const char *fmt, ...)
{
	int saved = errno;
	char msg[1024], prefix[64];
	va_list ap;

	if (journal < 0)
		journal = getenv("JOURNAL_STREAM") != NULL;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (journal) {
		snprintf(prefix, sizeof prefix, "<%d>", priorities[level]);
	} else {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		struct tm tm;
		localtime_r(&ts.tv_sec, &tm);
		snprintf(prefix, sizeof prefix, "%02d:%02d:%02d.%03ld ", tm.tm_hour, tm.tm_min,
			 tm.tm_sec, ts.tv_nsec / 1000000);
	}
	/* One write(2) per line, so lines of concurrent threads never interleave. */
	char out[1200];
	int n = snprintf(out, sizeof out, "%s[%s] %s:%d: %s\n", prefix,
			 rlog_level_name(level), file, line, msg);
	if (n > (int)sizeof out - 1) {
		n = (int)sizeof out - 1;
		out[n - 1] = '\n';
	}
	if (write(STDERR_FILENO, out, (size_t)n) < 0) {
		/* nowhere left to report it */
	}
	errno = saved;
}

void rlog_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}
