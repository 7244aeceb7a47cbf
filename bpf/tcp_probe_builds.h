/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What every program on tcp:tcp_probe needs, written once: the socket's cookie without a helper call, and the
 * two builds of one program (TCP_PROBE_BUILDS) that differ only in how `sk` becomes a tcp_sock.
 *
 * bpf_rdonly_cast (Linux >= 6.2) gives the verifier `sk` as a tcp_sock to read; it rewrites the call into a
 * register move, so nothing is called. The helper bpf_skc_to_tcp_sock is a real call, and on a kernel with
 * return-thunk mitigations (SRSO "Safe RET") a call and its return are among the most expensive things a
 * tcp_probe program does between samples. Declared __weak: libbpf leaves an extern this kernel lacks
 * unresolved instead of failing the whole object. A 6.1 verifier still rejects the unresolved call, even where
 * it can never run, hence two programs: the loaders load NAME where vmlinux BTF has bpf_rdonly_cast, and
 * NAME_skc, the same code through the helper, elsewhere.
 */
#ifndef __CCSCOPE_TCP_PROBE_BUILDS_H
#define __CCSCOPE_TCP_PROBE_BUILDS_H

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

/*
 * The socket's cookie as bpf_get_socket_cookie() gives it, without the helper call on the hot path once the
 * cookie exists (it is assigned on first use and never changes).
 */
static __always_inline __u64 socket_cookie(struct sock *sk)
{
	__u64 cookie = sk->__sk_common.skc_cookie.counter;

	return cookie ? cookie : bpf_get_socket_cookie(sk);
}

/* NAME and NAME_skc on tcp:tcp_probe, each calling BODY(sk, tp) with `tp` the socket as a tcp_sock. */
#define TCP_PROBE_BUILDS(NAME, BODY)                                                               \
	SEC("tp_btf/tcp_probe")                                                                    \
	int BPF_PROG(NAME, struct sock *sk, const struct sk_buff *skb)                            \
	{                                                                                          \
		return BODY(sk, bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct tcp_sock)));    \
	}                                                                                          \
	SEC("tp_btf/tcp_probe")                                                                    \
	int BPF_PROG(NAME##_skc, struct sock *sk, const struct sk_buff *skb)                      \
	{                                                                                          \
		return BODY(sk, bpf_skc_to_tcp_sock(sk));                                          \
	}

#endif /* __CCSCOPE_TCP_PROBE_BUILDS_H */
