/*
 * Shared tensors (ListTensors / MapTensors; docs/engines.md "Shared
 * tensors") against the real radianced on the CPU backend and the real
 * checkpoint:
 *   - list: every tensor of no linear layer (the ModelInfo inventory), with
 *     dtype, shape, bytes and an aligned offset inside the memfd;
 *   - map: the bytes equal the checkpoint file's, read here independently
 *     (the safetensors header parsed with jansson, the data with pread);
 *   - read-only: the four seals are on; a write through the mapping kills a
 *     child with SIGSEGV; mprotect(PROT_WRITE), a writable shared mmap,
 *     write(), ftruncate() and adding seals are all refused;
 *   - one copy: two processes that map it see the same memfd (st_dev,
 *     st_ino) and, where /proc/self/pagemap shows frame numbers (root), the
 *     same physical page;
 *   - freed with the model: once the last user releases it, the daemon holds
 *     no fd of it any more, while a mapping taken before still reads it;
 *   - charged: a max_model_bytes that fits the layers but not the shared
 *     tensors refuses the load (-EDQUOT, naming the limit), one that fits
 *     both loads it;
 *   - refusals (raw frames): a model the session does not hold (MapTensors)
 *     or that is not resident (ListTensors) is ENOENT and the session goes on;
 *     the Welcome an old client reads is protocol 1 with tensors_version set;
 *   - an older daemon (a fake one whose Welcome has no tensors_version): the
 *     library answers ENOTSUP itself and sends nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>

#include "checkpoint.h"
#include "raw_client.h"
#include "wire.h"

#define SEALS_ALL (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static struct h_daemon daemon_;
static char ckpt[512];

static int start(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	return h_daemon_start(&daemon_);
}

static int stop(void **state)
{
	return h_daemon_stop_clean(&daemon_);
}

static struct radiance *connect_to(const char *socket)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 20000;
	struct radiance *r = radiance_connect(socket, &o);
	assert_non_null(r);
	return r;
}

static struct radiance *connect_load(uint32_t *id)
{
	struct radiance *r = connect_to(daemon_.socket);
	int rc = radiance_load_model(r, ckpt, NULL, id);
	if (rc)
		fail_msg("load: %s", radiance_error_message(r));
	return r;
}

static struct radiance_tensors *map_or_fail(struct radiance *r, uint32_t id)
{
	struct radiance_tensors *t = NULL;
	int rc = radiance_map_tensors(r, id, &t);
	if (rc)
		fail_msg("map_tensors: %d %s", rc, radiance_error_message(r));
	return t;
}

/* ---- the checkpoint, read here without the daemon's reader ---------------- */

struct file_tensor {
	char name[256];
	char dtype[16];
	uint64_t begin, end;          /* absolute file offsets */
};

/* The tensors of model.safetensors from its header (jansson), without
 * __metadata__; returns how many. */
static size_t read_header(const char *path, struct file_tensor *out, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	uint64_t n;
	assert_int_equal(pread(fd, &n, 8, 0), 8);
	char *h = malloc(n);
	assert_non_null(h);
	assert_int_equal(pread(fd, h, n, 8), (ssize_t)n);
	close(fd);
	json_error_t je;
	json_t *j = json_loadb(h, n, 0, &je);
	free(h);
	assert_non_null(j);
	size_t count = 0;
	const char *key;
	json_t *v;
	json_object_foreach(j, key, v) {
		if (!strcmp(key, "__metadata__"))
			continue;
		assert_true(count < cap);
		struct file_tensor *t = &out[count++];
		snprintf(t->name, sizeof t->name, "%s", key);
		snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(json_object_get(v, "dtype")));
		json_t *off = json_object_get(v, "data_offsets");
		t->begin = 8 + n + (uint64_t)json_integer_value(json_array_get(off, 0));
		t->end = 8 + n + (uint64_t)json_integer_value(json_array_get(off, 1));
	}
	json_decref(j);
	return count;
}

static const struct file_tensor *file_find(const struct file_tensor *v, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, name))
			return &v[i];
	return NULL;
}

/* ---- list, map, values ---------------------------------------------------- */

static void list_and_values(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);
	assert_int_equal(radiance_get_server_info(r)->tensors_version, RADIANCE_TENSORS_VERSION);
	const struct radiance_model_info *mi = radiance_held_model(r, id);
	assert_non_null(mi);

	struct radiance_tensors *l = NULL;
	assert_int_equal(radiance_list_tensors(r, id, &l), 0);
	assert_null(l->base);
	assert_int_equal(l->fd, -1);
	/* the listing is the inventory ModelInfo gives, in its order */
	assert_int_equal(l->count, mi->n_other);
	assert_true(l->count >= 5);
	uint64_t sum = 0;
	for (size_t i = 0; i < l->count; i++) {
		const struct radiance_tensor *t = &l->tensors[i];
		assert_string_equal(t->name, mi->other[i].name);
		assert_string_equal(t->dtype, mi->other[i].dtype);
		assert_int_equal(t->ndim, mi->other[i].ndim);
		for (uint32_t d = 0; d < t->ndim; d++)
			assert_int_equal(t->shape[d], mi->other[i].shape[d]);
		assert_null(t->data);
		assert_int_equal(t->offset % RADIANCE_TENSORS_ALIGN, 0);
		if (i)
			assert_true(t->offset >= l->tensors[i - 1].offset + l->tensors[i - 1].bytes);
		sum += t->bytes;
	}
	assert_true(l->bytes >= sum && l->bytes % 4096 == 0 && l->bytes < sum + 4096 + 64 * l->count);
	const struct radiance_tensor *we = radiance_find_tensor(l, "embeddings.word_embeddings.weight");
	assert_non_null(we);
	assert_int_equal(we->ndim, 2);
	assert_int_equal(we->shape[1], 384);
	assert_null(radiance_find_tensor(l, "encoder.layer.0.attention.self.query.qweight"));
	assert_null(radiance_find_tensor(l, "no.such.tensor"));

	struct radiance_tensors *t = map_or_fail(r, id);
	assert_int_equal(t->count, l->count);
	assert_int_equal(t->bytes, l->bytes);
	assert_non_null(t->base);
	assert_true(t->fd >= 0);

	char path[600];
	snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
	static struct file_tensor ft[1024];
	size_t nft = read_header(path, ft, 1024);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	uint64_t compared = 0;
	for (size_t i = 0; i < t->count; i++) {
		const struct radiance_tensor *x = &t->tensors[i];
		const struct file_tensor *f = file_find(ft, nft, x->name);
		if (!f)
			fail_msg("shared tensor %s is not in %s", x->name, path);
		assert_string_equal(x->dtype, f->dtype);
		assert_int_equal(x->bytes, f->end - f->begin);
		assert_ptr_equal(x->data, (const uint8_t *)t->base + x->offset);
		assert_int_equal((uintptr_t)x->data % RADIANCE_TENSORS_ALIGN, 0);
		uint8_t *want = malloc(x->bytes ? x->bytes : 1);
		assert_non_null(want);
		assert_int_equal(pread(fd, want, x->bytes, (off_t)f->begin), (ssize_t)x->bytes);
		if (memcmp(want, x->data, x->bytes))
			fail_msg("shared tensor %s differs from the checkpoint's bytes", x->name);
		free(want);
		compared += x->bytes;
	}
	close(fd);
	/* and every tensor of the file that no linear uses is among them */
	size_t shared_in_file = 0;
	for (size_t i = 0; i < nft; i++)
		shared_in_file += radiance_find_tensor(t, ft[i].name) != NULL;
	assert_int_equal(shared_in_file, t->count);
	printf("# %zu shared tensors, %llu bytes equal to the checkpoint's, memfd %llu bytes\n",
	       t->count, (unsigned long long)compared, (unsigned long long)t->bytes);

	/* the model's resident bytes count the memfd once */
	uint64_t layers = 0;
	for (size_t i = 0; i < mi->n_layers; i++)
		layers += mi->layers[i].bytes;
	assert_int_equal(mi->resident_bytes, layers + t->bytes);

	radiance_tensors_free(l);
	radiance_tensors_free(t);
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);
}

/* ---- read-only ------------------------------------------------------------ */

static void read_only(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);
	struct radiance_tensors *t = map_or_fail(r, id);
	const struct radiance_tensor *x = radiance_find_tensor(t, "embeddings.LayerNorm.weight");
	assert_non_null(x);

	int seals = fcntl(t->fd, F_GET_SEALS);
	assert_int_equal(seals & SEALS_ALL, SEALS_ALL);
	/* the daemon passes a read-only open of its memfd */
	assert_int_equal(fcntl(t->fd, F_GETFL) & O_ACCMODE, O_RDONLY);
	errno = 0;
	assert_int_equal(fcntl(t->fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	assert_int_equal(errno, EPERM);

	/* a write through the mapping faults: in a child, which dies of it */
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		*(volatile uint8_t *)x->data = 0x55;
		_exit(0);   /* not reached */
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!WIFSIGNALED(st) || (WTERMSIG(st) != SIGSEGV && WTERMSIG(st) != SIGBUS))
		fail_msg("a write to the shared tensors did not fault (status 0x%x)", st);

	/* making it writable is refused, however it is tried */
	void *page = (void *)t->base;
	errno = 0;
	assert_int_equal(mprotect(page, 4096, PROT_READ | PROT_WRITE), -1);
	assert_int_equal(errno, EACCES);
	errno = 0;
	assert_true(mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0) == MAP_FAILED);
	assert_int_equal(errno, EACCES);   /* not open for writing */
	/* and the memfd itself through a writable open of it: the seals */
	char self[64];
	snprintf(self, sizeof self, "/proc/self/fd/%d", t->fd);
	int rw = open(self, O_RDWR | O_CLOEXEC);
	assert_true(rw >= 0);
	errno = 0;
	assert_true(mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) == MAP_FAILED);
	assert_int_equal(errno, EPERM);
	uint8_t b = 0;
	errno = 0;
	assert_int_equal(pwrite(rw, &b, 1, 0), -1);
	assert_int_equal(errno, EPERM);
	errno = 0;
	assert_int_equal(ftruncate(rw, 0), -1);
	assert_int_equal(errno, EPERM);
	errno = 0;
	assert_int_equal(ftruncate(rw, (off_t)t->bytes + 4096), -1);
	assert_int_equal(errno, EPERM);
	errno = 0;
	assert_int_equal(fcntl(rw, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
	assert_int_equal(errno, EPERM);   /* F_SEAL_SEAL */
	close(rw);
	/* a private writable mapping copies on write: the shared bytes stay */
	uint8_t before = *(const uint8_t *)x->data;
	uint8_t *priv = mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, t->fd, 0);
	assert_true(priv != MAP_FAILED);
	priv[x->offset] = (uint8_t)(before ^ 0xFF);
	assert_int_equal(*(const uint8_t *)x->data, before);
	munmap(priv, t->bytes);

	radiance_tensors_free(t);
	radiance_disconnect(r);
}

/* ---- one copy in two processes --------------------------------------------- */

/* The physical frame of the page at p, or 0 when pagemap hides it (no
 * CAP_SYS_ADMIN) or the page is not present. */
static uint64_t frame_of(const void *p)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	uint64_t e = 0;
	off_t at = (off_t)((uintptr_t)p / 4096 * 8);
	ssize_t n = pread(fd, &e, 8, at);
	close(fd);
	if (n != 8 || !(e & (1ull << 63)))
		return 0;
	return e & ((1ull << 55) - 1);
}

struct seen {
	uint64_t dev, ino, frame;
	uint8_t first[64];
	int rc;
};

static void what_i_see(const struct radiance_tensors *t, const struct radiance_tensor *x, struct seen *s)
{
	struct stat sb;
	assert_int_equal(fstat(t->fd, &sb), 0);
	s->dev = sb.st_dev;
	s->ino = sb.st_ino;
	memcpy(s->first, x->data, sizeof s->first);   /* faults the page in */
	s->frame = frame_of(x->data);
}

static void same_pages(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);
	int p[2];
	assert_int_equal(pipe(p), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* another process: its own session, attaching by name */
		close(p[0]);
		struct seen s = { .rc = -1 };
		struct radiance_options o = RADIANCE_OPTIONS_INIT;
		struct radiance *c = radiance_connect(daemon_.socket, &o);
		uint32_t cid;
		struct radiance_tensors *t = NULL;
		if (c && radiance_attach_model(c, radiance_held_model(r, id)->name, &cid) == 0 &&
		    (s.rc = radiance_map_tensors(c, cid, &t)) == 0)
			what_i_see(t, radiance_find_tensor(t, "embeddings.word_embeddings.weight"), &s);
		ssize_t n = write(p[1], &s, sizeof s);
		radiance_tensors_free(t);
		radiance_disconnect(c);
		_exit(n == sizeof s ? 0 : 1);
	}
	close(p[1]);
	struct seen theirs;
	assert_int_equal(read(p[0], &theirs, sizeof theirs), sizeof theirs);
	close(p[0]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_equal(theirs.rc, 0);

	struct radiance_tensors *t = map_or_fail(r, id);
	struct seen mine;
	what_i_see(t, radiance_find_tensor(t, "embeddings.word_embeddings.weight"), &mine);
	assert_int_equal(mine.dev, theirs.dev);
	assert_int_equal(mine.ino, theirs.ino);
	assert_memory_equal(mine.first, theirs.first, sizeof mine.first);
	if (mine.frame && theirs.frame) {
		assert_int_equal(mine.frame, theirs.frame);
		printf("# two processes: one memfd (inode %llu), page frame 0x%llx in both\n",
		       (unsigned long long)mine.ino, (unsigned long long)mine.frame);
	} else {
		printf("# two processes: one memfd (inode %llu); page frames hidden by "
		       "/proc/self/pagemap here (needs CAP_SYS_ADMIN), not compared\n",
		       (unsigned long long)mine.ino);
	}
	radiance_tensors_free(t);
	radiance_disconnect(r);
}

/* ---- freed with the model ------------------------------------------------- */

/* fds of pid that are a shared-tensors memfd */
static int tensor_memfds(pid_t pid)
{
	char dir[64], link[384], target[512];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(link, sizeof link, "%s/%s", dir, e->d_name);
		ssize_t len = readlink(link, target, sizeof target - 1);
		if (len <= 0)
			continue;
		target[len] = 0;
		if (strstr(target, "memfd:radiance-tensors:")) {
			n++;
			if (getenv("DEBUG_FDS"))
				printf("# daemon fd %s -> %s\n", e->d_name, target);
		}
	}
	closedir(d);
	return n;
}

/* tensor_memfds(pid), once it is want or after 10 s (a hang guard, not a
 * timing bound): the daemon closes the dup it puts on a reply frame just
 * after the send, and frees a model on the executor, both racing with us. */
static int tensor_memfds_settled(pid_t pid, int want)
{
	int n = tensor_memfds(pid);
	for (int i = 0; i < 2000 && n != want; i++) {
		usleep(5000);
		n = tensor_memfds(pid);
	}
	return n;
}

static void freed_with_model(void **state)
{
	assert_int_equal(tensor_memfds(daemon_.pid), 0);
	uint32_t id;
	struct radiance *r = connect_load(&id);
	assert_int_equal(tensor_memfds(daemon_.pid), 1);
	struct radiance_tensors *t = map_or_fail(r, id);
	struct radiance_tensors *t2 = map_or_fail(r, id);   /* twice: still one in the daemon */
	assert_int_equal(tensor_memfds_settled(daemon_.pid, 1), 1);
	uint8_t first[64];
	memcpy(first, t->tensors[0].data, sizeof first);
	radiance_tensors_free(t2);

	assert_int_equal(radiance_release_model(r, id), 0);
	/* the unload runs on the executor: wait for the model to go */
	struct radiance_model_list *ml = NULL;
	for (int i = 0; i < 2000; i++) {
		radiance_model_list_free(ml);
		assert_int_equal(radiance_list_models(r, &ml), 0);
		if (ml->count == 0)
			break;
		usleep(5000);
	}
	assert_int_equal(ml->count, 0);
	radiance_model_list_free(ml);
	assert_int_equal(tensor_memfds_settled(daemon_.pid, 0), 0);
	/* the mapping taken before keeps its pages (documented) */
	assert_memory_equal(first, t->tensors[0].data, sizeof first);
	struct radiance_tensors *gone = (void *)1;
	assert_int_equal(radiance_list_tensors(r, id, &gone), -ENOENT);
	assert_null(gone);
	assert_int_equal(radiance_map_tensors(r, id, &gone), -ENOENT);
	radiance_tensors_free(t);
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);
}

/* ---- charged to the model -------------------------------------------------- */

static void limit_counts_tensors(void **state)
{
	char err[512];
	struct radiance_model *m = NULL;
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	assert_int_equal(radiance_checkpoint_load_dir(ckpt, NULL, NULL, NULL, &m, err, sizeof err), 0);
	uint64_t layers = m->resident_bytes - m->tensors_bytes;
	assert_true(m->tensors_bytes > 0);
	char below[32], exact[32];
	snprintf(below, sizeof below, "%llu", (unsigned long long)(m->resident_bytes - 1));
	snprintf(exact, sizeof exact, "%llu", (unsigned long long)m->resident_bytes);
	radiance_model_destroy(m);

	/* room for the layers and all but one byte of the shared tensors */
	const char *const tight[] = { "--max-model-bytes", below, NULL };
	assert_int_equal(h_daemon_start_argv(&daemon_, tight), 0);
	struct radiance *r = connect_to(daemon_.socket);
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), -EDQUOT);
	const char *why = radiance_error_message(r);
	if (!strstr(why, "max_model_bytes") || !strstr(why, "resident bytes") ||
	    !strstr(why, "5.6M of linear weights, 22.8M of shared tensors"))
		fail_msg("refusal does not name the limit: '%s'", why);
	printf("# layers %llu bytes, + shared tensors over max_model_bytes = %s: \"%s\"\n",
	       (unsigned long long)layers, below, why);
	radiance_disconnect(r);
	assert_int_equal(h_daemon_stop_clean(&daemon_), 0);

	const char *const fits[] = { "--max-model-bytes", exact, NULL };
	assert_int_equal(h_daemon_start_argv(&daemon_, fits), 0);
	r = connect_to(daemon_.socket);
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	/* a second session mapping it costs nothing more: a second model would */
	struct radiance *r2 = connect_to(daemon_.socket);
	uint32_t id2;
	assert_int_equal(radiance_attach_model(r2, radiance_held_model(r, id)->name, &id2), 0);
	struct radiance_tensors *t = map_or_fail(r2, id2);
	struct radiance_tensors *t1 = map_or_fail(r, id);
	radiance_tensors_free(t);
	radiance_tensors_free(t1);
	radiance_disconnect(r2);
	radiance_disconnect(r);
	assert_int_equal(h_daemon_stop_clean(&daemon_), 0);
}

/* ---- raw refusals and what an old client reads ------------------------------ */

static void raw_refusals(void **state)
{
	struct raw w;
	assert_int_equal(raw_open_at(&w, daemon_.socket), 0);
	struct raw_welcome wl;
	raw_hello_welcome(&w, &wl);
	/* an old client reads protocol 1 and skips the unknown field 30 */
	assert_int_equal(wl.protocol_version, 1);
	assert_int_equal(wl.tensors_version, RADIANCE_TENSORS_VERSION);

	Rdw__ListTensors lt = RDW__LIST_TENSORS__INIT;
	lt.model_id = 9;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_LIST_TENSORS;
	m.list_tensors = &lt;
	raw_send_refused(&w, &m, ENOENT, "no resident model has model_id 9");
	Rdw__MapTensors mt = RDW__MAP_TENSORS__INIT;
	mt.model_id = 9;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_MAP_TENSORS;
	m.map_tensors = &mt;
	raw_send_refused(&w, &m, ENOENT, "not loaded by this session");
	raw_expect_alive(&w);
	raw_close(&w);

	/* a model resident in another session: listed, but not mapped by one
	 * that holds no reference (the library checks too) */
	uint32_t id;
	struct radiance *r = connect_load(&id);
	struct radiance *other = connect_to(daemon_.socket);
	struct radiance_tensors *t = NULL;
	assert_int_equal(radiance_list_tensors(other, id, &t), 0);
	radiance_tensors_free(t);
	t = (void *)1;
	assert_int_equal(radiance_map_tensors(other, id, &t), -ENOENT);
	assert_null(t);
	assert_int_equal(radiance_map_tensors(other, id, NULL), -EINVAL);
	assert_int_equal(radiance_get_error(other), 0);
	radiance_disconnect(other);
	radiance_disconnect(r);
}

/* A client that pipelines MapTensors and reads nothing: the daemon keeps at
 * most SESSION_FD_REPLIES_MAX_QUEUED (8) replies with their memfd dup unsent
 * and answers EBUSY beyond, instead of holding one descriptor per request.
 * 1000 replies of ~2 KiB are far more than a Unix socket buffers, so some
 * must wait in the daemon's queue. */
static void pipelined_maps_bounded(void **state)
{
	struct raw w;
	assert_int_equal(raw_open_at(&w, daemon_.socket), 0);
	raw_hello(&w);
	uint32_t id = raw_load_dir(&w, ckpt);
	enum { N = 1000 };
	Rdw__MapTensors mt = RDW__MAP_TENSORS__INIT;
	mt.model_id = id;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_MAP_TENSORS;
	m.map_tensors = &mt;
	raw_expect_fd_replies_capped(&w, daemon_.pid, &m, N, RDW__SERVER_MESSAGE__MSG_TENSOR_MAPPING,
				     "MapTensors");
	raw_expect_alive(&w);
	raw_close(&w);
}

/* ---- an older daemon ------------------------------------------------------- */

static void old_daemon_never_asked(void **state)
{
	struct raw_old old;
	raw_old_start(&old);
	struct radiance *r = radiance_connect(old.path, NULL);
	assert_non_null(r);
	assert_int_equal(radiance_get_server_info(r)->tensors_version, 0);
	struct radiance_tensors *t = (void *)1;
	assert_int_equal(radiance_list_tensors(r, 1, &t), -ENOTSUP);
	assert_null(t);
	assert_non_null(strstr(radiance_error_message(r), "does not serve shared tensors"));
	assert_int_equal(radiance_map_tensors(r, 1, &t), -ENOTSUP);
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);
	raw_old_reap(&old);   /* nothing but the Hello reached it */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(list_and_values, start, stop),
		cmocka_unit_test_setup_teardown(read_only, start, stop),
		cmocka_unit_test_setup_teardown(same_pages, start, stop),
		cmocka_unit_test_setup_teardown(freed_with_model, start, stop),
		cmocka_unit_test(limit_counts_tensors),
		cmocka_unit_test_setup_teardown(raw_refusals, start, stop),
		cmocka_unit_test_setup_teardown(pipelined_maps_bounded, start, stop),
		cmocka_unit_test(old_daemon_never_asked),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
