// The PI family of AQMs for ccscope-delayline: PIE (RFC 8033) and DualPI2 (RFC 9332), deciding as the
// kernel's sch_pie.c and sch_dualpi2.c do, in doubles instead of their fixed point. Decisions only: the
// delay line owns the queues, the clock and the packets, and carries out each verdict (pi.c).
#ifndef CCSCOPE_PI_H
#define CCSCOPE_PI_H

#include <stdint.h>

// The ECN field of an IP header (RFC 3168, RFC 9331): the two low bits of the TOS or traffic class.
enum ecn_field { ECN_NOT_ECT = 0, ECN_ECT1 = 1, ECN_ECT0 = 2, ECN_CE = 3 };

enum pi_verdict { PI_PASS, PI_MARK, PI_DROP };

// A queue the AQM guards holds at least this many bytes before it drops or marks (2 MTU frames).
#define PI_MIN_BACKLOG_BYTES (2 * 1514)

// PIE, one queue; decided at enqueue, its delay measured at dequeue, its probability updated every tupdate.
struct pie {
	int64_t target, tupdate; // ns
	int ecn;		 // marks ECN-capable packets while the probability is at most PIE_MARK_PROB
	double prob, accu_prob;
	int64_t qdelay, qdelay_old, burst; // ns
	int64_t dq_tstamp;		   // the last dequeue (0: none since the burst allowance was reset)
};

void pie_init(struct pie *s, int64_t target, int64_t tupdate, int ecn);
enum pi_verdict pie_enqueue(struct pie *s, uint64_t backlog_bytes, enum ecn_field ecn, double u);
void pie_dequeued(struct pie *s, int64_t now, int64_t sojourn, uint64_t backlog_after);
void pie_update(struct pie *s, uint64_t backlog_bytes);

// DualPI2: an L queue (ECT(1) and CE) beside a C queue (the rest), one PI controller coupling them.
struct dualpi2 {
	int64_t target, tupdate, step; // ns; step: the L queue's marking threshold (sojourn)
	double k;		       // coupling: p_CL = k p, p_C = p^2
	double p;		       // the PI controller's base probability
	int64_t last_q;		       // the queue delay at the previous update
	int64_t credit;		       // bytes x percent: > 0 serves C next (c_protection)
};

void dualpi2_init(struct dualpi2 *s, int64_t target, int64_t tupdate, int64_t step, double k);
int dualpi2_is_l(enum ecn_field ecn, unsigned ecn_mask);
void dualpi2_update(struct dualpi2 *s, int64_t c_sojourn, int64_t l_sojourn);
int dualpi2_serve_l(const struct dualpi2 *s, uint64_t l_packets, uint64_t c_packets);
void dualpi2_served(struct dualpi2 *s, int from_l, int other_waiting, uint32_t frame_bytes);
void dualpi2_idle(struct dualpi2 *s);
enum pi_verdict dualpi2_verdict(const struct dualpi2 *s, int from_l, enum ecn_field ecn, uint64_t backlog_bytes,
				int64_t sojourn, double u1, double u2, int *step_mark);

#endif
