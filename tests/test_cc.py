"""ccscope's BPF congestion controls on this kernel: registering, sharing, unregistering, cleanup after
kill -9, and the one-line errors. Real struct_ops registrations in the real state directory (so that
`ccscope cleanup` only ever touches dead runs); the tests use only bpf_* names, which nothing else on the
host registers, and unregister what they registered, also when they fail."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cchelpers import available, require_cc_objects, start_user, stop_user, wait_for
from ccscope.cc import registry

TCP_CONGESTION = 13


TEST_NAMES = ("bpf_westwood", "bpf_copa", "bpf_reno", "bpf_vegas", "bpf_prague")


@pytest.fixture
def env():
    require_cc_objects()
    assert not set(TEST_NAMES) & available(), "a test registration is already there (a test running twice?)"
    yield dict(os.environ)
    # What a failed test left registered goes now (its processes are dead by then). Never `cleanup --all`:
    # that would tear down the live runs of everyone else on this machine.
    for name in TEST_NAMES:
        registry.unhold(name)


def _cc(ccscope_cmd, env, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ccscope_cmd, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _socket_uses(name: str) -> str:
    with socket.socket() as s:
        s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, name.encode())
        return s.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16).rstrip(b"\0").decode()


def test_load_list_unload(ccscope_cmd, env):
    before = available()
    assert "bpf_westwood" not in before
    res = _cc(ccscope_cmd, env, "cc", "load", "bpf:westwood")
    assert res.returncode == 0, res.stderr
    assert "bpf_westwood: registered" in res.stdout
    # The loading process has exited: the kernel keeps the registration (struct_ops map without a link).
    assert "bpf_westwood" in available()
    assert _socket_uses("bpf_westwood") == "bpf_westwood"
    listing = _cc(ccscope_cmd, env, "cc", "list").stdout
    row = next(line for line in listing.splitlines() if line.startswith("bpf_westwood "))
    assert "yes (map" in row and "held by cc load" in row
    assert any(line.split()[:3] == ["copa", "-", "yes"] for line in listing.splitlines())
    res = _cc(ccscope_cmd, env, "cc", "unload", "bpf:westwood")
    assert res.returncode == 0 and "bpf_westwood: unregistered" in res.stdout
    wait_for(lambda: "bpf_westwood" not in available(), "bpf_westwood to go")
    assert available() - {"vegas", "westwood", "copa"} == before - {"vegas", "westwood", "copa"}


def test_two_users_share_one_registration(env):
    first, line = start_user(env, "bpf:copa")
    second = None
    try:
        assert line == "bpf_copa=bpf"
        second, _ = start_user(env, "bpf:copa")
        stop_user(first)
        assert first.returncode == 0
        # The first one out must not unregister what the second still uses.
        assert "bpf_copa" in available() and _socket_uses("bpf_copa") == "bpf_copa"
        stop_user(second)
        assert second.returncode == 0
        wait_for(lambda: "bpf_copa" not in available(), "bpf_copa to be unregistered by its last user")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_sigterm_unregisters_a_foreground_load(ccscope_cmd, env):
    proc = subprocess.Popen([*ccscope_cmd, "cc", "load", "bpf:reno", "--foreground"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "bpf_reno: registered" in proc.stdout.readline()
        assert "bpf_reno" in available()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        wait_for(lambda: "bpf_reno" not in available(), "bpf_reno to go after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cleanup_after_kill_9(ccscope_cmd, env, tmp_path: Path):
    before = available()
    proc, line = start_user(env, "bpf:vegas")
    try:
        assert line == "bpf_vegas=bpf"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert "bpf_vegas" in available()  # nobody unregistered it ...
    # ... and the next scenario names it with a killed run's other leftovers, before it writes anything
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("name: tiny\nalgorithms: [cubic]\nduration: 2s\nprofiles:\n  p: {rate: 10mbit}\n"
                    "traffic:\n  bulk: {flows: 1}\n")
    refused = _cc(ccscope_cmd, env, "scenario", "run", str(tiny), "--listen", "off", "--out", str(tmp_path / "out"))
    assert refused.returncode == 3 and "bpf_vegas still registered" in _one_line(refused), refused.stderr
    assert not (tmp_path / "out").exists()
    res = _cc(ccscope_cmd, env, "cleanup")
    assert res.returncode == 0, res.stderr
    assert "removed BPF congestion control bpf_vegas" in res.stdout
    wait_for(lambda: "bpf_vegas" not in available(), "bpf_vegas to go after cleanup")
    assert available() - {"vegas", "westwood", "copa"} == before - {"vegas", "westwood", "copa"}


def _one_line(res: subprocess.CompletedProcess) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


# In a namespace of its own: a listener (under `listener` if given, else the namespace's default) and a client
# that asks for `client` before it connects, as a user's program would; prints what the connected client runs
# and whether ECN was negotiated.
PEERS = """
import socket, sys
client_cc, listener_cc = sys.argv[1:]
with socket.socket() as server:
    if listener_cc:
        server.setsockopt(socket.IPPROTO_TCP, 13, listener_cc.encode())
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.socket()
    client.setsockopt(socket.IPPROTO_TCP, 13, client_cc.encode())
    client.connect(server.getsockname())
    peer, _ = server.accept()
    runs = client.getsockopt(socket.IPPROTO_TCP, 13, 16).rstrip(b"\\0").decode()
    options = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[5]  # tcpi_options
    print(runs, "ecn" if options & 8 else "no-ecn")  # TCPI_OPT_ECN
"""


@pytest.mark.parametrize(("listener", "expected"), [("bpf_prague", "bpf_prague ecn"), ("", "reno no-ecn")])
def test_prague_falls_back_to_reno_where_ecn_is_not_negotiated(env, listener: str, expected: str):
    """prague needs ECN (TCP_CONG_NEEDS_ECN): it asks for it and sends even its SYN ECT(0), as dctcp does. The
    kernel accepts an ECT SYN's request only at a listener whose own algorithm needs ECN (tcp_ecn_create_request;
    RFC 3168 wants SYNs Not-ECT), so against a listener under the namespace's default prague's init finds no
    ECN and hands the socket to the kernel's reno; against a prague listener it stays prague, ECN on. Read back
    with getsockopt(TCP_CONGESTION) and TCP_INFO's options."""
    ns = f"ccs-prague-{os.getpid()}"
    proc, line = start_user(env, "bpf:prague")
    try:
        assert line == "bpf_prague=bpf", line
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        ran = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PEERS, "bpf_prague", listener],
                             capture_output=True, text=True, timeout=30, env=env)
        assert ran.stdout.strip() == expected, ran
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        stop_user(proc)
    wait_for(lambda: "bpf_prague" not in available(), "bpf_prague to go")


def test_bad_input_gives_one_line(ccscope_cmd, env: dict, tmp_path: Path):
    res = _cc(ccscope_cmd, env, "cc", "load", "hybla")
    assert res.returncode == 2
    assert "hybla: ccscope has no BPF implementation of it" in _one_line(res)
    res = _cc(ccscope_cmd, env, "cc", "load", "reno")
    assert res.returncode == 3
    assert "already has a congestion control named reno (EEXIST)" in _one_line(res)
    res = _cc(ccscope_cmd, env, "cc", "unload", "bpf:copa")
    assert res.returncode == 2 and "not registered by ccscope" in _one_line(res)
    # A kernel without struct_ops congestion controls: its BTF lacks the type.
    fake_btf = tmp_path / "btf"
    fake_btf.write_bytes(b"\x9f\xeb\x01\x00 no struct_ops here")
    no_struct_ops = dict(env, CCSCOPE_BTF=str(fake_btf))
    res = _cc(ccscope_cmd, no_struct_ops, "cc", "load", "bpf:vegas")
    assert res.returncode == 3 and "cannot run BPF congestion controls" in _one_line(res)
    out = tmp_path / "out"
    res = _cc(ccscope_cmd, no_struct_ops, "scenario", "wired-vs-wireless", "--quick", "--algorithms",
              "cubic,bpf:vegas", "--out", str(out), "--listen", "off")
    assert res.returncode == 3 and "bpf:vegas: this kernel cannot run BPF congestion controls" in _one_line(res)
    assert not out.exists()
