"""Which congestion controls ccscope can provide as BPF programs, and how they are named.

Every algorithm in BPF_ALGORITHMS has one object, ccscope/bpf/cc/NAME.bpf.o, with two struct_ops maps
over the same programs: NAME (registered under the kernel's usual name where the kernel lacks the
algorithm, so sockets, `ss` and iperf3 see plain "vegas") and bpf_NAME (registered when the user forces
the BPF implementation with `bpf:NAME`, also next to a native NAME, so both can run in one comparison).
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from importlib import resources
from pathlib import Path

BPF_ALGORITHMS = ("reno", "vegas", "westwood", "copa", "prague")
# Scalable congestion controls whose data must carry L4S's identifier, ECT(1) (RFC 9331 4.1). The kernel lets a
# congestion control ask only for ECT(0) (TCP_CONG_NEEDS_ECN), so an emulated path rewrites it on the sender's
# egress (Testbed.send_ect1).
ECT1_SENDERS = ("prague",)
FORCE_PREFIX = "bpf:"   # what the user writes
BPF_PREFIX = "bpf_"     # the kernel name of a forced BPF registration
TCP_CA_NAME_MAX = 15    # characters, without the NUL


def normalize(name: str) -> str:
    """`bpf:vegas` (the spelling users write) -> `bpf_vegas` (the kernel name); others unchanged."""
    if name.startswith(FORCE_PREFIX):
        return BPF_PREFIX + name[len(FORCE_PREFIX):]
    return name


def bpf_source(name: str) -> str | None:
    """The BPF algorithm behind kernel name `name` (bpf_vegas or vegas -> vegas), or None."""
    name = normalize(name)
    base = name[len(BPF_PREFIX):] if name.startswith(BPF_PREFIX) else name
    return base if base in BPF_ALGORITHMS else None


def sends_ect1(name: str) -> bool:
    """Whether algorithm `name` (prague, bpf:prague, bpf_prague) sends L4S's ECT(1)."""
    return bpf_source(name) in ECT1_SENDERS


def is_forced(name: str) -> bool:
    name = normalize(name)
    return name.startswith(BPF_PREFIX) and bpf_source(name) is not None


def all_names() -> list[str]:
    """Every kernel name a BPF registration can have."""
    return [*BPF_ALGORITHMS, *(BPF_PREFIX + a for a in BPF_ALGORITHMS)]


def object_path(algorithm: str) -> Path:
    override = os.environ.get("CCSCOPE_CC_DIR")
    if override:
        return Path(override) / f"{algorithm}.bpf.o"
    return Path(str(resources.files("ccscope") / "bpf" / "cc" / f"{algorithm}.bpf.o"))


@cache
def _sha256(path: Path, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def object_sha256(algorithm: str) -> str:
    path = object_path(algorithm)
    return _sha256(path, path.stat().st_mtime_ns)


def display_name(name: str, implementation: str | None) -> str:
    """How legends and tables show an algorithm: `vegas (BPF)` when ccscope's program ran."""
    source = bpf_source(name)
    if implementation == "bpf" and source:
        return f"{source} (BPF)"
    return name
