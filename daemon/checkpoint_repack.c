/* Checkpoint loader, verify and repack: each planned layer's tensors copied
 * out of their files, their data checked (qzeros, g_idx, scales) on that
 * copy, and the copy repacked into the canonical host layout of
 * daemon/model.h; and the tensors of no linear copied into the model's
 * sealed shared memfd. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_private.h"
#include "io.h"
#include "numerics.h"
#include "wire.h"   /* RADIANCE_TENSORS_ALIGN */

#define TENSORS_PAGE 4096u

static int cmp_other(const void *a, const void *b)
{
	return strverscmp(((const struct radiance_tensor_info *)a)->name,
			  ((const struct radiance_tensor_info *)b)->name);
}

static void *alloc_array(size_t count, size_t size)
{
	void *p = NULL;
	size_t bytes = count * size;
	if (count && bytes / count != size)
		return NULL;
	if (posix_memalign(&p, 64, bytes ? bytes : 64))
		return NULL;
	return p;
}

/* dst[c][r] = src[r][c] for elements of esz bytes; src unaligned. Tiled so
 * both sides stay in cache on layers far bigger than L2. Inlined at each call
 * with a constant esz, so the memcpy is a plain load and store. */
static inline __attribute__((always_inline)) void
transpose(void *dst, const uint8_t *src, uint64_t rows, uint64_t cols, size_t esz)
{
	enum { T = 32 };
	uint8_t *d = dst;
	for (uint64_t r0 = 0; r0 < rows; r0 += T)
		for (uint64_t c0 = 0; c0 < cols; c0 += T) {
			uint64_t r1 = r0 + T < rows ? r0 + T : rows, c1 = c0 + T < cols ? c0 + T : cols;
			for (uint64_t r = r0; r < r1; r++)
				for (uint64_t c = c0; c < c1; c++)
					memcpy(d + (c * rows + r) * esz, src + (r * cols + c) * esz, esz);
		}
}

static float load_float(const struct radiance_st_tensor *t, uint64_t i)
{
	switch (t->dtype) {
	case RADIANCE_ST_BF16: return radiance_bf16_to_f32(radiance_st_get_u16(t, i));
	case RADIANCE_ST_F16: return radiance_f16_to_f32(radiance_st_get_u16(t, i));
	default: return radiance_st_get_f32(t, i);
	}
}

/* The kernels fold a constant zero point of 8 into the unpack: every qzeros
 * nibble of a real column must be 7 (GPTQ stores zero - 1). Columns past N in
 * the last word of a row are padding and not checked. */
static int verify_qzeros(struct ck_loader *L, const struct ck_plan *p,
			 const struct radiance_st_tensor *t)
{
	uint64_t words = (p->n + 7) / 8, groups = p->k / RADIANCE_GROUP_SIZE, bad = 0, first = 0;
	uint32_t first_v = 0, tail = p->n % 8;
	uint32_t last_mask = tail ? (uint32_t)((1ull << (4 * tail)) - 1) : 0xFFFFFFFFu;

	for (uint64_t g = 0; g < groups; g++)
		for (uint64_t w = 0; w < words; w++) {
			uint32_t mask = w == words - 1 ? last_mask : 0xFFFFFFFFu;
			uint32_t v = radiance_st_get_u32(t, g * words + w);
			if ((v & mask) != (0x77777777u & mask)) {
				if (!bad++) {
					first = g * words + w;
					first_v = v;
				}
			}
		}
	if (bad) {
		ck_err(L, "%s: layer \"%s\": %" PRIu64 " of %" PRIu64 " qzeros words differ from "
		       "0x77777777 (first: qzeros[%" PRIu64 "][%" PRIu64 "] = 0x%08" PRIx32 "), expected "
		       "every zero point 8 (stored as 7): the kernels support symmetric int4 only",
		       p->qzeros->f->name, p->module, bad, groups * words, first / words, first % words,
		       first_v);
		return -EINVAL;
	}
	return 0;
}

/* g_idx maps k to its group; GPTQ act-order (desc_act) permutes it. The
 * kernels read groups as contiguous 128-wide slabs of K, so only the
 * identity k / 128 is accepted. */
static int verify_g_idx(struct ck_loader *L, const struct ck_plan *p,
			const struct radiance_st_tensor *t)
{
	for (uint64_t k = 0; k < p->k; k++) {
		int64_t v;
		if (t->dtype == RADIANCE_ST_I64)
			memcpy(&v, (const uint8_t *)t->data + k * 8, 8);
		else
			v = (int32_t)radiance_st_get_u32(t, k);
		if (v != (int64_t)(k / RADIANCE_GROUP_SIZE)) {
			ck_err(L, "%s: layer \"%s\": g_idx[%" PRIu64 "] = %" PRId64 ", expected %" PRIu64
			       " (k / 128): act-order (desc_act) checkpoints are not supported, groups must "
			       "be contiguous along K", p->g_idx->f->name, p->module, k, v,
			       k / RADIANCE_GROUP_SIZE);
			return -EINVAL;
		}
	}
	return 0;
}

static int verify_scales(struct ck_loader *L, const struct ck_plan *p,
			 const struct radiance_st_tensor *t)
{
	uint64_t count = t->nelem, bad = 0, first = 0;
	uint16_t first_v = 0;
	for (uint64_t i = 0; i < count; i++) {
		uint16_t h = radiance_st_get_u16(t, i);
		if ((h & 0x7C00u) == 0x7C00u && !bad++) {
			first = i;
			first_v = h;
		}
	}
	if (bad) {
		ck_err(L, "%s: layer \"%s\": %" PRIu64 " of %" PRIu64 " scales are not finite (first: "
		       "scales[%" PRIu64 "][%" PRIu64 "] = 0x%04x, %s), expected finite fp16 scales",
		       p->scales->f->name, p->module, bad, count, first / p->n, first % p->n, first_v,
		       first_v & 0x3FF ? "NaN" : "Inf");
		return -EINVAL;
	}
	return 0;
}

/* Copies tensor r out of its file into the loader's scratch buffer (grown to
 * the largest tensor read so far and kept for the next) and gives a view of
 * r whose data is that copy, valid until the next call. Whoever sent the
 * file can still rewrite or shrink it: the copy is what is checked and then
 * repacked, so what passed the checks is what becomes resident, and a shrink
 * is this load's -EIO, never a fault. */
static int read_tensor(struct ck_loader *L, const struct ck_ref *r, struct radiance_st_tensor *view)
{
	uint64_t len = r->t->end - r->t->begin;
	if (len > L->scratch_len) {
		void *b = len <= SIZE_MAX ? malloc((size_t)len) : NULL;
		if (!b)
			return ck_nomem(L, r->name);
		free(L->scratch);
		L->scratch = b;
		L->scratch_len = (size_t)len;
	}
	int rc = radiance_st_read(r->f, r->t, L->scratch, L->err, L->errlen);
	if (rc)
		return rc;
	*view = *r->t;
	view->data = L->scratch;
	return 0;
}

/* One layer: its tensors read one at a time just before they are checked
 * and repacked, so the load holds about one tensor of the checkpoint at a
 * time beside the resident model. */
int radiance__ck_build_layer(struct ck_loader *L, struct ck_plan *p, struct radiance_layer *l)
{
	struct radiance_st_tensor t;
	int rc;

	l->kind = p->kind;
	l->n = p->n;
	l->k = p->k;
	if (p->kind == RADIANCE_LAYER_W4A8) {
		uint64_t words = p->k / RADIANCE_PACK, groups = p->k / RADIANCE_GROUP_SIZE;
		if ((rc = read_tensor(L, p->qzeros, &t)) || (rc = verify_qzeros(L, p, &t)))
			return rc;
		if (p->g_idx && ((rc = read_tensor(L, p->g_idx, &t)) || (rc = verify_g_idx(L, p, &t))))
			return rc;
		if ((rc = read_tensor(L, p->scales, &t)) || (rc = verify_scales(L, p, &t)))
			return rc;
		l->scales = alloc_array((size_t)p->n * groups, sizeof *l->scales);
		if (!l->scales)
			return ck_nomem(L, p->module);
		transpose(l->scales, t.data, groups, p->n, sizeof *l->scales);
		if ((rc = read_tensor(L, p->qweight, &t)))
			return rc;
		l->qweight = alloc_array((size_t)p->n * words, sizeof *l->qweight);
		if (!l->qweight)
			return ck_nomem(L, p->module);
		transpose(l->qweight, t.data, words, p->n, sizeof *l->qweight);
	} else {
		uint64_t count = (uint64_t)p->n * p->k;
		l->weight = alloc_array((size_t)count, sizeof *l->weight);
		if (!l->weight)
			return ck_nomem(L, p->module);
		if (p->weight->t->dtype == RADIANCE_ST_BF16) {
			/* stored as resident: straight into place */
			rc = radiance_st_read(p->weight->f, p->weight->t, l->weight, L->err, L->errlen);
			if (rc)
				return rc;
		} else {
			if ((rc = read_tensor(L, p->weight, &t)))
				return rc;
			for (uint64_t i = 0; i < count; i++)
				l->weight[i] = radiance_bf16_from_f32(load_float(&t, i));
		}
	}
	if (p->bias) {
		l->bias = alloc_array(p->n, sizeof *l->bias);
		if (!l->bias)
			return ck_nomem(L, p->module);
		if ((rc = read_tensor(L, p->bias, &t)))
			return rc;
		for (uint32_t i = 0; i < p->n; i++)
			l->bias[i] = load_float(&t, i);
	}
	l->bytes = radiance__ck_plan_bytes(p);
	return 0;
}

int radiance__ck_build_other(struct ck_loader *L, struct radiance_model *m)
{
	size_t n = 0;
	for (size_t i = 0; i < L->n_refs; i++)
		n += !L->refs[i].used;
	m->other = calloc(n + 1, sizeof *m->other);
	if (!m->other)
		return ck_nomem(L, "inventory");
	for (size_t i = 0; i < L->n_refs; i++) {
		const struct ck_ref *r = &L->refs[i];
		if (r->used)
			continue;
		if (r->t->ndim > 8) {
			ck_err(L, "%s: tensor \"%s\" has %u dimensions, expected at most 8", r->f->name,
			       r->name, r->t->ndim);
			return -EINVAL;
		}
		struct radiance_tensor_info *o = &m->other[m->n_other];
		o->name = strdup(r->name);
		if (!o->name)
			return ck_nomem(L, "inventory");
		m->n_other++;
		snprintf(o->dtype, sizeof o->dtype, "%s", radiance_st_dtype_name(r->t->dtype));
		o->ndim = r->t->ndim;
		for (uint32_t d = 0; d < r->t->ndim; d++)
			o->shape[d] = r->t->shape[d];
		o->bytes = r->t->end - r->t->begin;
	}
	qsort(m->other, m->n_other, sizeof *m->other, cmp_other);
	/* the memfd's layout, decided here so the plan check can charge it:
	 * name order, each tensor on a RADIANCE_TENSORS_ALIGN boundary. The
	 * sizes come from validated headers (each within its file), so the
	 * sum stays far from overflowing. */
	uint64_t off = 0;
	for (size_t i = 0; i < m->n_other; i++) {
		off = (off + RADIANCE_TENSORS_ALIGN - 1) & ~(uint64_t)(RADIANCE_TENSORS_ALIGN - 1);
		m->other[i].offset = off;
		off += m->other[i].bytes;
	}
	m->tensors_bytes = (off + TENSORS_PAGE - 1) & ~(uint64_t)(TENSORS_PAGE - 1);
	return 0;
}

/* F_SEAL_WRITE fails with EBUSY while any page of the memfd has a
 * reference beyond the page cache's (a writable mapping, or a transient
 * one: I/O in flight, migration). memfd_wait_for_pins() in the kernel waits
 * ~150 ms for those; on a loaded machine that has not always been enough
 * (seen in CI), so wait a little longer, with backoff, before failing. */
static int seal_tensors(int fd)
{
	const int seals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	for (int attempt = 0;; attempt++) {
		if (fcntl(fd, F_ADD_SEALS, seals) == 0)
			return 0;
		if (errno != EBUSY || attempt == 6)
			return -errno;
		struct timespec ts = { 0, (10L << attempt) * 1000000L };   /* 10 .. 320 ms */
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
		}
	}
}

/* Bytes of a shared tensor copied per pread/pwrite pair: the embeddings
 * (tens of MB, GBs for large vocabularies) stream through this much, not
 * through a buffer of their size, which malloc would leave in a loader
 * thread's arena after the load (seen: +29 MB of RSS per loader thread). */
#define TENSORS_CHUNK (1u << 20)

/* The shared tensors: a memfd of the daemon's own that no client holds
 * until it is sealed. Each tensor is copied out of its file with pread
 * (radiance_st_read_part: a client's shrinking file is this load's -EIO)
 * and into place with pwrite, a chunk at a time; the memfd is never mapped
 * here, so nothing of the daemon's can keep a page of it busy when it is
 * sealed and nobody, the daemon included, can change or resize it again. */
int radiance__ck_build_tensors(struct ck_loader *L, struct radiance_model *m)
{
	char mname[200];
	snprintf(mname, sizeof mname, "radiance-tensors:%s", m->name);
	int fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		int e = errno;
		ck_err(L, "shared tensors of \"%s\": memfd_create: %s", m->name, strerror(e));
		return -e;
	}
	int rc = 0;
	uint8_t *chunk = NULL;
	if (m->tensors_bytes > (uint64_t)INT64_MAX || ftruncate(fd, (off_t)m->tensors_bytes) < 0) {
		rc = m->tensors_bytes > (uint64_t)INT64_MAX ? -ENOMEM : -errno;
		ck_err(L, "shared tensors of \"%s\": %" PRIu64 " bytes: %s", m->name, m->tensors_bytes,
		       strerror(-rc));
		goto out;
	}
	for (size_t i = 0; i < m->n_other; i++) {
		const struct radiance_tensor_info *o = &m->other[i];
		struct ck_ref key = { .name = o->name };
		const struct ck_ref *r = bsearch(&key, L->refs, L->n_refs, sizeof key, ck_cmp_ref);
		if (!r) {   /* m->other was made from L->refs */
			ck_err(L, "shared tensors: \"%s\" vanished from the index", o->name);
			rc = -EINVAL;
			goto out;
		}
		if (!chunk && o->bytes && !(chunk = malloc(TENSORS_CHUNK))) {
			rc = ck_nomem(L, o->name);
			goto out;
		}
		for (uint64_t done = 0; done < o->bytes;) {
			uint64_t n = o->bytes - done < TENSORS_CHUNK ? o->bytes - done : TENSORS_CHUNK;
			if ((rc = radiance_st_read_part(r->f, r->t, done, n, chunk, L->err, L->errlen)))
				goto out;
			if ((rc = rio_pwrite_all(fd, chunk, (size_t)n, o->offset + done))) {
				ck_err(L, "shared tensors of \"%s\": writing \"%s\" (%" PRIu64 " bytes at %"
				       PRIu64 "): %s", m->name, o->name, n, o->offset + done, strerror(-rc));
				goto out;
			}
			done += n;
		}
	}
	if ((rc = seal_tensors(fd))) {
		ck_err(L, "shared tensors of \"%s\": sealing the memfd: %s", m->name, strerror(-rc));
		goto out;
	}
	/* What clients get is a read-only open of it: a MAP_SHARED mapping
	 * of an O_RDONLY fd can never become writable (mprotect: EACCES), on
	 * any kernel; through a read-write fd that rests on the seal checks,
	 * which older kernels (before 6.7's VM_MAYWRITE rework) did not make
	 * the same way. Without /proc the seals alone stand guard. */
	char self[64];
	snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
	int ro = open(self, O_RDONLY | O_CLOEXEC);
	if (ro >= 0) {
		close(fd);
		fd = ro;
	}
	m->tensors_fd = fd;
	fd = -1;
out:
	free(chunk);
	if (fd >= 0)
		close(fd);
	return rc;
}
