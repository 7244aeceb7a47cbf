// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ccscope: per-flow TCP congestion telemetry from BTF-typed tracepoints.
 *
 *   tp_btf/tcp_probe            every incoming segment on an established socket;
 *                               refreshes the flow at most once per sample interval
 *   tp_btf/tcp_retransmit_skb   retransmit counters per flow and per algorithm
 *   tp_btf/inet_sock_set_state  final values when a tracked flow reaches TCP_CLOSE;
 *                               the owning process at connect (SYN_SENT) and listen
 *   iter/task_file              run once at start: owners of the sockets that already exist
 *
 * The hot path (tcp_probe between samples) is an inlined per-CPU array
 * access and a compare against the socket's own clock (tp->tcp_mstamp): no
 * clock read, no hash lookup, and on Linux >= 6.2 no call at all (tcp_probe
 * and tcp_probe_skc below). Nothing here ever blocks: a full ring buffer only
 * bumps a counter.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "core_min.h"
#include "ccscope.h"
#include "tcp_probe_builds.h"

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7
#define TCP_LISTEN 10
#define RINGBUF_WAKEUP_BYTES (256 << 10) /* the loader never sizes the ring below 1 MiB */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Sizes are defaults; the loader resizes `flows` and `samples` before load. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct flow);
} flows SEC(".maps");

/*
 * Sockets already counted in cc_stats.flows, and when they were first seen. Socket-local
 * storage lives and dies with the socket, unlike an entry of the LRU `flows` map: a flow
 * evicted there and re-inserted when it shows up again is the same flow, not a new one.
 */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64); /* first_ns */
} first_seen SEC(".maps");

/* Each flow's retransmitted segments by cause; sized as `flows` by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct retrans_causes);
} retrans_causes SEC(".maps");

/*
 * Per socket: how much of its tp->total_retrans is already in cc_stats and cgroup_stats (add_retransmits), and
 * the causes of what it retransmitted before it was a flow. A socket becomes a flow at its first tcp_probe, an
 * incoming segment once established: its SYNs, a passive socket's SYN-ACKs, and a loss probe sent before the
 * first ACK came back (seen: 1 in 10 runs of a 10 %-loss test under a busy CPU) come before that. Their causes
 * wait here, where they die with the socket, and move to retrans_causes when its flow is made
 * (move_pending_causes): an LRU entry per untracked socket would let sockets never tracked (a full flow map)
 * evict the causes of tracked ones.
 */
struct retrans_mark {
	__u32 counted;
	__u32 pending[CCSCOPE_RETRANS_CAUSES];
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct retrans_mark);
} retrans_counted SEC(".maps");

/*
 * A socket's retrans_counted, made on first meeting it with `start` counted: 0 at its connect (everything it
 * will retransmit is ours to count, its SYNs too), its current total where we meet it later (at its first
 * sample or retransmission: a socket older than the probe, whose past is not this probe's to count).
 */
static __always_inline struct retrans_mark *retrans_mark(struct sock *sk, __u32 start)
{
	struct retrans_mark *mark = bpf_sk_storage_get(&retrans_counted, sk, 0, 0);

	if (mark)
		return mark;
	mark = bpf_sk_storage_get(&retrans_counted, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (mark)
		mark->counted = start;
	return mark;
}

/*
 * A connect counts from 0: a new socket's total_retrans is 0, and so is a reconnecting one's (tcp_disconnect()
 * zeroes it), whose storage would otherwise keep the last connection's count and make the next delta wrap.
 */
static __always_inline void restart_retrans_mark(struct sock *sk)
{
	struct retrans_mark *mark = bpf_sk_storage_get(&retrans_counted, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);

	if (mark) /* made zeroed, or the last connection's */
		*mark = (struct retrans_mark){};
}

/* `segments` retransmitted by the flow `cookie` for `cause`. */
static __always_inline void add_cause(__u64 cookie, __u32 cause, __u32 segments)
{
	struct retrans_causes *causes = bpf_map_lookup_elem(&retrans_causes, &cookie), fresh = {};

	if (!causes) {
		bpf_map_update_elem(&retrans_causes, &cookie, &fresh, BPF_NOEXIST);
		causes = bpf_map_lookup_elem(&retrans_causes, &cookie);
		if (!causes)
			return;
	}
	if (cause < CCSCOPE_RETRANS_CAUSES)
		__sync_fetch_and_add(&causes->segments[cause], segments);
}

/* A socket has just become the flow `cookie`: what it retransmitted before that is the flow's. */
static __always_inline void move_pending_causes(struct retrans_mark *mark, __u64 cookie)
{
	for (__u32 cause = 0; cause < CCSCOPE_RETRANS_CAUSES; cause++) {
		if (mark->pending[cause])
			add_cause(cookie, cause, mark->pending[cause]);
		mark->pending[cause] = 0;
	}
}

/*
 * Sampling gate: a small per-CPU direct-mapped cache of "socket cookie -> time of
 * its next sample". A hit costs an inlined array access and a compare; a miss
 * (new socket, collision, or another CPU sampled it) falls back to the flow
 * map, which holds the authoritative last sample time.
 */
#define GATE_SLOTS 1024

struct gate_slot {
	__u64 cookie;
	__u64 next_us; /* tcp_mstamp before which tcp_probe does nothing */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GATE_SLOTS);
	__type(key, __u32);
	__type(value, struct gate_slot);
} gates SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct cc_key);
	__type(value, struct cc_stats);
} cc_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 128);
	__type(key, struct hist_key);
	__type(value, struct hist);
} hists SEC(".maps");

/*
 * Owners of sockets not yet (or no longer) in `flows`: set at connect, read
 * once when tcp_probe first sees the flow. LRU: connects that never carry
 * data age out. The loader sizes it like `flows`.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct owner);
} owners SEC(".maps");

/* Listening sockets' owners: accepted flows are created in softirq, where `current` is nobody's. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct listener_key);
	__type(value, struct owner);
} listeners SEC(".maps");

/*
 * Host aggregates by cgroup, in slots: a flow learns its cgroup's slot once,
 * when it is created, so a sample costs an array access rather than a hash
 * lookup. Slot CCSCOPE_CGROUP_OTHER takes the cgroups that found no free
 * slot. Per-CPU: every flow of a busy cgroup updates the same slot at each
 * sample, and atomics on one shared line would cost more than the rest of the
 * sample. The loader sizes the three maps to --max-cgroups (+1 for the array),
 * fills free_slots with 1..--max-cgroups, and gives a slot back (zeroed) when
 * its cgroup has expired.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 129);
	__type(key, __u32);
	__type(value, struct cgroup_stats);
} cgroup_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 128);
	__type(key, __u64);   /* cgroup id */
	__type(value, __u32); /* its slot in cgroup_stats */
} cgroup_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 128);
	__type(value, __u32);
} free_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CCSCOPE_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &idx);

	if (value)
		*value += 1; /* per-CPU: no atomics needed */
}

static __always_inline struct config *get_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&config, &zero);
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

/*
 * All zeroes, the initial value of new hists: in .bss, not on the stack, which
 * tcp_probe and create_flow share (512 bytes together on 6.1's verifier).
 */
static struct hist zero_hist;

static __always_inline __u32 hist_slot(__u32 value_us)
{
	__u32 slot;

	/*
	 * Values are u32 microseconds, so log2 <= 31 < CCSCOPE_HIST_SLOTS. The
	 * barrier keeps clang from folding the mask into log2's arithmetic,
	 * where the 6.1 verifier loses track of the bound.
	 */
	slot = log2_u64(value_us);
	barrier_var(slot);
	return slot & (CCSCOPE_HIST_SLOTS - 1);
}

static __always_inline void hist_add(struct hist *h, __u32 value_us)
{
	__sync_fetch_and_add(&h->slots[hist_slot(value_us)], 1);
	__sync_fetch_and_add(&h->sum_us, value_us);
}

/* For per-CPU values: plain adds, no shared cache line to bounce between CPUs. */
static __always_inline void hist_add_local(struct hist *h, __u32 value_us)
{
	h->slots[hist_slot(value_us)] += 1;
	h->sum_us += value_us;
}

static __always_inline void observe(const char *ca_name, __u32 kind, __u32 value_us)
{
	struct hist_key key = { .kind = kind };
	struct hist *h;

	__builtin_memcpy(key.name, ca_name, CCSCOPE_CA_NAME_LEN);
	h = bpf_map_lookup_elem(&hists, &key);
	if (!h) {
		bpf_map_update_elem(&hists, &key, &zero_hist, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hists, &key);
		if (!h)
			return;
	}
	hist_add(h, value_us);
}

static __always_inline struct cc_stats *cc_stats_for(const char *ca_name)
{
	struct cc_key key;
	struct cc_stats *stats;

	__builtin_memcpy(key.name, ca_name, CCSCOPE_CA_NAME_LEN);
	stats = bpf_map_lookup_elem(&cc_stats, &key);
	if (stats)
		return stats;
	struct cc_stats empty = {};
	bpf_map_update_elem(&cc_stats, &key, &empty, BPF_NOEXIST);
	return bpf_map_lookup_elem(&cc_stats, &key);
}

/* A cgroup's slot in cgroup_stats; with `allocate`, a free one for a cgroup without. */
static __always_inline __u32 cgroup_slot(__u64 cgroup_id, int allocate)
{
	__u32 *found, slot;

	if (!cgroup_id)
		return CCSCOPE_CGROUP_OTHER;
	found = bpf_map_lookup_elem(&cgroup_slots, &cgroup_id);
	if (found)
		return *found;
	if (!allocate || bpf_map_pop_elem(&free_slots, &slot) != 0)
		return CCSCOPE_CGROUP_OTHER;
	if (bpf_map_update_elem(&cgroup_slots, &cgroup_id, &slot, BPF_NOEXIST) != 0) {
		bpf_map_push_elem(&free_slots, &slot, 0); /* another CPU gave this cgroup a slot first */
		found = bpf_map_lookup_elem(&cgroup_slots, &cgroup_id);
		return found ? *found : CCSCOPE_CGROUP_OTHER;
	}
	return slot;
}

static __always_inline struct cgroup_stats *cgroup_stats_at(__u32 slot)
{
	return bpf_map_lookup_elem(&cgroup_stats, &slot);
}

/*
 * The socket's cgroup v2 id, set when the socket was created (accepted
 * sockets inherit their listener's). 0 when this kernel keeps none.
 */
static __always_inline __u64 socket_cgroup_id(const struct sock *sk)
{
	struct cgroup *cgrp;

	if (!bpf_core_field_exists(sk->sk_cgrp_data))
		return 0;
	if (bpf_core_field_exists(sk->sk_cgrp_data.cgroup)) {
		cgrp = BPF_CORE_READ(sk, sk_cgrp_data.cgroup);
	} else {
		struct sock_cgroup_data___old *old = (void *)&sk->sk_cgrp_data;
		__u64 val = BPF_CORE_READ(old, val);

		if (val & 1) /* net_cls/net_prio data, not a cgroup pointer */
			return 0;
		cgrp = (struct cgroup *)val;
	}
	return cgrp ? BPF_CORE_READ(cgrp, kn, id) : 0;
}

static __always_inline void current_owner(struct owner *o)
{
	o->tgid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(o->comm, sizeof(o->comm));
}

static __always_inline struct listener_key listener_of(const struct sock *sk)
{
	struct listener_key key = {};

	key.netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	key.port = sk->__sk_common.skc_num;
	return key;
}

/*
 * seed_owners' key for a socket that had no cookie yet: its address. Kernel addresses lie above 2^63 and
 * cookies below, so both share the owners map; the entry is taken by the socket's flow or dropped at its close.
 */
static __always_inline __u64 address_key(const struct sock *sk)
{
	return (__u64)sk;
}

/* Owner of a new flow: its connect() record, else (accepted) its listener's, else the seed's, else none. */
static __always_inline void attribute(struct flow *f, const struct sock *sk, __u64 cookie)
{
	struct listener_key key;
	struct owner *o;
	__u64 address;

	f->cgroup_id = socket_cgroup_id(sk);
	o = bpf_map_lookup_elem(&owners, &cookie);
	if (!o) {
		key = listener_of(sk);
		o = bpf_map_lookup_elem(&listeners, &key);
	}
	if (!o) {
		address = address_key(sk);
		o = bpf_map_lookup_elem(&owners, &address);
		if (o) {
			bpf_map_update_elem(&owners, &cookie, o, BPF_NOEXIST);
			bpf_map_delete_elem(&owners, &address);
			o = bpf_map_lookup_elem(&owners, &cookie);
		}
	}
	if (o) {
		f->tgid = o->tgid;
		__builtin_memcpy(f->comm, o->comm, CCSCOPE_COMM_LEN);
	}
}

static __always_inline void read_ca_name(struct tcp_sock *tp, char *dst)
{
	const struct tcp_congestion_ops *ops = BPF_CORE_READ(tp, inet_conn.icsk_ca_ops);

	if (ops)
		bpf_probe_read_kernel_str(dst, CCSCOPE_CA_NAME_LEN, &ops->name);
}

/* Copy the kernel's current view of the socket into the flow record. */
static __always_inline void refresh(struct flow *f, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	f->last_ns = now;
	f->sk_state = sk->__sk_common.skc_state;
	f->ca_state = BPF_CORE_READ_BITFIELD_PROBED(&tp->inet_conn, icsk_ca_state);
	f->snd_cwnd = tp->snd_cwnd;
	f->snd_ssthresh = tp->snd_ssthresh;
	f->srtt_us = tp->srtt_us >> 3;   /* stored <<3 by the kernel */
	f->rttvar_us = tp->mdev_us >> 2; /* what tcp_get_info() reports */
	f->min_rtt_us = tp->rtt_min.s[0].v;
	f->mss_cache = tp->mss_cache;
	f->packets_out = tp->packets_out;
	f->retrans_out = tp->retrans_out;
	f->lost_out = tp->lost_out;
	f->sacked_out = tp->sacked_out;
	f->total_retrans = tp->total_retrans;
	if (bpf_core_field_exists(tp->lost))
		f->lost = tp->lost;
	f->delivered = tp->delivered;
	if (bpf_core_field_exists(tp->delivered_ce)) /* since 5.1 */
		f->delivered_ce = tp->delivered_ce;
	f->ecn_flags = tp->ecn_flags;
	/* INET_ECN_xmit() and INET_ECN_dontxmit() keep an IPv6 socket's tos beside its traffic class: one read */
	f->ecn_codepoint = tp->inet_conn.icsk_inet.tos & 3;
	if (bpf_core_field_exists(tp->dsack_dups)) /* since 5.0 */
		f->dsack_dups = tp->dsack_dups;
	f->rate_delivered = tp->rate_delivered;
	f->rate_interval_us = tp->rate_interval_us;
	f->bytes_acked = tp->bytes_acked;
	f->bytes_sent = tp->bytes_sent;
	f->bytes_received = tp->bytes_received;
	f->pacing_rate = sk->sk_pacing_rate;
	read_ca_name(tp, f->ca_name);
}

static __always_inline void emit(const struct flow *f, __u8 event, const struct config *cfg)
{
	struct flow *sample;

	if (!cfg || !cfg->emit_samples)
		return;
	sample = bpf_ringbuf_reserve(&samples, sizeof(*sample), 0);
	if (!sample) {
		count(CCSCOPE_CNT_SAMPLES_LOST);
		return;
	}
	__builtin_memcpy(sample, f, sizeof(*sample));
	sample->event = event;
	/*
	 * No wakeup per sample: consumers drain on their own timer (every
	 * 50-100 ms), which turns thousands of wakeups a second into a few.
	 * A filling buffer still wakes them at once.
	 */
	bpf_ringbuf_submit(sample, bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) > RINGBUF_WAKEUP_BYTES ?
					   BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	count(CCSCOPE_CNT_SAMPLES);
}

/*
 * Not inlined: it runs once per flow, and inlined its registers would spill
 * on tcp_probe's per-event path (measured: ~10 ns per event).
 */
static __noinline struct flow *create_flow(struct sock *sk, struct tcp_sock *tp, __u64 cookie, __u64 now,
						const struct config *cfg)
{
	struct retrans_mark *mark;
	struct flow f = {};
	struct cc_stats *stats;
	__u64 *seen;

	f.cookie = cookie;
	f.first_ns = now;
	f.netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	f.family = sk->__sk_common.skc_family;
	f.sport = sk->__sk_common.skc_num;
	f.dport = bpf_ntohs(sk->__sk_common.skc_dport);
	if (f.family == AF_INET6) {
		BPF_CORE_READ_INTO(&f.saddr, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&f.daddr, sk, __sk_common.skc_v6_daddr);
	} else {
		__builtin_memcpy(f.saddr, (const void *)&sk->__sk_common.skc_rcv_saddr, 4);
		__builtin_memcpy(f.daddr, (const void *)&sk->__sk_common.skc_daddr, 4);
	}
	read_ca_name(tp, f.ca_name);
	attribute(&f, sk, cookie);
	if (cfg->cgroup_stats)
		f.cgroup_slot = cgroup_slot(f.cgroup_id, 1);
	/*
	 * A new storage entry holds 0: this socket was never seen. Without storage (out of
	 * memory) the flow counts as new, as it would have without this check.
	 */
	mark = retrans_mark(sk, tp->total_retrans);
	seen = bpf_sk_storage_get(&first_seen, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (seen && *seen)
		f.first_ns = *seen; /* re-inserted after an eviction: the same flow */
	if (bpf_map_update_elem(&flows, &cookie, &f, BPF_NOEXIST) != 0) {
		count(CCSCOPE_CNT_FLOW_MAP_FULL);
		return 0;
	}
	count(CCSCOPE_CNT_FLOWS_CREATED); /* map insertions: evictions are derived from them */
	if (mark)
		move_pending_causes(mark, cookie);
	if (!seen || !*seen) {
		if (seen)
			*seen = now;
		stats = cc_stats_for(f.ca_name);
		if (stats)
			__sync_fetch_and_add(&stats->flows, 1);
		if (cfg->cgroup_stats) {
			struct cgroup_stats *cg = cgroup_stats_at(f.cgroup_slot);

			if (cg)
				cg->flows += 1;
		}
	}
	return bpf_map_lookup_elem(&flows, &cookie);
}

/*
 * The rest of tcp_probe, once the gate lets an event through: a sample may be due. Not inlined: between samples
 * tcp_probe then keeps a small stack frame and few registers (inlined, all of this made it save four
 * callee-saved registers and move its stack to the per-CPU private one on every event).
 */
static __noinline int sample(struct sock *sk, struct tcp_sock *tp, __u64 cookie, struct gate_slot *gate)
{
	struct config *cfg;
	struct flow *f;
	__u64 now, interval_ns, mstamp_ns;
	__u32 queue_us;

	cfg = get_config();
	if (!cfg)
		return 0;
	interval_ns = cfg->sample_interval_ns;
	mstamp_ns = tp->tcp_mstamp * 1000;
	f = bpf_map_lookup_elem(&flows, &cookie);
	if (f && mstamp_ns < f->last_ns + interval_ns) {
		gate->cookie = cookie; /* learn it on this CPU */
		gate->next_us = (f->last_ns + interval_ns) / 1000;
		return 0;
	}
	now = bpf_ktime_get_ns();
	gate->cookie = cookie;
	gate->next_us = (now + interval_ns) / 1000;
	if (!f) {
		f = create_flow(sk, tp, cookie, now, cfg);
		if (!f)
			return 0;
	}
	refresh(f, sk, tp, now);
	observe(f->ca_name, CCSCOPE_HIST_SRTT, f->srtt_us);
	queue_us = f->min_rtt_us && f->min_rtt_us != ~0U && f->srtt_us > f->min_rtt_us ?
		   f->srtt_us - f->min_rtt_us : 0;
	observe(f->ca_name, CCSCOPE_HIST_QUEUE_DELAY, queue_us);
	if (cfg->cgroup_stats) {
		struct cgroup_stats *cg = cgroup_stats_at(f->cgroup_slot);

		if (cg)
			hist_add_local(&cg->queue_delay, queue_us);
	}
	emit(f, CCSCOPE_EV_PROBE, cfg);
	return 0;
}

/*
 * The body of tcp_probe, for `tp` the socket seen as a tcp_sock (NULL: not a full TCP socket; never so where
 * tcp_probe fires, in tcp_rcv_established()). Inlined into each of the two programs below.
 */
static __always_inline int probe(struct sock *sk, struct tcp_sock *tp)
{
	__u64 cookie = socket_cookie(sk);
	__u32 slot = cookie & (GATE_SLOTS - 1); /* cookies are sequential: recent sockets get distinct slots */
	struct gate_slot *gate;

	count(CCSCOPE_CNT_PROBE_EVENTS);
	if (!tp)
		return 0;
	gate = bpf_map_lookup_elem(&gates, &slot);
	if (!gate)
		return 0;
	/*
	 * tcp_mstamp is the stack's own clock (us, CLOCK_MONOTONIC) as of the
	 * socket's previous event: stale by at most one packet, and free to read.
	 */
	if (gate->cookie == cookie && tp->tcp_mstamp < gate->next_us)
		return 0;
	return sample(sk, tp, cookie, gate);
}

/* tcp_probe and tcp_probe_skc (tcp_probe_builds.h): the loader loads the first this kernel takes. */
TCP_PROBE_BUILDS(tcp_probe, probe)

/*
 * Retransmitted segments as the kernel counts them (tp->total_retrans, tcpi_total_retrans): what the socket added
 * since it was last counted. Counting hits of tcp_retransmit_skb instead was wrong: a hit can carry several
 * segments (a reno flow at 2 % random loss: 49 hits, 141 segments), and newer kernels (6.18 here) also fire it
 * for retransmissions that failed; even each successful hit's segments fell short of TCP_INFO's now and then
 * (100 of 107).
 * Runs under the socket's lock (the tracepoint's and TCP_CLOSE's callers hold it): no two at once per socket.
 */
#define TCP_CA_RECOVERY 3
#define TCP_CA_LOSS 4
#define ICSK_TIME_LOSS_PROBE 5

/*
 * The cause, from where the kernel retransmits: tcp_retransmit_timer() enters Loss before it retransmits the
 * head (and the slow start after an RTO stays in Loss); fast retransmit and RACK's reordering timeout
 * retransmit in Recovery; tcp_send_loss_probe() runs from the write timer with icsk_pending still
 * ICSK_TIME_LOSS_PROBE (the RTO case clears it first), and only in Open. Checked in that order.
 */
static __always_inline __u32 retransmit_cause(struct tcp_sock *tp)
{
	__u8 state = BPF_CORE_READ_BITFIELD_PROBED(&tp->inet_conn, icsk_ca_state);

	if (state == TCP_CA_LOSS)
		return CCSCOPE_RETRANS_RTO;
	if (state == TCP_CA_RECOVERY)
		return CCSCOPE_RETRANS_FAST;
	if (bpf_core_field_exists(tp->inet_conn.icsk_pending) &&
	    BPF_CORE_READ(tp, inet_conn.icsk_pending) == ICSK_TIME_LOSS_PROBE)
		return CCSCOPE_RETRANS_TLP;
	return CCSCOPE_RETRANS_OTHER;
}

/*
 * `cookie`: the flow whose causes to count, 0 for a socket tcp_probe has yet to meet (its causes wait in its
 * retrans_mark). `cause`: why, as its caller knows it.
 */
static __always_inline void add_retransmits(struct sock *sk, struct tcp_sock *tp, __u32 slot, __u64 cookie,
					    __u32 cause)
{
	__u32 total = tp->total_retrans, segments;
	struct retrans_mark *mark = retrans_mark(sk, total);
	char ca_name[CCSCOPE_CA_NAME_LEN] = {};
	struct cgroup_stats *cg;
	struct cc_stats *stats;
	struct config *cfg;

	if (!mark)
		return;
	segments = total - mark->counted;
	mark->counted = total;
	if (!segments)
		return;
	if (cookie)
		add_cause(cookie, cause, segments);
	else if (cause < CCSCOPE_RETRANS_CAUSES)
		mark->pending[cause] += segments;
	read_ca_name(tp, ca_name);
	stats = cc_stats_for(ca_name);
	if (stats)
		__sync_fetch_and_add(&stats->retransmits, segments);
	cfg = get_config();
	if (cfg && cfg->cgroup_stats) {
		cg = cgroup_stats_at(slot);
		if (cg)
			cg->retransmits += segments;
	}
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tcp_retransmit_skb, const struct sock *sk, const struct sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie((void *)sk);
	struct flow *f = bpf_map_lookup_elem(&flows, &cookie);
	struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);

	count(CCSCOPE_CNT_RETRANSMIT_EVENTS);
	if (f)
		__sync_fetch_and_add(&f->retransmit_events, 1);
	if (tp)
		add_retransmits((struct sock *)sk, tp, f ? f->cgroup_slot : cgroup_slot(socket_cgroup_id(sk), 0),
				f ? cookie : 0, retransmit_cause(tp));
	return 0;
}

/*
 * A passive socket's handshake retransmits (SYN-ACKs, sent by its request's timer before the socket existed)
 * are in its total_retrans from birth (tcp_create_openreq_child); counted as it becomes established, as RTOs.
 */
static __always_inline void add_synack_retransmits(const struct sock *sk)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);

	if (tp && retrans_mark((struct sock *)sk, 0))
		add_retransmits((struct sock *)sk, tp, cgroup_slot(socket_cgroup_id(sk), 0), 0, CCSCOPE_RETRANS_RTO);
}

/*
 * connect() and listen() set these states from the calling task (tcp_v4_connect,
 * inet_csk_listen_start), so `current` is the socket's owner here; an accepted
 * socket reaches its states in softirq and is attributed through its listener.
 */
static __always_inline void record_owner(const struct sock *sk, int newstate)
{
	struct owner o = {};
	__u64 cookie;

	current_owner(&o);
	if (newstate == TCP_LISTEN) {
		struct listener_key key = listener_of(sk);

		bpf_map_update_elem(&listeners, &key, &o, BPF_ANY);
		return;
	}
	cookie = bpf_get_socket_cookie((void *)sk);
	bpf_map_update_elem(&owners, &cookie, &o, BPF_ANY);
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(inet_sock_set_state, const struct sock *sk, const int oldstate, const int newstate)
{
	__u64 cookie, address, now;
	struct flow *f;
	struct tcp_sock *tp;

	if (newstate == TCP_SYN_SENT || newstate == TCP_LISTEN) {
		record_owner(sk, newstate);
		if (newstate == TCP_SYN_SENT)
			restart_retrans_mark((struct sock *)sk);
		return 0;
	}
	if (oldstate == TCP_SYN_RECV && newstate == TCP_ESTABLISHED)
		add_synack_retransmits(sk);
	if (newstate != TCP_CLOSE)
		return 0;
	cookie = bpf_get_socket_cookie((void *)sk);
	if (oldstate == TCP_LISTEN) {
		struct listener_key key = listener_of(sk);

		bpf_map_delete_elem(&listeners, &key);
		return 0;
	}
	bpf_map_delete_elem(&owners, &cookie);
	address = address_key(sk); /* a seeded socket that closes before it is a flow */
	bpf_map_delete_elem(&owners, &address);
	f = bpf_map_lookup_elem(&flows, &cookie);
	if (!f) { /* untracked, or a flow the LRU evicted: its causes, if any, go with it */
		bpf_map_delete_elem(&retrans_causes, &cookie);
		return 0;
	}
	now = bpf_ktime_get_ns();
	tp = bpf_skc_to_tcp_sock((void *)sk);
	if (tp) {
		refresh(f, (struct sock *)sk, tp, now);
		add_retransmits((struct sock *)sk, tp, f->cgroup_slot, cookie, CCSCOPE_RETRANS_OTHER); /* a missed hit's */
	}
	f->sk_state = TCP_CLOSE;
	f->closed_ns = now;
	count(CCSCOPE_CNT_FLOWS_CLOSED);
	emit(f, CCSCOPE_EV_CLOSE, get_config());
	return 0;
}

/*
 * Run once by the loader right after attaching: the sockets that existed
 * before ccscope started never pass connect or listen again, so their owners
 * are taken from the file tables instead (the process holding the socket; for
 * an accepted socket, the process that accepted it). Records made since the
 * attach are fresher and are kept (BPF_NOEXIST); a flow tcp_probe created in
 * between gets its owner filled in.
 */
SEC("iter/task_file")
int seed_owners(struct bpf_iter__task_file *ctx)
{
	struct task_struct *task = ctx->task;
	struct file *file = ctx->file;
	struct owner o = {};
	struct socket *sock;
	struct sock *sk;
	struct flow *f;
	__u64 cookie;
	__u16 family;

	if (!task || !file)
		return 0;
	sock = bpf_sock_from_file(file);
	if (!sock || sock->type != SOCK_STREAM)
		return 0;
	sk = sock->sk;
	if (!sk)
		return 0;
	family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return 0;
	o.tgid = task->tgid;
	bpf_probe_read_kernel_str(o.comm, sizeof(o.comm), task->comm);
	if (sk->__sk_common.skc_state == TCP_LISTEN) {
		struct listener_key key = listener_of(sk);

		bpf_map_update_elem(&listeners, &key, &o, BPF_NOEXIST);
		return 0;
	}
	/*
	 * sock->sk is an untrusted pointer to the 6.18.44 verifier, which bpf_get_socket_cookie() refuses: the
	 * cookie is read as the helper would return it once made, and a socket without one yet (nothing has asked
	 * for it: tcp_probe, ss, SO_COOKIE) is keyed by its address until its flow is made.
	 */
	cookie = sk->__sk_common.skc_cookie.counter;
	if (!cookie) {
		cookie = address_key(sk);
		bpf_map_update_elem(&owners, &cookie, &o, BPF_NOEXIST);
		return 0;
	}
	bpf_map_update_elem(&owners, &cookie, &o, BPF_NOEXIST);
	f = bpf_map_lookup_elem(&flows, &cookie);
	if (f && !f->tgid) {
		f->tgid = o.tgid;
		__builtin_memcpy(f->comm, o.comm, CCSCOPE_COMM_LEN);
	}
	return 0;
}
