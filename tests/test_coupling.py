"""scenario/coupling.py: a DualPI2 bottleneck's utilization and rate balance, against RFC 9332's coupling worked by
hand, from a results document alone (the full l4s run checks the same rows: tests/test_scenario_full.py)."""

from __future__ import annotations

import pytest
from ccscope.scenario import models, report
from ccscope.scenario.coupling import coupling_rows

RATE = 50e6


def _flow(algorithm: str, goodput_bps: float, srtt_ms: float) -> dict:
    """A bulk flow; prague's reached the router as ECT(1), as Testbed.send_ect1 rewrites them."""
    return {"algorithm": algorithm, "goodput_bps": goodput_bps, "srtt_ms": {"mean": srtt_ms}} | (
        {"ect1_packets": 40000} if algorithm == "prague" else {})


def _doc(*runs: tuple[str, list[dict]], aqm: str = "dualpi2") -> dict:
    profile = {"up_rate_bps": RATE, "aqm": {"up": {"name": aqm, "coupling": 2.0}}}
    return {"profiles": {"dualpi2": profile},
            "runs": [{"profile": "dualpi2", "label": f"dualpi2_{mix}_r1", "algorithms": mix, "flows": flows}
                     for mix, flows in runs]}


def test_the_coupling_predicts_roughly_equal_rates() -> None:
    assert models.dualpi2_rate_balance(2.0, 0.02, 0.02) == pytest.approx(2 / 2.44)  # 0.82
    assert models.dualpi2_rate_balance(2.0, 0.03, 0.02) == pytest.approx(2 / 2.44 * 1.5)  # the longer C RTT
    with pytest.raises(ValueError):
        models.dualpi2_rate_balance(0.0, 0.02, 0.02)


def test_rows_give_utilization_and_the_balance_against_the_model() -> None:
    payload = RATE * 1448 / 1514
    doc = _doc(("prague", [_flow("prague", 0.98 * payload, 21.0)]),
               ("prague+cubic", [_flow("prague", 0.6 * payload, 21.0), _flow("cubic", 0.3 * payload, 33.0)]))
    alone, both = coupling_rows(doc)
    assert alone.utilization == pytest.approx(0.98) and alone.balance is None and alone.predicted is None
    assert both.utilization == pytest.approx(0.9) and both.balance == pytest.approx(2.0)
    assert both.predicted == pytest.approx(2 / (1.22 * 2) * 33 / 21)  # 1.29
    page = report._html_coupling(doc)
    assert "dualpi2_prague+cubic_r1" in page and "<td class=n>90.0</td>" in page
    assert f"<td class=n>{2 / (2 / (1.22 * 2) * 33 / 21):.2f}</td>" in page  # measured / predicted, 1.55


def test_no_dualpi2_no_section() -> None:
    doc = _doc(("cubic", [_flow("cubic", 40e6, 30.0)]), aqm="codel")
    assert coupling_rows(doc) == [] and report._html_coupling(doc) == ""
