/*
 * Daemon logging, seatd-style: level-checked macros that add file:line and
 * leave errno as it was, one line per call to stderr (journald picks it up;
 * under systemd, JOURNAL_STREAM is set and lines carry a "<N>" syslog
 * priority prefix instead of a timestamp). The client library does not use
 * this: it is silent unless its log callback is set.
 *
 * Thread safety: any thread may log; each line is written with one call.
 */
#ifndef RADIANCE_LOG_H
#define RADIANCE_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum rlog_level {
	RADIANCE_LOG_SILENT = 0,
	RADIANCE_LOG_ERROR = 1,
	RADIANCE_LOG_WARN = 2,
	RADIANCE_LOG_INFO = 3,
	RADIANCE_LOG_DEBUG = 4,
};

/* Sets the most verbose level that is written (default INFO). */
void rlog_init(enum rlog_level level);
enum rlog_level rlog_get_level(void);
/* "silent", "error", "warn"/"warning", "info", "debug" -> level; -1 if unknown. */
int rlog_level_parse(const char *s);
const char *rlog_level_name(enum rlog_level level);

void rlog_write(enum rlog_level level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#define rlog(lvl, ...)                                                          \
	do {                                                                            \
		if ((lvl) <= rlog_get_level())                                  \
			rlog_write((lvl), __FILE__, __LINE__, __VA_ARGS__);          \
	} while (0)

/* Formats a message into a caller's error buffer, the err/errlen pair of the
 * parsers' and backends' functions; err may be NULL or errlen 0 (no message
 * wanted). Not logging: the caller decides what becomes of the text. */
void rlog_errf(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_error(...) rlog(RADIANCE_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) rlog(RADIANCE_LOG_WARN, __VA_ARGS__)
#define log_info(...) rlog(RADIANCE_LOG_INFO, __VA_ARGS__)
#define log_debug(...) rlog(RADIANCE_LOG_DEBUG, __VA_ARGS__)

#endif
