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

enum radiance_log_level {
	RADIANCE_LOG_SILENT = 0,
	RADIANCE_LOG_ERROR = 1,
	RADIANCE_LOG_WARN = 2,
	RADIANCE_LOG_INFO = 3,
	RADIANCE_LOG_DEBUG = 4,
};

/* Sets the most verbose level that is written (default INFO). */
void radiance_log_init(enum radiance_log_level level);
enum radiance_log_level radiance_log_get_level(void);
/* "silent", "error", "warn"/"warning", "info", "debug" -> level; -1 if unknown. */
int radiance_log_level_parse(const char *s);
const char *radiance_log_level_name(enum radiance_log_level level);

void radiance__log(enum radiance_log_level level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#define radiance_log(lvl, ...)                                                          \
	do {                                                                            \
		if ((lvl) <= radiance_log_get_level())                                  \
			radiance__log((lvl), __FILE__, __LINE__, __VA_ARGS__);          \
	} while (0)

/* Formats a message into a caller's error buffer, the err/errlen pair of the
 * parsers' and backends' functions; err may be NULL or errlen 0 (no message
 * wanted). Not logging: the caller decides what becomes of the text. */
void radiance__errf(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_error(...) radiance_log(RADIANCE_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) radiance_log(RADIANCE_LOG_WARN, __VA_ARGS__)
#define log_info(...) radiance_log(RADIANCE_LOG_INFO, __VA_ARGS__)
#define log_debug(...) radiance_log(RADIANCE_LOG_DEBUG, __VA_ARGS__)

#endif
