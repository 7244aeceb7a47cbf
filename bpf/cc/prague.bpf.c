// SPDX-License-Identifier: GPL-2.0-only
/*
 * A scalable congestion control for L4S experiments, written from RFC 9331 section 4 (the "Prague L4S
 * requirements") and DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257), as a BPF congestion control that
 * loads on any kernel with BPF struct_ops (5.13 and later). It is not L4STeam's out-of-tree TCP Prague;
 * docs/congestion-control.md says what it does and does not do next to it.
 *
 * Sender, every ACK (cong_control: this program owns cwnd and pacing, as BBR does):
 *   alpha: the EWMA (g = 1/16) of F, the fraction of the segments delivered in one window whose ACK
 *       carried ECE (the kernel's tp->delivered_ce and tp->delivered). A window ends when snd_una
 *       reaches the snd_nxt of its start. As in TCP Prague, alpha stays 1 until the first CE, so the
 *       first response (the end of slow start) halves the window.
 *   Response to CE: once per window (the kernel's CWR state), cwnd -= cwnd * alpha / 2.
 *   Additive increase: one segment per RTT, on every ACK also during CWR, counting only the
 *       segments delivered without CE (so the increase is (1 - p) per RTT, as Prague's).
 *   The window is kept in 1/2^20 segment; cwnd follows it, down by at most one segment per ACK (the
 *   kernel's PRR spreads a reduction over an RTT in the same way) and up by at most the segments acked.
 *   Loss: the window halves from what it was before the round's CE cut (Recovery; an RTO once the kernel
 *       cuts, CA_EVENT_LOSS; a loss a tail-loss probe repaired, CWR without CE), without increase until
 *       the state is Open again; undo restores it.
 *   Pacing at 200 % of cwnd/srtt in slow start and 100 % after it (Prague's), by TCP's own pacing
 *       (no fq needed).
 * Receiver (the accepted socket runs it too), with classic ECN: ECE on exactly the ACKs of CE-marked data
 *   (DCTCP's state machine): at each change between CE and not-CE data, a delayed ACK of the old state is
 *   sent first and the new segment is ACKed at once. With AccECN (where both ends' net.ipv4.tcp_ecn is 3,
 *   kernels after 6.18) the kernel's ACE counter feeds back every CE packet: the same ACKs, ECE left alone.
 * ECN: the ops carry TCP_CONG_NEEDS_ECN, so the SYN asks for ECN and data go out ECT(0) whatever
 *   net.ipv4.tcp_ecn says; a listener running it accepts ECN, AccECN where both ends allow it. Mainline
 *   kernels up to 6.19 let no congestion control send ECT(1), the L4S identifier: so this sends ECT(0), and
 *   reaches a DualPI2 L queue only where the AQM classifies any ECT as L4S (`ecn_mask: any_ect`, a lab
 *   setting). Without ECN of either kind negotiated it becomes the kernel's reno at init.
 * Not done: Prague's RTT independence, its classic-ECN-AQM detection, sub-segment windows and its GSO cap.
 */
#include "cc_common.h"

char LICENSE[] SEC("license") = "GPL";

#define PRAGUE_SHIFT 20
#define PRAGUE_ONE (1U << PRAGUE_SHIFT)
#define PRAGUE_G_SHIFT 4		/* g = 1/16 */
#define PRAGUE_MIN_CWND 2

/* include/net/tcp.h, include/net/inet_connection_sock.h, include/net/tcp_ecn.h, linux/tcp.h */
#define CA_EVENT_ECN_NO_CE 4
#define CA_EVENT_ECN_IS_CE 5
#define ICSK_ACK_TIMER 2
#define ICSK_ACK_NOW 16
#define TCP_ECN_MODE_RFC3168 1
#define TCP_ECN_DEMAND_CWR 4
#define TCP_ECN_MODE_ACCECN 16	/* 6.18+; no meaning before */
#define TCP_ECN_MODE_ANY (TCP_ECN_MODE_RFC3168 | TCP_ECN_MODE_ACCECN)
#define TCP_CONG_NEEDS_ECN 2
#define TCP_ESTABLISHED 1
#define TCP_CLOSE 7
#define TCP_LISTEN 10
#define SOL_TCP 6
#define TCP_CONGESTION 13

static __always_inline void prague_start_window(struct prague *p, const struct tcp_sock *tp)
{
	p->next_seq = tp->snd_nxt;
	p->window_delivered = tp->delivered;
	p->window_ce = tp->delivered_ce;
}

SEC("struct_ops/prague_init")
void BPF_PROG(prague_init, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct prague *p = inet_csk_ca(sk);
	__u8 state = sk->__sk_common.skc_state;

	if (state != TCP_LISTEN && state != TCP_CLOSE && !(tp->ecn_flags & TCP_ECN_MODE_ANY)) {
		/* no ECN with the peer: reno (re-initialising without NEEDS_ECN also clears ECT) */
		char fallback[] = "reno";

		bpf_setsockopt(sk, SOL_TCP, TCP_CONGESTION, fallback, sizeof(fallback));
		return;
	}
	__builtin_memset(p, 0, sizeof(*p));
	cc_tag(sk, CCSTATE_PRAGUE);
	p->alpha = PRAGUE_ONE;
	p->frac_cwnd = (__u64)tp->snd_cwnd << PRAGUE_SHIFT;
	p->prior_delivered = tp->delivered;
	p->prior_ce = tp->delivered_ce;
	p->prior_rcv_nxt = tp->rcv_nxt;
	prague_start_window(p, tp);
	sk->sk_pacing_status = SK_PACING_NEEDED;
}

/* The end of a window: alpha += g (F - alpha), once the first CE was seen. */
static __always_inline void prague_update_alpha(struct prague *p, const struct tcp_sock *tp)
{
	__u32 delivered = tp->delivered - p->window_delivered, ce = tp->delivered_ce - p->window_ce;
	__u32 fraction;

	if (p->saw_ce && delivered) {
		fraction = ((__u64)min(ce, delivered) << PRAGUE_SHIFT) / delivered;
		p->last_fraction = fraction;
		p->alpha = p->alpha - (p->alpha >> PRAGUE_G_SHIFT) + (fraction >> PRAGUE_G_SHIFT);
	}
	prague_start_window(p, tp);
}

/* As tcp_update_pacing_rate(): over max(cwnd, in flight), at most SO_MAX_PACING_RATE. */
static __always_inline void prague_set_pacing(struct sock *sk, __u32 cwnd)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	__u64 rate = (__u64)max(cwnd, tp->packets_out) * tp->mss_cache * USEC_PER_SEC << 3;	/* srtt_us: 8 x srtt */

	if (cwnd < tp->snd_ssthresh / 2)
		rate <<= 1;
	rate /= max(tp->srtt_us, 1U);
	sk->sk_pacing_rate = min(rate, (__u64)sk->sk_max_pacing_rate);
}

/* cwnd toward the window: down by at most the segments acked (one on a duplicate ACK), as PRR spreads a
 * reduction over the segments delivered in a round; up by at most the segments acked. */
static __always_inline __u32 prague_follow(struct tcp_sock *tp, __u64 frac, __u32 acked)
{
	__u32 target = (frac + PRAGUE_ONE - 1) >> PRAGUE_SHIFT, cwnd = tp->snd_cwnd;

	target = min(max(target, (__u32)PRAGUE_MIN_CWND), tp->snd_cwnd_clamp);
	if (target < cwnd)
		cwnd -= min(cwnd - target, max(acked, 1U));
	else if (target > cwnd)
		cwnd = min(target, cwnd + acked);
	if (cwnd != tp->snd_cwnd)
		tp->snd_cwnd = cwnd;
	return cwnd;
}

SEC("struct_ops/prague_cong_control")
void BPF_PROG(prague_cong_control, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct prague *p = inet_csk_ca(sk);
	__u32 delivered = tp->delivered, delivered_ce = tp->delivered_ce, cwnd = tp->snd_cwnd;
	__u32 acked = delivered - p->prior_delivered, ce = delivered_ce - p->prior_ce, clean;

	p->prior_delivered = delivered;
	p->prior_ce = delivered_ce;
	if (ce)
		p->saw_ce = 1;
	clean = acked > ce ? acked - ce : 0;
	/* grow only while cwnd limits the sender (in flight before this ACK, as copa.bpf.c counts it) */
	if (clean && !p->in_loss && (tp->packets_out + acked) * 2 >= cwnd) {
		if (tcp_in_slow_start(tp))
			p->frac_cwnd += (__u64)clean << PRAGUE_SHIFT;
		else
			p->frac_cwnd += ((__u64)clean << PRAGUE_SHIFT) / max(cwnd, 1U);
		/* no window past the clamp: ssthresh follows it, and alpha x frac must not overflow */
		p->frac_cwnd = min(p->frac_cwnd, (__u64)tp->snd_cwnd_clamp << PRAGUE_SHIFT);
	}
	if (!seq_before(tp->snd_una, p->next_seq))
		prague_update_alpha(p, tp);
	prague_set_pacing(sk, prague_follow(tp, p->frac_cwnd, acked));
}

static __always_inline void prague_cut(struct prague *p, struct tcp_sock *tp, __u64 to)
{
	p->frac_cwnd = to;
	tp->snd_ssthresh = max((__u32)(to >> PRAGUE_SHIFT), (__u32)PRAGUE_MIN_CWND);
}

/* A loss: half the window from before this round's reductions; what it was is kept for undo. */
static __always_inline void prague_halve(struct prague *p, struct tcp_sock *tp, __u64 before)
{
	if (!p->in_loss)
		p->loss_frac = before;
	p->in_loss = 1;
	prague_cut(p, tp, min(before >> 1, p->frac_cwnd));
}

SEC("struct_ops/prague_set_state")
void BPF_PROG(prague_set_state, struct sock *sk, __u8 new_state)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct prague *p = inet_csk_ca(sk);
	__u8 old_state = tcp_ca_state(sk);	/* the kernel writes the new one after this call */

	if (new_state == TCP_CA_CWR && old_state < TCP_CA_CWR) {
		p->cwr_frac = p->frac_cwnd;
		if (tp->delivered_ce != p->prior_ce) {
			/* CE on this ACK (counted before cong_control runs): frac -= frac x alpha / 2 */
			prague_cut(p, tp, p->frac_cwnd - min((p->frac_cwnd * p->alpha) >> (PRAGUE_SHIFT + 1),
							     p->frac_cwnd));
			p->reductions += 1;
		} else {
			/* a loss a tail-loss probe repaired, or local congestion: halve, as for a loss */
			prague_cut(p, tp, p->frac_cwnd >> 1);
		}
	} else if (new_state == TCP_CA_Recovery && old_state != TCP_CA_Recovery) {
		prague_halve(p, tp, old_state == TCP_CA_CWR ? p->cwr_frac : p->frac_cwnd);
	} else if (new_state == TCP_CA_Loss) {
		p->in_loss = 1;	/* the cut is CA_EVENT_LOSS's, which comes only when the kernel cuts */
	} else if (new_state == TCP_CA_Open) {
		p->in_loss = 0;
	}
}

static __always_inline void prague_set_ece(struct tcp_sock *tp, __u8 ce)
{
	if (ce)
		tp->ecn_flags |= TCP_ECN_DEMAND_CWR;
	else
		tp->ecn_flags &= ~TCP_ECN_DEMAND_CWR;
}

/* The receiver's ECE: on exactly the ACKs of CE-marked data (DCTCP's dctcp_ece_ack_update()). */
SEC("struct_ops/prague_cwnd_event")
void BPF_PROG(prague_cwnd_event, struct sock *sk, int event)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct inet_connection_sock *icsk = (void *)sk;
	struct prague *p = inet_csk_ca(sk);
	__u8 ce_state, accecn = !!(tp->ecn_flags & TCP_ECN_MODE_ACCECN);

	if (event == CA_EVENT_LOSS) {
		/* an RTO, once per window as tcp_enter_loss() cuts (dctcp_cwnd_event() too); cwnd is 1 now and
		 * climbs back to the halved window */
		prague_halve(p, tp, p->frac_cwnd);
		return;
	}
	if (event != CA_EVENT_ECN_IS_CE && event != CA_EVENT_ECN_NO_CE)
		return;
	/* With AccECN the ACE field counts the CE packets itself and ECE is part of that counter, so ECE is left
	 * alone; the ACKs at each change stay (AccECN's change-triggered ACKs): without them the sender's
	 * delivered_ce missed 1.6-2.9 % of the marks in the lab, where the kernel's dctcp, which sends them, missed
	 * 0-0.6 % (the 3-bit ACE wraps when one ACK covers more than 7 CE packets). */
	ce_state = event == CA_EVENT_ECN_IS_CE;
	if (p->ce_state != ce_state) {
		if (icsk->icsk_ack.pending & ICSK_ACK_TIMER) {
			/* the delayed ACK covers data of the old state: send it now, with the old ECE */
			if (!accecn)
				prague_set_ece(tp, p->ce_state);
			bpf_tcp_send_ack(tp, p->prior_rcv_nxt);
		}
		icsk->icsk_ack.pending |= ICSK_ACK_NOW;
	}
	p->prior_rcv_nxt = tp->rcv_nxt;
	p->ce_state = ce_state;
	if (!accecn)
		prague_set_ece(tp, ce_state);
}

/* What the kernel keeps as ssthresh when it enters CWR, Recovery or Loss; set_state sets the real one. */
SEC("struct_ops/prague_ssthresh")
__u32 BPF_PROG(prague_ssthresh, struct sock *sk)
{
	return max(tcp_sk(sk)->snd_ssthresh, (__u32)PRAGUE_MIN_CWND);
}

SEC("struct_ops/prague_undo_cwnd")
__u32 BPF_PROG(prague_undo_cwnd, struct sock *sk)
{
	struct prague *p = inet_csk_ca(sk);

	if (p->loss_frac > p->frac_cwnd)
		p->frac_cwnd = p->loss_frac;
	p->in_loss = 0;
	return max(tcp_sk(sk)->snd_cwnd, (__u32)(p->frac_cwnd >> PRAGUE_SHIFT));
}

/*
 * A socket that leaves prague for another algorithm leaves the ECN prague negotiated for itself: iperf3 sets
 * its -C algorithm after connect(), so in a competing set every handshake runs under the namespace's default,
 * and a cubic flow beside prague had classic ECN, sent ECT(0) and landed in the L queue (0.41 of its packets
 * marked, 1.1 of 20 Mbit/s).
 */
SEC("struct_ops/prague_release")
void BPF_PROG(prague_release, struct sock *sk)
{
	tcp_sk(sk)->ecn_flags = 0;
}

CCSCOPE_CC(prague,
	.init = (void *)prague_init,
	.cong_control = (void *)prague_cong_control,
	.set_state = (void *)prague_set_state,
	.cwnd_event = (void *)prague_cwnd_event,
	.ssthresh = (void *)prague_ssthresh,
	.undo_cwnd = (void *)prague_undo_cwnd,
	.release = (void *)prague_release,
	.flags = TCP_CONG_NEEDS_ECN);
