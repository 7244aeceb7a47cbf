// SPDX-License-Identifier: GPL-2.0-only
/*
 * TCP Westwood+ (Mascolo, Casetti, Gerla et al., MobiCom 2001; Grieco and
 * Mascolo, CCR 2004) as a BPF congestion control.
 *
 * Written from the papers with the Linux module's constants and structure
 * (net/ipv4/tcp_westwood.c), so that it can stand in for tcp_westwood.ko:
 *   Bandwidth estimate (BWE): bytes acknowledged over one sampling window of
 *       max(RTT, 50 ms), then two cascaded EWMA filters with gain 1/8
 *       (bw = (7 bw + sample) / 8): the Westwood+ per-RTT filter.
 *   Bytes acknowledged: snd_una advance on in-order ACKs; on the slow path
 *       (dupACKs, SACK) one MSS per dupACK, subtracted again from the next
 *       cumulative ACK that covers it.
 *   RTTmin: minimum RTT, restarted from the next sample after each RTO.
 *   After a loss: ssthresh = BWE x RTTmin / MSS (at least 2) on an RTO; at the
 *       end of fast recovery ssthresh = cwnd = BWE x RTTmin / MSS. Otherwise
 *       Reno (kfuncs).
 *   Time in jiffies (bpf_jiffies64) and RTT converted with the kernel's HZ
 *       (CONFIG_HZ from the kernel config), so BWE has the module's units
 *       (bytes per jiffy) and rounding.
 * Deviations: if the kernel config is unreadable, HZ is taken as 1000 (the
 * result then differs only in rounding). get_info is not provided.
 */
#include "cc_common.h"

char LICENSE[] SEC("license") = "GPL";

extern unsigned int CONFIG_HZ __kconfig __weak;

#define HZ (CONFIG_HZ ? CONFIG_HZ : 1000)
#define WESTWOOD_RTT_MIN (HZ / 20)	/* 50 ms: shortest sampling window */
#define WESTWOOD_INIT_RTT (20 * HZ)	/* until the first RTT sample */


static __always_inline __u32 jiffies32(void)
{
	return (__u32)bpf_jiffies64();
}

/* usecs_to_jiffies(), which rounds up */
static __always_inline __u32 us_to_jiffies(__u32 us)
{
	return ((__u64)us * HZ + USEC_PER_SEC - 1) / USEC_PER_SEC;
}

static __always_inline __u32 ewma8(__u32 avg, __u32 sample)
{
	return (7 * avg + sample) >> 3;
}

SEC("struct_ops/westwood_init")
void BPF_PROG(westwood_init, struct sock *sk)
{
	struct westwood *w = inet_csk_ca(sk);

	cc_tag(sk, CCSTATE_WESTWOOD);
	w->hz = HZ;
	w->bk = 0;
	w->bw_ns_est = 0;
	w->bw_est = 0;
	w->accounted = 0;
	w->cumul_ack = 0;
	w->reset_rtt_min = 1;
	w->rtt_min = w->rtt = WESTWOOD_INIT_RTT;
	w->rtt_win_sx = jiffies32();
	w->snd_una = tcp_sk(sk)->snd_una;
	w->first_ack = 1;
}

SEC("struct_ops/westwood_pkts_acked")
void BPF_PROG(westwood_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct westwood *w = inet_csk_ca(sk);

	if (sample->rtt_us > 0)
		w->rtt = us_to_jiffies(sample->rtt_us);
}

/* Closes the sampling window once it is longer than max(RTT, 50 ms). */
static __always_inline void westwood_update_window(struct sock *sk)
{
	struct westwood *w = inet_csk_ca(sk);
	__u32 now = jiffies32();
	__s32 delta = now - w->rtt_win_sx;

	if (w->first_ack) {
		w->snd_una = tcp_sk(sk)->snd_una;
		w->first_ack = 0;
	}
	if (w->rtt && delta > (__s32)max(w->rtt, WESTWOOD_RTT_MIN)) {
		__u32 sample = w->bk / (__u32)delta;

		if (w->bw_ns_est == 0 && w->bw_est == 0) {
			w->bw_ns_est = sample;
			w->bw_est = sample;
		} else {
			w->bw_ns_est = ewma8(w->bw_ns_est, sample);
			w->bw_est = ewma8(w->bw_est, w->bw_ns_est);
		}
		w->bk = 0;
		w->rtt_win_sx = now;
	}
}

static __always_inline void westwood_update_rtt_min(struct westwood *w)
{
	if (w->reset_rtt_min) {
		w->rtt_min = w->rtt;
		w->reset_rtt_min = 0;
	} else {
		w->rtt_min = min(w->rtt, w->rtt_min);
	}
}

/* Bytes an ACK on the slow path acknowledges, crediting dupACKs one MSS each. */
static __always_inline __u32 westwood_acked_count(struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct westwood *w = inet_csk_ca(sk);
	__u32 mss = tp->mss_cache;

	w->cumul_ack = tp->snd_una - w->snd_una;
	if (!w->cumul_ack) {
		w->accounted += mss;
		w->cumul_ack = mss;
	}
	if (w->cumul_ack > mss) {
		if (w->accounted >= w->cumul_ack) {
			w->accounted -= w->cumul_ack;
			w->cumul_ack = mss;
		} else {
			w->cumul_ack -= w->accounted;
			w->accounted = 0;
		}
	}
	w->snd_una = tp->snd_una;
	return w->cumul_ack;
}

SEC("struct_ops/westwood_in_ack_event")
void BPF_PROG(westwood_in_ack_event, struct sock *sk, __u32 flags)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct westwood *w = inet_csk_ca(sk);

	westwood_update_window(sk);
	if (flags & CA_ACK_SLOWPATH) {
		w->bk += westwood_acked_count(sk);
	} else {
		w->bk += tp->snd_una - w->snd_una;
		w->snd_una = tp->snd_una;
	}
	westwood_update_rtt_min(w);
}

/* BWE x RTTmin in segments: the window that fills the pipe without a queue. */
static __always_inline __u32 westwood_bw_rttmin(const struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	const struct westwood *w = inet_csk_ca(sk);

	return max((w->bw_est * w->rtt_min) / tp->mss_cache, 2U);
}

SEC("struct_ops/westwood_cwnd_event")
void BPF_PROG(westwood_cwnd_event, struct sock *sk, int event)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct westwood *w = inet_csk_ca(sk);

	if (event == CA_EVENT_COMPLETE_CWR) {
		tp->snd_ssthresh = westwood_bw_rttmin(sk);
		tp->snd_cwnd = tp->snd_ssthresh;	/* and go on in congestion avoidance */
	} else if (event == CA_EVENT_LOSS) {
		tp->snd_ssthresh = westwood_bw_rttmin(sk);
		w->reset_rtt_min = 1;
	}
}

SEC("struct_ops/westwood_cong_avoid")
void BPF_PROG(westwood_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	tcp_reno_cong_avoid(sk, ack, acked);
}

SEC("struct_ops/westwood_ssthresh")
__u32 BPF_PROG(westwood_ssthresh, struct sock *sk)
{
	return tcp_reno_ssthresh(sk);
}

SEC("struct_ops/westwood_undo_cwnd")
__u32 BPF_PROG(westwood_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

CCSCOPE_CC(westwood,
	.init = (void *)westwood_init,
	.ssthresh = (void *)westwood_ssthresh,
	.undo_cwnd = (void *)westwood_undo_cwnd,
	.cong_avoid = (void *)westwood_cong_avoid,
	.pkts_acked = (void *)westwood_pkts_acked,
	.in_ack_event = (void *)westwood_in_ack_event,
	.cwnd_event = (void *)westwood_cwnd_event);
