/* Text from clients and checkpoints, checked and shown; see text.h. */
#include "text.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

void rtext_escape(const char *s, char *out, size_t outlen)
{
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		size_t need = *p >= 0x20 && *p < 0x7f && *p != '\\' ? 1 : 4;
		if (o + need + 4 > outlen) {   /* room for "..." and the 0 */
			o += (size_t)snprintf(out + o, outlen - o, "...");
			return;
		}
		if (need == 1)
			out[o++] = (char)*p;
		else
			o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", *p);
	}
	out[o] = 0;
}

/* Length of the UTF-8 sequence at p, with its code point in *cp; 0 when it
 * is not one (a stray continuation byte, a truncated sequence, an overlong
 * form, a surrogate, or beyond U+10FFFF). */
static size_t utf8_decode(const unsigned char *p, uint32_t *cp)
{
	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	size_t n;
	uint32_t min;
	if (p[0] >= 0xC2 && p[0] <= 0xDF) {
		n = 2, min = 0x80, *cp = p[0] & 0x1F;
	} else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
		n = 3, min = 0x800, *cp = p[0] & 0x0F;
	} else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
		n = 4, min = 0x10000, *cp = p[0] & 0x07;
	} else {
		return 0;
	}
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xC0) != 0x80)   /* also stops at the terminating 0 */
			return 0;
		*cp = (*cp << 6) | (p[i] & 0x3F);
	}
	if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF))
		return 0;
	return n;
}

int rtext_check(const char *field, const char *name, size_t max_len, char *err,
			size_t errlen)
{
	char shown[160];
	size_t len = strlen(name);
	if (max_len && len == 0) {
		snprintf(err, errlen, "%s is empty; a name is 1..%zu bytes", field, max_len);
		return -EINVAL;
	}
	if (max_len && len > max_len) {
		snprintf(err, errlen, "%s is %zu bytes long; a name is 1..%zu bytes", field, len,
			 max_len);
		return -EINVAL;
	}
	const unsigned char *p = (const unsigned char *)name;
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t n = utf8_decode(p + i, &cp);
		if (n == 0) {
			rtext_escape(name, shown, sizeof shown);
			snprintf(err, errlen, "%s \"%s\" is not valid UTF-8 at byte %zu (0x%02x)", field,
				 shown, i, p[i]);
			return -EINVAL;
		}
		if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) {
			char what[16];
			if (n == 1)
				snprintf(what, sizeof what, "0x%02x", (unsigned)cp);
			else
				snprintf(what, sizeof what, "U+%04X", (unsigned)cp);
			rtext_escape(name, shown, sizeof shown);
			snprintf(err, errlen, "%s \"%s\" has a control character (%s) at byte %zu; a "
				 "name must be printable text", field, shown, what, i);
			return -EINVAL;
		}
		i += n;
	}
	return 0;
}

int rtext_check_model_name(const char *field, const char *name, size_t max_len, char *err,
			   size_t errlen)
{
	int rc = rtext_check(field, name, max_len, err, errlen);
	if (rc < 0)
		return rc;
	size_t len = strlen(name);
	const char *slash = strchr(name, '/');
	char why[64];
	if (slash)
		snprintf(why, sizeof why, "has a '/' at byte %zu", (size_t)(slash - name));
	else if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		snprintf(why, sizeof why, "is a directory's name");
	else if (len && (name[0] == ' ' || name[len - 1] == ' '))
		snprintf(why, sizeof why, "%s with a space", name[0] == ' ' ? "begins" : "ends");
	else
		return 0;
	char shown[160];
	rtext_escape(name, shown, sizeof shown);
	snprintf(err, errlen, "%s \"%s\" %s; a model name is printable text of 1..%zu bytes, "
		 "without '/', not \".\" or \"..\", with no space at either end", field, shown,
		 why, max_len);
	return -EINVAL;
}
