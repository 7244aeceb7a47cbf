/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Shared by ccscope's BPF congestion controls (struct_ops tcp_congestion_ops).
 *
 * Each bpf/cc/NAME.bpf.c defines its callbacks and then CCSCOPE_CC(NAME, ...),
 * which emits two struct_ops maps over the same programs: NAME (registered
 * under the kernel name NAME where the kernel lacks the algorithm) and
 * bpf_NAME (registered when the user forces the BPF implementation with
 * bpf:NAME, also next to a native NAME). The loader attaches only one of them.
 *
 * Built against core_min.h (CO-RE, no vmlinux.h). The kfuncs below exist from
 * Linux 5.13 on and are only callable from GPL-compatible programs.
 */
#ifndef __CCSCOPE_CC_COMMON_H
#define __CCSCOPE_CC_COMMON_H

#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "../core_min.h"
#include "cc_state.h"

/* include/net/tcp.h */
#define TCP_CA_Open 0
#define TCP_CA_CWR 2
#define TCP_CA_Recovery 3
#define TCP_CA_Loss 4
#define CA_EVENT_TX_START 0
#define CA_EVENT_CWND_RESTART 1
#define CA_EVENT_COMPLETE_CWR 2
#define CA_EVENT_LOSS 3
#define CA_ACK_SLOWPATH (1 << 0)
#define TCP_INFINITE_SSTHRESH 0x7fffffff
#define SK_PACING_NEEDED 1
#define USEC_PER_SEC 1000000ULL

extern void tcp_reno_cong_avoid(struct sock *sk, __u32 ack, __u32 acked) __ksym;
extern __u32 tcp_reno_ssthresh(struct sock *sk) __ksym;
extern __u32 tcp_reno_undo_cwnd(struct sock *sk) __ksym;
extern __u32 tcp_slow_start(struct tcp_sock *tp, __u32 acked) __ksym;
extern void tcp_cong_avoid_ai(struct tcp_sock *tp, __u32 w, __u32 acked) __ksym;

#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))

static __always_inline struct tcp_sock *tcp_sk(const struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline void *inet_csk_ca(const struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

/* The tag by which bpf/ccstate.bpf.c knows this socket's state as ccscope's `kind` (cc_state.h). */
static __always_inline void cc_tag(struct sock *sk, __u32 kind)
{
	struct ccscope_ca_tag *tag = (void *)((char *)inet_csk_ca(sk) + CCSCOPE_CA_TAG_OFFSET);

	tag->magic = CCSCOPE_CA_MAGIC;
	tag->kind = kind;
}

/* Sequence-space comparisons, as before()/after() in include/net/tcp.h. */
static __always_inline bool seq_before(__u32 seq1, __u32 seq2)
{
	return (__s32)(seq1 - seq2) < 0;
}
#define seq_after(seq2, seq1) seq_before(seq1, seq2)

static __always_inline bool tcp_in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

static __always_inline __u8 tcp_ca_state(const struct sock *sk)
{
	const struct inet_connection_sock *icsk = (const void *)sk;

	return BPF_CORE_READ_BITFIELD(icsk, icsk_ca_state);
}

static __always_inline bool tcp_in_cwnd_reduction(const struct sock *sk)
{
	return ((1 << TCP_CA_CWR) | (1 << TCP_CA_Recovery)) & (1 << tcp_ca_state(sk));
}

/* tcp_current_ssthresh(): the ssthresh to keep when cwnd is set by the algorithm. */
static __always_inline __u32 tcp_current_ssthresh(const struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if (tcp_in_cwnd_reduction(sk))
		return tp->snd_ssthresh;
	return max(tp->snd_ssthresh, (tp->snd_cwnd >> 1) + (tp->snd_cwnd >> 2));
}

/*
 * Windowed running minimum over the last `win` time units with three samples,
 * the algorithm of the kernel's lib/win_minmax.c (Kathleen Nichols'): the
 * best, second best and third best samples from successive sub-windows.
 */


static __always_inline __u32 cc_minmax_reset(struct cc_minmax *m, __u32 t, __u32 v)
{
	m->s[0].t = m->s[1].t = m->s[2].t = t;
	m->s[0].v = m->s[1].v = m->s[2].v = v;
	return v;
}

static __always_inline __u32 cc_minmax_running_min(struct cc_minmax *m, __u32 win, __u32 t, __u32 v)
{
	__u32 dt;

	/* The usual case, and no change: above all three while the best is in its first quarter window. */
	if (v > m->s[2].v && t - m->s[0].t <= win / 4)
		return m->s[0].v;
	if (v <= m->s[0].v || t - m->s[2].t > win)
		return cc_minmax_reset(m, t, v);
	if (v <= m->s[1].v) {
		m->s[2].t = m->s[1].t = t;
		m->s[2].v = m->s[1].v = v;
	} else if (v <= m->s[2].v) {
		m->s[2].t = t;
		m->s[2].v = v;
	}
	/* Age out the best sample when its sub-window has passed. */
	dt = t - m->s[0].t;
	if (dt > win) {
		m->s[0] = m->s[1];
		m->s[1] = m->s[2];
		m->s[2].t = t;
		m->s[2].v = v;
		if (t - m->s[0].t > win) {
			m->s[0] = m->s[1];
			m->s[1] = m->s[2];
		}
	} else if (m->s[1].t == m->s[0].t && dt > win / 4) {
		m->s[2].t = m->s[1].t = t;
		m->s[2].v = m->s[1].v = v;
	} else if (m->s[2].t == m->s[1].t && dt > win / 2) {
		m->s[2].t = t;
		m->s[2].v = v;
	}
	return m->s[0].v;
}

/* Both registrations of one algorithm; see the top of this file. */
#define CCSCOPE_CC(alg, ...)							\
	SEC(".struct_ops") struct tcp_congestion_ops alg = {			\
		__VA_ARGS__, .name = #alg,					\
	};									\
	SEC(".struct_ops") struct tcp_congestion_ops bpf_##alg = {		\
		__VA_ARGS__, .name = "bpf_" #alg,				\
	}

#endif /* __CCSCOPE_CC_COMMON_H */
