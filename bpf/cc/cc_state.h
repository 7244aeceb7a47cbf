/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What ccscope's BPF congestion controls keep per socket in icsk_ca_priv, shared by their objects (bpf/cc/) and
 * by bpf/ccstate.bpf.c, which reads it as the kernel's own algorithms' state is read.
 *
 * Each sets a tag at init in the last 8 bytes of icsk_ca_priv (104 bytes; the kernel zeroes it before init), past
 * every struct here: the state reader knows a socket's algorithm is ccscope's by the tag, never by the name alone
 * ("vegas" may also be the kernel's module, whose struct is another).
 */
#ifndef __CCSCOPE_CC_STATE_H
#define __CCSCOPE_CC_STATE_H

#include "../ccstate.h"

#define CCSCOPE_CA_TAG_OFFSET 96
#define CCSCOPE_CA_MAGIC 0xcc5c0bcc

struct ccscope_ca_tag {
	__u32 magic;		/* CCSCOPE_CA_MAGIC */
	__u32 kind;		/* enum ccstate_kind */
};

/* Copa's RTT filters (cc_common.h's cc_minmax_*). */
struct cc_minmax_sample {
	__u32 t;
	__u32 v;
};

struct cc_minmax {
	struct cc_minmax_sample s[3];
};

struct vegas {
	__u32 beg_snd_nxt;	/* right edge of the current RTT's window */
	__u32 min_rtt_us;	/* minimum RTT sample in this RTT */
	__u32 base_rtt_us;	/* minimum RTT sample of the connection */
	__u16 rtt_samples;	/* RTT samples in this RTT */
	__u8 enabled;		/* 0 outside TCP_CA_Open: Reno rules then */
	/* The last adjustment's view, for ccscope's state reader (bpf/ccstate.bpf.c): nothing reads it here. */
	__u32 last_rtt_us;	/* the RTT it took: the minimum sample of that RTT */
	__u32 last_diff;	/* packets queued in the network by Vegas's estimate */
	__u32 adjustments;	/* RTTs adjusted (with enough samples, in TCP_CA_Open) */
};

struct westwood {
	__u32 bw_ns_est;	/* first filter stage, bytes per jiffy */
	__u32 bw_est;		/* BWE: second filter stage, bytes per jiffy */
	__u32 rtt_win_sx;	/* start of the current sampling window (jiffies) */
	__u32 bk;		/* bytes acknowledged in this window */
	__u32 snd_una;
	__u32 cumul_ack;
	__u32 accounted;	/* bytes credited to dupACKs, not yet covered */
	__u32 rtt;		/* last RTT sample (jiffies) */
	__u32 rtt_min;		/* RTTmin (jiffies) */
	__u8 first_ack;
	__u8 reset_rtt_min;
	__u32 hz;		/* the HZ of the units above, for ccscope's state reader (it reads no kernel config) */
};

struct copa {
	/* Every ACK: these 48 bytes, one cache line on 6.18 (icsk_ca_priv starts 16 bytes into one). */
	struct cc_minmax rtt_standing;	/* us */
	__u32 rtt_min;			/* us; 0 until the first RTT sample */
	__u32 round_min;		/* us: smallest sample of this round */
	__u32 round_stamp;		/* us: start of this round (one srtt) */
	__u32 prior_delivered;		/* tp->delivered at the previous ACK */
	__s32 cwnd_cnt;			/* pending cwnd change, in 1/cwnd packet */
	__u8 velocity_shift;		/* v = 1 << velocity_shift */
	__u8 direction;
	__u8 same_direction;		/* rounds in a row moving in `direction` */
	__u8 slow_start;
	/* Once per round. */
	struct cc_minmax rtt_min_win;	/* us: the rounds' minima over 10 s */
	__u32 round_cwnd;		/* cwnd at round_stamp */
};

struct prague {
	__u64 frac_cwnd;	/* the window in 1/2^20 segment (PRAGUE_ONE) */
	__u64 loss_frac;	/* frac_cwnd before the last loss, for undo */
	__u64 cwr_frac;		/* frac_cwnd before this round's CE cut: a loss in the round halves that */
	__u32 alpha;		/* the EWMA of the CE fraction, in 1/2^20 (PRAGUE_ONE = 1.0) */
	__u32 last_fraction;	/* the CE fraction of the last finished window, in 1/2^20 */
	__u32 next_seq;		/* snd_nxt when this window began: it ends once snd_una reaches it */
	__u32 window_delivered;	/* tp->delivered when this window began */
	__u32 window_ce;	/* tp->delivered_ce when this window began */
	__u32 prior_delivered;	/* tp->delivered at the previous ACK */
	__u32 prior_ce;		/* tp->delivered_ce at the previous ACK */
	__u32 reductions;	/* CE responses (once per window at most) */
	__u32 prior_rcv_nxt;	/* the receiver's rcv_nxt at the previous data segment */
	__u8 ce_state;		/* the receiver's: was the last data segment CE */
	__u8 saw_ce;		/* alpha moves only from the first CE on: the first response halves */
	__u8 in_loss;		/* in Recovery or Loss: no additive increase */
};

_Static_assert(sizeof(struct vegas) <= CCSCOPE_CA_TAG_OFFSET, "struct vegas must leave the tag its place");
_Static_assert(sizeof(struct westwood) <= CCSCOPE_CA_TAG_OFFSET, "struct westwood must leave the tag its place");
_Static_assert(sizeof(struct copa) <= CCSCOPE_CA_TAG_OFFSET, "struct copa must leave the tag its place");
_Static_assert(sizeof(struct prague) <= CCSCOPE_CA_TAG_OFFSET, "struct prague must leave the tag its place");

#endif /* __CCSCOPE_CC_STATE_H */
