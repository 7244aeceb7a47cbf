// ccscope-delayline: the userspace delay line of ccscope's emulated network ("userspace" backend).
//
// Kernels without sch_netem (WSL2, Firecracker, minimal cloud kernels) still have NFQUEUE. The router
// namespace sends one direction's forwarded packets to one queue (iptables ... -j NFQUEUE --queue-num N,
// no --queue-bypass: a bypass would silently remove the delay). This program holds every packet for
// delay (+ jitter) and then accepts it, drops a random fraction `loss`, and optionally owns the
// bottleneck: its queue, then either the delivery opportunities of a Mahimahi trace (--trace) or a fixed
// rate (--rate-bps) with an active queue management (--aqm codel, fq_codel, pie, fq_pie or dualpi2; pi.c
// decides for the PI ones). Otherwise rate limiting and the
// bottleneck queue stay in the kernel (tbf on the router's egress), separate from the delay line.
//
// Stage order per packet: random loss -> delay line (FIFO) -> [bottleneck queue (drop-tail at its
// limit) -> a trace's delivery opportunity, or the AQM's dequeue and the link's serialization at the
// rate] -> NF_ACCEPT.
//
// Order is always kept: with jitter a packet is never released before the one queued ahead of it
// (release = max(arrival + delay + U(-jitter, +jitter), previous release)), like a real path whose
// delay varies but which does not reorder. Because release order equals arrival order, one
// nfq_set_verdict_batch() accepts every packet up to the newest one due, which keeps up at high packet
// rates. fq_codel and fq_pie reorder between flows and dualpi2 between its two queues (their point): there each
// packet gets a verdict of its own.
//
// Usage: ccscope-delayline --queue N [--delay-us D] [--jitter-us J] [--loss P] [--seed S]
//          [--trace FILE | --rate-bps R [--aqm fifo|codel|fq_codel|pie|fq_pie|dualpi2 [--target-us T]
//          [--interval-us I] [--tupdate-us U] [--step-us S] [--coupling K] [--ecn-mask M] [--ecn]]]
//          [--queue-packets N | --queue-bytes N] [--maxlen N] [--stats FILE] [--realtime]
// Prints "ready" on stdout once bound to the queue. SIGUSR1 writes counters to the stats file
// (key value lines, `seq` increments per write); SIGTERM/SIGINT write them and exit.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <math.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#include "pi.h"

#define TRACE_OPPORTUNITY_BYTES 1500
#define ETH_HEADER_BYTES 14 // a rate is at layer 2, as tbf counts it: the IP packet and its Ethernet header
#define MTU_FRAME_BYTES 1514 // CoDel does not drop while at most a frame is queued (the kernel's psched_mtu)
#define SOJOURN_BUCKETS 96  // bucket i holds sojourns in [2^(i/4), 2^((i+1)/4)) us, up to 2^24 us (16 s)
#define RECV_BATCH 32
// A release this much after it was due means the machine did not run us (the delay line itself wakes
// within 0.14 ms of a release beside two busy loops, over 100 ping trains): the packet's delay is the machine's, not the
// emulated one's. Counted, so that a probe can tell (pathcheck's RTT, see testbed.verify).
#define LATE_NS 2000000LL

struct pkt {
	uint32_t id;
	uint32_t len;
	int64_t t;   // release time from the delay line (monotonic ns)
	int64_t enq; // when it entered the bottleneck queue (for the AQM's sojourn time)
	uint32_t flow; // its 5-tuple's hash (fq_codel)
	uint8_t ecn;   // the ECN field it arrived with (enum ecn_field)
	uint8_t l;     // dualpi2: it went through the L queue
	// With an AQM that marks (--ecn): the whole packet as the kernel gave it, to release with CE set.
	unsigned char *data;
	uint32_t caplen;
	int marked;
};

// Growable FIFO ring of packets.
struct ring {
	struct pkt *v;
	size_t cap, head, n;
	uint64_t bytes;
};

static void ring_push(struct ring *r, struct pkt p)
{
	if (r->n == r->cap) {
		size_t ncap = r->cap ? r->cap * 2 : 4096;
		struct pkt *nv = malloc(ncap * sizeof(*nv));
		if (!nv) {
			perror("ccscope-delayline: malloc");
			exit(1);
		}
		for (size_t i = 0; i < r->n; i++)
			nv[i] = r->v[(r->head + i) % r->cap];
		free(r->v);
		r->v = nv;
		r->cap = ncap;
		r->head = 0;
	}
	r->v[(r->head + r->n) % r->cap] = p;
	r->n++;
	r->bytes += p.len;
}

static struct pkt *ring_front(struct ring *r)
{
	return r->n ? &r->v[r->head] : NULL;
}

static struct pkt ring_pop(struct ring *r)
{
	struct pkt p = r->v[r->head];
	r->head = (r->head + 1) % r->cap;
	r->n--;
	r->bytes -= p.len;
	return p;
}

// Configuration and state (one process serves one queue = one direction).
static int64_t delay_ns, jitter_ns;
static double loss;
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t queue_num;
static const char *stats_path;
static int64_t *trace_ms; // delivery opportunities, ms offsets
static size_t trace_n;
static int64_t trace_period_ms;
static uint64_t tq_limit_packets, tq_limit_bytes;
static double rate_bps; // 0: no rate of our own (the kernel's tbf, or a trace)

static struct ring delayq, bq; // the delay line, and the bottleneck queue (trace or rate mode)
static int64_t last_release;
static int64_t trace_base;
static size_t trace_idx;
static uint64_t trace_loop;
static int64_t trace_carry;

// Rate mode: the packet on the wire, and when the link is free again.
static struct pkt on_wire;
static int wire_busy;
static int64_t link_free;
static int64_t queued_since; // when the bottleneck queue last went from empty to not

// The AQM of the bottleneck queue (rate mode): its kind and CoDel's parameters (RFC 8289), times in ns.
enum aqm_kind { AQM_FIFO, AQM_CODEL, AQM_FQ_CODEL, AQM_PIE, AQM_DUALPI2, AQM_FQ_PIE };
static struct {
	enum aqm_kind kind;
	int ecn; // marks ECN-capable packets where it would drop them
	int64_t target, interval;
	int64_t tupdate, step; // PIE and DualPI2: how often the probability is updated; DualPI2's L step
	double coupling;
	unsigned ecn_mask; // DualPI2: which ECN codepoints go to the L queue (pi.c's dualpi2_is_l)
} aqm = {.target = 5000000, .interval = 100000000, .tupdate = 16000000, .step = 1000000, .coupling = 2,
	 .ecn_mask = 1};

// PIE and DualPI2 (pi.h): their state, DualPI2's L queue (bq is its C queue), and the next update.
static struct pie pie;
static struct dualpi2 dualpi2;
static struct ring lq;
static int64_t next_update;

// CoDel's state of one queue: the bottleneck's (codel), or each flow's (fq_codel), as the kernel's
// include/net/codel_impl.h keeps it.
struct codel_vars {
	uint32_t count, lastcount;
	int dropping;
	int64_t first_above_time, drop_next;
};
static struct codel_vars bq_codel;

// fq_codel (RFC 8290), as the kernel's sch_fq_codel.c: packets hashed by their 5-tuple into FQ_FLOWS
// queues, each with its own CoDel; deficit round robin of FQ_QUANTUM bytes, flows that just became active
// (new_flows) served before the others (old_flows).
#define FQ_FLOWS 1024
#define FQ_QUANTUM 1514
#define FQ_DROP_BATCH 64 // at most this many packets go from the fattest flow at once (drop_batch_size)
// fq_pie (sch_fq_pie.c) keeps the flow queues and their round robin, with PIE per flow instead of CoDel:
// each flow's PIE decides at enqueue from that flow's own delay and backlog, all updated every tupdate.
struct fq_flow {
	struct ring q;
	struct codel_vars cv;
	struct pie pv; // fq_pie
	int64_t deficit;
	int list; // 0 in none, 1 new_flows, 2 old_flows
	int next; // the next flow of its list; -1 at its tail
};
struct flow_list {
	int head, tail;
};
static struct fq_flow *fq;
static struct flow_list new_flows = {-1, -1}, old_flows = {-1, -1};
static uint64_t fq_packets, fq_bytes;
static uint32_t hash_seed;

static int flow_queued(void)
{
	return aqm.kind == AQM_FQ_CODEL || aqm.kind == AQM_FQ_PIE;
}

// One flow queue's bytes at layer 2 (fq_pie's PIE guards each flow's own backlog).
static uint64_t flow_backlog(int i)
{
	return fq[i].q.bytes + fq[i].q.n * ETH_HEADER_BYTES;
}

static struct {
	uint64_t packets, bytes, accepted, random_drops, queue_drops, enobufs, max_held, seq, stamped;
	uint64_t late_releases, max_late_ns, late_ns, aqm_drops, aqm_marks, aqm_step_marks;
	uint64_t sojourn[SOJOURN_BUCKETS];   // of every packet the bottleneck sent (rate mode)
	uint64_t sojourn_l[SOJOURN_BUCKETS]; // of those that went through dualpi2's L queue
} st;

static int64_t release_now; // when the current round of releases happens (monotonic ns)

static uint32_t max_accept_id;
static int have_accept;

static volatile sig_atomic_t want_stats, want_exit;

// Packets in the bottleneck's queues (not yet on the wire).
static uint64_t queued_packets(void)
{
	return bq.n + lq.n + fq_packets;
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// CLOCK_REALTIME less CLOCK_MONOTONIC, from a realtime read between two monotonic ones. The stamp's age used to
// be taken from a realtime read after the caller's monotonic one: whatever ran between the two (an interrupt, the
// host descheduling the VM) was added to the age, and the packet left that much before its delay. Back-to-back
// read pairs on this VM: 11 of 26 M more than 100 us apart, one 1 ms (2026-11-29). A bracket wider than
// OFFSET_BRACKET_NS is read again, up to OFFSET_READS times, and the narrowest is kept.
#define OFFSET_BRACKET_NS 20000
#define OFFSET_READS 4
static int64_t realtime_offset_ns(void)
{
	int64_t offset = 0, narrowest = INT64_MAX;
	for (int i = 0; i < OFFSET_READS && narrowest > OFFSET_BRACKET_NS; i++) {
		struct timespec real;
		int64_t before = now_ns();
		clock_gettime(CLOCK_REALTIME, &real);
		int64_t after = now_ns();
		if (after - before < narrowest) {
			narrowest = after - before;
			offset = (int64_t)real.tv_sec * 1000000000LL + real.tv_nsec - (before + narrowest / 2);
		}
	}
	return offset;
}

// When the packet reached the router, on the monotonic clock. The kernel stamps arriving packets
// (CLOCK_REALTIME) once any socket asks for timestamps, which enable_kernel_timestamps() does; the
// NFQUEUE message carries the stamp. Counting the delay from it rather than from our own receipt keeps
// the kernel-to-userspace wake-up latency out of the emulated delay. Falls back to `now`.
static int64_t arrival_ns(struct nfq_data *nfa, int64_t now)
{
	struct timeval tv;
	if (nfq_get_timestamp(nfa, &tv) != 0 || tv.tv_sec == 0)
		return now;
	int64_t arrival = (int64_t)tv.tv_sec * 1000000000LL + (int64_t)tv.tv_usec * 1000LL - realtime_offset_ns();
	if (arrival > now || now - arrival > 1000000000LL) // clock stepped, or a stale stamp: trust our own clock
		return now;
	st.stamped++;
	return arrival;
}

// Kernel receive timestamps are on only while some socket wants them: this one, for our lifetime.
static void enable_kernel_timestamps(void)
{
	int one = 1;
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof(one)) != 0)
		perror("ccscope-delayline: SO_TIMESTAMP (delays count from our receipt instead)");
}

static uint64_t rng_next(void) // xorshift64*
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rng_unit(void) // [0, 1)
{
	return (rng_next() >> 11) * (1.0 / 9007199254740992.0);
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		want_stats = 1;
	else
		want_exit = 1;
}

// The kernel's own counters for our queue: packets dropped because the queue was full
// (queue_dropped) or the netlink socket could not take them (user_dropped).
static void kernel_counters(uint64_t *queue_dropped, uint64_t *user_dropped, uint64_t *waiting)
{
	*queue_dropped = *user_dropped = *waiting = 0;
	FILE *f = fopen("/proc/net/netfilter/nfnetlink_queue", "r");
	if (!f)
		return;
	unsigned qn, portid, qlen, mode, range;
	unsigned long long qd, ud, idseq;
	int one;
	while (fscanf(f, "%u %u %u %u %u %llu %llu %llu %d", &qn, &portid, &qlen, &mode, &range, &qd, &ud,
		      &idseq, &one) == 9) {
		if (qn == queue_num) {
			*queue_dropped = qd;
			*user_dropped = ud;
			*waiting = qlen; // packets awaiting our verdict, read by us or not yet
		}
	}
	fclose(f);
}

static void write_stats(void)
{
	if (!stats_path)
		return;
	uint64_t kqd, kud, waiting;
	kernel_counters(&kqd, &kud, &waiting);
	uint64_t held = delayq.n + queued_packets() + (uint64_t)wire_busy;
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", stats_path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	st.seq++;
	fprintf(f,
		"seq %" PRIu64 "\npackets %" PRIu64 "\nbytes %" PRIu64 "\naccepted %" PRIu64
		"\nrandom_drops %" PRIu64 "\nqueue_drops %" PRIu64 "\nkernel_queue_dropped %" PRIu64
		"\nkernel_user_dropped %" PRIu64 "\nenobufs %" PRIu64 "\nmax_held %" PRIu64 "\nheld %" PRIu64
		"\nkernel_stamped %" PRIu64 "\nlate_releases %" PRIu64 "\nmax_late_us %" PRIu64 "\nlate_us %" PRIu64
		"\naqm_drops %" PRIu64 "\naqm_marks %" PRIu64 "\naqm_step_marks %" PRIu64 "\n",
		st.seq, st.packets, st.bytes, st.accepted, st.random_drops, st.queue_drops, kqd, kud, st.enobufs,
		st.max_held, held > waiting ? held : waiting, st.stamped, st.late_releases, st.max_late_ns / 1000,
		st.late_ns / 1000, st.aqm_drops, st.aqm_marks, st.aqm_step_marks);
	for (int i = 0; i < SOJOURN_BUCKETS; i++) {
		if (st.sojourn[i])
			fprintf(f, "sojourn_bucket_%d %" PRIu64 "\n", i, st.sojourn[i]);
		if (st.sojourn_l[i])
			fprintf(f, "sojourn_l_bucket_%d %" PRIu64 "\n", i, st.sojourn_l[i]);
	}
	fclose(f);
	rename(tmp, stats_path);
}

static void forget(struct pkt *p)
{
	free(p->data);
	p->data = NULL;
}

static void count_release(int64_t due)
{
	int64_t late = release_now - due;
	if (late > LATE_NS)
		st.late_releases++;
	if (late > 0 && (uint64_t)late > st.max_late_ns)
		st.max_late_ns = (uint64_t)late;
	if (late > 0)
		st.late_ns += (uint64_t)late; // all of it, below LATE_NS too: what a packet's delay carries on average
	st.accepted++;
}

static void flush_accepts(struct nfq_q_handle *qh)
{
	if (have_accept) {
		nfq_set_verdict_batch(qh, max_accept_id, NF_ACCEPT);
		have_accept = 0;
	}
}

// Releases p, which was due at `due` (its delay line time, or the trace opportunity that carries it), in
// the next batch verdict: every packet the kernel still holds up to p's id goes with it, which is right
// while packets leave in the order they came. fq_codel's flows and dualpi2's queues leave out of that order
// (a new flow's packet before an older one of the bulk flow, which a batch would release early, and whose
// drop would then come too late): one verdict each.
static void accept_pkt(struct nfq_q_handle *qh, struct pkt *p, int64_t due)
{
	count_release(due);
	if (flow_queued() || aqm.kind == AQM_DUALPI2) {
		nfq_set_verdict(qh, p->id, NF_ACCEPT, 0, NULL);
	} else {
		max_accept_id = p->id;
		have_accept = 1;
	}
	forget(p);
}

// Releases p with the header CE marked: alone, after every packet ahead of it (a batch verdict would
// release p as the kernel holds it, unmarked).
static void accept_marked(struct nfq_q_handle *qh, struct pkt *p, int64_t due)
{
	flush_accepts(qh);
	count_release(due);
	nfq_set_verdict(qh, p->id, NF_ACCEPT, p->caplen, p->data);
	forget(p);
}

// INET_ECN_set_ce(): CE into an ECN-capable packet (ECT(0) or ECT(1)), the IPv4 header checksum updated
// for the changed word (RFC 1624, eqn. 3); 1 if the packet now carries CE. 0 for one that is not
// ECN-capable, or whose copy is not the whole packet: the AQM drops it instead.
static int set_ce(struct pkt *p)
{
	unsigned char *h = p->data;
	if (!h || p->caplen < p->len || p->caplen < 20)
		return 0;
	if ((h[0] >> 4) == 4) {
		if ((h[1] & 3) == 0)
			return 0;
		if ((h[1] & 3) == 3)
			return 1;
		uint16_t old = (uint16_t)(h[0] << 8 | h[1]);
		h[1] |= 3;
		uint32_t sum = (uint16_t)~(h[10] << 8 | h[11]);
		sum += (uint16_t)~old;
		sum += (uint16_t)(h[0] << 8 | h[1]);
		sum = (sum & 0xffff) + (sum >> 16);
		sum = (sum & 0xffff) + (sum >> 16);
		h[10] = (unsigned char)(~sum >> 8);
		h[11] = (unsigned char)~sum;
	} else if ((h[0] >> 4) == 6 && p->caplen >= 40) {
		if (((h[1] >> 4) & 3) == 0)
			return 0;
		h[1] |= 0x30;
	} else {
		return 0;
	}
	p->marked = 1;
	return 1;
}

// CoDel's choice at the head, where it would drop: mark instead if it may and the packet can carry it.
static int codel_mark(struct pkt *p)
{
	if (aqm.ecn && set_ce(p)) {
		st.aqm_marks++;
		return 1;
	}
	return 0;
}

static int64_t next_opportunity(void)
{
	return trace_base + ((int64_t)trace_loop * trace_period_ms + trace_ms[trace_idx]) * 1000000LL;
}

static void advance_opportunity(void)
{
	if (++trace_idx == trace_n) {
		trace_idx = 0;
		trace_loop++;
	}
}

static int over_limit(uint64_t packets, uint64_t bytes)
{
	return (tq_limit_packets && packets > tq_limit_packets) || (tq_limit_bytes && bytes > tq_limit_bytes);
}

static void tail_drop(struct nfq_q_handle *qh, struct pkt *p)
{
	st.queue_drops++;
	nfq_set_verdict(qh, p->id, NF_DROP, 0, NULL);
	forget(p);
}

static void fq_enqueue(struct nfq_q_handle *qh, struct pkt p);

static void aqm_drop(struct nfq_q_handle *qh, struct pkt *p)
{
	st.aqm_drops++;
	nfq_set_verdict(qh, p->id, NF_DROP, 0, NULL);
	forget(p);
}

static uint64_t backlog_bytes(void)
{
	// at layer 2, as the kernel's qdisc_pkt_len counts
	if (flow_queued())
		return fq_bytes + fq_packets * ETH_HEADER_BYTES;
	return bq.bytes + lq.bytes + (bq.n + lq.n) * ETH_HEADER_BYTES;
}

// A PI verdict carried out on p: 1 if p goes on (marked if so decided), 0 if it was dropped. A packet that
// already carries CE passes as it is, uncounted: a mark is a CE packet made. (The kernel's INET_ECN_set_ce()
// succeeds on a CE packet, so sch_dualpi2 counts it again, and twice when its coupling and then its step
// mark the same packet: tests/vm/test_aqm_fidelity.py.) One whose copy cannot be rewritten is dropped.
static int carry_out(struct nfq_q_handle *qh, struct pkt *p, enum pi_verdict v, int step)
{
	if (v == PI_MARK && p->ecn != ECN_CE) {
		if (!set_ce(p))
			v = PI_DROP;
		else
			st.aqm_marks++, st.aqm_step_marks += (uint64_t)step;
	}
	if (v == PI_DROP) {
		aqm_drop(qh, p);
		return 0;
	}
	return 1;
}

// Moves a packet that left the delay line into the bottleneck queue (drop-tail at its limit); PIE decides
// here, DualPI2 sorts it into its L or C queue.
static void enter_bottleneck(struct nfq_q_handle *qh, struct pkt p)
{
	p.enq = p.t;
	if (!queued_packets())
		queued_since = p.enq;
	if (flow_queued()) {
		fq_enqueue(qh, p);
		return;
	}
	if (over_limit(bq.n + lq.n + 1, bq.bytes + lq.bytes + p.len)) {
		pie.accu_prob = 0; // PIE's derandomization restarts at every drop (sch_pie.c's out:)
		tail_drop(qh, &p);
		return;
	}
	if (aqm.kind == AQM_PIE && !carry_out(qh, &p, pie_enqueue(&pie, backlog_bytes(), p.ecn, rng_unit()), 0))
		return;
	ring_push(aqm.kind == AQM_DUALPI2 && dualpi2_is_l(p.ecn, aqm.ecn_mask) ? &lq : &bq, p);
}

// The head of queue q (the bottleneck's, or one flow's under fq_codel, whose totals it keeps).
static struct pkt pop_from(struct ring *q)
{
	struct pkt p = ring_pop(q);
	if (q != &bq) {
		fq_packets--;
		fq_bytes -= p.len;
	}
	return p;
}

// codel_should_drop(): the packet waited above target for a whole interval (and more than one packet
// is queued, so dropping cannot starve the link). NULL: the queue ran empty.
static int codel_should_drop(const struct pkt *p, struct codel_vars *v, int64_t now)
{
	if (!p || now - p->enq < aqm.target || backlog_bytes() <= MTU_FRAME_BYTES) {
		v->first_above_time = 0;
		return 0;
	}
	if (v->first_above_time == 0) {
		v->first_above_time = now + aqm.interval;
		return 0;
	}
	return now > v->first_above_time; // codel_time_after(): strictly after
}

static int64_t codel_control_law(int64_t t, uint32_t count)
{
	return t + (int64_t)((double)aqm.interval / sqrt((double)count));
}

// The next packet of queue q to send at `now`, after CoDel's drops and marks (codel_dequeue() of the
// kernel); 0 if none is left.
static int codel_dequeue(struct nfq_q_handle *qh, int64_t now, struct ring *q, struct codel_vars *v,
			 struct pkt *out)
{
	if (!q->n) {
		v->dropping = 0;
		return 0;
	}
	struct pkt p = pop_from(q);
	int have = 1, drop = codel_should_drop(&p, v, now);
	if (v->dropping) {
		if (!drop) {
			v->dropping = 0;
		} else {
			while (v->dropping && now >= v->drop_next) {
				v->count++;
				if (codel_mark(&p)) {
					v->drop_next = codel_control_law(v->drop_next, v->count);
					break;
				}
				aqm_drop(qh, &p);
				have = q->n > 0;
				if (have)
					p = pop_from(q);
				if (!codel_should_drop(have ? &p : NULL, v, now))
					v->dropping = 0;
				else
					v->drop_next = codel_control_law(v->drop_next, v->count);
			}
		}
	} else if (drop) {
		if (!codel_mark(&p)) {
			aqm_drop(qh, &p);
			have = q->n > 0;
			if (have)
				p = pop_from(q);
			codel_should_drop(have ? &p : NULL, v, now);
		}
		v->dropping = 1;
		uint32_t delta = v->count - v->lastcount;
		v->count = (delta > 1 && now - v->drop_next < 16 * aqm.interval) ? delta : 1;
		v->lastcount = v->count;
		v->drop_next = codel_control_law(now, v->count);
	}
	if (have)
		*out = p;
	return have;
}

static void list_append(struct flow_list *l, int i, int which)
{
	fq[i].next = -1;
	fq[i].list = which;
	if (l->tail >= 0)
		fq[l->tail].next = i;
	else
		l->head = i;
	l->tail = i;
}

static int list_pop(struct flow_list *l)
{
	int i = l->head;
	l->head = fq[i].next;
	if (l->head < 0)
		l->tail = -1;
	fq[i].list = 0;
	return i;
}

// fq_codel_drop(): the queue is over its limit, so the flow with the most bytes queued loses packets from
// its head until half its backlog is gone (at most FQ_DROP_BATCH), and its CoDel counts them as drops.
static void fq_drop_batch(struct nfq_q_handle *qh)
{
	int fattest = 0;
	for (int j = 1; j < FQ_FLOWS; j++)
		if (fq[j].q.bytes > fq[fattest].q.bytes)
			fattest = j;
	uint64_t half = fq[fattest].q.bytes / 2, gone = 0;
	uint32_t n = 0;
	while (fq[fattest].q.n && n < FQ_DROP_BATCH) {
		struct pkt dropped = pop_from(&fq[fattest].q);
		gone += dropped.len;
		tail_drop(qh, &dropped);
		if (++n, gone >= half)
			break;
	}
	fq[fattest].cv.count += n;
}

// fq_codel_enqueue(): into its flow's queue, the flow onto new_flows if it was idle; over the limit, a
// batch from the fattest flow goes (RFC 8290 section 4.1.3). fq_pie_qdisc_enqueue(): over the limit the
// packet goes, then its flow's PIE drops or marks it, or lets it in.
static void fq_enqueue(struct nfq_q_handle *qh, struct pkt p)
{
	int i = (int)(p.flow % FQ_FLOWS);
	if (aqm.kind == AQM_FQ_PIE) {
		if (over_limit(fq_packets + 1, fq_bytes + p.len)) {
			fq[i].pv.accu_prob = 0; // as every drop (sch_fq_pie.c's out:)
			tail_drop(qh, &p);
			return;
		}
		if (!carry_out(qh, &p, pie_enqueue(&fq[i].pv, flow_backlog(i), p.ecn, rng_unit()), 0))
			return;
	}
	ring_push(&fq[i].q, p);
	fq_packets++;
	fq_bytes += p.len;
	if (!fq[i].list) {
		list_append(&new_flows, i, 1);
		fq[i].deficit = FQ_QUANTUM;
	}
	if (aqm.kind == AQM_FQ_CODEL && over_limit(fq_packets, fq_bytes))
		fq_drop_batch(qh);
}

// The head of flow i under fq_pie, whose PIE learns its delay (fq_pie_qdisc_dequeue()); 0 if it is empty.
static int fq_pie_dequeue(int i, int64_t now, struct pkt *out)
{
	if (!fq[i].q.n)
		return 0;
	*out = pop_from(&fq[i].q);
	pie_dequeued(&fq[i].pv, now, now - out->enq, flow_backlog(i));
	return 1;
}

// fq_codel_dequeue(): new flows first, then old ones, each for its deficit; a flow that runs out of
// deficit goes to the tail of old_flows, one that runs empty leaves (via old_flows if it was new and
// others wait there, so that it cannot take new_flows' priority again at once).
static int fq_dequeue(struct nfq_q_handle *qh, int64_t now, struct pkt *out)
{
	for (;;) {
		struct flow_list *head = new_flows.head >= 0 ? &new_flows : old_flows.head >= 0 ? &old_flows : NULL;
		if (!head)
			return 0;
		int i = head->head;
		if (fq[i].deficit <= 0) {
			fq[i].deficit += FQ_QUANTUM;
			list_pop(head);
			list_append(&old_flows, i, 2);
			continue;
		}
		if (aqm.kind == AQM_FQ_PIE ? fq_pie_dequeue(i, now, out) : codel_dequeue(qh, now, &fq[i].q, &fq[i].cv, out)) {
			fq[i].deficit -= out->len + ETH_HEADER_BYTES;
			return 1;
		}
		list_pop(head);
		if (head == &new_flows && old_flows.head >= 0)
			list_append(&old_flows, i, 2);
	}
}

// A flow's 5-tuple (addresses, protocol, ports where there are), hashed with the run's seed.
static uint32_t flow_hash(const unsigned char *h, int len)
{
	uint32_t x = hash_seed;
	int from = 0, to = 0, ports = -1;
	if (len >= 20 && (h[0] >> 4) == 4) {
		from = 9, to = 20; // protocol, checksum, addresses
		ports = (h[0] & 0xf) * 4;
		if (h[9] != 6 && h[9] != 17)
			ports = -1;
	} else if (len >= 40 && (h[0] >> 4) == 6) {
		from = 6, to = 40; // next header, hop limit, addresses
		ports = h[6] == 6 || h[6] == 17 ? 40 : -1;
	}
	for (int i = from; i < to; i++)
		if (!((h[0] >> 4) == 4 && (i == 10 || i == 11)) && !((h[0] >> 4) == 6 && i == 7))
			x = (x ^ h[i]) * 16777619u;
	if (ports >= 0 && ports + 4 <= len)
		for (int i = ports; i < ports + 4; i++)
			x = (x ^ h[i]) * 16777619u;
	return x ^ (x >> 15);
}

static void count_sojourn(uint64_t *hist, int64_t ns)
{
	double us = ns > 0 ? (double)ns / 1000.0 : 0.0;
	int i = us < 1.0 ? 0 : (int)(4.0 * log2(us));
	hist[i < SOJOURN_BUCKETS ? i : SOJOURN_BUCKETS - 1]++;
}

// The next packet PIE lets go: it decided at enqueue, and learns the delay here.
static int pie_dequeue(int64_t now, struct pkt *out)
{
	if (!bq.n)
		return 0;
	*out = ring_pop(&bq);
	pie_dequeued(&pie, now, now - out->enq, backlog_bytes());
	return 1;
}

// dualpi2_dequeue(): the queue the credit picks gives its head, which the AQM may then drop or mark.
static int dualpi2_dequeue(struct nfq_q_handle *qh, int64_t now, struct pkt *out)
{
	while (lq.n || bq.n) {
		int from_l = dualpi2_serve_l(&dualpi2, lq.n, bq.n), step;
		struct pkt p = ring_pop(from_l ? &lq : &bq);
		int other_waiting = from_l ? bq.n > 0 : lq.n > 0;
		enum pi_verdict v = dualpi2_verdict(&dualpi2, from_l, p.ecn, backlog_bytes(), now - p.enq, rng_unit(),
						    rng_unit(), &step);
		if (!carry_out(qh, &p, v, step))
			continue;
		dualpi2_served(&dualpi2, from_l, other_waiting, p.len + ETH_HEADER_BYTES);
		p.l = (uint8_t)from_l;
		*out = p;
		return 1;
	}
	dualpi2_idle(&dualpi2);
	return 0;
}

// Every tupdate: the PI controller's step, from the queue delay now.
static void pi_update(int64_t t)
{
	if (aqm.kind == AQM_PIE) {
		pie_update(&pie, backlog_bytes());
	} else if (aqm.kind == AQM_FQ_PIE) {
		for (int i = 0; i < FQ_FLOWS; i++)
			pie_update(&fq[i].pv, flow_backlog(i));
	} else {
		int64_t c = bq.n ? t - ring_front(&bq)->enq : 0, l = lq.n ? t - ring_front(&lq)->enq : 0;
		dualpi2_update(&dualpi2, c, l);
	}
	next_update += aqm.tupdate;
}

// Rate mode at `t`: the link is free, so the bottleneck queue's next packet (after the AQM) goes on the
// wire, to be released when its last bit has left at the rate.
static void start_sending(struct nfq_q_handle *qh, int64_t t)
{
	struct pkt p;
	int have = flow_queued() ? fq_dequeue(qh, t, &p)
		   : aqm.kind == AQM_CODEL  ? codel_dequeue(qh, t, &bq, &bq_codel, &p)
		   : aqm.kind == AQM_PIE    ? pie_dequeue(t, &p)
		   : aqm.kind == AQM_DUALPI2 ? dualpi2_dequeue(qh, t, &p)
		   : bq.n		    ? (p = ring_pop(&bq), 1)
					    : 0;
	if (!have)
		return;
	count_sojourn(st.sojourn, t - p.enq);
	if (p.l)
		count_sojourn(st.sojourn_l, t - p.enq);
	on_wire = p;
	wire_busy = 1;
	link_free = t + (int64_t)((double)(p.len + ETH_HEADER_BYTES) * 8e9 / rate_bps + 0.5);
}

// Rate mode: the same as run_due below, with the wire instead of trace opportunities.
static int64_t run_due_rate(struct nfq_q_handle *qh, int64_t now)
{
	for (;;) {
		struct pkt *d = ring_front(&delayq);
		int64_t td = d ? d->t : INT64_MAX;
		int64_t tf = wire_busy ? link_free : INT64_MAX; // the packet on the wire has left
		int64_t ts = INT64_MAX;				// the next one goes on the wire
		if (!wire_busy && queued_packets()) // the link is free since link_free, the queue full since
			ts = link_free > queued_since ? link_free : queued_since;
		int64_t tu = aqm.kind == AQM_PIE || aqm.kind == AQM_DUALPI2 || aqm.kind == AQM_FQ_PIE ? next_update
											      : INT64_MAX;
		int64_t t = td < tf ? td : tf;
		t = t < ts ? t : ts;
		t = t < tu ? t : tu;
		if (t > now)
			return t == INT64_MAX ? -1 : t;
		if (tu == t) {
			pi_update(t);
		} else if (tf == t) {
			wire_busy = 0;
			if (on_wire.marked)
				accept_marked(qh, &on_wire, link_free);
			else
				accept_pkt(qh, &on_wire, link_free);
			// sch_dualpi2 under tbf: tbf asks it for the next packet as the last one leaves, and finding
			// both queues empty it gives L the first turn again (dequeue_packet). The link drained here.
			if (aqm.kind == AQM_DUALPI2 && !queued_packets())
				dualpi2_idle(&dualpi2);
		} else if (td == t) {
			enter_bottleneck(qh, ring_pop(&delayq));
		} else {
			start_sending(qh, t);
		}
	}
}

// Processes every event due by `now` in time order; returns the time of the next event or -1.
static int64_t run_due(struct nfq_q_handle *qh, int64_t now)
{
	if (rate_bps > 0)
		return run_due_rate(qh, now);
	for (;;) {
		struct pkt *d = ring_front(&delayq);
		int64_t td = d ? d->t : INT64_MAX;
		int64_t to = INT64_MAX;
		if (trace_n) {
			if (!bq.n) {
				// Opportunities pass unused while the queue is empty (as in Mahimahi).
				int64_t horizon = d ? d->t : now;
				while (next_opportunity() < horizon)
					advance_opportunity();
				trace_carry = 0;
			}
			if (bq.n)
				to = next_opportunity();
		}
		int64_t t = td < to ? td : to;
		if (t > now)
			return t == INT64_MAX ? -1 : t;
		if (td <= to) {
			struct pkt p = ring_pop(&delayq);
			if (trace_n)
				enter_bottleneck(qh, p);
			else
				accept_pkt(qh, &p, p.t);
		} else {
			int64_t budget = TRACE_OPPORTUNITY_BYTES + trace_carry;
			while (bq.n && ring_front(&bq)->len <= budget) {
				struct pkt p = ring_pop(&bq);
				budget -= p.len;
				accept_pkt(qh, &p, to);
			}
			// A packet larger than what is left keeps the remainder toward its delivery.
			trace_carry = bq.n ? budget : 0;
			advance_opportunity();
		}
	}
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data)
{
	(void)msg;
	(void)data;
	struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
	if (!ph)
		return 0;
	uint32_t id = ntohl(ph->packet_id);
	unsigned char *payload;
	int plen = nfq_get_payload(nfa, &payload);
	uint32_t len = 0;
	// We copy only the headers (the whole packet when the AQM marks); the IP header carries the full length.
	if (plen >= 20 && (payload[0] >> 4) == 4)
		len = ((uint32_t)payload[2] << 8) | payload[3];
	else if (plen >= 40 && (payload[0] >> 4) == 6)
		len = 40 + (((uint32_t)payload[4] << 8) | payload[5]);
	else if (plen > 0)
		len = (uint32_t)plen;
	st.packets++;
	st.bytes += len;
	if (loss > 0 && rng_unit() < loss) {
		st.random_drops++;
		nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
		return 0;
	}
	int64_t now = arrival_ns(nfa, now_ns());
	int64_t d = delay_ns;
	if (jitter_ns)
		d += (int64_t)((rng_unit() * 2.0 - 1.0) * (double)jitter_ns);
	if (d < 0)
		d = 0;
	int64_t t = now + d;
	if (t < last_release)
		t = last_release; // keep order
	last_release = t;
	struct pkt p = {.id = id, .len = len, .t = t};
	if (plen >= 20 && (payload[0] >> 4) == 4)
		p.ecn = payload[1] & 3;
	else if (plen >= 40 && (payload[0] >> 4) == 6)
		p.ecn = (payload[1] >> 4) & 3;
	if (flow_queued())
		p.flow = flow_hash(payload, plen);
	if (aqm.ecn && plen > 0) {
		p.data = malloc((size_t)plen);
		if (!p.data) {
			perror("ccscope-delayline: malloc");
			exit(1);
		}
		memcpy(p.data, payload, (size_t)plen);
		p.caplen = (uint32_t)plen;
	}
	ring_push(&delayq, p);
	uint64_t held = delayq.n + queued_packets() + (uint64_t)wire_busy;
	if (held > st.max_held)
		st.max_held = held;
	return 0;
}

static void load_trace(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "ccscope-delayline: cannot open trace %s: %s\n", path, strerror(errno));
		exit(2);
	}
	size_t cap = 0;
	long long v, prev = -1;
	while (fscanf(f, "%lld", &v) == 1) {
		if (v < prev || v < 0) {
			fprintf(stderr, "ccscope-delayline: trace %s: timestamps must be >= 0 and ascending\n", path);
			exit(2);
		}
		prev = v;
		if (trace_n == cap) {
			cap = cap ? cap * 2 : 4096;
			trace_ms = realloc(trace_ms, cap * sizeof(*trace_ms));
			if (!trace_ms)
				exit(1);
		}
		trace_ms[trace_n++] = v;
	}
	fclose(f);
	if (!trace_n || prev <= 0) {
		fprintf(stderr, "ccscope-delayline: trace %s has no delivery opportunities after 0 ms\n", path);
		exit(2);
	}
	trace_period_ms = prev; // Mahimahi loops the trace with the last timestamp as its period
}

static void usage(void)
{
	fprintf(stderr, "usage: ccscope-delayline --queue N [--delay-us D] [--jitter-us J] [--loss P] "
			"[--seed S] [--trace FILE | --rate-bps R [--aqm fifo|codel|fq_codel|pie|fq_pie|dualpi2 [--target-us T] "
			"[--interval-us I] [--tupdate-us U] [--step-us S] [--coupling K] [--ecn-mask M] [--ecn]]] "
			"[--queue-packets N|--queue-bytes N] [--maxlen N] [--stats FILE] [--realtime]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"queue", required_argument, 0, 'q'},	 {"delay-us", required_argument, 0, 'd'},
		{"jitter-us", required_argument, 0, 'j'}, {"loss", required_argument, 0, 'l'},
		{"seed", required_argument, 0, 's'},	 {"trace", required_argument, 0, 't'},
		{"queue-packets", required_argument, 0, 'p'}, {"queue-bytes", required_argument, 0, 'b'},
		{"maxlen", required_argument, 0, 'm'},	 {"stats", required_argument, 0, 'o'},
		{"realtime", no_argument, 0, 'r'},	 {"rate-bps", required_argument, 0, 'R'},
		{"aqm", required_argument, 0, 'A'},	 {"target-us", required_argument, 0, 'T'},
		{"interval-us", required_argument, 0, 'I'}, {"ecn", no_argument, 0, 'E'},
		{"tupdate-us", required_argument, 0, 'U'}, {"step-us", required_argument, 0, 'S'},
		{"coupling", required_argument, 0, 'K'},	 {"ecn-mask", required_argument, 0, 'M'},
		{0, 0, 0, 0},
	};
	long long maxlen = 1 << 17;
	int have_queue = 0, realtime = 0, c;
	const char *trace = NULL;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'q': queue_num = (uint32_t)strtoul(optarg, NULL, 10); have_queue = 1; break;
		case 'd': delay_ns = strtoll(optarg, NULL, 10) * 1000LL; break;
		case 'j': jitter_ns = strtoll(optarg, NULL, 10) * 1000LL; break;
		case 'l': loss = strtod(optarg, NULL); break;
		case 's': rng_state = strtoull(optarg, NULL, 10) | 1; break;
		case 't': trace = optarg; break;
		case 'p': tq_limit_packets = strtoull(optarg, NULL, 10); break;
		case 'b': tq_limit_bytes = strtoull(optarg, NULL, 10); break;
		case 'm': maxlen = strtoll(optarg, NULL, 10); break;
		case 'o': stats_path = optarg; break;
		case 'r': realtime = 1; break;
		case 'R': rate_bps = strtod(optarg, NULL); break;
		case 'A':
			if (strcmp(optarg, "codel") == 0)
				aqm.kind = AQM_CODEL;
			else if (strcmp(optarg, "fq_codel") == 0)
				aqm.kind = AQM_FQ_CODEL;
			else if (strcmp(optarg, "pie") == 0)
				aqm.kind = AQM_PIE;
			else if (strcmp(optarg, "fq_pie") == 0)
				aqm.kind = AQM_FQ_PIE;
			else if (strcmp(optarg, "dualpi2") == 0)
				aqm.kind = AQM_DUALPI2;
			else if (strcmp(optarg, "fifo") != 0)
				usage();
			break;
		case 'T': aqm.target = strtoll(optarg, NULL, 10) * 1000LL; break;
		case 'I': aqm.interval = strtoll(optarg, NULL, 10) * 1000LL; break;
		case 'E': aqm.ecn = 1; break;
		case 'U': aqm.tupdate = strtoll(optarg, NULL, 10) * 1000LL; break;
		case 'S': aqm.step = strtoll(optarg, NULL, 10) * 1000LL; break;
		case 'K': aqm.coupling = strtod(optarg, NULL); break;
		case 'M': aqm.ecn_mask = (unsigned)strtoul(optarg, NULL, 10); break;
		default: usage();
		}
	}
	if (!have_queue || delay_ns < 0 || jitter_ns < 0 || loss < 0 || loss > 1 || maxlen <= 0 || rate_bps < 0 ||
	    (rate_bps > 0 && trace) || (aqm.kind != AQM_FIFO && rate_bps <= 0) || (aqm.ecn && aqm.kind == AQM_FIFO) || aqm.target <= 0 ||
	    aqm.interval <= 0 || aqm.tupdate <= 0 || aqm.step < 0 || !(aqm.coupling >= 1) ||
	    aqm.ecn_mask < 1 || aqm.ecn_mask > 3)
		usage();
	if (aqm.kind == AQM_DUALPI2)
		aqm.ecn = 1; // marking is its point: L4S packets are ECN-capable by definition
	pie_init(&pie, aqm.target, aqm.tupdate, aqm.ecn);
	dualpi2_init(&dualpi2, aqm.target, aqm.tupdate, aqm.step, aqm.coupling);
	if (trace)
		load_trace(trace);
	// From the whole seed, without drawing from it. Its high half alone is 0 for the 32-bit seeds a testbed
	// draws, which would put every run's flows into the same buckets.
	hash_seed = (uint32_t)((rng_state * 0x9e3779b97f4a7c15ULL) >> 32);
	if (flow_queued() && !(fq = calloc(FQ_FLOWS, sizeof(*fq)))) {
		perror("ccscope-delayline: calloc");
		return 1;
	}
	for (int i = 0; flow_queued() && i < FQ_FLOWS; i++)
		pie_init(&fq[i].pv, aqm.target, aqm.tupdate, aqm.ecn);
	// Default timer slack (50 us) would add up to 50 us to every release.
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	// A delay line that waits for a CPU behind the traffic it delays adds that wait to the RTT. The
	// lowest real-time priority runs it first; it sleeps in ppoll between packets, and the kernel's RT
	// throttling keeps a share of CPU for everything else. Best effort: without permission we go on.
	if (realtime) {
		struct sched_param sp = {.sched_priority = 1};
		if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
			perror("ccscope-delayline: SCHED_FIFO (continuing without)");
	}

	struct nfq_handle *h = nfq_open();
	if (!h) {
		perror("ccscope-delayline: nfq_open");
		return 1;
	}
	struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)queue_num, on_packet, NULL);
	if (!qh) {
		fprintf(stderr, "ccscope-delayline: cannot bind queue %u: %s\n", queue_num, strerror(errno));
		return 1;
	}
	// Headers only: the IP header gives the length, the payload stays in the kernel. An AQM that marks
	// copies the whole packet: it releases it with a rewritten header, which replaces the kernel's copy.
	if (nfq_set_mode(qh, NFQNL_COPY_PACKET, aqm.ecn ? 0xffff : 64) < 0) {
		perror("ccscope-delayline: nfq_set_mode");
		return 1;
	}
	// A long kernel queue: it holds every packet in the delay line. Overflows are counted by the
	// kernel (queue_dropped) and reported in the stats, never bypassed.
	if (nfq_set_queue_maxlen(qh, (uint32_t)maxlen) < 0)
		perror("ccscope-delayline: nfq_set_queue_maxlen");
	nfnl_rcvbufsiz(nfq_nfnlh(h), 64 << 20);
	int fd = nfq_fd(h);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

	sigset_t block, empty;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	sigprocmask(SIG_BLOCK, &block, NULL);
	sigemptyset(&empty);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);

	enable_kernel_timestamps();
	trace_base = now_ns();
	next_update = trace_base + aqm.tupdate;
	write_stats();
	printf("ready\n");
	fflush(stdout);

	// recvmmsg takes up to RECV_BATCH queued packets per system call (each message is small: only
	// the headers are copied).
	static char bufs[RECV_BATCH][4096] __attribute__((aligned(8)));
	static struct iovec iovs[RECV_BATCH];
	static struct mmsghdr msgs[RECV_BATCH];
	for (int i = 0; i < RECV_BATCH; i++) {
		iovs[i] = (struct iovec){.iov_base = bufs[i], .iov_len = sizeof(bufs[i])};
		msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iovs[i], .msg_iovlen = 1};
	}
	// Waking from ppoll takes time (timer, scheduler): `early` is the running mean of that lateness, and
	// we ask to wake that much before a release is due and treat what is due by then as due, so that
	// releases land on time on average instead of always late.
	int64_t early = 0;
	while (!want_exit) {
		release_now = now_ns();
		int64_t next = run_due(qh, release_now + early);
		flush_accepts(qh);
		if (want_stats) {
			want_stats = 0;
			write_stats();
		}
		struct timespec ts, *tsp = NULL;
		int64_t wake_at = next - early;
		if (next >= 0) {
			int64_t wait = wake_at - now_ns();
			if (wait < 0)
				wait = 0;
			ts.tv_sec = wait / 1000000000LL;
			ts.tv_nsec = wait % 1000000000LL;
			tsp = &ts;
		}
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int r = ppoll(&pfd, 1, tsp, &empty);
		if (r == 0 && next >= 0) {
			int64_t late = now_ns() - wake_at;
			if (late >= 0 && late < 1000000) // ignore outliers (preempted for a whole ms)
				early += (late - early) / 8;
			if (early > 200000)
				early = 200000;
		}
		if (r <= 0)
			continue;
		for (int round = 0; round < 4; round++) {
			int n = recvmmsg(fd, msgs, RECV_BATCH, MSG_DONTWAIT, NULL);
			if (n < 0) {
				if (errno == ENOBUFS) {
					st.enobufs++; // the kernel counts the lost packets in user_dropped
					continue;
				}
				break; // EAGAIN
			}
			for (int i = 0; i < n; i++)
				nfq_handle_packet(h, bufs[i], (int)msgs[i].msg_len);
			if (n < RECV_BATCH)
				break;
		}
	}
	write_stats();
	nfq_destroy_queue(qh);
	nfq_close(h);
	return 0;
}
