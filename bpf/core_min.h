/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The few kernel types ccscope reads, declared with preserve_access_index so
 * every access is a CO-RE relocation resolved against the running kernel's
 * BTF at load time. Offsets and sizes here do not matter; names do. Keeping
 * our own minimal header (instead of a 130k-line vmlinux.h) makes the build
 * independent of the build machine's kernel.
 */
#ifndef __CCSCOPE_CORE_MIN_H
#define __CCSCOPE_CORE_MIN_H

#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)

struct ns_common {
	unsigned int inum;
};

struct net {
	struct ns_common ns;
};

typedef struct {
	struct net *net;
} possible_net_t;

struct in6_addr {
	union {
		__u8 u6_addr8[16];
	} in6_u;
};

typedef struct {
	__s64 counter;
} atomic64_t;

struct sock_common {
	atomic64_t skc_cookie;
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	possible_net_t skc_net;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
};

struct kernfs_node {
	__u64 id; /* u64 since 5.5: the cgroup id, and the inode number of its directory */
};

struct cgroup {
	struct kernfs_node *kn;
};

/* 5.15+: a plain pointer to the socket's cgroup v2 cgroup. */
struct sock_cgroup_data {
	struct cgroup *cgroup;
};

/*
 * Before 5.15: a union whose u64 `val` is the cgroup pointer, or (lowest bit
 * set) net_cls/net_prio data when cgroup v1 controllers claimed the socket.
 * CO-RE finds `val` inside the anonymous union.
 */
struct sock_cgroup_data___old {
	__u64 val;
};

struct sock {
	struct sock_common __sk_common;
	__u8 sk_pacing_status;		/* written by BPF congestion controls */
	unsigned long sk_pacing_rate;	/* written by BPF congestion controls */
	unsigned long sk_max_pacing_rate;
	struct sock_cgroup_data sk_cgrp_data;
};

struct socket {
	short type;
	struct sock *sk;
};

struct file;

struct task_struct {
	int tgid;
	char comm[16];
};

struct bpf_iter_meta;

/* The context of iter/task_file programs: every open file of every task. */
struct bpf_iter__task_file {
	union {
		struct bpf_iter_meta *meta;
	};
	union {
		struct task_struct *task;
	};
	__u32 fd;
	union {
		struct file *file;
	};
};

struct inet_sock {
	struct sock sk;
	__u8 tos;	/* its low two bits: the ECN codepoint tcp_ecn_send() puts on the socket's next segments */
};

struct ack_sample {
	__u32 pkts_acked;
	__s32 rtt_us;
	__u32 in_flight;
};

struct rate_sample;
union tcp_cc_info;

/*
 * The members a BPF congestion control may set (bpf/cc/). libbpf matches them
 * by name against the kernel's struct when it builds the struct_ops map, so
 * members the kernel added or moved (cong_control gained arguments in 6.10)
 * do not matter as long as the programs only read the arguments they share.
 */
struct tcp_congestion_ops {
	__u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, __u32 ack, __u32 acked);
	void (*set_state)(struct sock *sk, __u8 new_state);
	void (*cwnd_event)(struct sock *sk, int ev);
	void (*in_ack_event)(struct sock *sk, __u32 flags);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	void (*cong_control)(struct sock *sk, const struct rate_sample *rs);
	__u32 (*undo_cwnd)(struct sock *sk);
	char name[16];
	__u32 flags;
	void (*init)(struct sock *sk);
	void (*release)(struct sock *sk);
};

struct inet_connection_sock {
	struct inet_sock icsk_inet;
	const struct tcp_congestion_ops *icsk_ca_ops;
	__u8 icsk_ca_state: 5;
	__u8 icsk_ca_initialized: 1;
	__u8 icsk_ca_setsockopt: 1;
	__u8 icsk_ca_dst_locked: 1;
	__u8 icsk_pending;	/* the write timer's event: ICSK_TIME_LOSS_PROBE while a tail-loss probe is sent */
	struct {
		__u8 pending;	/* ICSK_ACK_*: written by BPF congestion controls that answer CE (bpf/cc/prague.bpf.c) */
	} icsk_ack;
	__u64 icsk_ca_priv[13];
};

struct minmax_sample {
	__u32 t;
	__u32 v;
};

struct minmax {
	struct minmax_sample s[3];
};

struct tcp_sock {
	struct inet_connection_sock inet_conn;
	__u32 snd_cwnd;
	__u32 snd_cwnd_cnt;
	__u32 snd_cwnd_clamp;
	__u32 snd_ssthresh;
	__u32 snd_nxt;
	__u32 snd_una;
	__u32 srtt_us;
	__u32 mdev_us;
	struct minmax rtt_min;
	__u32 mss_cache;
	__u32 packets_out;
	__u32 retrans_out;
	__u32 lost_out;
	__u32 sacked_out;
	__u32 total_retrans;
	__u32 lost;
	__u32 delivered;
	__u32 rate_delivered;
	__u32 rate_interval_us;
	__u64 bytes_acked;
	__u64 bytes_sent;
	__u64 bytes_received;
	__u64 tcp_mstamp;
	__u32 delivered_ce;
	__u32 dsack_dups;
	__u8 ecn_flags;		/* TCP_ECN_*: bpf/cc/prague.bpf.c writes TCP_ECN_DEMAND_CWR */
	__u32 rcv_nxt;
};

struct sk_buff;

#pragma clang attribute pop

#endif /* __CCSCOPE_CORE_MIN_H */
