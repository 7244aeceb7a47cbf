"""What a DualPI2 bottleneck's runs show of its coupling: per run, how much of the link its flows used, and where
L4S (ECT(1)) and classic flows ran together, their rate balance beside the one RFC 9332's coupling predicts
(models.dualpi2_rate_balance), from results.json alone."""

from __future__ import annotations

import statistics
from typing import NamedTuple

from . import models


class CouplingRow(NamedTuple):
    profile: str
    label: str
    algorithms: str
    utilization: float | None        # the bulk flows' goodput over what TCP can carry of the link's rate
    scalable_bps: float | None       # the L4S flows' mean goodput
    classic_bps: float | None        # the classic flows'
    balance: float | None            # L4S over classic, per flow
    predicted: float | None          # the coupling's, at the flows' mean srtt


def coupling_rows(doc: dict) -> list[CouplingRow]:
    """One row per run on a profile whose uplink is a DualPI2, in run order."""
    rows = []
    for run in doc["runs"]:
        profile = doc["profiles"].get(run["profile"]) or {}
        aqm = (profile.get("aqm") or {}).get("up") or {}
        if aqm.get("name") == "dualpi2" and run["flows"]:
            rows.append(_row(run, profile, aqm.get("coupling")))
    return rows


def _row(run: dict, profile: dict, coupling: float | None) -> CouplingRow:
    flows = [f for f in run["flows"] if f.get("goodput_bps")]
    # L4S by its identifier (RFC 9331): the flows whose packets reached the router as ECT(1)
    scalable = [f for f in flows if f.get("ect1_packets")]
    classic = [f for f in flows if not f.get("ect1_packets")]
    rate = profile.get("up_rate_bps")
    utilization = sum(f["goodput_bps"] for f in flows) / (rate * models.PAYLOAD_SHARE) if rate and flows else None
    l_bps, c_bps = _mean_goodput(scalable), _mean_goodput(classic)
    balance = l_bps / c_bps if l_bps and c_bps else None
    l_rtt, c_rtt = _mean_srtt_s(scalable), _mean_srtt_s(classic)
    predicted = (models.dualpi2_rate_balance(coupling, c_rtt, l_rtt)
                 if balance is not None and coupling and l_rtt and c_rtt else None)
    return CouplingRow(run["profile"], run["label"], run["algorithms"], utilization, l_bps, c_bps, balance, predicted)


def _mean_goodput(flows: list[dict]) -> float | None:
    return statistics.fmean(f["goodput_bps"] for f in flows) if flows else None


def _mean_srtt_s(flows: list[dict]) -> float | None:
    means = [f["srtt_ms"]["mean"] for f in flows if f["srtt_ms"].get("mean")]
    return statistics.fmean(means) / 1e3 if means else None
