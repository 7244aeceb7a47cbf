"""Published models to put next to what a scenario measures.

BBRv1's share of a link against loss-based flows (Ware, Mukerjee, Sherry and Seshan, "Modeling BBR's
Interactions with Loss-Based Congestion Control", IMC 2019, section 4):

    share = (1 - p) * (1 - (q/c + 0.2 + l) / 10),   p = max(0, 1/2 - 1/(2X) - 4N/q)

X is the buffer in BDPs, q the buffer in packets, c the link in packets per second, l the base RTT in
seconds and N the number of BBR flows; 0.2 s is ProbeRTT's duration and 10 s its period. Packets are
1500-byte frames: with them the model gives the paper's figures for 10 Mbit/s and 40 ms, 0.97, 0.78,
0.63, 0.55 and 0.49 at 1, 2, 4, 8 and 16 BDP (tests/test_harm.py).

And the rate balance DualPI2's coupling is meant to give an L4S flow against a classic one (RFC 9332):
dualpi2_rate_balance.
"""

from __future__ import annotations

PACKET_BYTES = 1500
PAYLOAD_SHARE = 1448 / 1514  # TCP payload in a full Ethernet frame: what goodput can reach of a link's rate


def bbr_share(rate_bps: float, rtt_s: float, buffer_bdp: float, bbr_flows: int = 1) -> float:
    """BBRv1's predicted share of the link against loss-based flows (see above)."""
    if rate_bps <= 0 or rtt_s <= 0 or buffer_bdp <= 0 or bbr_flows < 1:
        raise ValueError("rate, RTT and buffer must be positive, and there is at least one BBR flow")
    c = rate_bps / (PACKET_BYTES * 8)   # packets per second
    q = buffer_bdp * c * rtt_s          # buffer in packets
    p = max(0.0, 0.5 - 1 / (2 * buffer_bdp) - 4 * bbr_flows / q)
    return (1 - p) * (1 - (q / c + 0.2 + rtt_s) / 10)


def dualpi2_rate_balance(coupling: float, classic_rtt_s: float, scalable_rtt_s: float) -> float:
    """A scalable flow's rate over a Reno-like classic flow's through one DualPI2 (RFC 9332, section 2.1 and
    appendix A): the base probability p' marks L at p_L = k p' and drops or marks C at p_C = p'^2, a scalable
    window holds 2 / p_L segments and Reno's 1.22 / sqrt(p_C), so the windows stand at 2 / (1.22 k) and the rates
    at that times RTT_C / RTT_L. k = 2, the default, gives 0.82 at equal RTTs: the coupling's "roughly equal"."""
    if coupling <= 0 or classic_rtt_s <= 0 or scalable_rtt_s <= 0:
        raise ValueError("the coupling factor and both RTTs must be positive")
    return 2 / (1.22 * coupling) * classic_rtt_s / scalable_rtt_s


# Models a scenario's `expected: {share: {ALG: NAME}}` may name; each takes the profile's path and the set.
SHARE_MODELS = ("ware2019",)


def expected_share(definition: dict, profile: dict, profile_name: str, mix: list[str], algorithm: str) -> float | None:
    """What the scenario's `expected` says `algorithm`'s share of the set `mix` is on a profile (an entry of
    results.json's `profiles`); None when it says nothing or the model cannot apply (a real path, no queue)."""
    declared = ((definition.get("expected") or {}).get("share") or {}).get(algorithm)
    if isinstance(declared, dict):
        value = declared.get(profile_name)
        return float(value) if isinstance(value, int | float) else None
    if declared != "ware2019" or algorithm not in mix:
        return None
    rate, rtt, bdp, queue = (profile.get(k) for k in ("up_rate_bps", "base_rtt_s", "bdp_bytes", "queue_bytes"))
    if not all(isinstance(v, int | float) and v > 0 for v in (rate, rtt, bdp, queue)):
        return None
    return bbr_share(rate, rtt, queue / bdp, bbr_flows=mix.count(algorithm))


def model_name(definition: dict, algorithm: str) -> str:
    """The model (or the table of values) the scenario's `expected` names for `algorithm`'s share."""
    return str(((definition.get("expected") or {}).get("share") or {}).get(algorithm))


def competing_rows(doc: dict) -> list[dict]:
    """The summary rows of algorithms that ran in a competing set, with a share measured."""
    return [r for r in doc["summary"] if "+" in r["algorithms"] and (r.get("share") or {}).get("mean") is not None]
