// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ccstate: each congestion control's own state per flow (BBR's mode, gains and estimates; CUBIC's W_max, K
 * and epoch; DCTCP's alpha), read with CO-RE from inet_csk(sk)->icsk_ca_priv on tcp:tcp_probe.
 *
 * An object of its own beside ccscope.bpf.o: a kernel that lacks one algorithm's type still loads it (the
 * reads of a missing type sit behind bpf_core_type_exists and are never run), and a kernel that refuses it
 * costs the flows their state, never their telemetry.
 *
 * Between copies, each segment costs a per-CPU array access, a compare of the socket's congestion ops and of
 * its state's key (change_key()): a change of either is copied on the segment after it, so a 200 ms PROBE_RTT
 * or a loss's new W_max is never lost between two periodic copies.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "core_min.h"
#include "core_cc.h"
#include "ccstate.h"
#include "tcp_probe_builds.h"
#include "cc/cc_state.h"

#define GATE_SLOTS 1024
#define BBR_PROBE_RTT 3

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384); /* the loader sizes it as the flows map */
	__type(key, __u64);
	__type(value, struct ccstate);
} ccstates SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ccstate_config);
} ccstate_config SEC(".maps");

/*
 * Every change of an algorithm's key (BBR's mode; CUBIC's W_max or its epoch starting or ending), as the whole
 * record after it, for `ccscope trace`: exact events, where the map holds only the latest. A flow's first copy
 * goes there too, and so may a copy on a CPU whose gate had not met the flow (the reader drops repeats).
 * 128 KiB holds 1820 records; a reader drains it every 100 ms.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 128 * 1024);
} ccstate_changes SEC(".maps");

/* Per CPU, per socket (by cookie, direct-mapped): what the last copy saw, and when the next is due. */
struct gate {
	__u64 cookie;
	__u64 ops;             /* icsk_ca_ops of the last copy: a change of algorithm classifies again */
	__u64 next_us;         /* tcp_mstamp before which no periodic copy is due */
	__u32 kind;
	__u32 key;             /* change_key() at the last copy */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GATE_SLOTS);
	__type(key, __u32);
	__type(value, struct gate);
} ccstate_gates SEC(".maps");

/*
 * What is copied at once when it changes: the algorithm's key (BBR's mode; CUBIC's W_max and whether an epoch
 * runs), and whether everything sent is acknowledged. The latter copies the state a flow comes to rest in: tcp_probe fires before
 * its segment is processed, so a copy shows the state after the segment before, and the periodic copy
 * compares the socket's clock as of that segment; without it, the state after a round's last ACK waited for
 * the next round (`ss` read pacing_gain 1.25 where the copy still said 1).
 */
static __always_inline __u32 change_key(struct tcp_sock *tp, __u32 kind)
{
	void *priv = tp->inet_conn.icsk_ca_priv;
	__u32 idle = tp->packets_out == 0;

	if (kind == CCSTATE_BBR && bpf_core_type_exists(struct bbr))
		return BPF_CORE_READ_BITFIELD((struct bbr *)priv, mode) << 1 | idle;
	if (kind == CCSTATE_CUBIC && bpf_core_type_exists(struct bictcp))
		return ((struct bictcp *)priv)->last_max_cwnd << 2 | !((struct bictcp *)priv)->epoch_start << 1 | idle;
	if (kind == CCSTATE_COPA)
		return ((struct copa *)priv)->slow_start << 3 | ((struct copa *)priv)->direction << 1 | idle;
	if (kind == CCSTATE_PRAGUE)	/* each CE response and each loss episode */
		return ((struct prague *)priv)->reductions << 2 | ((struct prague *)priv)->in_loss << 1 | idle;
	return idle;
}

/* ccscope's own algorithms by the tag they set at init (cc_state.h), whatever their name. */
static __always_inline __u32 tagged_kind(struct tcp_sock *tp)
{
	struct ccscope_ca_tag *tag = (void *)((char *)tp->inet_conn.icsk_ca_priv + CCSCOPE_CA_TAG_OFFSET);
	__u32 kind = tag->kind;

	if (tag->magic != CCSCOPE_CA_MAGIC || kind < CCSTATE_VEGAS || kind > CCSTATE_PRAGUE)
		return CCSTATE_NONE;
	return kind;
}

static __always_inline __u32 classify(struct tcp_sock *tp, const struct tcp_congestion_ops *ops)
{
	char name[8] = {};

	/* the kernel's by name first: struct bbr fills all 104 bytes, the tag's place included */
	if (!ops || bpf_probe_read_kernel(name, sizeof(name), ops->name) != 0)
		return CCSTATE_NONE;
	if (bpf_core_type_exists(struct bbr) && name[0] == 'b' && name[1] == 'b' && name[2] == 'r' && !name[3])
		return CCSTATE_BBR;
	if (bpf_core_type_exists(struct bictcp) && name[0] == 'c' && name[1] == 'u' && name[2] == 'b' &&
	    name[3] == 'i' && name[4] == 'c' && !name[5])
		return CCSTATE_CUBIC;
	if (bpf_core_type_exists(struct dctcp) && name[0] == 'd' && name[1] == 'c' && name[2] == 't' &&
	    name[3] == 'c' && name[4] == 'p' && !name[5])
		return CCSTATE_DCTCP;
	return tagged_kind(tp);
}

static __always_inline void copy_bbr(struct bbr_state *out, struct tcp_sock *tp, int counted)
{
	struct bbr *b = (void *)tp->inet_conn.icsk_ca_priv;
	__u8 mode;

	if (!bpf_core_type_exists(struct bbr))
		return;
	mode = BPF_CORE_READ_BITFIELD(b, mode);
	if (counted && mode != out->mode) {
		out->mode_changes += 1;
		if (mode == BBR_PROBE_RTT)
			out->probe_rtt_entries += 1;
	}
	out->mode = mode;
	out->min_rtt_us = b->min_rtt_us;
	out->mss = tp->mss_cache;
	out->bw = b->bw.s[0].v;
	/* the rest is tcp_bbr.c's since 4.9 or 4.10; a BBR without one of them still gives what it has */
	if (bpf_core_field_exists(b->lt_use_bw) && bpf_core_field_exists(b->lt_bw)) {
		out->lt_use_bw = BPF_CORE_READ_BITFIELD(b, lt_use_bw);
		if (out->lt_use_bw)
			out->bw = b->lt_bw;
	}
	if (bpf_core_field_exists(b->pacing_gain))
		out->pacing_gain = BPF_CORE_READ_BITFIELD(b, pacing_gain);
	if (bpf_core_field_exists(b->cwnd_gain))
		out->cwnd_gain = BPF_CORE_READ_BITFIELD(b, cwnd_gain);
	if (bpf_core_field_exists(b->cycle_idx))
		out->cycle_idx = BPF_CORE_READ_BITFIELD(b, cycle_idx);
	if (bpf_core_field_exists(b->full_bw_reached))
		out->full_bw_reached = BPF_CORE_READ_BITFIELD(b, full_bw_reached);
}

/*
 * W_max is set at every loss (cubictcp_recalc_ssthresh()), which also ends the epoch; an RTO then zeroes it
 * again (bictcp_reset() on entering Loss). One update is counted per copy that sees either change: a loss in
 * slow start ends no epoch but sets W_max, and a loss in congestion avoidance may set the W_max it had.
 */
static __always_inline void copy_cubic(struct cubic_state *out, struct tcp_sock *tp, int counted)
{
	struct bictcp *c = (void *)tp->inet_conn.icsk_ca_priv;
	__u32 epoch_start, wmax;

	if (!bpf_core_type_exists(struct bictcp))
		return;
	epoch_start = c->epoch_start;
	wmax = c->last_max_cwnd;
	if (counted && (wmax != out->last_max_cwnd || (!epoch_start && out->epoch_start)))
		out->wmax_updates += 1;
	out->epoch_start = epoch_start;
	out->last_max_cwnd = wmax;
	out->bic_K = c->bic_K;
	out->bic_origin_point = c->bic_origin_point;
	out->tcp_cwnd = c->tcp_cwnd;
	out->delay_min = c->delay_min;
	out->found = c->found;
	out->snd_cwnd = tp->snd_cwnd;
	out->snd_ssthresh = tp->snd_ssthresh;
}

static __always_inline void copy_vegas(struct vegas_state *out, struct tcp_sock *tp)
{
	struct vegas *v = (void *)tp->inet_conn.icsk_ca_priv;

	out->base_rtt_us = v->base_rtt_us;
	out->min_rtt_us = v->min_rtt_us;
	out->last_rtt_us = v->last_rtt_us;
	out->last_diff = v->last_diff;
	out->adjustments = v->adjustments;
	out->enabled = v->enabled;
	out->snd_cwnd = tp->snd_cwnd;
}

static __always_inline void copy_westwood(struct westwood_state *out, struct tcp_sock *tp)
{
	struct westwood *w = (void *)tp->inet_conn.icsk_ca_priv;

	out->bw_est = w->bw_est;
	out->bw_ns_est = w->bw_ns_est;
	out->rtt_min = w->rtt_min;
	out->rtt = w->rtt;
	out->hz = w->hz;
	out->mss = tp->mss_cache;
	out->snd_cwnd = tp->snd_cwnd;
	out->snd_ssthresh = tp->snd_ssthresh;
}

static __always_inline void copy_copa(struct copa_state *out, struct tcp_sock *tp)
{
	struct copa *c = (void *)tp->inet_conn.icsk_ca_priv;

	out->rtt_standing_us = c->rtt_standing.s[0].v;
	out->rtt_min_us = c->rtt_min;
	out->velocity_shift = c->velocity_shift;
	out->direction = c->direction;
	out->slow_start = c->slow_start;
	out->same_direction = c->same_direction;
	out->snd_cwnd = tp->snd_cwnd;
}

static __always_inline void copy_prague(struct prague_state *out, struct tcp_sock *tp)
{
	struct prague *p = (void *)tp->inet_conn.icsk_ca_priv;

	out->alpha = p->alpha;
	out->last_fraction = p->last_fraction;
	out->reductions = p->reductions;
	out->window_1024 = p->frac_cwnd >> 10;
	out->saw_ce = p->saw_ce;
	out->in_loss = p->in_loss;
	out->snd_cwnd = tp->snd_cwnd;
	out->snd_ssthresh = tp->snd_ssthresh;
}

static __always_inline void copy_dctcp(struct dctcp_state *out, struct tcp_sock *tp)
{
	struct dctcp *d = (void *)tp->inet_conn.icsk_ca_priv;

	if (!bpf_core_type_exists(struct dctcp))
		return;
	out->alpha = d->dctcp_alpha;
	out->loss_cwnd = d->loss_cwnd;
	out->ce_state = d->ce_state;
	out->snd_cwnd = tp->snd_cwnd;
	out->snd_ssthresh = tp->snd_ssthresh;
}

/* The record of this socket, made (or made again, after a change of algorithm) for `kind`. */
static __noinline struct ccstate *record_for(__u64 cookie, __u32 kind)
{
	struct ccstate *st = bpf_map_lookup_elem(&ccstates, &cookie);
	struct ccstate fresh = {};

	if (st && st->kind == kind)
		return st;
	fresh.cookie = cookie;
	fresh.kind = kind;
	if (bpf_map_update_elem(&ccstates, &cookie, &fresh, BPF_ANY) != 0)
		return 0;
	return bpf_map_lookup_elem(&ccstates, &cookie);
}

/* A copy is due: a new socket or algorithm, a change of the key word, or the periodic interval. */
static __noinline int copy(struct tcp_sock *tp, __u64 cookie, __u64 ops, struct gate *gate)
{
	__u32 key = 0, slot = 0, kind = gate->kind, old_key = gate->key;
	int met = gate->cookie == cookie && gate->ops == ops;
	struct ccstate_config *cfg;
	struct ccstate *st;
	int counted;
	__u64 now;

	if (gate->cookie != cookie || gate->ops != ops)
		kind = classify(tp, (const struct tcp_congestion_ops *)ops);
	cfg = bpf_map_lookup_elem(&ccstate_config, &slot);
	now = bpf_ktime_get_ns();
	gate->cookie = cookie;
	gate->ops = ops;
	gate->kind = kind;
	gate->next_us = (now + (cfg ? cfg->interval_ns : 10000000)) / 1000;
	if (kind == CCSTATE_NONE)
		return 0;
	st = record_for(cookie, kind);
	if (!st)
		return 0;
	counted = st->updated_ns != 0; /* a fresh record has nothing to compare with */
	if (kind == CCSTATE_BBR)
		copy_bbr(&st->bbr, tp, counted);
	else if (kind == CCSTATE_CUBIC)
		copy_cubic(&st->cubic, tp, counted);
	else if (kind == CCSTATE_VEGAS)
		copy_vegas(&st->vegas, tp);
	else if (kind == CCSTATE_WESTWOOD)
		copy_westwood(&st->westwood, tp);
	else if (kind == CCSTATE_COPA)
		copy_copa(&st->copa, tp);
	else if (kind == CCSTATE_PRAGUE)
		copy_prague(&st->prague, tp);
	else
		copy_dctcp(&st->dctcp, tp);
	st->updated_ns = now;
	key = change_key(tp, kind);
	gate->key = key;
	/* the key's lowest bit is "all acknowledged": a flow at rest is no change of the algorithm's */
	if (!met || !counted || (key >> 1) != (old_key >> 1))
		bpf_ringbuf_output(&ccstate_changes, st, sizeof(*st), 0);
	return 0;
}

static __always_inline int follow(struct sock *sk, struct tcp_sock *tp)
{
	__u64 cookie = socket_cookie(sk), ops;
	__u32 slot = cookie & (GATE_SLOTS - 1);
	struct gate *gate = bpf_map_lookup_elem(&ccstate_gates, &slot);

	if (!gate || !tp)
		return 0;
	ops = (__u64)tp->inet_conn.icsk_ca_ops;
	if (gate->cookie == cookie && gate->ops == ops) {
		if (gate->kind == CCSTATE_NONE)
			return 0;
		if (change_key(tp, gate->kind) == gate->key && tp->tcp_mstamp < gate->next_us)
			return 0;
	}
	return copy(tp, cookie, ops, gate);
}

/* ccstate_probe and ccstate_probe_skc (tcp_probe_builds.h): the loader takes the first this kernel loads. */
TCP_PROBE_BUILDS(ccstate_probe, follow)
