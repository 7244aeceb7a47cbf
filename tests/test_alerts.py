"""Alert and recording rules: promtool accepts them, and every alert has a firing and a quiet unit test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from ccscope_testkit.prereqs import ROOT, require_tools

PROM = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))


def _run(*cmd: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)


def _rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def _alerts() -> list[dict]:
    return [r for r in _rules() if "alert" in r]


def test_rule_files_exist():
    assert RULE_FILES and TEST_FILES
    assert {r["alert"] for r in _alerts()} >= {
        "CcscopeFlowBufferbloat", "CcscopeHostBufferbloat", "CcscopeHighRetransmitRatio",
        "CcscopeDaemonDown", "CcscopeDaemonMissing", "CcscopeSamplesLost"}


def test_promtool_check_rules():
    require_tools("promtool")
    result = _run("promtool", "check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests():
    require_tools("promtool")
    result = _run("promtool", "test", "rules", *TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout + result.stderr


def test_alert_conventions():
    for alert in _alerts():
        name = alert["alert"]
        assert re.fullmatch(r"Ccscope(?:[A-Z][a-z0-9]+)+", name), name
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert alert["annotations"]["summary"].strip(), name
        assert len(alert["annotations"]["description"]) > 40, name
    for rule in _rules():
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_every_alert_has_a_firing_and_a_quiet_case():
    firing, quiet = set(), set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested staying quiet"


def test_prometheus_config_loads_the_rules(tmp_path: Path):
    """The compose config, with its rule glob pointed at the repo, passes `promtool check config`."""
    require_tools("promtool")
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert [j for j in config["scrape_configs"] if j["job_name"] == "ccscope"]
    config["rule_files"] = [str(PROM / "rules" / "*.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = _run("promtool", "check", "config", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout + result.stderr


def test_alertmanager_config():
    require_tools("amtool")
    result = _run("amtool", "check-config", ROOT / "deploy" / "alertmanager" / "alertmanager.yml")
    assert result.returncode == 0, result.stdout + result.stderr
