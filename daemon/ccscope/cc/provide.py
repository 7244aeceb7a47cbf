"""Which implementation of an algorithm runs, and keeping ccscope's BPF ones registered while used."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from ccscope.errors import PrerequisiteError
from ccscope.host import algorithms

from . import catalog, registry, structops


@dataclass(frozen=True)
class Implementation:
    name: str                  # the kernel name sockets use: vegas, bpf_vegas, cubic
    implementation: str        # "kernel" or "bpf"
    display: str               # "vegas (BPF)"
    sha256: str | None = None  # of the BPF object
    object: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def kernel_algorithms() -> set[str]:
    """Algorithms the kernel has on its own (built in, or as loadable modules), without ccscope's."""
    return algorithms.available_algorithms() - set(registry.registrations())


def shown_names() -> dict[str, str]:
    """How legends and tables name the algorithms ccscope runs as BPF programs on this host now (kernel name ->
    `vegas (BPF)`, display_name()); for observers of every flow (the daemon's live page) that have no
    scenario's Implementations to go by."""
    return {name: catalog.display_name(name, "bpf") for name in registry.current()}


def providable() -> set[str]:
    """Every name a scenario may ask for here: the kernel's, plus ccscope's BPF ones where struct_ops works."""
    names = kernel_algorithms()
    if structops.supported():
        names |= set(catalog.all_names())
    return names


def check_forced(names: list[str]) -> None:
    """One clear line for bpf:NAME where the kernel cannot run BPF congestion controls at all."""
    for name in names:
        if catalog.is_forced(name):
            structops.require_supported(catalog.FORCE_PREFIX + (catalog.bpf_source(name) or name))


def resolve(name: str, kernel: set[str] | None = None) -> Implementation:
    """The kernel's module where it exists; else ccscope's BPF program (bpf:NAME always the BPF one)."""
    name = catalog.normalize(name)
    kernel = kernel_algorithms() if kernel is None else kernel
    source = catalog.bpf_source(name)
    if name in kernel and not catalog.is_forced(name):
        return Implementation(name, "kernel", name)
    if source is None:
        shown = " ".join(sorted(kernel | set(catalog.BPF_ALGORITHMS)))
        raise PrerequisiteError(f"{name} is not available in this kernel and ccscope has no BPF version of it",
                                f"available: {shown}")
    structops.require_supported(name)
    return Implementation(name, "bpf", catalog.display_name(name, "bpf"), catalog.object_sha256(source),
                          str(catalog.object_path(source)))


@contextlib.contextmanager
def provided(names: list[str], what: str) -> Iterator[dict[str, Implementation]]:
    """Resolves every name, loads the kernel's modules among them, and keeps the BPF ones registered until the
    block ends: normally, on an error, on Ctrl-C, SIGTERM or SIGHUP (`ccscope cleanup` handles kill -9)."""
    kernel = kernel_algorithms()
    chosen = {catalog.normalize(n): resolve(n, kernel) for n in names}
    algorithms.load_modules(impl.name for impl in chosen.values() if impl.implementation == "kernel")
    tokens: list[tuple[str, str]] = []
    with _signals_exit():
        try:
            for impl in chosen.values():
                if impl.implementation == "bpf":
                    _, token = registry.acquire(impl.name, what)
                    tokens.append((impl.name, token))
            yield chosen
        finally:
            for name, token in reversed(tokens):
                registry.release(name, token)


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C does, so the `finally` above runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
