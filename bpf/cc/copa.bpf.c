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
 *       acknowledged packet, else cwnd -= v / (delta * cwnd).
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
 * cwnd only grows while at least half of it was in flight when the ACK came
 *   (not app-limited);
 * the RTT signal is the kernel's per-ACK RTT sample (ack_sample.rtt_us).
 *
 * Per-ACK cost (issue 10; bench/cc.py, target <= 50 ns per ACK above the
 * kernel's Reno). Measured, the cost is almost all cache misses of a program
 * that runs once per ACK, not instructions: the JIT code and the state lines
 * it touches are cold by the next ACK. So the per-ACK path touches one line of
 * state, calls no map or helper, divides only when cwnd moves, and is short
 * (the object is built with -mcpu=v3, see the Makefile). Approximations this
 * takes, all bounded:
 *   Windowed minima: Kathleen Nichols' three-sample filter (cc_minmax in
 *       cc_common.h, as lib/win_minmax.c for BBR), exact within its
 *       sub-windows, with an early exit when a sample changes nothing.
 *   RTTmin: per ACK only the current round's (srtt's) minimum is kept (and
 *       lowers RTTmin at once); the 10 s filter takes one sample per round, the
 *       round's minimum stamped with the round's end. An old minimum therefore
 *       leaves RTTmin up to one srtt later than with a filter fed every sample.
 *   v is a power of two, as in the paper (1, doubled, reset to 1), kept as a
 *       shift; so the cap above is the largest power of two <= cwnd/2.
 *   cwnd's fraction: acked * v / delta steps of 1/cwnd packet are counted, as
 *       the kernel's snd_cwnd_cnt; cwnd moves by a packet when they reach
 *       cwnd (a division only when two or more packets move at once).
 *   Pacing is recomputed (a 64-bit division) when cwnd changes and once per
 *       round, not when only RTTstanding moves: it may use an RTTstanding up
 *       to one srtt old. Outside slow start cwnd moves 2v times per RTT, and
 *       the gain of 2 leaves room for RTTstanding to fall by half meanwhile.
 */
#include "cc_common.h"

char LICENSE[] SEC("license") = "GPL";

#define COPA_DELTA_INV 2		/* 1 / delta */
#define COPA_RTT_MIN_WIN_US 10000000	/* RTTmin window: 10 s */
#define COPA_MIN_CWND 2
#define COPA_SAME_DIRECTION_RTTS 3
#define COPA_PACING_GAIN 2
#define COPA_NO_RTT 0xffffffff

enum { COPA_NONE, COPA_UP, COPA_DOWN };


_Static_assert(__builtin_offsetof(struct copa, rtt_min_win) == 48, "the per-ACK state is one cache line's worth");
_Static_assert(sizeof(struct copa) <= sizeof(((struct inet_connection_sock *)0)->icsk_ca_priv),
	       "struct copa must fit icsk_ca_priv (ICSK_CA_PRIV_SIZE, 13 u64)");

static __always_inline __u32 now_us(const struct tcp_sock *tp)
{
	return (__u32)tp->tcp_mstamp;
}

/* A 64-bit division: only when cwnd moved and once per round (see the top). */
static __always_inline void copa_set_pacing(struct sock *sk, __u32 cwnd, __u32 rtt_standing)
{
	__u64 rate = (__u64)COPA_PACING_GAIN * cwnd * tcp_sk(sk)->mss_cache * USEC_PER_SEC;

	sk->sk_pacing_rate = rate / max(rtt_standing, 1U);
}

SEC("struct_ops/copa_init")
void BPF_PROG(copa_init, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct copa *c = inet_csk_ca(sk);

	__builtin_memset(c, 0, sizeof(*c));
	cc_tag(sk, CCSTATE_COPA);
	c->slow_start = 1;
	c->round_min = COPA_NO_RTT;
	c->round_cwnd = tp->snd_cwnd;
	c->round_stamp = now_us(tp);
	c->prior_delivered = tp->delivered;
	sk->sk_pacing_status = SK_PACING_NEEDED;
}

SEC("struct_ops/copa_pkts_acked")
void BPF_PROG(copa_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct copa *c = inet_csk_ca(sk);
	__u32 now = now_us(tp), rtt;

	if (sample->rtt_us <= 0)
		return;
	rtt = sample->rtt_us;
	if (!c->rtt_min) {
		cc_minmax_reset(&c->rtt_standing, now, rtt);
		cc_minmax_reset(&c->rtt_min_win, now, rtt);
		c->rtt_min = c->round_min = rtt;
		copa_set_pacing(sk, tp->snd_cwnd, rtt);
		return;
	}
	/* RTTmin: the current round's minimum here, the 10 s filter once per round (cong_control). */
	if (rtt < c->round_min) {
		c->round_min = rtt;
		if (rtt < c->rtt_min)
			c->rtt_min = rtt;
	}
	cc_minmax_running_min(&c->rtt_standing, max(tp->srtt_us >> 4, 1U), now, rtt);
}

/* floor(log2(x)) for x > 0, without a loop. */
static __always_inline __u8 copa_log2(__u32 x)
{
	__u8 r = 0;

	if (x >> 16)
		x >>= 16, r += 16;
	if (x >> 8)
		x >>= 8, r += 8;
	if (x >> 4)
		x >>= 4, r += 4;
	if (x >> 2)
		x >>= 2, r += 2;
	return r + (x >> 1);
}

/* Once per round (srtt), outside slow start: has cwnd kept moving the same way? Then speed up. */
static __always_inline void copa_update_velocity(struct copa *c, __u32 cwnd)
{
	__u8 moved = cwnd > c->round_cwnd ? COPA_UP : COPA_DOWN;

	if (moved == c->direction) {
		if (c->same_direction < COPA_SAME_DIRECTION_RTTS)
			c->same_direction++;
		if (c->same_direction >= COPA_SAME_DIRECTION_RTTS)
			c->velocity_shift = min(c->velocity_shift + 1, copa_log2(max(cwnd / 2, 1U)));
	} else {
		c->direction = moved;
		c->same_direction = 1;
		c->velocity_shift = 0;
	}
}

SEC("struct_ops/copa_cong_control")
void BPF_PROG(copa_cong_control, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct copa *c = inet_csk_ca(sk);
	__u32 prior_cwnd = tp->snd_cwnd, cwnd = prior_cwnd, now = now_us(tp), delivered = tp->delivered;
	__u32 acked = delivered - c->prior_delivered, rtt_standing, dq;
	__u64 step, mag, whole;
	bool increase, round_end;
	__s64 cnt;

	c->prior_delivered = delivered;
	if (!c->rtt_min || !acked)
		return;
	round_end = now - c->round_stamp >= tp->srtt_us >> 3;
	if (round_end && c->round_min != COPA_NO_RTT) {
		c->rtt_min = cc_minmax_running_min(&c->rtt_min_win, COPA_RTT_MIN_WIN_US, now, c->round_min);
		c->round_min = COPA_NO_RTT;
	}
	rtt_standing = c->rtt_standing.s[0].v;
	dq = rtt_standing > c->rtt_min ? rtt_standing - c->rtt_min : 0;
	/* lambda <= lambda_t  <=>  cwnd / RTTstanding <= 1 / (delta * dq) */
	increase = (__u64)cwnd * dq <= (__u64)COPA_DELTA_INV * rtt_standing;
	/*
	 * Application-limited: hold. In flight is counted before this ACK
	 * (packets_out + acked): after it, a delayed ACK for both packets of a
	 * cwnd of 2 leaves packets_out at 0, and every ACK held cwnd at 2 for
	 * 2.5 s (0.48 of 4 Mbit/s) after a fall had driven it there.
	 */
	if (increase && (tp->packets_out + acked) * 2 < cwnd)
		increase = false, acked = 0;

	if (c->slow_start && increase) {
		cwnd += acked;
	} else {
		c->slow_start = 0;
		if ((increase && c->direction == COPA_DOWN) || (!increase && c->direction == COPA_UP)) {
			c->velocity_shift = 0;
			c->same_direction = 0;
		}
		if (round_end)
			copa_update_velocity(c, cwnd);
		/* acked * v / delta steps of 1/cwnd packet; cwnd moves when they add up to a packet. */
		step = (__u64)acked * COPA_DELTA_INV << c->velocity_shift;
		cnt = c->cwnd_cnt + (increase ? (__s64)step : -(__s64)step);
		mag = cnt < 0 ? -cnt : cnt;
		if (mag >= cwnd) {
			/* Packets to move, at most one cwnd per ACK; a division only from two on. */
			whole = mag < 2 * (__u64)cwnd ? 1 : mag / cwnd;
			if (whole >= cwnd)
				whole = cwnd, mag = 0;
			else
				mag -= whole * cwnd;
			if (cnt > 0)
				cwnd += whole, cnt = mag;
			else
				cwnd = cwnd < COPA_MIN_CWND + whole ? COPA_MIN_CWND : cwnd - whole, cnt = -(__s64)mag;
		}
		c->cwnd_cnt = cnt;
	}
	if (round_end) {
		c->round_cwnd = prior_cwnd;
		c->round_stamp = now;
	}
	if (cwnd != prior_cwnd) {
		cwnd = min(cwnd, tp->snd_cwnd_clamp);
		tp->snd_cwnd = cwnd;
	} else if (!round_end) {
		return;
	}
	copa_set_pacing(sk, cwnd, rtt_standing);
}

SEC("struct_ops/copa_set_state")
void BPF_PROG(copa_set_state, struct sock *sk, __u8 new_state)
{
	struct copa *c = inet_csk_ca(sk);

	if (new_state == TCP_CA_Loss) {	/* RTO: the kernel set cwnd to 1 */
		c->slow_start = 1;
		c->velocity_shift = 0;
		c->direction = COPA_NONE;
		c->cwnd_cnt = 0;
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
