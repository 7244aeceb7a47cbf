"""Whose flow is it, on the real cgroup v2 hierarchy: processes in cgroups named the way kubelet, containerd,
CRI-O and docker name theirs open real loopback flows, and the daemon's series, `ccscope flows` and
`ccscope trace` must name their process, cgroup, container and pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ccscope.attribution import RULES, CgroupResolver, cgroup2_mount, parse_workload, truncate
from ccscope.exporter import FLOW_LABELS
from ccscope.flows import decode
from ccscope.loader import ProbeOptions, TelemetryProbe
from ccscope.telemetry import quantities
from ccscope_testkit.cgroups import Tree, cgroup_tree, kubepods_systemd, pod_logs
from ccscope_testkit.net import cli, daemon, free_port, parse_metrics, values, wait_for
from ccscope_testkit.prereqs import require_bpf_object, require_root

FLOW_SERIES = "ccscope_flow_bytes_sent_total"


# --- the parsing table ---------------------------------------------------------------------------------------

CID = "0123456789abcdef" * 4
UID = "5f0c2a4e-9b1d-4c8e-a3f2-7d6e5c4b3a21"


@pytest.mark.parametrize(("path", "container", "pod"), [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     f"cri-containerd-{CID}.scope", CID, UID),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope", CID, UID),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
     f"docker-{CID}.scope", CID, UID),
    (f"/kubepods/burstable/pod{UID}/{CID}", CID, UID),
    (f"/kubepods/pod{UID}/{CID}", CID, UID),
    (f"/docker/{CID}", CID, ""),
    (f"/system.slice/docker-{CID}.scope", CID, ""),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice", "", UID),
    (f"/user.slice/{CID}", "", ""),  # a bare ID outside a pod or /docker is nobody's container
    ("/system.slice/sshd.service", "", ""),
    ("/", "", ""),
])
def test_workload_table(path: str, container: str, pod: str) -> None:
    found = parse_workload(path)
    assert (found.container, found.pod_uid) == (container, pod)


def test_every_rule_is_exercised_and_truncation() -> None:
    assert {r.layout for r in RULES} == {"systemd", "cgroupfs", "containerd", "cri-o", "docker", "docker-cgroupfs"}
    assert truncate("/a/b/c", 2) == "/a/b" and truncate("/a/b/c", 0) == "/a/b/c" and truncate("/", 3) == "/"
    assert cgroup2_mount("none /x tmpfs rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n") == \
        Path("/sys/fs/cgroup/unified")


# --- real cgroups, real processes, real flows ----------------------------------------------------------------


@pytest.fixture
def tree() -> Iterator[Tree]:
    require_root()
    require_bpf_object()
    with cgroup_tree() as made:
        yield made


LOOPBACK = {"src": "127.0.0.1", "dst": "127.0.0.1", "netns": str(os.stat("/proc/self/ns/net").st_ino)}


def _flow_series(samples, sport: int, dport: int) -> list[dict[str, str]]:
    """The series of one loopback flow of this network namespace (ports alone may recur in other tests' netns)."""
    want = {**LOOPBACK, "sport": str(sport), "dport": str(dport)}
    return [lab for name, lab, _ in samples if name == FLOW_SERIES and all(lab.get(k) == v for k, v in want.items())]


def test_pod_container_comm_labels_and_cleanup(tree: Tree, tmp_path: Path) -> None:
    """Client in a containerd container of a systemd-driver pod, server in a cgroupfs-driver pod, a docker
    client; then the client's container goes away and its series with it after --grace."""
    client_uid, server_uid = str(uuid.uuid4()), str(uuid.uuid4())
    client_cid, server_cid, docker_cid = (uuid.uuid4().hex * 2 for _ in range(3))
    logs = pod_logs(tmp_path, "shop", "checkout-7d9f", client_uid)
    (logs / f"payments_ledger-0_{server_uid}").mkdir()
    client_cg = tree.cgroup(kubepods_systemd(client_uid, client_cid))
    server_cg = tree.cgroup(f"kubepods/besteffort/pod{server_uid}/{server_cid}")
    docker_cg = tree.cgroup(f"system.slice/docker-{docker_cid}.scope")

    # --cgroup: only this test's flows get series, however many other tests run on the host.
    with daemon("--labels", "comm,cgroup,container,pod", "--flows", "all", "--grace", "1s",
                "--pod-logs", str(logs), "--cgroup", tree.path_of(tree.top)) as running:
        port = free_port()
        _, server_pid, _ = tree.start(server_cg, "ccs-server", "serve", port)
        client, client_pid, client_port = tree.start(client_cg, "ccs-client", "connect", port)
        _, _, docker_port = tree.start(docker_cg, "ccs-docker", "connect", port)

        def both_sides():
            samples = running.scrape()
            mine = _flow_series(samples, client_port, port) + _flow_series(samples, port, client_port)
            docker = _flow_series(samples, docker_port, port)
            return (samples, mine, docker) if len(mine) == 2 and docker else None

        found = wait_for(both_sides, timeout=15)
        assert found, "the workers' flows never appeared on /metrics"
        samples, mine, docker = found
        out = next(lab for lab in mine if lab["sport"] == str(client_port))
        accepted = next(lab for lab in mine if lab["sport"] == str(port))
        assert {k: out[k] for k in ("comm", "pod", "namespace", "pod_uid", "container", "cgroup")} == {
            "comm": "ccs-client", "pod": "checkout-7d9f", "namespace": "shop", "pod_uid": client_uid,
            "container": client_cid, "cgroup": tree.path_of(client_cg)}
        # The accepted side was created in softirq: it must carry the listener's process, cgroup and pod.
        assert {k: accepted[k] for k in ("comm", "pod", "namespace", "container", "cgroup")} == {
            "comm": "ccs-server", "pod": "ledger-0", "namespace": "payments", "container": server_cid,
            "cgroup": tree.path_of(server_cg)}
        assert (docker[0]["comm"], docker[0]["container"], docker[0]["pod"]) == ("ccs-docker", docker_cid, "")
        # Host aggregates by cgroup: one flow started in the client's container, with its pod labels.
        started = values(samples, "ccscope_cgroup_flows_started_total", cgroup=tree.path_of(client_cg),
                         pod="checkout-7d9f", namespace="shop", container=client_cid)
        assert started == [1.0]
        delay = values(samples, "ccscope_cgroup_queueing_delay_seconds_count", cgroup=tree.path_of(server_cg))
        assert delay and delay[0] >= 1

        # `ccscope flows` and `trace --json`, filtered by process name and cgroup prefix.
        table = subprocess.run(cli("flows", "--once", "--interval", "0.3s", "--comm", "ccs-server", "--json",
                                   "--cgroup", tree.path_of(tree.top), "--pod-logs", str(logs)),
                               capture_output=True, text=True, timeout=30)
        assert table.returncode == 0, table.stderr
        rows = json.loads(table.stdout)
        assert rows and {(r["comm"], r["tgid"], r["pod"], r["namespace"]) for r in rows} == {
            ("ccs-server", server_pid, "ledger-0", "payments")}
        trace = subprocess.run(cli("trace", "--json", "--count", "3", "--duration", "10s", "--comm", "ccs-client",
                                   "--pod-logs", str(logs)), capture_output=True, text=True, timeout=30)
        lines = [json.loads(line) for line in trace.stdout.splitlines()]
        assert len(lines) == 3, trace.stderr
        assert {(d["comm"], d["tgid"], d["pod"], d["container"]) for d in lines} == {
            ("ccs-client", client_pid, "checkout-7d9f", client_cid)}
        text = subprocess.run(cli("flows", "--once", "--interval", "0.3s", "--comm", "ccs-client",
                                  "--pod-logs", str(logs)), capture_output=True, text=True, timeout=30)
        assert "COMM" in text.stdout and "CGROUP/POD" in text.stdout and "shop/checkout-7d9f" in text.stdout

        # The client's container stops and its cgroup is removed: no series of it may stay behind.
        tree.stop(client)
        tree.remove(client_cg)
        gone = wait_for(lambda: not [lab for _, lab, _ in running.scrape()
                                     if lab.get("cgroup") == tree.path_of(client_cg)], timeout=15)
        assert gone, "series of a deleted cgroup outlived --grace"
        still = running.scrape()
        assert _flow_series(still, docker_port, port), "the docker flow lost its series too"


def test_max_cgroups_other_bucket(tree: Tree) -> None:
    """--max-cgroups 2: at most 2 cgroups of the host get their own aggregates, the rest count as other."""
    port = free_port()
    cgroups = [tree.cgroup(f"app{i}") for i in range(4)]
    with daemon("--labels", "cgroup", "--max-cgroups", "2", "--flows", "all",
                "--cgroup", tree.path_of(tree.top)) as running:
        tree.start(cgroups[0], "ccs-server", "serve", port)
        clients = [tree.start(cg, f"ccs-c{i}", "connect", port)[2] for i, cg in enumerate(cgroups[1:])]

        def all_seen():
            samples = running.scrape()
            return samples if all(_flow_series(samples, p, port) for p in clients) else None

        samples = wait_for(all_seen, timeout=15)
        assert samples, "the clients' flows never appeared"
        groups = {lab["cgroup"]: v for name, lab, v in samples if name == "ccscope_cgroup_flows_started_total"}
        assert len(groups) <= 3 and "other" in groups, groups
        ours = {tree.path_of(cg) for cg in cgroups}
        # 4 accepted + client flows in 4 cgroups: at least 2 of ours did not fit and were counted as other.
        assert len(ours & set(groups)) <= 2 and groups["other"] >= 2, groups
        # per-flow series keep their real cgroup: only the aggregates are bounded
        for client_port, cg in zip(clients, cgroups[1:], strict=True):
            assert _flow_series(samples, client_port, port)[0]["cgroup"] == tree.path_of(cg)


def test_labels_off_exposition_unchanged() -> None:
    """Without --labels: no attribution label anywhere, no by-cgroup family, flow series keep FLOW_LABELS."""
    require_root()
    require_bpf_object()
    with daemon("--flows", "top:5") as running:
        def with_flows() -> str | None:
            text = running.scrape_text()
            return text if "ccscope_flow_" in text else None

        text = wait_for(with_flows, timeout=10)
    assert text, "no flow series to check (the scrape itself is a flow, so there should be one)"
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert not [f for f in families if f.startswith("ccscope_cgroup")]
    flow_families = {q.prometheus for q in quantities.exported()}
    for name, labels, _ in parse_metrics(text):
        if name.removesuffix("_total") in flow_families:
            assert sorted(labels) == sorted(FLOW_LABELS), name
        assert not {"comm", "cgroup", "container", "pod", "namespace", "pod_uid"} & set(labels), name


def _inotify_instances() -> int:
    fds = Path("/proc/self/fd")
    return sum(os.readlink(fds / fd) == "anon_inode:inotify" for fd in os.listdir(fds) if (fds / fd).exists())


@pytest.mark.parametrize("follow", [True, False])
def test_a_resolver_that_does_not_follow_takes_no_watches_and_still_resolves(tree: Tree, follow: bool) -> None:
    """The daemon's page resolves cgroups without --labels: it must not take inotify watches (one per cgroup
    directory, from the budget kubelet and containerd share with root), and still name a cgroup made after it
    started, by rescanning on the miss."""
    before = _inotify_instances()
    resolver = CgroupResolver(tree.root, follow=follow)
    try:
        assert _inotify_instances() - before == (1 if follow else 0)
        made = tree.cgroup("late/child")
        cgroup_id = os.stat(made).st_ino  # a cgroup v2 directory's inode number is its id
        assert wait_for(lambda: resolver.path(cgroup_id) == tree.path_of(made), timeout=5)
    finally:
        resolver.close()
    assert _inotify_instances() == before


SEEDED_PEER = """
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
listener = socket.create_server(("127.0.0.1", 0))
pairs = []
for ask_cookie in (False, True):
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    if ask_cookie:  # SO_COOKIE makes the socket's cookie, as tcp_probe, ss or a daemon's scrape would
        client.getsockopt(socket.SOL_SOCKET, 57, 8)
    pairs.append((client, server))
print(" ".join(str(c.getsockname()[1]) for c, _ in pairs), flush=True)
sys.stdin.readline()  # idle until the probe has attached and seeded its owners
for client, server in pairs:
    client.sendall(b"x" * 1000)
    server.recv(1000)
print("sent", flush=True)
sys.stdin.readline()
"""


def test_sockets_opened_before_the_probe_get_their_owner() -> None:
    """seed_owners names the process of sockets that existed before ccscope attached: one whose cookie was made
    before (keyed by it), and one that had none until its first segment after the attach (keyed by the socket's
    address until tcp_probe makes its flow; 6.18.44's verifier refuses bpf_get_socket_cookie on that pointer)."""
    require_root()
    require_bpf_object()
    peer = subprocess.Popen([sys.executable, "-c", SEEDED_PEER, "ccs-seeded"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        ports = {int(p) for p in peer.stdout.readline().split()}
        with TelemetryProbe(ProbeOptions()) as probe:
            assert probe.seeded
            peer.stdin.write("go\n")
            peer.stdin.flush()
            assert peer.stdout.readline().strip() == "sent"

            def owners() -> dict[int, tuple[str, int]]:
                return {flow.sport: (flow.comm, flow.tgid) for flow in map(decode, probe.read_flows())
                        if flow.sport in ports and flow.src == "127.0.0.1"}
            assert wait_for(lambda: len(owners()) == 2, 5), owners()
            assert owners() == dict.fromkeys(ports, ("ccs-seeded", peer.pid)), owners()
    finally:
        peer.kill()
        peer.wait()
