/*
 * The daemon's counters (GetStats), copied into library-owned structs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client-private.h"
#include "proto_util.h"

static void stats_from_pb(struct radiance_stats *s, const Rdw__Stats *pb)
{
	memset(s, 0, sizeof *s);
	if (!pb)
		return;
	s->requests = pb->requests;
	s->rows = pb->rows;
	s->bytes_in = pb->bytes_in;
	s->bytes_out = pb->bytes_out;
	s->errors = pb->errors;
	s->latency_p50_ns = pb->latency_p50_ns;
	s->latency_p99_ns = pb->latency_p99_ns;
	s->latency_max_ns = pb->latency_max_ns;
	s->sessions = pb->sessions;
	s->uptime_ns = pb->uptime_ns;
}

void radiance_stats_free(struct radiance_stats_reply *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n_sessions; i++)
		free((char *)s->sessions[i].client_name);
	free(s->sessions);
	free((uint32_t *)s->session_weights);
	free((uint64_t *)s->latency_le_ns);
	free((uint64_t *)s->latency_cumulative);
	free(s);
}

static int get_stats(struct radiance *r, struct radiance_stats_reply **out)
{
	if (!out)
		return radiance__client_fail(r, -EINVAL, "the result pointer is NULL");
	*out = NULL;
	if (r->error)
		return r->error;
	Rdw__GetStats get = RDW__GET_STATS__INIT;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_GET_STATS;
	msg.get_stats = &get;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_STATS) {
		rc = radiance__client_break(r, -EPROTO, "get_stats answered with %s",
				     rproto_server_name(reply));
		goto out;
	}
	const Rdw__StatsReply *pb = reply->stats;
	struct radiance_stats_reply *s = calloc(1, sizeof *s);
	uint32_t *weights = NULL;
	if (!s || (pb->n_sessions && (!(s->sessions = calloc(pb->n_sessions, sizeof *s->sessions)) ||
				      !(weights = calloc(pb->n_sessions, sizeof *weights))))) {
		if (s)
			free(s->sessions);
		free(s);
		rc = radiance__client_fail(r, -ENOMEM, "out of memory");
		goto out;
	}
	stats_from_pb(&s->global, pb->global);
	/* the histogram: two arrays of one length, bounds increasing, counts
	 * not decreasing; otherwise it is left out. The counts may run ahead
	 * of `requests` (not one atomic snapshot). */
	const Rdw__Stats *g = pb->global;
	if (g && g->n_latency_le_ns && g->n_latency_le_ns == g->n_latency_cumulative &&
	    g->n_latency_le_ns <= 1024) {
		size_t n = g->n_latency_le_ns, i = 0;
		for (; i < n; i++)
			if (i && (g->latency_le_ns[i] <= g->latency_le_ns[i - 1] ||
				  g->latency_cumulative[i] < g->latency_cumulative[i - 1]))
				break;
		uint64_t *le = i == n ? malloc(n * sizeof *le) : NULL;
		uint64_t *cum = le ? malloc(n * sizeof *cum) : NULL;
		if (cum) {
			memcpy(le, g->latency_le_ns, n * sizeof *le);
			memcpy(cum, g->latency_cumulative, n * sizeof *cum);
			s->latency_le_ns = le;
			s->latency_cumulative = cum;
			s->n_latency_buckets = n;
			s->latency_sum_ns = g->latency_sum_ns;
		} else {
			free(le);
		}
	}
	s->launches = g ? g->launches : 0;
	stats_from_pb(&s->session, pb->session);
	s->session_weights = weights;
	for (size_t i = 0; i < pb->n_sessions; i++) {
		const Rdw__SessionStats *ps = pb->sessions[i];
		struct radiance_session_stats *ss = &s->sessions[i];
		s->n_sessions = i + 1;
		ss->session_id = ps->session_id;
		ss->pid = ps->pid;
		ss->uid = ps->uid;
		weights[i] = ps->weight;
		stats_from_pb(&ss->stats, ps->stats);
		if (!(ss->client_name = strdup(ps->client_name ? ps->client_name : ""))) {
			radiance_stats_free(s);
			rc = radiance__client_fail(r, -ENOMEM, "out of memory");
			goto out;
		}
	}
	*out = s;
out:
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}

int radiance_get_stats(struct radiance *r, struct radiance_stats_reply **out)
{
	RADIANCE__GUARDED(r, get_stats(r, out));
}
