"""`ccscope check`: can this host run ccscope, and if not, what is missing and how to fix it."""

from __future__ import annotations

import ctypes
import platform
from dataclasses import dataclass
from pathlib import Path

from . import loader
from .errors import CcscopeError
from .hosttools import PACKAGES, SCENARIO_TOOLS, missing

REQUIRED_TRACEPOINTS = ("tcp_probe", "tcp_retransmit_skb", "inet_sock_set_state")


@dataclass(frozen=True)
class Result:
    name: str
    status: str  # "ok", "warn", "FAIL"
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def check_privileges(caps: int | None = None) -> Result:
    if loader.has_bpf_privileges(caps):
        return Result("privileges", "ok", "can load BPF (CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN)")
    return Result("privileges", "FAIL", "needs root or CAP_BPF+CAP_PERFMON: run with sudo")


def check_kernel(release: str | None = None) -> Result:
    release = release or platform.release()
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return Result("kernel", "warn", f"{release}: cannot tell the version")
    if (major, minor) < (5, 8):
        return Result("kernel", "FAIL", f"{release}: needs Linux >= 5.8 (tp_btf, ring buffer)")
    return Result("kernel", "ok", release)


def check_btf(path: str | None = None) -> Result:
    path = path or loader.btf_path()
    if Path(path).is_file():
        return Result("kernel BTF", "ok", path)
    return Result("kernel BTF", "FAIL",
                  f"{path} missing: use a kernel with CONFIG_DEBUG_INFO_BTF=y or set CCSCOPE_BTF to a BTF file")


def check_tracepoints(path: str | None = None) -> Result:
    """The kernel's BTF names a `btf_trace_<tp>` typedef for each BTF-enabled tracepoint."""
    path = path or loader.btf_path()
    try:
        data = Path(path).read_bytes()
    except OSError:
        return Result("tracepoints", "FAIL", f"cannot read {path}")
    missing = [tp for tp in REQUIRED_TRACEPOINTS if b"btf_trace_" + tp.encode() + b"\0" not in data]
    if missing:
        return Result("tracepoints", "FAIL", f"missing in this kernel: {', '.join(missing)} (needs Linux >= 5.8)")
    return Result("tracepoints", "ok", ", ".join(REQUIRED_TRACEPOINTS))


def check_libbpf() -> Result:
    try:
        lib = loader.Libbpf().lib
    except CcscopeError as exc:
        return Result("libbpf", "FAIL", exc.line())
    version = getattr(lib, "libbpf_version_string", None)
    if version is None:
        return Result("libbpf", "ok", "loaded")
    version.restype = ctypes.c_char_p
    return Result("libbpf", "ok", version().decode())


def check_object() -> Result:
    path = loader.object_path()
    if path.is_file():
        return Result("BPF object", "ok", str(path))
    return Result("BPF object", "FAIL", f"{path} missing: build it with `make bpf` (needs clang, libbpf-dev)")


def check_attach() -> Result:
    try:
        with loader.TelemetryProbe() as probe:
            build = probe.programs["tcp_probe"]
    except CcscopeError as exc:
        return Result("load and attach", "FAIL", exc.line())
    how = "bpf_rdonly_cast" if build == "tcp_probe" else "the helper bpf_skc_to_tcp_sock (Linux < 6.2)"
    return Result("load and attach", "ok", f"3 programs attached and detached; tcp_probe casts the socket with {how}")


# algorithm, its struct, its module
STATE_TYPES = (("bbr", "bbr", "tcp_bbr"), ("cubic", "bictcp", "tcp_cubic"), ("dctcp", "dctcp", "tcp_dctcp"))
BTF_KIND_STRUCT = 4


def _state_type_where(libbpf: loader.Libbpf, struct: str, module: str) -> str | None:
    """Where CO-RE finds an algorithm's type: vmlinux BTF, its module's BTF while loaded, or nowhere (None)."""
    lib = libbpf.lib
    btf = lib.btf__load_vmlinux_btf()
    if btf:
        try:
            if lib.btf__find_by_name_kind(btf, struct.encode(), BTF_KIND_STRUCT) > 0:
                return "vmlinux"
        finally:
            lib.btf__free(btf)
    return f"module {module}" if Path("/sys/kernel/btf", module).exists() else None


def check_algorithm_state() -> Result:
    """Whether flows will carry their algorithm's own state (ccstate), and for which of the algorithms this kernel
    has, loaded or as a module (one it lacks has no flows to show)."""
    from .ccstate.probe import open_optional
    from .host.algorithms import available_algorithms

    state_probe, why = open_optional(64, 10_000_000)
    if state_probe is None:
        return Result("algorithm state", "warn", f"flows carry no algorithm state: {why}")
    available = available_algorithms()
    here = [(name, struct, module) for name, struct, module in STATE_TYPES if name in available]
    try:
        where = {name: _state_type_where(state_probe.libbpf, struct, module) for name, struct, module in here}
    finally:
        state_probe.close()
    found = [f"{name} ({place})" for name, place in where.items() if place] + [OURS]
    lacking = [f"{name} (its type is in no BTF: load its module, e.g. modprobe {module})"
               for name, _, module in here if not where[name]]
    if lacking:
        return Result("algorithm state", "warn", f"{', '.join(found) or 'none'}; no state for {', '.join(lacking)}")
    return Result("algorithm state", "ok", ", ".join(found))


OURS = "ccscope's BPF vegas, westwood, copa, prague (by their tag)"  # their types are ccscope's own: always readable


def check_algorithms() -> Result:
    base = Path("/proc/sys/net/ipv4")
    try:
        available = (base / "tcp_available_congestion_control").read_text().split()
        current = (base / "tcp_congestion_control").read_text().strip()
    except OSError:
        return Result("congestion control", "warn", "cannot read net.ipv4 sysctls")
    return Result("congestion control", "ok", f"available: {' '.join(available)}; default {current}")


def check_tools() -> Result:
    packages = sorted({PACKAGES[tool] for tool in missing(*SCENARIO_TOOLS)})
    if packages:
        return Result("scenario tools", "warn", f"missing for scenarios: apt-get install {' '.join(packages)}")
    return Result("scenario tools", "ok", ", ".join(SCENARIO_TOOLS))


def check_emulation() -> Result:
    """Which link-emulation backend scenarios will get (tried in a scratch namespace)."""
    from .emulation.backends import probe_backends

    try:
        caps = probe_backends()
    except CcscopeError as exc:
        return Result("link emulation", "warn", f"cannot probe: {exc.line()}")
    qdiscs = " ".join(sorted(caps.qdiscs)) or "none"
    if caps.netem:
        return Result("link emulation", "ok", f"netem backend (qdiscs: {qdiscs})")
    if caps.userspace:
        return Result("link emulation", "ok", f"userspace backend: no sch_netem, tbf + NFQUEUE delay line "
                                              f"(qdiscs: {qdiscs})")
    why = caps.nfqueue_error or ("delay line not built: make all" if caps.delayline is None else "no tbf")
    return Result("link emulation", "warn", f"scenarios cannot run: no netem and no fallback ({why})")


def run_checks() -> list[Result]:
    results = [check_privileges(), check_kernel(), check_btf(), check_tracepoints(), check_libbpf(),
               check_object()]
    if not any(r.failed for r in results):
        results += [check_attach(), check_algorithm_state()]
    results += [check_algorithms(), check_tools(), check_emulation()]
    return results


def format_table(results: list[Result]) -> str:
    width = max(len(r.name) for r in results)
    return "\n".join(f"{r.name:<{width}}  {r.status:<4}  {r.detail}" for r in results)
