/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Structs shared by the BPF programs (ccscope.bpf.c) and userspace
 * (daemon/ccscope/bpf_types.py mirrors them; tests/test_layout.py checks
 * sizes and offsets against the compiled object's BTF).
 *
 * Every field is naturally aligned and explicitly padded, so the layout is
 * the same for clang -target bpf and for x86_64/arm64 userspace.
 */
#ifndef __CCSCOPE_H
#define __CCSCOPE_H

#define CCSCOPE_CA_NAME_LEN 16
#define CCSCOPE_HIST_SLOTS 32 /* log2 buckets of microseconds; a power of two, see observe() */
#define CCSCOPE_COMM_LEN 16    /* TASK_COMM_LEN */
#define CCSCOPE_CGROUP_OTHER 0 /* cgroup_stats slot of the cgroups that found no free slot */

/*
 * Why a flow record was emitted to the ring buffer. Retransmits are counted
 * (flow.retransmit_events, cc_stats), not streamed; 2 stays unused so the
 * numbers in existing CSVs keep their meaning.
 */
enum ccscope_event {
	CCSCOPE_EV_PROBE = 1,      /* tcp:tcp_probe, rate-limited per flow */
	CCSCOPE_EV_CLOSE = 3,      /* sock:inet_sock_set_state -> TCP_CLOSE */
};

/*
 * Why a segment was retransmitted, from the socket's state as tcp_retransmit_skb fires (retransmit_cause()):
 * RTO (the Loss state: the timer's retransmit and the slow start after it), fast retransmit (Recovery), a
 * tail-loss probe (the write timer's event is the loss probe), and anything else.
 */
enum ccscope_retrans_cause {
	CCSCOPE_RETRANS_RTO = 0,
	CCSCOPE_RETRANS_FAST = 1,
	CCSCOPE_RETRANS_TLP = 2,
	CCSCOPE_RETRANS_OTHER = 3,
	CCSCOPE_RETRANS_CAUSES = 4,
};

/* Histograms kept per congestion algorithm, observed once per sample interval per flow. */
enum ccscope_hist_kind {
	CCSCOPE_HIST_SRTT = 0,
	CCSCOPE_HIST_QUEUE_DELAY = 1, /* srtt - min_rtt */
};

/* Indexes of the per-CPU counter array. */
enum ccscope_counter {
	CCSCOPE_CNT_PROBE_EVENTS = 0,
	CCSCOPE_CNT_SAMPLES = 1,
	CCSCOPE_CNT_SAMPLES_LOST = 2,
	CCSCOPE_CNT_FLOWS_CREATED = 3,
	CCSCOPE_CNT_FLOWS_CLOSED = 4,
	CCSCOPE_CNT_RETRANSMIT_EVENTS = 5,
	CCSCOPE_CNT_FLOW_MAP_FULL = 6,
	CCSCOPE_CNT_MAX = 8,
};

/*
 * Per-flow state, keyed by socket cookie in the `flows` map. The same struct
 * is the payload of every ring-buffer sample, so userspace decodes one type.
 */
struct flow {
	__u64 cookie;
	__u64 first_ns;        /* bpf_ktime_get_ns() at first sight */
	__u64 last_ns;         /* time of the values below */
	__u64 closed_ns;       /* 0 while open */
	__u64 bytes_acked;
	__u64 bytes_sent;      /* includes retransmissions */
	__u64 bytes_received;
	__u64 pacing_rate;     /* bytes/s, ~0 when unlimited */
	__u32 netns;           /* network namespace inode */
	__u16 family;          /* AF_INET / AF_INET6 */
	__u16 sport;           /* host byte order */
	__u16 dport;           /* host byte order */
	__u8 ca_state;         /* TCP_CA_Open .. TCP_CA_Loss */
	__u8 sk_state;         /* TCP_ESTABLISHED .. */
	__u8 event;            /* enum ccscope_event of this copy */
	__u8 __pad0[3];
	__u8 saddr[16];        /* IPv4 in the first 4 bytes */
	__u8 daddr[16];
	__u32 snd_cwnd;        /* segments */
	__u32 snd_ssthresh;    /* segments */
	__u32 srtt_us;
	__u32 rttvar_us;
	__u32 min_rtt_us;
	__u32 mss_cache;
	__u32 packets_out;
	__u32 retrans_out;
	__u32 lost_out;
	__u32 sacked_out;
	__u32 total_retrans;   /* tcpi_total_retrans */
	__u32 lost;            /* total packets lost incl. rexmits, 0 if unknown */
	__u32 delivered;       /* packets */
	__u32 rate_delivered;  /* packets in the last rate sample */
	__u32 rate_interval_us;
	__u32 retransmit_events; /* tcp_retransmit_skb calls seen for this flow */
	char ca_name[CCSCOPE_CA_NAME_LEN];
	__u64 cgroup_id;       /* cgroup v2 id of the socket (inode of its directory); 0 if unknown */
	__u32 tgid;            /* process that connected, or listened for an accepted flow; 0 if unknown */
	__u32 cgroup_slot;     /* its cgroup's slot in cgroup_stats (with config.cgroup_stats) */
	char comm[CCSCOPE_COMM_LEN]; /* that process's name at connect/listen time */
	__u32 delivered_ce;    /* packets delivered with a CE mark, as the peer fed back (tcpi_delivered_ce) */
	__u8 ecn_flags;        /* tp->ecn_flags: bit 0 classic ECN, bit 4 AccECN (6.18+), both while pending */
	__u8 ecn_codepoint;    /* inet->tos & 3 as the last segment left: 0 Not-ECT, 1 ECT(1) (L4S), 2 ECT(0) */
	__u8 __pad1[2];
	__u32 dsack_dups;      /* segments the peer reported it already had (DSACK): spurious retransmits, 5.0+ */
	__u32 __pad2;
};

/* Retransmitted segments of one flow by cause, keyed by socket cookie in the `retrans_causes` map. */
struct retrans_causes {
	__u32 segments[CCSCOPE_RETRANS_CAUSES]; /* indexed by enum ccscope_retrans_cause */
};

/* Who opened a socket, recorded in process context at connect (by cookie) and at listen (by netns+port). */
struct owner {
	__u32 tgid;
	__u32 __pad0;
	char comm[CCSCOPE_COMM_LEN];
};

struct listener_key {
	__u32 netns;
	__u16 port;            /* host byte order */
	__u16 __pad0;
};

struct cc_key {
	char name[CCSCOPE_CA_NAME_LEN];
};

/* Host aggregates per congestion algorithm. */
struct cc_stats {
	__u64 flows;        /* flows first seen with this algorithm */
	__u64 retransmits;  /* retransmitted segments */
};

struct hist_key {
	char name[CCSCOPE_CA_NAME_LEN];
	__u32 kind;         /* enum ccscope_hist_kind */
	__u32 __pad0;
};

struct hist {
	__u64 slots[CCSCOPE_HIST_SLOTS]; /* slot i counts values in [2^i, 2^(i+1)) us; 0 goes to slot 0 */
	__u64 sum_us;
};

/* Host aggregates per cgroup (config.cgroup_stats), per-CPU, in the slot cgroup_slots gives the cgroup. */
struct cgroup_stats {
	__u64 flows;
	__u64 retransmits;
	struct hist queue_delay;
};

struct config {
	__u64 sample_interval_ns; /* per-flow minimum spacing of samples and histogram observations */
	__u32 emit_samples;       /* 0: keep maps only, 1: also stream samples to the ring buffer */
	__u32 cgroup_stats;       /* 1: also aggregate by cgroup into the cgroup_stats map */
};

#endif /* __CCSCOPE_H */
