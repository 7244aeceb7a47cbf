"""Bad flags and missing prerequisites: one line `ccscope: error: ...` on stderr, the exit code of errors.py, no
traceback. Every case runs the real CLI in a subprocess, the way a user meets it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ccscope import check
from ccscope.errors import BpfError, PrerequisiteError, UsageError
from ccscope.host import algorithms
from ccscope.loader import PROGRAMS
from ccscope_testkit.net import held_link_count, wait_for
from ccscope_testkit.prereqs import require, require_bpf_object, require_root, require_tools

USAGE, PREREQ, BPF = UsageError.exit_code, PrerequisiteError.exit_code, BpfError.exit_code


def run_cli(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "ccscope.cli", *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    err = result.stderr
    assert "Traceback" not in err and "Traceback" not in result.stdout, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ccscope: error: "), err
    assert result.returncode == code, (result.returncode, err)
    for needle in needles:
        assert needle in lines[0], (needle, err)
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["daemon", "--listen", "garbage"], "--listen 'garbage'"),
    (["daemon", "--listen", "127.0.0.1:99999"], "--listen"),
    (["daemon", "--flows", "top:0"], "--flows top:N 0"),
    (["daemon", "--flows", "bottom:3"], "--flows"),
    (["daemon", "--sample-interval", "-1"], "--sample-interval '-1'"),
    (["daemon", "--sample-interval", "1h"], "--sample-interval '1h' is out of range"),
    (["daemon", "--grace", "soon"], "--grace"),
    (["daemon", "--max-flows", "1"], "--max-flows 1"),
    (["daemon", "--tls-cert", "/x.pem"], "--tls-cert and --tls-key"),
    (["daemon", "--basic-auth-file", "/nonexistent/users"], "--basic-auth-file"),
    (["daemon", "--bogus"], "unrecognized arguments: --bogus"),
    (["daemon", "--port", "0"], "--port 0"),
    (["flows", "--cidr", "10.0.0.0/99"], "--cidr"),
    (["flows", "--netns", "abc"], "--netns 'abc'"),
    (["flows", "--sort", "nothing"], "--sort"),
    (["flows", "--interval", "1ms"], "--interval"),
    (["trace", "--count", "0"], "--count"),
    (["daemon", "--labels", "comm,uid"], "--labels 'uid' is not one of comm,cgroup,container,pod"),
    (["daemon", "--labels", "cgroup", "--cgroup-depth", "-1"], "--cgroup-depth -1"),
    (["daemon", "--labels", "pod", "--max-cgroups", "0"], "--max-cgroups 0"),
    (["daemon", "--labels", "pod", "--cgroup-root", "/tmp"], "--cgroup-root /tmp is not a cgroup v2 hierarchy"),
    (["flows", "--cgroup", "kubepods.slice"], "--cgroup 'kubepods.slice'"),
    (["trace", "--comm", "a-name-longer-than-15"], "--comm 'a-name-longer-than-15'"),
    (["trace", "--duration", "forever"], "--duration"),
    (["trace", "--duration", "0"], "--duration '0' is shorter than 1ms (leave --duration out"),  # ran forever
    (["daemon", "--labels", "comm,comm"], "--labels 'comm,comm': comm is listed twice"),
    (["daemon", "--labels", ""], "--labels '': no label named"),
    (["daemon", "--labels", "comm,,pod"], "--labels 'comm,,pod': an empty name"),
    # negative values are refused by the flag's own check, not "expected one argument"
    (["flows", "--interval", "-1s"], "--interval '-1s' is negative"),
    (["trace", "--duration", "-5s"], "--duration '-5s' is negative"),
    (["daemon", "--grace", "-0.5s"], "--grace '-0.5s' is negative"),
    (["scenario", "fast-vs-slow", "--duration", "-5s"], "--duration '-5s' is negative"),
    (["scenario", "fast-vs-slow", "--duration", "0"], "--duration '0' is out of range (1s to 3600s)"),
    (["flows", "--limit", "-1"], "--limit -1 is out of range 1..1000000"),
    (["flows", "--limit", "0"], "--limit 0 is out of range"),
    (["scenario", "fast-vs-slow", "--algorithms", "cubic,,bbr"], "--algorithms 'cubic,,bbr': an empty name"),
    (["scenario", "fast-vs-slow", "--algorithms", "cubic,"], "an empty name between commas"),
    (["scenario", "fast-vs-slow", "--algorithms", "bbr,cubic,bbr"], "bbr is listed twice"),
    (["scenario", "fast-vs-slow", "--algorithms", "TCP Cubic"], "'TCP Cubic' is not a congestion control"),
    ([], "missing COMMAND"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_flags(args: list[str], needle: str) -> None:
    assert_one_line_error(run_cli(*args), USAGE, needle)


def test_port_in_use() -> None:
    require_root()
    require_bpf_object()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("daemon", "--listen", f"127.0.0.1:{port}")
    assert_one_line_error(result, PREREQ, f"port {port} on 127.0.0.1 is already in use")


def test_not_root() -> None:
    require_tools("setpriv")
    require(os.geteuid() == 0, "needs root to drop to nobody")
    result = run_cli("daemon", prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    line = assert_one_line_error(result, PREREQ, "not allowed to load BPF programs", "CAP_BPF")
    # The hint's command, as a user would paste it (nobody for USER, nogroup for GROUP), really gets past the
    # check: before, it said `setcap ...+ep`, which the kernel ignores on the ccscope script.
    command = re.search(r"`sudo (setpriv [^`]*) ccscope \.\.\.`", line)
    assert command, line
    words = command.group(1).replace("USER", "nobody").replace("GROUP", "nogroup").split()
    result = run_cli("flows", "--once", "--limit", "1", prefix=tuple(words))
    assert result.returncode == 0 and "flows, sorted by bytes" in result.stdout, result.stderr


def test_capabilities_only_without_bpf_caps() -> None:
    """Root without CAP_SYS_ADMIN/CAP_BPF/CAP_PERFMON (e.g. an unprivileged container) gets the same message."""
    require_tools("setpriv")
    require(os.geteuid() == 0, "needs root to drop capabilities")
    drop = "-sys_admin,-bpf,-perfmon"
    result = run_cli("flows", "--once", prefix=("setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}"))
    assert_one_line_error(result, PREREQ, "not allowed to load BPF programs")


def test_btf_missing() -> None:
    require_root()
    result = run_cli("daemon", env={"CCSCOPE_BTF": "/nonexistent/vmlinux"})
    assert_one_line_error(result, PREREQ, "kernel BTF not found at /nonexistent/vmlinux", "CCSCOPE_BTF")


def test_bpf_object_missing() -> None:
    require_root()
    result = run_cli("trace", env={"CCSCOPE_BPF_OBJECT": "/nonexistent/ccscope.bpf.o"})
    assert_one_line_error(result, PREREQ, "BPF object missing at /nonexistent/ccscope.bpf.o", "make bpf")


def test_bpf_object_garbage(tmp_path: Path) -> None:
    require_root()
    bogus = tmp_path / "ccscope.bpf.o"
    bogus.write_bytes(b"\x7fELF not really")
    result = run_cli("daemon", env={"CCSCOPE_BPF_OBJECT": str(bogus)})
    assert_one_line_error(result, BPF, "cannot open BPF object")


def _libbpf_file() -> str:
    """The file libbpf.so.1 resolves to, found the way the loader finds it."""
    import ctypes

    ctypes.CDLL("libbpf.so.1")
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libbpf.so" in line:
            return line.split()[-1]
    raise AssertionError("libbpf.so.1 loaded but not mapped")


def test_libbpf_missing(tmp_path: Path) -> None:
    """libbpf hidden inside a private mount namespace: an empty file bind-mounted over it (gone with the process)."""
    require_root()
    require_tools("unshare", "mount")
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    hide = f"mount --bind {empty} {_libbpf_file()} && exec \"$@\""
    result = run_cli("daemon", prefix=("unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "sh"))
    assert_one_line_error(result, PREREQ, "libbpf is not installed", "apt-get install libbpf1")


def test_kernel_btf_without_our_tracepoints(tmp_path: Path) -> None:
    """A kernel whose BTF lacks the btf_trace_* typedefs: `check` names what is missing, the daemon fails in one
    line (libbpf cannot resolve the attach targets)."""
    require_root()
    require_bpf_object()
    fake = tmp_path / "vmlinux"
    fake.write_bytes(b"\x9f\xeb\x01\x00" + b"\0" * 64 + b"btf_trace_tcp_probe\0")
    result = check.check_tracepoints(str(fake))
    assert result.failed
    assert result.detail.startswith("missing in this kernel: tcp_retransmit_skb, inet_sock_set_state")
    assert "tcp_probe," not in result.detail
    assert check.check_tracepoints(str(tmp_path / "none")).failed
    real = check.check_tracepoints()
    require(not real.failed, "this kernel lacks the tracepoints")
    assert real.detail == "tcp_probe, tcp_retransmit_skb, inet_sock_set_state"

    checked = run_cli("check", env={"CCSCOPE_BTF": str(fake)})
    assert checked.returncode == PREREQ and "Traceback" not in checked.stderr
    assert any(line.startswith("tracepoints") and "FAIL" in line for line in checked.stdout.splitlines())
    assert checked.stderr.strip().startswith("ccscope: cannot run here:")
    assert_one_line_error(run_cli("daemon", env={"CCSCOPE_BTF": str(fake)}), BPF, "kernel rejected the BPF programs")


def test_check_says_in_one_line_which_algorithm_lacks_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """An algorithm the kernel could load as a module whose type is in no BTF (the module not loaded): `check`
    warns, naming the module to load, on one line. dctcp stands in for a distribution's tcp_bbr.ko: this kernel
    has no dctcp, so its type is in neither vmlinux nor a module's BTF; the list of loadable ones is patched as if
    /lib/modules held tcp_dctcp.ko (the stock-kernel lab's guest checks the same with tcp_bbr unloaded for real)."""
    require_root()
    require_bpf_object()
    require(not Path("/sys/kernel/btf/tcp_dctcp").exists(), "this kernel has dctcp's type")
    real = algorithms.available_algorithms
    monkeypatch.setattr(algorithms, "available_algorithms", lambda: real() | {"dctcp"})
    said = check.check_algorithm_state()
    assert said.status == "warn" and "\n" not in said.detail, said
    assert said.detail.endswith("; no state for dctcp (its type is in no BTF: load its module, e.g. modprobe "
                                "tcp_dctcp)"), said
    assert said.detail.startswith("bbr (vmlinux), cubic (vmlinux)"), said


def test_check_passes_here() -> None:
    require_root()
    require_bpf_object()
    result = run_cli("check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "load and attach" in result.stdout and "FAIL" not in result.stdout
    # bbr and cubic have their types where this kernel keeps them: vmlinux here (built in), or a loaded
    # module's BTF (issue 28); a module not loaded would be a warning, not ok
    state = next(line for line in result.stdout.splitlines() if line.startswith("algorithm state"))
    assert re.fullmatch(r"algorithm state +ok +bbr \((vmlinux|module tcp_bbr)\), cubic \((vmlinux|module tcp_cubic)\), "
                        r"ccscope's BPF vegas, westwood, copa, prague \(by their tag\)",
                        state), state
    # The backend scenarios will get on this kernel: netem where the kernel has it, else the fallback.
    emulation = next(line for line in result.stdout.splitlines() if line.startswith("link emulation"))
    has_netem = "netem" in emulation.split("qdiscs:")[-1]
    assert ("netem backend" if has_netem else "userspace backend") in emulation, emulation


def test_interrupted_trace_has_no_traceback() -> None:
    """SIGINT during a trace: exit 0, nothing but the samples."""
    require_root()
    require_bpf_object()
    proc = subprocess.Popen([sys.executable, "-m", "ccscope.cli", "trace", "--port", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        def attached_or_gone() -> bool:
            return proc.poll() is not None or held_link_count(proc.pid) >= len(PROGRAMS)

        assert wait_for(attached_or_gone, 15), "trace never attached its tracepoints"
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(2)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "Traceback" not in err and out == "", err


@pytest.mark.parametrize("args", [["scenario", "run"], ["daemon", "--listen", "127.0.0.1:9", "--web.config.file"]])
def test_a_file_that_is_not_ours_is_never_quoted(tmp_path: Path, args: list[str]) -> None:
    """Run as root, `ccscope scenario run /etc/shadow` printed the file's first line in its error."""
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$y$j9T$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    result = run_cli(*args, str(shadow))
    assert_one_line_error(result, 2, "(a key that is not a name)")
    assert "SECRETHASH" not in result.stderr + result.stdout and "root:" not in result.stderr
