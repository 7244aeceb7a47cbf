"""Published models to put next to what a scenario measures.

BBRv1's share of a link against loss-based flows (Ware, Mukerjee, Sherry and Seshan, "Modeling BBR's
Interactions with Loss-Based Congestion Control", IMC 2019, section 4):

    share = (1 - p) * (1 - (q/c + 0.2 + l) / 10),   p = max(0, 1/2 - 1/(2X) - 4N/q)

X is the buffer in BDPs, q the buffer in packets, c the link in packets per second, l the base RTT in
seconds and N the number of BBR flows; 0.2 s is ProbeRTT's duration and 10 s its period. Packets are
1500-byte frames: with them the model gives the paper's figures for 10 Mbit/s and 40 ms, 0.97, 0.78,
0.63, 0.55 and 0.49 at 1, 2, 4, 8 and 16 BDP (tests/test_harm.py).
"""

from __future__ import annotations

PACKET_BYTES = 1500


def bbr_share(rate_bps: float, rtt_s: float, buffer_bdp: float, bbr_flows: int = 1) -> float:
    """BBRv1's predicted share of the link against loss-based flows (see above)."""
    if rate_bps <= 0 or rtt_s <= 0 or buffer_bdp <= 0 or bbr_flows < 1:
        raise ValueError("rate, RTT and buffer must be positive, and there is at least one BBR flow")
    c = rate_bps / (PACKET_BYTES * 8)   # packets per second
    q = buffer_bdp * c * rtt_s          # buffer in packets
    p = max(0.0, 0.5 - 1 / (2 * buffer_bdp) - 4 * bbr_flows / q)
    return (1 - p) * (1 - (q / c + 0.2 + rtt_s) / 10)


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
