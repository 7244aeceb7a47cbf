"""Kernel records (struct flow) as tcp_probe writes them, for the decoders' tests."""

from __future__ import annotations

import ipaddress
import socket

from ccscope import bpf_types as bt


def raw_flow(**fields) -> bt.Flow:
    """A kernel record as tcp_probe would write it: a cubic IPv4 flow in congestion avoidance."""
    values = dict(cookie=42, netns=4026531840, family=socket.AF_INET, sport=40000, dport=5201, ca_state=0,
                  sk_state=1, event=1, snd_cwnd=20, snd_ssthresh=14, srtt_us=12_500, rttvar_us=700,
                  min_rtt_us=10_000, mss_cache=1448, packets_out=18, retrans_out=1, lost_out=2, sacked_out=3,
                  total_retrans=7, lost=9, rate_delivered=10, rate_interval_us=2_000, bytes_acked=1_000_000,
                  bytes_received=500, bytes_sent=1_010_000, pacing_rate=3_000_000, first_ns=1, last_ns=2,
                  ca_name=b"cubic")
    values.update(fields)
    flow = bt.Flow()
    for name in ("saddr", "daddr"):
        addr = values.pop(name, None)
        if addr is not None:
            packed = ipaddress.ip_address(addr).packed
            getattr(flow, name)[: len(packed)] = list(packed)
    for name, value in values.items():
        setattr(flow, name, value)
    return flow
