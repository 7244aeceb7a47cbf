// SPDX-License-Identifier: GPL-2.0-only
/*
 * Copa (Arun and Balakrishnan, "Copa: Practical Delay-Based Congestion
 * Control for the Internet", NSDI 2018) as a BPF congestion control.
 * No kernel has Copa; this is written from the paper.
 *
 * Default mode only, delta = 0.5 (the paper's default): Copa aims at a
 * sending rate lambda_t = 1 / (delta * dq), where dq = RTTstanding - RTTmin is
 * the queueing delay it sees, so it keeps about 1/delta = 2 packets queued.
 *   RTTstanding: minimum RTT sample over the last srtt/2 (windowed min).
 *   RTTmin: minimum RTT sample over the last 10 s (windowed min).
 *   Per ACK: lambda = cwnd / RTTstanding. If lambda <= lambda_t (equivalently
 *       cwnd * dq <= RTTstanding / delta), cwnd += v / (delta * cwnd) per
 *       acknowledged packet, else cwnd -= v / (delta * cwnd). cwnd is kept in
 *       1/1024 packet internally.
 *   Velocity v: 1 at start; once per RTT (srtt) the direction cwnd moved in
 *       is compared with the previous RTT's; after three RTTs in the same
 *       direction v doubles every RTT. A per-ACK decision against the current
 *       direction resets v to 1 (as the authors' mvfst implementation does).
 *   Slow start: cwnd += acknowledged packets (doubling per RTT) until the
 *       first ACK with lambda > lambda_t; re-entered after an RTO.
 *   Pacing at 2 * cwnd / RTTstanding (TCP's internal pacing is switched on,
 *       as no fq qdisc may be present); cong_control replaces the kernel's
 *       cwnd and pacing updates entirely, like BBR does.
 *   Loss: the default mode reacts to delay, not loss; the kernel still
 *       retransmits, and an RTO resets cwnd (kernel) and re-enters slow start.
 * Not implemented: the competitive mode (delta adapted when Copa detects a
 * buffer-filling competitor) and the paper's TCP-mode switch; delta stays 0.5.
 * Deviations: v is capped at cwnd/2 (a change of at most one cwnd per RTT);
 * cwnd only grows while at least half of it is in flight (not app-limited);
 * the RTT signal is the kernel's per-ACK RTT sample (ack_sample.rtt_us).
 */
#include "cc_common.h"

char LICENSE[] SEC("license") = "GPL";

#define COPA_DELTA_INV 2		/* 1 / delta */
#define COPA_RTT_MIN_WIN_US 10000000	/* RTTmin window: 10 s */
#define COPA_FRAC_SHIFT 10		/* cwnd fraction in 1/1024 packet */
#define COPA_MIN_CWND 2
#define COPA_SAME_DIRECTION_RTTS 3
#define COPA_PACING_GAIN 2

enum { COPA_NONE, COPA_UP, COPA_DOWN };

struct copa {
	struct cc_minmax rtt_standing;	/* us */
	struct cc_minmax rtt_min;	/* us */
	__s32 cwnd_frac;		/* pending fraction of a packet, 1/1024 */
	__u32 velocity;
	__u32 dir_cwnd;			/* cwnd at the start of the velocity RTT */
	__u32 dir_stamp;		/* its time (us) */
	__u32 prior_delivered;		/* tp->delivered at the previous ACK */
	__u32 paced_cwnd;		/* the inputs of the pacing rate last set */
	__u32 paced_rtt;
	__u8 direction;
	__u8 same_direction;		/* RTTs in a row moving in `direction` */
	__u8 slow_start;
	__u8 have_rtt;
};

static __always_inline __u32 now_us(const struct tcp_sock *tp)
{
	return (__u32)tp->tcp_mstamp;
}

SEC("struct_ops/copa_init")
void BPF_PROG(copa_init, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct copa *c = inet_csk_ca(sk);

	__builtin_memset(c, 0, sizeof(*c));
	c->velocity = 1;
	c->slow_start = 1;
	c->dir_cwnd = tp->snd_cwnd;
	c->dir_stamp = now_us(tp);
	c->prior_delivered = tp->delivered;
	sk->sk_pacing_status = SK_PACING_NEEDED;
}

SEC("struct_ops/copa_pkts_acked")
void BPF_PROG(copa_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct copa *c = inet_csk_ca(sk);
	__u32 now = now_us(tp), rtt, srtt;

	if (sample->rtt_us <= 0)
		return;
	rtt = sample->rtt_us;
	srtt = tp->srtt_us >> 3;
	if (!c->have_rtt) {
		cc_minmax_reset(&c->rtt_standing, now, rtt);
		cc_minmax_reset(&c->rtt_min, now, rtt);
		c->have_rtt = 1;
		return;
	}
	cc_minmax_running_min(&c->rtt_standing, max(srtt / 2, 1U), now, rtt);
	cc_minmax_running_min(&c->rtt_min, COPA_RTT_MIN_WIN_US, now, rtt);
}

/* Once per srtt: has cwnd kept moving the same way? Then speed up. */
static __always_inline void copa_update_velocity(struct copa *c, __u32 cwnd, __u32 now, __u32 srtt)
{
	__u8 moved;

	if (now - c->dir_stamp < srtt)
		return;
	moved = cwnd > c->dir_cwnd ? COPA_UP : COPA_DOWN;
	if (moved == c->direction) {
		if (c->same_direction < COPA_SAME_DIRECTION_RTTS)
			c->same_direction++;
		if (c->same_direction >= COPA_SAME_DIRECTION_RTTS)
			c->velocity = min(c->velocity * 2, max(cwnd / 2, 1U));
	} else {
		c->direction = moved;
		c->same_direction = 1;
		c->velocity = 1;
	}
	c->dir_cwnd = cwnd;
	c->dir_stamp = now;
}

/* Recomputed only when cwnd or RTTstanding moved: a 64-bit division per ACK is most of its cost. */
static __always_inline void copa_set_pacing(struct sock *sk, struct copa *c, __u32 cwnd, __u32 rtt_standing)
{
	__u64 rate;

	if (cwnd == c->paced_cwnd && rtt_standing == c->paced_rtt)
		return;
	c->paced_cwnd = cwnd;
	c->paced_rtt = rtt_standing;
	rate = (__u64)COPA_PACING_GAIN * cwnd * tcp_sk(sk)->mss_cache * USEC_PER_SEC;
	sk->sk_pacing_rate = rate / max(rtt_standing, 1U);
}

SEC("struct_ops/copa_cong_control")
void BPF_PROG(copa_cong_control, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct copa *c = inet_csk_ca(sk);
	__u32 cwnd = tp->snd_cwnd, now = now_us(tp), srtt = tp->srtt_us >> 3;
	__u32 acked = tp->delivered - c->prior_delivered;
	__u32 rtt_standing, dq, step;
	bool increase;
	__s32 whole;

	c->prior_delivered = tp->delivered;
	if (!c->have_rtt || !acked)
		return;
	rtt_standing = c->rtt_standing.s[0].v;
	dq = rtt_standing > c->rtt_min.s[0].v ? rtt_standing - c->rtt_min.s[0].v : 0;
	/* lambda <= lambda_t  <=>  cwnd / RTTstanding <= 1 / (delta * dq) */
	increase = (__u64)cwnd * dq <= (__u64)COPA_DELTA_INV * rtt_standing;
	if (increase && tp->packets_out * 2 < cwnd)
		increase = false, acked = 0;	/* application-limited: hold */

	if (c->slow_start && increase) {
		cwnd += acked;
	} else {
		c->slow_start = 0;
		if ((increase && c->direction == COPA_DOWN) || (!increase && c->direction == COPA_UP)) {
			c->velocity = 1;
			c->same_direction = 0;
		}
		copa_update_velocity(c, cwnd, now, srtt);
		/* acked * v / (delta * cwnd) packets, in 1/1024 packet */
		step = ((__u64)acked * c->velocity * COPA_DELTA_INV << COPA_FRAC_SHIFT) / cwnd;
		step = min(step, cwnd << COPA_FRAC_SHIFT);
		c->cwnd_frac += increase ? (__s32)step : -(__s32)step;
		whole = c->cwnd_frac >> COPA_FRAC_SHIFT;	/* floor, also when negative */
		c->cwnd_frac -= whole << COPA_FRAC_SHIFT;
		cwnd = (__s32)cwnd + whole < COPA_MIN_CWND ? COPA_MIN_CWND : cwnd + whole;
	}
	cwnd = min(cwnd, tp->snd_cwnd_clamp);
	tp->snd_cwnd = cwnd;
	copa_set_pacing(sk, c, cwnd, rtt_standing);
}

SEC("struct_ops/copa_set_state")
void BPF_PROG(copa_set_state, struct sock *sk, __u8 new_state)
{
	struct copa *c = inet_csk_ca(sk);

	if (new_state == TCP_CA_Loss) {	/* RTO: the kernel set cwnd to 1 */
		c->slow_start = 1;
		c->velocity = 1;
		c->direction = COPA_NONE;
		c->cwnd_frac = 0;
	}
}

/* Loss does not change Copa's window in the default mode. */
SEC("struct_ops/copa_ssthresh")
__u32 BPF_PROG(copa_ssthresh, struct sock *sk)
{
	return max(tcp_sk(sk)->snd_cwnd, 2U);
}

SEC("struct_ops/copa_undo_cwnd")
__u32 BPF_PROG(copa_undo_cwnd, struct sock *sk)
{
	return tcp_sk(sk)->snd_cwnd;
}

CCSCOPE_CC(copa,
	.init = (void *)copa_init,
	.ssthresh = (void *)copa_ssthresh,
	.undo_cwnd = (void *)copa_undo_cwnd,
	.cong_control = (void *)copa_cong_control,
	.pkts_acked = (void *)copa_pkts_acked,
	.set_state = (void *)copa_set_state);
