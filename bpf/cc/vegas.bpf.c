// SPDX-License-Identifier: GPL-2.0-only
/*
 * TCP Vegas (Brakmo and Peterson, IEEE JSAC 1995) as a BPF congestion control.
 *
 * Written from the paper with the Linux module's parameters and structure
 * (net/ipv4/tcp_vegas.c), so that it can stand in for tcp_vegas.ko:
 *   alpha = 2, beta = 4 packets: the band of "extra" packets queued in the
 *       network (diff = cwnd * (rtt - baseRTT) / baseRTT) that Vegas holds;
 *       below alpha cwnd grows by 1 per RTT, above beta it shrinks by 1.
 *   gamma = 1 packet: leave slow start once diff exceeds it, capping cwnd at
 *       the target cwnd * baseRTT / rtt + 1.
 *   baseRTT: the minimum RTT ever seen by the connection (reset on idle
 *       restart); rtt: the minimum RTT seen during the last RTT.
 *   One adjustment per RTT (when the ACK passes the snd_nxt recorded at the
 *       start of the previous adjustment), and only with > 2 RTT samples in it;
 *       otherwise, and outside TCP_CA_Open, Reno's rules (kernel kfunc).
 *   RTT samples in microseconds (+1, so that 0 never means "no sample").
 * Deviations from the module: none in behaviour; get_info (vegas counters in
 * INET_DIAG) is not provided, as struct_ops does not allow it.
 */
#include "cc_common.h"

char LICENSE[] SEC("license") = "GPL";

#define VEGAS_ALPHA 2
#define VEGAS_BETA 4
#define VEGAS_GAMMA 1
#define VEGAS_NO_RTT 0x7fffffff


static __always_inline void vegas_enable(struct sock *sk)
{
	struct vegas *v = inet_csk_ca(sk);

	v->enabled = 1;
	v->beg_snd_nxt = tcp_sk(sk)->snd_nxt;
	v->rtt_samples = 0;
	v->min_rtt_us = VEGAS_NO_RTT;
}

static __always_inline void vegas_reset(struct sock *sk)
{
	struct vegas *v = inet_csk_ca(sk);

	v->base_rtt_us = VEGAS_NO_RTT;
	vegas_enable(sk);
}

SEC("struct_ops/vegas_init")
void BPF_PROG(vegas_init, struct sock *sk)
{
	cc_tag(sk, CCSTATE_VEGAS);
	vegas_reset(sk);
}

SEC("struct_ops/vegas_pkts_acked")
void BPF_PROG(vegas_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct vegas *v = inet_csk_ca(sk);
	__u32 rtt_us;

	if (sample->rtt_us < 0)
		return;
	rtt_us = sample->rtt_us + 1;
	v->base_rtt_us = min(v->base_rtt_us, rtt_us);
	v->min_rtt_us = min(v->min_rtt_us, rtt_us);
	v->rtt_samples++;
}

SEC("struct_ops/vegas_set_state")
void BPF_PROG(vegas_set_state, struct sock *sk, __u8 new_state)
{
	if (new_state == TCP_CA_Open)
		vegas_enable(sk);
	else
		((struct vegas *)inet_csk_ca(sk))->enabled = 0;
}

SEC("struct_ops/vegas_cwnd_event")
void BPF_PROG(vegas_cwnd_event, struct sock *sk, int event)
{
	if (event == CA_EVENT_CWND_RESTART || event == CA_EVENT_TX_START)
		vegas_reset(sk);
}

/* Once per RTT: compare the expected rate (cwnd / baseRTT) with the actual one (cwnd / rtt). */
static __always_inline void vegas_adjust(struct sock *sk, __u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct vegas *v = inet_csk_ca(sk);
	__u32 rtt = v->min_rtt_us, cwnd = tp->snd_cwnd;
	__u32 target = (__u64)cwnd * v->base_rtt_us / rtt;
	__u32 diff = (__u64)cwnd * (rtt - v->base_rtt_us) / v->base_rtt_us;

	if (diff > VEGAS_GAMMA && tcp_in_slow_start(tp)) {
		tp->snd_cwnd = min(cwnd, target + 1);
		tp->snd_ssthresh = min(tp->snd_ssthresh, tp->snd_cwnd);
	} else if (tcp_in_slow_start(tp)) {
		tcp_slow_start(tp, acked);
	} else if (diff > VEGAS_BETA) {
		tp->snd_cwnd = cwnd - 1;
		tp->snd_ssthresh = min(tp->snd_ssthresh, tp->snd_cwnd);
	} else if (diff < VEGAS_ALPHA) {
		tp->snd_cwnd = cwnd + 1;
	}
	v->last_rtt_us = rtt;
	v->last_diff = diff;
	v->adjustments += 1;
	if (tp->snd_cwnd < 2)
		tp->snd_cwnd = 2;
	else if (tp->snd_cwnd > tp->snd_cwnd_clamp)
		tp->snd_cwnd = tp->snd_cwnd_clamp;
	tp->snd_ssthresh = tcp_current_ssthresh(sk);
}

SEC("struct_ops/vegas_cong_avoid")
void BPF_PROG(vegas_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct vegas *v = inet_csk_ca(sk);

	if (!v->enabled) {
		tcp_reno_cong_avoid(sk, ack, acked);
		return;
	}
	if (seq_after(ack, v->beg_snd_nxt)) {
		v->beg_snd_nxt = tp->snd_nxt;
		/* Too few samples to tell queueing from delayed ACKs: behave like Reno this RTT. */
		if (v->rtt_samples <= 2)
			tcp_reno_cong_avoid(sk, ack, acked);
		else
			vegas_adjust(sk, acked);
		v->rtt_samples = 0;
		v->min_rtt_us = VEGAS_NO_RTT;
	} else if (tcp_in_slow_start(tp)) {
		tcp_slow_start(tp, acked);
	}
}

SEC("struct_ops/vegas_ssthresh")
__u32 BPF_PROG(vegas_ssthresh, struct sock *sk)
{
	return tcp_reno_ssthresh(sk);
}

SEC("struct_ops/vegas_undo_cwnd")
__u32 BPF_PROG(vegas_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

CCSCOPE_CC(vegas,
	.init = (void *)vegas_init,
	.ssthresh = (void *)vegas_ssthresh,
	.undo_cwnd = (void *)vegas_undo_cwnd,
	.cong_avoid = (void *)vegas_cong_avoid,
	.pkts_acked = (void *)vegas_pkts_acked,
	.set_state = (void *)vegas_set_state,
	.cwnd_event = (void *)vegas_cwnd_event);
