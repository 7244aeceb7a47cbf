/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What bpf/ccstate.bpf.c keeps per flow: a congestion control's own state, as the kernel holds it in
 * inet_csk(sk)->icsk_ca_priv, copied out in the kernel's units (daemon/ccscope/ccstate/ decodes each
 * algorithm's part in a file of its own; tests/test_layout.py checks the mirror).
 */
#ifndef __CCSCOPE_CCSTATE_H
#define __CCSCOPE_CCSTATE_H

enum ccstate_kind {
	CCSTATE_NONE = 0,  /* an algorithm without a decoder, or whose type this kernel's BTF lacks */
	CCSTATE_BBR = 1,
	CCSTATE_CUBIC = 2,
	CCSTATE_VEGAS = 3, /* ccscope's BPF algorithms (bpf/cc/cc_state.h) */
	CCSTATE_WESTWOOD = 4,
	CCSTATE_COPA = 5,
	CCSTATE_PRAGUE = 6,
	CCSTATE_DCTCP = 7, /* the kernel's tcp_dctcp.c, by name */
};

/* tcp_bbr.c's struct bbr, the fields ccscope shows. */
struct bbr_state {
	__u32 bw;              /* bbr_bw(): packets per us << 24 (BW_SCALE); lt_bw while lt_use_bw */
	__u32 min_rtt_us;
	__u32 mss;             /* tp->mss_cache at the same moment, to turn bw into bytes */
	__u16 pacing_gain;     /* << 8 (BBR_UNIT) */
	__u16 cwnd_gain;       /* << 8 */
	__u8 mode;             /* enum bbr_mode: 0 startup, 1 drain, 2 probe_bw, 3 probe_rtt */
	__u8 cycle_idx;
	__u8 full_bw_reached;
	__u8 lt_use_bw;
	__u32 mode_changes;    /* every change of mode seen, counted on the first segment after it */
	__u32 probe_rtt_entries;
	__u32 __pad0;
};

/* tcp_cubic.c's struct bictcp. */
struct cubic_state {
	__u32 last_max_cwnd;   /* W_max, segments */
	__u32 bic_K;           /* 1/1024 s (BICTCP_HZ 10) */
	__u32 bic_origin_point;
	__u32 epoch_start;     /* jiffies; 0 until the first ACK after a loss or idle */
	__u32 tcp_cwnd;        /* the Reno-friendly estimate */
	__u32 delay_min;       /* HyStart's min RTT: us (us << 3 before Linux 5.7) */
	__u32 snd_cwnd;        /* the socket's, at the same moment */
	__u32 snd_ssthresh;
	__u32 wmax_updates;    /* each loss (W_max set, the epoch ended) and each RTO (W_max reset to 0) */
	__u8 found;            /* HyStart ended slow start (1; before Linux 5.7, 2 for its delay signal) */
	__u8 __pad0[3];
};

/* ccscope's BPF Vegas (bpf/cc/vegas.bpf.c). */
struct vegas_state {
	__u32 base_rtt_us;     /* the connection's minimum RTT; 0x7fffffff before a sample */
	__u32 min_rtt_us;      /* the minimum of this RTT so far; 0x7fffffff before a sample */
	__u32 last_rtt_us;     /* the RTT the last adjustment took */
	__u32 last_diff;       /* packets queued by Vegas's estimate at the last adjustment */
	__u32 adjustments;
	__u32 snd_cwnd;
	__u8 enabled;          /* 0 outside TCP_CA_Open */
	__u8 __pad0[3];
};

/* ccscope's BPF Westwood+ (bpf/cc/westwood.bpf.c), in the module's units. */
struct westwood_state {
	__u32 bw_est;          /* BWE, bytes per jiffy */
	__u32 bw_ns_est;       /* its first filter stage */
	__u32 rtt_min;         /* jiffies */
	__u32 rtt;             /* jiffies */
	__u32 hz;              /* the kernel's CONFIG_HZ (1000 if unreadable) */
	__u32 mss;
	__u32 snd_cwnd;
	__u32 snd_ssthresh;
};

/* ccscope's BPF Copa (bpf/cc/copa.bpf.c). */
struct copa_state {
	__u32 rtt_standing_us; /* the standing RTT: the minimum over the last srtt/2 */
	__u32 rtt_min_us;      /* 0 until the first sample */
	__u32 snd_cwnd;
	__u8 velocity_shift;   /* velocity = 1 << velocity_shift */
	__u8 direction;        /* 0 none, 1 up, 2 down */
	__u8 slow_start;
	__u8 same_direction;
};

/* ccscope's BPF prague (bpf/cc/prague.bpf.c). */
struct prague_state {
	__u32 alpha;           /* the EWMA of the CE fraction, 1/2^20 */
	__u32 last_fraction;   /* the CE fraction of the last finished window, 1/2^20 */
	__u32 reductions;      /* CE responses */
	__u32 snd_cwnd;
	__u32 snd_ssthresh;
	__u32 window_1024;     /* its window, 1/1024 segment */
	__u8 saw_ce;
	__u8 in_loss;
	__u8 __pad0[2];
};

/* tcp_dctcp.c's struct dctcp. */
struct dctcp_state {
	__u32 alpha;           /* dctcp_alpha: the EWMA (g = 1/16) of the CE fraction, 1/1024 (DCTCP_MAX_ALPHA) */
	__u32 loss_cwnd;       /* cwnd before the last reduction, for undo */
	__u32 snd_cwnd;
	__u32 snd_ssthresh;
	__u8 ce_state;         /* the receiver's: whether the last data it got was CE-marked */
	__u8 __pad0[3];
};

#define CCSTATE_BYTES 48

struct ccstate {
	__u64 cookie;
	__u64 updated_ns;      /* bpf_ktime_get_ns() of the copy */
	__u32 kind;            /* enum ccstate_kind */
	__u32 __pad0;
	union {
		struct bbr_state bbr;
		struct cubic_state cubic;
		struct vegas_state vegas;
		struct westwood_state westwood;
		struct copa_state copa;
		struct prague_state prague;
		struct dctcp_state dctcp;
		__u8 bytes[CCSTATE_BYTES];
	};
};

struct ccstate_config {
	__u64 interval_ns;     /* copies at most this often per flow, besides every change of mode or W_max */
};

#endif /* __CCSCOPE_CCSTATE_H */
