"""Deploy files against what the daemon needs: capabilities, mounts, ports and flags, checked by construction.

There is no Docker engine, Kubernetes or booted systemd here, so the files are parsed and compared with the
daemon's real defaults (cli.py, loader.py), the Dockerfile with the build steps CI runs (Makefile,
tools/bootstrap), and the capability set they all grant is proven sufficient by running the real daemon
with exactly those capabilities as an unprivileged user, under strace, against the unit's syscall filter.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from ccscope import cli, loader
from ccscope_testkit.net import stop_process
from ccscope_testkit.prereqs import ROOT, require, require_bpf_object, require_root, require_tools

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "kubernetes"
UNIT = DEPLOY / "systemd" / "ccscope.service"
CAPS = {"BPF", "PERFMON"}
BTF_DIR = str(Path(loader.DEFAULT_BTF).parent)


def _daemon_defaults() -> dict[str, str]:
    parser = cli.build_parser()
    daemon = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "daemon")[1]
    return {a.dest: a.default for a in daemon._actions if a.dest in ("listen", "flows", "grace")}


def _flags(args: list[str]) -> dict[str, str]:
    """--a b / --a=b pairs of a daemon command line."""
    out, it = {}, iter(args)
    for arg in it:
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            out[name.replace("-", "_")] = value or next(it)
    return out


def _yaml(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- compose -------------------------------------------------------------------------------------------


def _compose() -> dict:
    return _yaml(COMPOSE / "compose.yaml")[0]


def test_compose_runs_the_daemon_with_least_privilege():
    svc = _compose()["services"]["ccscope"]
    assert svc["network_mode"] == "host"
    assert svc["cap_drop"] == ["ALL"] and set(svc["cap_add"]) == CAPS
    assert "no-new-privileges:true" in svc["security_opt"] and svc["read_only"] is True
    assert "privileged" not in svc and "ports" not in svc
    assert f"{BTF_DIR}:{BTF_DIR}:ro" in svc["volumes"]
    assert svc["command"][0] == "daemon"
    assert _flags(svc["command"][1:]) == _daemon_defaults()
    assert svc["build"]["dockerfile"] == "Dockerfile" and (COMPOSE / svc["build"]["context"] / "Dockerfile").is_file()


def test_compose_services_are_on_localhost_and_mount_the_committed_files():
    services = _compose()["services"]
    assert set(services) == {"ccscope", "prometheus", "alertmanager", "grafana"}
    for name, svc in services.items():
        assert svc["network_mode"] == "host", name
        assert "ports" not in svc, name
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), f"{name}: {source}"
    prom = services["prometheus"]
    assert "--web.listen-address=127.0.0.1:9090" in prom["command"]
    assert "../prometheus/rules:/etc/prometheus/rules:ro" in prom["volumes"]
    assert "--web.listen-address=127.0.0.1:9093" in services["alertmanager"]["command"]
    grafana = services["grafana"]
    assert grafana["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert "../../dashboards:/var/lib/grafana/dashboards/ccscope:ro" in grafana["volumes"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / Path(home).name).is_file()


def test_compose_prometheus_scrapes_the_daemon_listen_address():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "ccscope")
    assert job["static_configs"][0]["targets"] == [_daemon_defaults()["listen"]]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    scenario_job = next(j for j in config["scrape_configs"] if j["job_name"] == "ccscope-scenario")
    override = _yaml(COMPOSE / "compose.scenario.yaml")[0]["services"]["scenario"]
    assert f"--listen {scenario_job['static_configs'][0]['targets'][0]}" in " ".join(override["entrypoint"])


def test_grafana_provisioning():
    ds = _yaml(COMPOSE / "grafana/provisioning/datasources/ccscope.yaml")[0]["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://127.0.0.1:9090" and ds["isDefault"]
    provider = _yaml(COMPOSE / "grafana/provisioning/dashboards/ccscope.yaml")[0]["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/ccscope"


def test_net_admin_only_in_the_scenario_override():
    assert "NET_ADMIN" not in (COMPOSE / "compose.yaml").read_text()
    override = _yaml(COMPOSE / "compose.scenario.yaml")[0]["services"]["scenario"]
    assert override["profiles"] == ["scenario"]
    assert "NET_ADMIN" in override["cap_add"] and override["cap_drop"] == ["ALL"]


# --- Dockerfile ----------------------------------------------------------------------------------------


def _dockerfile_stages() -> list[list[tuple[str, str]]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op, rest.strip()))
    return stages


def _apt_packages(run: str) -> set[str]:
    words = run.split("apt-get install", 1)[1].split("&&")[0].split()
    return {w for w in words if not w.startswith("-")}


def _bootstrap_packages() -> set[str]:
    text = (ROOT / "tools" / "bootstrap").read_text()
    block = re.search(r"packages=\(([^)]*)\)", text)[1]
    return set(block.split())


def test_dockerfile_builds_with_the_same_commands_as_ci():
    build, _ = _dockerfile_stages()
    runs = [rest for op, rest in build if op == "RUN"]
    # tools/bootstrap (which `make test` and so CI run) builds with `make -s all` and pip-installs the package.
    bootstrap = (ROOT / "tools" / "bootstrap").read_text()
    assert re.search(r"^make -s all$", bootstrap, re.M)
    assert "make all" in runs
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^all: .*\bbpf\b", makefile, re.M), "make all no longer builds the BPF object"
    assert any(re.search(r"pip install .*--no-cache-dir \.(\s|$)", r) for r in runs)
    assert "pip install -q -e ." in bootstrap or "pip install -q -e '.[dev]'" in bootstrap
    # Build packages are the bootstrap's (so a package the build needs cannot be missing from one of them).
    apt = next(r for r in runs if "apt-get install" in r)
    assert _apt_packages(apt) - {"libc6-dev"} <= _bootstrap_packages()
    assert {"clang", "libbpf-dev", "make"} <= _apt_packages(apt)
    # Everything the Makefile's bpf and delayline targets read is copied in, and not dockerignored.
    copied = " ".join(rest for op, rest in build if op == "COPY")
    # scenarios/: daemon/ccscope/scenarios links to it, and the wheel ships the built-ins from there.
    for needed in ("Makefile", "pyproject.toml", "README.md", "bpf/", "daemon/", "scenarios/"):
        assert needed in copied, needed
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not {"bpf", "daemon", "scenarios", "Makefile", "pyproject.toml", "README.md"} & set(ignored)
    assert "daemon/ccscope/bpf/*.o" in ignored and ".venv" in ignored


def test_dockerfile_make_targets_exist():
    """`make -n all` plans the BPF and helper builds from a clean tree (dry run: nothing is built)."""
    require_tools("make")
    result = subprocess.run(["make", "-n", "-B", "all"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "-target bpf" in result.stdout and "ccscope.bpf.o" in result.stdout


def test_dockerfile_runtime_image():
    _, runtime = _dockerfile_stages()
    assert "slim" in runtime[0][1]
    apt = next(rest for op, rest in runtime if op == "RUN" and "apt-get install" in rest)
    assert {"python3", "libbpf1", "iperf3", "iproute2", "iptables", "ethtool"} <= _apt_packages(apt)
    assert not {"clang", "llvm", "gcc", "libbpf-dev"} & _apt_packages(apt)
    assert ("COPY", "--from=build /opt/ccscope /opt/ccscope") in runtime
    entry = next(rest for op, rest in runtime if op == "ENTRYPOINT")
    cmd = yaml.safe_load(next(rest for op, rest in runtime if op == "CMD"))
    assert yaml.safe_load(entry) == ["ccscope"] and cmd[0] == "daemon"
    assert _flags(cmd[1:]) == _daemon_defaults()


# --- systemd -------------------------------------------------------------------------------------------


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_unit_grants_only_bpf_and_perfmon():
    svc = _unit()["Service"]
    caps = {c.removeprefix("CAP_") for c in svc["AmbientCapabilities"].split()}
    assert caps == CAPS == {c.removeprefix("CAP_") for c in svc["CapabilityBoundingSet"].split()}
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "Restart": "on-failure", "DynamicUser": "yes"}.items():
        assert svc[key] == value, key
    assert "bpf" in svc["SystemCallFilter"].split()
    assert "PrivateNetwork" not in svc and "MemoryDenyWriteExecute" not in svc
    argv = shlex.split(svc["ExecStart"])
    assert argv[1] == "daemon" and _flags(argv[2:]) == _daemon_defaults()


def test_systemd_analyze_verify(tmp_path: Path):
    require_tools("systemd-analyze")
    exe = shutil.which("ccscope") or str(Path(sys.executable).parent / "ccscope")
    unit = tmp_path / "ccscope.service"
    unit.write_text(UNIT.read_text().replace("/opt/ccscope/bin/ccscope", exe))
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True,
                            text=True, timeout=60)
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if "ccscope.service" in line or "Unknown" in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


def _syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True, timeout=60).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def _expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= _expand(groups[name], groups) if name.startswith("@") else {name}
    return out


def _start_daemon(prefix: list[str], port: int, log: Path) -> subprocess.Popen:
    exe = str(Path(sys.executable).parent / "ccscope")
    return subprocess.Popen([*prefix, exe, "daemon", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))


def _scrape(port: int, proc: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.read().decode()
        except OSError:
            time.sleep(0.2)
    raise AssertionError("daemon did not serve /metrics")


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_daemon_runs_with_only_the_granted_capabilities_as_nobody(tmp_path: Path):
    """The capability set of the unit, compose and the DaemonSet is enough: nobody + BPF + PERFMON + NNP."""
    require_root()
    require_tools("setpriv")
    require_bpf_object()
    caps = ",".join(f"+{c.lower()}" for c in sorted(CAPS))
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps=-all,{caps}",
              f"--ambient-caps=-all,{caps}", f"--bounding-set=-all,{caps}", "--no-new-privs"]
    port, log = _port(), tmp_path / "daemon.log"
    proc = _start_daemon(prefix, port, log)
    try:
        text = _scrape(port, proc, log)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(r"^CapEff:\s*000000c000000000$", status, re.M), status  # bits 38, 39 only
        assert re.search(r"^Uid:\s+65534\b", status, re.M)
    finally:
        stop_process(proc)
    assert "ccscope_build_info{" in text and "ccscope_tcp_flows" in text


def test_daemon_syscalls_pass_the_unit_filter(tmp_path: Path):
    """Every syscall the daemon makes (start, attach, scrape, stop) is allowed by SystemCallFilter=."""
    require_root()
    require_tools("strace", "systemd-analyze")
    require_bpf_object()
    allowed = _expand(_unit()["Service"]["SystemCallFilter"].split(), _syscall_groups())
    trace = tmp_path / "strace.out"
    port, log = _port(), tmp_path / "daemon.log"
    proc = _start_daemon(["strace", "-f", "-qq", "-o", str(trace)], port, log)
    try:
        _scrape(port, proc, log)
        _scrape(port, proc, log)
    finally:
        # Stop the traced daemon itself (strace's child); strace exits with it.
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for child in children:
                os.kill(int(child), 9)
            proc.kill()
            proc.wait()
    used = set(re.findall(r"^\d+\s+([a-z_0-9]+)\(", trace.read_text(), re.M))
    assert "bpf" in used
    assert used - allowed == set()
    # ProtectKernelTunables makes /sys read-only and hides /proc/kallsyms: the daemon must only read there.
    writes = re.findall(r'openat\([^"]*"(/(?:sys|proc/sys)/[^"]*)", [^)]*O_(?:WRONLY|RDWR)', trace.read_text())
    assert writes == []
    assert "/proc/kallsyms" not in trace.read_text()


# --- Kubernetes ----------------------------------------------------------------------------------------


def _k8s(name: str) -> dict:
    return _yaml(K8S / name)[0]


def test_daemonset_security_and_scheduling():
    ds = _k8s("daemonset.yaml")
    assert ds["kind"] == "DaemonSet"
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert {"operator": "Exists"} in pod["tolerations"]
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": sorted(CAPS)}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "btf")
    volume = next(v for v in pod["volumes"] if v["name"] == "btf")
    assert mount == {"name": "btf", "mountPath": BTF_DIR, "readOnly": True}
    assert volume["hostPath"]["path"] == BTF_DIR
    # --labels: the node's cgroup tree and pod log directory, read-only, where the flags point.
    assert all(m.get("readOnly") for m in container["volumeMounts"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    flags = _flags(container["args"][1:])
    assert hosts["cgroup"] == "/sys/fs/cgroup" and mounts["cgroup"] == flags["cgroup_root"]
    assert hosts["pod-logs"] == "/var/log/pods" and mounts["pod-logs"] == flags["pod_logs"]
    assert set(flags["labels"].split(",")) <= {"comm", "cgroup", "container", "pod"}
    from ccscope.cli import build_parser

    args = build_parser().parse_args([a.replace("$(NODE_IP)", "10.0.0.1") for a in container["args"]])
    assert (args.labels, args.pod_logs) == (flags["labels"], flags["pod_logs"])


def test_daemonset_flags_ports_and_monitoring_agree():
    ds = _k8s("daemonset.yaml")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "daemon"
    flags = _flags(container["args"][1:])
    defaults = _daemon_defaults()
    assert flags["listen"] == "$(NODE_IP):" + defaults["listen"].rsplit(":", 1)[1]
    assert flags["flows"] == defaults["flows"] and flags["grace"] == defaults["grace"]
    assert [e["name"] for e in container["env"]] == ["NODE_IP"]
    port = container["ports"][0]
    assert port["containerPort"] == int(defaults["listen"].rsplit(":", 1)[1])
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    service = _k8s("service.yaml")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    monitor = _k8s("podmonitor.yaml")
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == port["name"]
    # The flows' pod/namespace/container labels must not be renamed exported_* by the target's own.
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    # The alert rules watch job="ccscope": the PodMonitor's jobLabel must produce exactly that.
    assert pod_labels[monitor["spec"]["jobLabel"]] == "ccscope"
    assert 'up{job="ccscope"}' in (DEPLOY / "prometheus" / "rules" / "ccscope-alerts.yml").read_text()


def test_kustomization_and_prometheusrule_in_sync():
    kustomization = _k8s("kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    result = subprocess.run([sys.executable, str(K8S / "sync_rules.py"), "--check"], capture_output=True,
                            timeout=60)
    assert result.returncode == 0, "prometheusrule.yaml is stale: run python3 deploy/kubernetes/sync_rules.py"
    rule = _k8s("prometheusrule.yaml")
    names = {g["name"] for g in rule["spec"]["groups"]}
    assert names == {"ccscope-recording", "ccscope-alerts"}


@pytest.mark.parametrize("path", sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml")),
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path):
    assert _yaml(path)





def test_wheel_ships_the_bpf_object_delay_line_and_scenarios(tmp_path: Path) -> None:
    """What a non-editable install (the Docker image, pip install .) gets: the runtime files are in the wheel."""
    import zipfile

    require_bpf_object()
    delayline = ROOT / "daemon/ccscope/emulation/ccscope-delayline"
    require(delayline.is_file(), "delay line not built: make all")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("ccscope-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        mode = zf.getinfo("ccscope/emulation/ccscope-delayline").external_attr >> 16
    assert "ccscope/bpf/ccscope.bpf.o" in names
    assert mode & 0o111, "the delay line must stay executable"
    shipped = {n.removeprefix("ccscope/scenarios/") for n in names if n.startswith("ccscope/scenarios/")}
    assert shipped == {str(p.relative_to(ROOT / "scenarios")) for p in (ROOT / "scenarios").rglob("*.yaml")}
    assert "templates/real-wired-vs-wireless.yaml" in shipped
    assert "wired-vs-wireless.yaml" in shipped
    # the live page works offline: its own files and the vendored chart library with its licence
    from ccscope.live import vendor

    require(not vendor.missing_files(), "live page assets not built: make assets")
    for name in ("index.html", "live.js", "live.css", *(f"vendor/{n}" for n in vendor.UPLOT_FILES.values())):
        assert f"ccscope/live/static/{name}" in names, name
