/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The private state of the kernel's own congestion controls, as CO-RE sees it: only the names matter, and
 * libbpf finds each type in vmlinux BTF or in its module's (/sys/kernel/btf/tcp_bbr, tcp_dctcp on distribution kernels,
 * present only while the module is loaded). Bitfields are read with BPF_CORE_READ_BITFIELD, so their widths
 * and places may differ from these (older BBRs had restore_cwnd:1 and tso_segs_goal:7 among them).
 */
#ifndef __CCSCOPE_CORE_CC_H
#define __CCSCOPE_CORE_CC_H

#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)

struct bbr {
	__u32 min_rtt_us;
	struct minmax bw;
	__u32 mode:3, lt_use_bw:1;
	__u32 lt_bw;
	__u32 pacing_gain:10, cwnd_gain:10, full_bw_reached:1, cycle_idx:3;
};

struct bictcp {
	__u32 last_max_cwnd;
	__u32 bic_origin_point;
	__u32 bic_K;
	__u32 delay_min;
	__u32 epoch_start;
	__u32 tcp_cwnd;
	__u8 found;
};

struct dctcp {
	__u32 dctcp_alpha;
	__u32 ce_state;
	__u32 loss_cwnd;
};

#pragma clang attribute pop

#endif /* __CCSCOPE_CORE_CC_H */
