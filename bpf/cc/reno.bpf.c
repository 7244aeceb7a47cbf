// SPDX-License-Identifier: GPL-2.0-only
/*
 * Reno as a BPF congestion control: the control of the mechanism. It only
 * forwards to the kernel's own Reno (kfuncs), so BPF Reno against built-in
 * reno measures what struct_ops itself changes (nothing, ideally) and the
 * per-ACK cost of the BPF trampoline. Registered only as bpf_reno (the
 * kernel always has reno). reno_pkts_acked does nothing: its run time in the
 * kernel's BPF accounting (kernel.bpf_stats_enabled) is the accounting's own
 * cost per call, which bench/cc.py subtracts from every program's.
 */
#include "cc_common.h"

char LICENSE[] SEC("license") = "GPL";

SEC("struct_ops/reno_cong_avoid")
void BPF_PROG(reno_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	tcp_reno_cong_avoid(sk, ack, acked);
}

SEC("struct_ops/reno_pkts_acked")
void BPF_PROG(reno_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
}

SEC("struct_ops/reno_ssthresh")
__u32 BPF_PROG(reno_ssthresh, struct sock *sk)
{
	return tcp_reno_ssthresh(sk);
}

SEC("struct_ops/reno_undo_cwnd")
__u32 BPF_PROG(reno_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

CCSCOPE_CC(reno,
	.cong_avoid = (void *)reno_cong_avoid,
	.pkts_acked = (void *)reno_pkts_acked,
	.ssthresh = (void *)reno_ssthresh,
	.undo_cwnd = (void *)reno_undo_cwnd);
