// PIE and DualPI2's decisions (pi.h), from RFC 8033 and RFC 9332 with the kernel's choices where the two
// differ (said at each place), so that a scenario's AQM behaves as `tc qdisc add ... pie|dualpi2` would.
#include "pi.h"

#define NS 1e9
#define MS 1000000LL

// PIE (sch_pie.c's defaults): alpha 2/16 Hz, beta 20/16 Hz; 150 ms of burst allowed after an idle queue;
// ECN-capable packets are marked instead of dropped only while the probability is at most 10 %.
#define PIE_ALPHA (2.0 / 16)
#define PIE_BETA (20.0 / 16)
#define PIE_MAX_BURST (150 * MS)
#define PIE_MARK_PROB 0.1

void pie_init(struct pie *s, int64_t target, int64_t tupdate, int ecn)
{
	*s = (struct pie){.target = target, .tupdate = tupdate, .ecn = ecn, .burst = PIE_MAX_BURST};
}

// drop_early(): no drop within the burst allowance, while the delay is low and the probability small, or
// with under two frames queued; otherwise drop at the probability, derandomized (accu_prob: a drop at
// the latest when the probabilities since the last drop add up to 8.5, never before 0.85).
static int pie_drop_early(struct pie *s, uint64_t backlog_bytes, double u)
{
	if (s->burst > 0)
		return 0;
	// the kernel compares the current delay here, RFC 8033 the previous update's
	if (s->qdelay < s->target / 2 && s->prob < 0.2)
		return 0;
	if (backlog_bytes < PI_MIN_BACKLOG_BYTES)
		return 0;
	s->accu_prob = s->prob == 0 ? 0 : s->accu_prob + s->prob;
	if (s->accu_prob < 0.85)
		return 0;
	if (s->accu_prob >= 8.5)
		return 1;
	if (u < s->prob) {
		s->accu_prob = 0;
		return 1;
	}
	return 0;
}

enum pi_verdict pie_enqueue(struct pie *s, uint64_t backlog_bytes, enum ecn_field ecn, double u)
{
	if (!pie_drop_early(s, backlog_bytes, u))
		return PI_PASS;
	if (s->ecn && s->prob <= PIE_MARK_PROB && ecn != ECN_NOT_ECT)
		return PI_MARK;
	s->accu_prob = 0;
	return PI_DROP;
}

// The delay is the sojourn of the packet that just left (0 once the queue is empty); the burst allowance
// drains by the time between dequeues.
void pie_dequeued(struct pie *s, int64_t now, int64_t sojourn, uint64_t backlog_after)
{
	s->qdelay = backlog_after ? sojourn : 0;
	if (s->dq_tstamp) {
		int64_t dtime = now - s->dq_tstamp;
		s->burst = s->burst > dtime ? s->burst - dtime : 0;
	}
	s->dq_tstamp = now;
}

// calculate_probability(): the PI step, its gains scaled down while the probability is small (RFC 8033
// section 5.2: by 2 under 10 %, then by 4 per decade down to 0.0001 %), at most +2 % per step above 10 %,
// +2 % more while the delay exceeds 250 ms; decay by 1/64 while the queue stays empty; a fresh burst
// allowance once delay and probability are back to nothing.
void pie_update(struct pie *s, uint64_t backlog_bytes)
{
	double alpha = PIE_ALPHA, beta = PIE_BETA;
	int update_ok = !(s->qdelay == 0 && backlog_bytes != 0);
	if (s->prob < 0.1) {
		alpha /= 2, beta /= 2;
		for (double tier = 0.01; tier > 5e-7 && s->prob < tier; tier /= 10)
			alpha /= 4, beta /= 4;
	}
	double delta = alpha * (double)(s->qdelay - s->target) / NS + beta * (double)(s->qdelay - s->qdelay_old) / NS;
	if (delta > 0.02 && s->prob >= 0.1)
		delta = 0.02;
	if (s->qdelay > 250 * MS)
		delta += 0.02;
	s->prob += delta;
	if (s->prob > 1) {
		s->prob = 1;
		update_ok = 0;
	} else if (s->prob < 0) {
		s->prob = 0;
	}
	if (s->qdelay == 0 && s->qdelay_old == 0 && update_ok)
		s->prob -= s->prob / 64;
	if (s->qdelay < s->target / 2 && s->qdelay_old < s->target / 2 && s->prob == 0) {
		s->burst = PIE_MAX_BURST;
		s->accu_prob = 0;
		s->dq_tstamp = 0;
	}
	s->qdelay_old = s->qdelay;
}

// DualPI2 (sch_dualpi2.c's defaults): alpha 41/256 Hz and beta 819/256 Hz (RFC 9332's 0.16 and 3.2 for a
// 100 ms worst RTT); the C queue gets 10 % of the link when both wait (c_protection), the L queue 90 %.
#define DUALPI2_ALPHA (41.0 / 256)
#define DUALPI2_BETA (819.0 / 256)
#define DUALPI2_WC 10
#define DUALPI2_WL 90
#define DUALPI2_INIT_CREDIT (1514LL * (DUALPI2_WC - DUALPI2_WL)) // the L queue first

void dualpi2_init(struct dualpi2 *s, int64_t target, int64_t tupdate, int64_t step, double k)
{
	*s = (struct dualpi2){.target = target, .tupdate = tupdate, .step = step, .k = k,
			      .credit = DUALPI2_INIT_CREDIT};
}

// The L queue takes the packets whose ECN field shares a bit with `ecn_mask`, as sch_dualpi2.c classifies:
// 1 (l4s_ect, the default) ECT(1) and CE (CE may be an L4S packet marked upstream); 2 (cla_ect) ECT(0) and
// CE; 3 (any_ect) every ECN-capable packet, for scalable senders that can only send ECT(0).
int dualpi2_is_l(enum ecn_field ecn, unsigned ecn_mask)
{
	return (ecn & ecn_mask) != 0;
}

// The PI step on the larger of the two heads' sojourns (the kernel's; RFC 9332's reference uses the C
// queue's), without a cap: above p = 1/k the L queue is overloaded (below).
void dualpi2_update(struct dualpi2 *s, int64_t c_sojourn, int64_t l_sojourn)
{
	int64_t q = c_sojourn > l_sojourn ? c_sojourn : l_sojourn;
	s->p += DUALPI2_ALPHA * (double)(q - s->target) / NS + DUALPI2_BETA * (double)(q - s->last_q) / NS;
	s->p = s->p < 0 ? 0 : s->p > 1 ? 1 : s->p;
	s->last_q = q;
}

// Which queue sends next: L unless C waits and has credit (weighted round robin by bytes).
int dualpi2_serve_l(const struct dualpi2 *s, uint64_t l_packets, uint64_t c_packets)
{
	return l_packets && (!c_packets || s->credit <= 0);
}

// A packet left (not dropped): the credit moves only while the other queue waited.
void dualpi2_served(struct dualpi2 *s, int from_l, int other_waiting, uint32_t frame_bytes)
{
	if (other_waiting)
		s->credit += from_l ? DUALPI2_WC * (int64_t)frame_bytes : -DUALPI2_WL * (int64_t)frame_bytes;
}

void dualpi2_idle(struct dualpi2 *s)
{
	s->credit = DUALPI2_INIT_CREDIT;
}

// At dequeue (the kernel's default; not at enqueue): the C queue's packets are marked or dropped at p^2
// (two rolls), the L queue's marked at k p, and an L packet that waited more than the step is marked
// (`step_mark`). Overloaded (k p > 1), both queues drop at p^2 and the L queue marks everything else.
// Not-ECT cannot carry a mark: dropped instead. Nothing under two frames queued.
enum pi_verdict dualpi2_verdict(const struct dualpi2 *s, int from_l, enum ecn_field ecn, uint64_t backlog_bytes,
				int64_t sojourn, double u1, double u2, int *step_mark)
{
	int overload = s->k * s->p > 1, classic_roll = u1 < s->p && u2 < s->p;
	enum pi_verdict v = PI_PASS;
	*step_mark = 0;
	if (backlog_bytes >= PI_MIN_BACKLOG_BYTES) {
		if (!from_l && classic_roll)
			v = overload || ecn == ECN_NOT_ECT ? PI_DROP : PI_MARK;
		else if (from_l && overload)
			v = classic_roll ? PI_DROP : PI_MARK;
		else if (from_l && u1 < s->k * s->p)
			v = ecn == ECN_NOT_ECT ? PI_DROP : PI_MARK;
	}
	if (v == PI_PASS && from_l && sojourn > s->step) {
		*step_mark = 1;
		v = ecn == ECN_NOT_ECT ? PI_DROP : PI_MARK;
	}
	return v;
}
