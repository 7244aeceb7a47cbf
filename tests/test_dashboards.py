"""The Grafana dashboards, checked by construction (there is no Grafana here).

Static checks read the committed JSON. The live checks start a real Prometheus scraping a real
`ccscope daemon` with pod labels (and an in-process exporter that labels our namespaces like a scenario run
does) while iperf3, in a cgroup named like a Kubernetes pod's container, pushes a real flow through a tbf
bottleneck between two namespaces, then run every panel query,
variable query and annotation query, with Grafana's variables substituted, and require data from each.
A renamed metric, a broken label or a wrong unit of time in a query fails here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from ccscope_testkit import prometheus3
from ccscope_testkit.cgroups import Tree, cgroup_tree, kubepods_systemd, pod_logs
from ccscope_testkit.net import free_port, netns_name, stop_process
from ccscope_testkit.prereqs import ROOT, require, require_bpf_object, require_root, require_tools

DASHBOARDS = ROOT / "dashboards"
RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
FILES = sorted(DASHBOARDS.glob("*.json"))
# Series Prometheus itself adds to every target; not in the daemon's output.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
METRIC_RE = re.compile(r"(?<![\w:])(ccscope_[a-z0-9_]+|up|scrape_[a-z_]+)(?![\w:(])")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _panels(dash: dict) -> list[dict]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def _exprs(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(dash) for t in p["targets"]]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return exprs


def _variable_queries(dash: dict) -> list[str]:
    return [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]


def _metric_names(text: str) -> set[str]:
    return set(METRIC_RE.findall(text))


# --- static checks -------------------------------------------------------------------------------------


def test_generated_json_is_up_to_date():
    result = subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _inventory(dash: dict) -> dict:
    """What a dashboard shows and asks: every panel's kind, place, texts, field settings and queries."""

    def query(t: dict) -> dict:
        return {"refId": t["refId"], "expr": t["expr"], "legendFormat": t.get("legendFormat"),
                "instant": bool(t.get("instant")), "format": t.get("format", "time_series"),
                "datasource": t["datasource"]}

    def panel(p: dict) -> dict:
        if p["type"] == "row":
            return {k: p.get(k) for k in ("type", "id", "title", "gridPos", "collapsed")}
        d = p["fieldConfig"]["defaults"]
        return {**{k: p.get(k) for k in ("type", "id", "title", "description", "gridPos", "datasource", "options")},
                **{k: d.get(k) for k in ("unit", "decimals", "thresholds", "mappings", "custom")},
                "targets": [query(t) for t in p["targets"]]}

    def variable(v: dict) -> dict:
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        keys = ("type", "name", "label", "datasource", "refresh", "regex", "sort", "multi", "includeAll",
                "allValue", "hide")
        return {**{k: v.get(k) for k in keys}, "query": query}

    keep = ("uid", "title", "description", "tags", "editable", "graphTooltip", "refresh", "timezone", "time", "links")
    return {**{k: dash.get(k) for k in keep}, "variables": [variable(v) for v in dash["templating"]["list"]],
            "annotations": dash["annotations"]["list"], "panels": [panel(p) for p in dash["panels"]]}


def _assert_within(expected: object, actual: object, where: str) -> None:
    """Every key and value of `expected` holds in `actual`, which may spell out more."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not an object"
        for key, value in expected.items():
            assert key in actual, f"{where}.{key}: missing"
            _assert_within(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r}"
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            _assert_within(want, got, f"{where}[{i}]")
    else:
        assert expected == actual, f"{where}: {expected!r} became {actual!r}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_typed_builder_keeps_every_panel_and_query(path: Path):
    """The dashboards were hand-written JSON until grafana-foundation-sdk built them. tests/data/
    dashboard-inventory.json is the hand-written pair's inventory, with null (unset) dropped: every panel,
    place, text, unit, threshold, mapping, option and query of it must hold in what the builder writes. The
    builder may add keys: it spells out Grafana 11's own defaults (a stat's justifyMode "auto", a bar gauge's
    minVizHeight 16, a legend's empty calcs), and a datasource variable has no refresh to set (Grafana
    reloads it with the dashboard)."""
    expected = json.loads((ROOT / "tests" / "data" / "dashboard-inventory.json").read_text())[path.name]
    _assert_within(expected, _inventory(_load(path)), path.stem)


def test_inventory_check_sees_a_changed_query():
    dash = _load(FILES[0])
    expected = json.loads((ROOT / "tests" / "data" / "dashboard-inventory.json").read_text())[FILES[0].name]
    dash["panels"][2]["targets"][0]["expr"] += " > 0"
    with pytest.raises(AssertionError, match=r"panels\[2\]\.targets\[0\]\.expr"):
        _assert_within(expected, _inventory(dash), FILES[0].stem)


def test_two_dashboards_with_stable_unique_uids():
    uids = {_load(p)["uid"]: p.name for p in FILES}
    assert set(uids) == {"ccscope-live-flows", "ccscope-scenario"}
    for path in FILES:
        dash = _load(path)
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), path.name
        assert dash["schemaVersion"] >= 39


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_panel_uses_the_datasource_variable_and_has_unit_and_description(path: Path):
    dash = _load(path)
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names[:3] == ["datasource", "job", "instance"]
    assert dash["templating"]["list"][0]["query"] == "prometheus"
    for panel in _panels(dash):
        title = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), title
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert len(panel.get("description", "")) > 15, f"{title}: no description"
        assert panel["targets"], title
    for var in dash["templating"]["list"][1:]:
        assert var["datasource"]["uid"] == "${datasource}", var["name"]
    for ann in dash["annotations"]["list"][1:]:
        assert ann["datasource"]["uid"] == "${datasource}", ann["name"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_query_matches_job_and_instance_and_rates_use_rate_interval(path: Path):
    dash = _load(path)
    for expr in _exprs(dash) + _variable_queries(dash)[1:]:
        selectors = re.findall(r"\b[a-z_:]+\{([^}]*)\}", expr)
        assert selectors, expr
        for sel in selectors:
            assert 'job=~"$job"' in sel, expr
            if "label_values(ccscope_build_info" not in expr:
                assert 'instance=~"$instance"' in sel, expr
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range", "$__range:$__interval", "5m"), expr
        for fn_window in re.findall(r"\b(?:rate|increase)\([^\[]*\[([^\]]+)\]", expr):
            assert fn_window in ("$__rate_interval", "$__range"), expr


def test_live_dashboard_variables():
    dash = _load(DASHBOARDS / "ccscope-live-flows.json")
    assert [v["name"] for v in dash["templating"]["list"]] == [
        "datasource", "job", "instance", "namespace", "pod", "container", "netns", "cc", "flow"]
    scen = _load(DASHBOARDS / "ccscope-scenario.json")
    assert [v["name"] for v in scen["templating"]["list"]] == ["datasource", "job", "instance", "scenario", "run"]
    assert {a["name"] for a in scen["annotations"]["list"][1:]} == {"Run start", "Run end", "Algorithm swap"}


# --- the live stack ----------------------------------------------------------------------------------


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def _unix(rfc3339: str) -> float:
    """Prometheus's timestamps (nanosecond fractions; Z or the server's offset) as Unix seconds."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", rfc3339)).timestamp()


def _all_past(st: Stack, t: float) -> bool:
    """Whether every target was scraped, and every rule group evaluated, at or after Unix time t."""
    scraped = [_unix(x["lastScrape"]) for x in st.api("targets")["activeTargets"]]
    evaluated = [_unix(g["lastEvaluation"]) for g in st.api("rules")["groups"]]
    return bool(scraped and evaluated) and min(scraped + evaluated) >= t


def _wait(what: str, predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Stack:
    prom: str
    version: str  # of Prometheus: Debian's 2.42, or a current 3.x that also receives the daemon's OTLP push
    daemon_url: str
    scenario_url: str
    start: float = 0.0
    end: float = 0.0
    events: dict[str, float] = field(default_factory=dict)
    sender_netns: str = ""
    iperf: list[dict] = field(default_factory=list)

    def api(self, path: str, **params: str | float) -> list[dict]:
        body = json.loads(_get(f"{self.prom}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"))
        assert body["status"] == "success", body
        return body["data"]

    def query_range(self, expr: str, step: float = 1.0) -> list[dict]:
        return self.api("query_range", query=expr, start=self.start, end=self.end, step=step)["result"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        return self.api("query", query=expr, time=at or self.end)["result"]


class ScenarioExporter:
    """What the scenario runner does in-process: a FlowCollector restricted to its namespaces, labelled."""

    def __init__(self, netns: set[int], port: int) -> None:
        from ccscope.exporter import FlowCollector
        from ccscope.flows import FlowFilter, FlowSelection, FlowTable
        from ccscope.loader import TelemetryProbe
        from ccscope.metrics_endpoint import MetricsServer
        from prometheus_client import CollectorRegistry

        self.netns = netns
        self.probe = TelemetryProbe().__enter__()
        try:
            self.collector = FlowCollector(FlowTable(self.probe, grace_s=10.0), FlowSelection.parse("all"),
                                           FlowFilter(netns=netns))
            registry = CollectorRegistry()
            registry.register(self.collector)
            self.server = MetricsServer(registry, "127.0.0.1", port)
        except BaseException:
            self.probe.close()
            raise

    def label(self, labels: dict[str, str]) -> None:
        self.collector.set_netns_labels({ns: labels for ns in self.netns} if labels else {})

    def close(self) -> None:
        self.server.close()
        self.probe.close()


PROM_CONFIG = """
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: {rules}
scrape_configs:
  - job_name: ccscope
    static_configs: [{{targets: ["127.0.0.1:{daemon}"]}}]
  - job_name: ccscope-scenario
    static_configs: [{{targets: ["127.0.0.1:{scenario}"]}}]
"""
SCENARIO = {"scenario": "dashboard-test", "profile": "tbf-20mbit", "run": "1"}
# The pod the iperf3 client runs in (its cgroup named as kubelet and containerd name them).
POD = {"namespace": "shop", "pod": "loadgen-5c7d", "pod_uid": "0b7e2a1c-3d4f-4a5b-8c6d-7e8f9a0b1c2d",
       "container": "c0ffee" * 10 + "abcd"}


VERSIONS = ("2.42", "3")  # of Prometheus: Debian's, and a current 3.x that also receives the daemon's OTLP push


@pytest.fixture(scope="module")
def stacks() -> Iterator[dict[str, Stack]]:
    """One traffic run (a cubic unit, then a bbr one) that both Prometheus versions scrape side by side, so each
    version's tests query the same flows (one run, not one per version: 25 s each)."""
    require_root()
    require_tools("iperf3", "ip", "tc", "prometheus")
    require_bpf_object()
    require(Path("/sys/kernel/btf/vmlinux").is_file(), "no kernel BTF")
    binaries = {"2.42": "prometheus", "3": str(prometheus3.binary())}
    tag = f"{os.getpid() % 100000}"  # device names: at most 15 characters
    ns_a, ns_r, ns_b = (netns_name(f"dash{x}") for x in "arb")
    tmp = Path(tempfile.mkdtemp(prefix="ccscope-dash-"))
    procs: list[subprocess.Popen] = []
    exporter: ScenarioExporter | None = None
    cleanup = contextlib.ExitStack()
    try:
        tree = cleanup.enter_context(cgroup_tree())
        pod_cgroup = tree.cgroup(kubepods_systemd(POD["pod_uid"], POD["container"]))
        logs = pod_logs(tmp, POD["namespace"], POD["pod"], POD["pod_uid"])
        # sender A -> router R -> receiver B. The bottleneck sits on the router, not on the sender's own
        # qdisc, where TCP small queues would keep the queue (and the losses) from ever building up.
        for ns in (ns_a, ns_r, ns_b):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        links = ((ns_a, f"cdv{tag}a", "192.0.2.1/24", ns_r, f"cdv{tag}r", "192.0.2.254/24"),
                 (ns_b, f"cdv{tag}b", "198.51.100.2/24", ns_r, f"cdv{tag}s", "198.51.100.254/24"))
        for ns1, dev1, addr1, ns2, dev2, addr2 in links:
            _sh("ip", "link", "add", dev1, "netns", ns1, "type", "veth", "peer", "name", dev2, "netns", ns2)
            for ns, dev, addr in ((ns1, dev1, addr1), (ns2, dev2, addr2)):
                _sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
                _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns_a, "route", "add", "default", "via", "192.0.2.254")
        _sh("ip", "-n", ns_b, "route", "add", "default", "via", "198.51.100.254")
        _sh("ip", "netns", "exec", ns_r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # 20 Mbit/s with a 100 kB queue: up to 40 ms of queueing delay, then drops (finite ssthresh).
        _sh("tc", "-n", ns_r, "qdisc", "add", "dev", f"cdv{tag}s", "root", "tbf", "rate", "20mbit",
            "burst", "16kb", "limit", "100kb")
        inodes = {os.stat(f"/run/netns/{ns}").st_ino for ns in (ns_a, ns_b)}

        daemon_port, scenario_port = free_port(), free_port()
        prom_ports = {version: free_port() for version in VERSIONS}
        # Prometheus 3 also receives the same daemon's series over OTLP (test_pushed_series_agree_with_scraped)
        push = ["--otlp", f"http://127.0.0.1:{prom_ports['3']}/api/v1/otlp/v1/metrics", "--otlp-interval", "1s",
                "--otlp-timeout", "0.8s"]
        found = {version: Stack(f"http://127.0.0.1:{port}", version, f"http://127.0.0.1:{daemon_port}/metrics",
                                f"http://127.0.0.1:{scenario_port}/metrics",
                                sender_netns=str(os.stat(f"/run/netns/{ns_a}").st_ino))
                 for version, port in prom_ports.items()}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ccscope.cli", "daemon", "--listen", f"127.0.0.1:{daemon_port}",
             "--flows", "top:50", "--grace", "10s", "--labels", "comm,cgroup,container,pod", "--pod-logs", str(logs),
             *push],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        exporter = ScenarioExporter(inodes, scenario_port)
        (tmp / "prometheus.yml").write_text(PROM_CONFIG.format(
            rules=json.dumps([str(r) for r in RULES]), daemon=daemon_port, scenario=scenario_port))
        for version, port in prom_ports.items():
            procs.append(subprocess.Popen(
                [binaries[version], f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / version}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
                 *(["--web.enable-otlp-receiver"] if version == "3" else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns_b, "iperf3", "-s", "-B", "198.51.100.2"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def targets_up(st: Stack) -> bool:
            if procs[0].poll() is not None:
                raise AssertionError(f"ccscope daemon exited: {procs[0].stderr.read().decode()}")
            active = st.api("targets")["activeTargets"]
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        for version, st in found.items():
            _wait(f"Prometheus {version} scraping both exporters", lambda st=st: targets_up(st), 30)
        _wait("iperf3 server", lambda: "5201" in _sh("ip", "netns", "exec", ns_b, "ss", "-ltn"))
        start, events, iperf = time.time() - 1, {}, []

        def unit(algorithm: str, seconds: int, *extra: str) -> None:
            exporter.label({**SCENARIO, "algorithm": algorithm})
            events[algorithm] = time.time()
            out = _sh(*Tree.command(pod_cgroup, "ip", "netns", "exec", ns_a, "iperf3", "-c", "198.51.100.2",
                                    "-t", str(seconds), "-J", *extra))
            iperf.append(json.loads(out))
            exporter.label({})

        unit("cubic", 8, "-C", "cubic")
        time.sleep(2)             # the runner's gap between units
        unit("bbr", 6, "-C", "bbr")
        events["end"] = time.time()
        # Stale markers for the run's series (the first scrape without them) and rule evaluations over the
        # end: two of each after it (1 s intervals), by each Prometheus's own account.
        for version, st in found.items():
            _wait(f"two scrapes and rule evaluations after the run ({version})",
                  lambda st=st: _all_past(st, events["end"] + 2), 30)
        end = time.time()
        for st in found.values():
            st.start, st.end, st.events, st.iperf = start, end, events, iperf
        yield found
    finally:
        if exporter:
            exporter.close()
        for proc in reversed(procs):
            stop_process(proc)
        for ns in (ns_a, ns_r, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        cleanup.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module", params=VERSIONS)
def stack(request, stacks: dict[str, Stack]) -> Stack:
    return stacks[request.param]


def test_the_flow_saw_losses(stack: Stack):
    """The bottleneck did its job: iperf3 itself reports retransmissions (so ssthresh became finite)."""
    assert stack.iperf[0]["end"]["sender_tcp_congestion"] == "cubic"
    cubic = stack.iperf[0]["end"]["sum_sent"]
    assert cubic["retransmits"] > 0
    assert stack.iperf[1]["end"]["sender_tcp_congestion"] == "bbr"


@pytest.mark.parametrize("stack", ["3"], indirect=True)  # Prometheus 2.42 has no OTLP receiver
def test_pushed_series_agree_with_scraped(stack: Stack):
    """In Prometheus 3, the daemon's OTLP push and its /metrics agree: for every sender flow of the cubic
    unit, the bytes it had acknowledged when it closed (held for --grace), and the algorithm."""
    at = stack.events["bbr"]  # the cubic unit's flows closed 2 s before, their series still held
    where = f'netns="{stack.sender_netns}"'
    scraped = {r["metric"]["sport"]: float(r["value"][1]) for r in stack.query(
        f'max_over_time(ccscope_flow_bytes_acked_total{{job="ccscope",{where},cc="cubic"}}[15s])', at)}
    pushed = {r["metric"]["network_local_port"]: float(r["value"][1]) for r in stack.query(
        f'max_over_time(system_network_tcp_acked_bytes_total{{ccscope_{where},'
        'network_tcp_congestion_control="cubic"}[15s])', at)}
    assert scraped and pushed == scraped


# --- Grafana emulation -----------------------------------------------------------------------------------


def _grafana_regex(value: str) -> str:
    """How Grafana escapes a variable's value for `=~` in a Prometheus query."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def _substitute(text: str, values: dict[str, str], stack: Stack) -> str:
    builtins = {"__rate_interval": "4s", "__interval": "1s", "__range": f"{int(stack.end - stack.start)}s"}
    for name, value in sorted({**builtins, **values}.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"${name}", value).replace(f"${{{name}}}", value)
    assert "$" not in text, text
    return text


def _label_values(stack: Stack, query: str) -> list[str]:
    match = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
    assert match, query
    return stack.api(f"label/{match[2]}/values", **{"match[]": match[1], "start": stack.start, "end": stack.end})


def _resolve(stack: Stack, dash: dict, prefer: dict[str, str], all_values: bool) -> dict[str, str]:
    """Run each variable query as Grafana would, in order, and pick a value (or All) from its result."""
    values: dict[str, str] = {}
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        found = _label_values(stack, _substitute(var["query"]["query"], values, stack))
        assert found, f"variable {var['name']}: no values for {var['query']['query']}"
        if all_values and var.get("includeAll") and var["name"] not in ("job", "instance"):
            values[var["name"]] = var["allValue"]
            continue
        want = prefer.get(var["name"], found[0])
        assert want in found, f"variable {var['name']}: {want!r} not in {found}"
        values[var["name"]] = _grafana_regex(want)
    return values


def _live_prefs(stack: Stack) -> dict[str, str]:
    """The sender's data flow of the cubic unit: the flow a person would pick to look at."""
    sel = f'job="ccscope",netns="{stack.sender_netns}",dport="5201"'
    top = stack.query(f"topk(1, max_over_time(ccscope_flow_bytes_sent_total{{{sel}}}[1h]))",
                      at=stack.events["cubic"] + 8)
    assert top, "the daemon exported no flow of our namespace"
    instance = stack.query('ccscope_build_info{job="ccscope"}')[0]["metric"]["instance"]
    return {"job": "ccscope", "instance": instance, "namespace": POD["namespace"], "pod": POD["pod"],
            "container": POD["container"], "netns": stack.sender_netns, "cc": "cubic",
            "flow": top[0]["metric"]["flow"]}


def _run_panels(stack: Stack, dash: dict, values: dict[str, str]) -> list[str]:
    empty = []
    for panel in _panels(dash):
        for target in panel["targets"]:
            expr = _substitute(target["expr"], values, stack)
            result = stack.query(expr) if target.get("instant") else stack.query_range(expr)
            if not result:
                empty.append(f"{panel['title']} [{target['refId']}]: {expr}")
    return empty


@pytest.mark.parametrize("all_values", [False, True], ids=["chosen-flow", "all"])
def test_every_live_flows_panel_returns_data(stack: Stack, all_values: bool):
    """With every flow, every panel has data; with the cubic flow chosen, all but BBR's own (its state's series are
    absent, not zero, on other algorithms' flows), and CUBIC's own do."""
    dash = _load(DASHBOARDS / "ccscope-live-flows.json")
    values = _resolve(stack, dash, _live_prefs(stack), all_values)
    bbr_only = [] if all_values else [f"{p['title']} [{t['refId']}]" for p in _panels(dash) for t in p["targets"]
                                      if "ccscope_flow_bbr_" in t["expr"] or 'cc="bbr"' in t["expr"]]
    assert len(bbr_only) == (0 if all_values else 3)
    assert [e.split(": ", 1)[0] for e in _run_panels(stack, dash, values)] == bbr_only


def _scenario_values(stack: Stack) -> dict[str, str]:
    dash = _load(DASHBOARDS / "ccscope-scenario.json")
    instance = stack.query('ccscope_build_info{job="ccscope-scenario"}')[0]["metric"]["instance"]
    return _resolve(stack, dash, {"job": "ccscope-scenario", "instance": instance,
                                  "scenario": SCENARIO["scenario"], "run": SCENARIO["run"]}, False)


def test_every_scenario_panel_returns_data(stack: Stack):
    dash = _load(DASHBOARDS / "ccscope-scenario.json")
    assert _run_panels(stack, dash, _scenario_values(stack)) == []
    # Both algorithms of the run are compared side by side.
    values = _scenario_values(stack)
    panel = next(p for p in _panels(dash) if p["title"] == "Mean goodput")
    result = stack.query(_substitute(panel["targets"][0]["expr"], values, stack))
    goodput = {r["metric"]["algorithm"]: float(r["value"][1]) for r in result}
    assert set(goodput) == {"cubic", "bbr"}
    assert all(1e6 < v < 3e6 for v in goodput.values()), goodput  # ~20 Mbit/s = 2.5 MB/s


def test_scenario_annotations_mark_start_swap_and_end(stack: Stack):
    dash = _load(DASHBOARDS / "ccscope-scenario.json")
    values = _scenario_values(stack)
    expected = {"Run start": stack.events["cubic"], "Algorithm swap": stack.events["bbr"],
                "Run end": stack.events["end"]}
    for ann in dash["annotations"]["list"][1:]:
        result = stack.query_range(_substitute(ann["expr"], values, stack), step=1)
        times = [float(t) for series in result for t, v in series["values"] if float(v) > 0]
        assert len(times) == 1, f"{ann['name']}: expected one event, got {times}"
        assert abs(times[0] - expected[ann["name"]]) < 4, (ann["name"], times[0], expected[ann["name"]])
        if ann["name"] == "Algorithm swap":
            assert result[0]["metric"]["algorithm"] == "bbr"


def test_recording_rules_produce_series(stack: Stack):
    recorded = [r["record"] for path in RULES for g in yaml.safe_load(path.read_text())["groups"]
                for r in g["rules"] if "record" in r]
    missing = [name for name in recorded if not stack.query_range(f'{name}{{job="ccscope"}}')]
    assert missing == []
    ratio = stack.query_range('job_instance_cc:ccscope_flow_retransmit_ratio:rate5m{job="ccscope",cc="cubic"}')
    assert max(float(v) for _, v in ratio[0]["values"]) > 0


def test_every_metric_used_exists_in_the_daemon_output(stack: Stack):
    text = _get(stack.daemon_url).decode()
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    # a flow's series go with it (after --grace): the cubic unit's, ended before the bbr unit ran, Prometheus
    # scraped from the daemon while they were there
    exposed |= set(stack.api("label/__name__/values", **{"match[]": '{job="ccscope",__name__=~"ccscope_flow_.+"}',
                                                         "start": stack.start, "end": stack.end}))
    used = set()
    for path in FILES:
        dash = _load(path)
        for expr in _exprs(dash) + _variable_queries(dash):
            used |= _metric_names(expr)
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                used |= _metric_names(rule["expr"])
    assert used - exposed - PROMETHEUS_SERIES == set()
    assert len(used) > 25


def test_exported_metrics_pass_promtool_check_metrics(stack: Stack):
    require_tools("promtool")
    for url in (stack.daemon_url, stack.scenario_url):
        text = _get(url)
        result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
        assert result.returncode == 0, (url, result.stdout.decode() + result.stderr.decode())


def test_alert_rules_evaluate_in_prometheus(stack: Stack):
    """The rule files load into a real Prometheus and every group evaluates without error."""
    groups = stack.api("rules")["groups"]
    assert {g["name"] for g in groups} == {"ccscope-recording", "ccscope-alerts"}
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule

