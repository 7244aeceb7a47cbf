"""Loads bpf/ccstate.bpf.o beside the telemetry probe and reads each flow's algorithm state from its map.

Optional by design: where the kernel refuses the object, flows simply carry no state; `ccscope check` and the
daemon's start line say why, in one line. Its program is built twice, as the telemetry probe's tcp_probe is:
through bpf_rdonly_cast (Linux >= 6.2, no call) and through the helper bpf_skc_to_tcp_sock.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from pathlib import Path

from ..errors import BpfError, PrerequisiteError
from ..libbpf import Libbpf, RingBuffer
from ..loader import REBUILD, check_map_layouts, kernel_has_function, open_options
from ..ringbuf import MappedRing, open_ring
from .decoders import AlgorithmState, decode
from .record import MAP_LAYOUTS, CcState, CcStateConfig, u32, u64

BUILDS = {"ccstate_probe": "bpf_rdonly_cast", "ccstate_probe_skc": None}  # program -> kernel function it needs


def object_path() -> Path:
    return Path(str(resources.files("ccscope") / "bpf" / "ccstate.bpf.o"))


class StateProbe:
    """The loaded and attached state reader. A context manager: the link detaches on exit."""

    def __init__(self, max_flows: int = 16384, interval_ns: int = 10_000_000, libbpf: Libbpf | None = None) -> None:
        """`libbpf`: the telemetry probe's, where there is one (libbpf logs to one instance per process)."""
        self.max_flows = max_flows
        self.interval_ns = interval_ns
        self.libbpf: Libbpf | None = libbpf
        self._obj: int | None = None
        self._link: int | None = None
        self._fd = -1
        self._changes_fd = -1

    def __enter__(self) -> StateProbe:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        if not object_path().is_file():
            raise PrerequisiteError(f"BPF object missing at {object_path()}", REBUILD)
        self.libbpf = self.libbpf or Libbpf()
        lib = self.libbpf.lib
        opts = open_options()
        self._obj = self.libbpf.check_ptr(lib.bpf_object__open_file(str(object_path()).encode(), ctypes.byref(opts)),
                                          f"cannot open BPF object {object_path()}")
        check_map_layouts(self.libbpf, self._obj, MAP_LAYOUTS, object_path())
        states = lib.bpf_object__find_map_by_name(self._obj, b"ccstates")
        self.libbpf.check_int(lib.bpf_map__set_max_entries(states, self.max_flows), "cannot size map ccstates")
        programs = {name: lib.bpf_object__find_program_by_name(self._obj, name.encode()) for name in BUILDS}
        if not all(programs.values()):
            raise BpfError(f"BPF object {object_path()} lacks the programs {', '.join(BUILDS)}", REBUILD)
        build = next(name for name, needs in BUILDS.items() if needs is None or kernel_has_function(self.libbpf, needs))
        for name, program in programs.items():
            lib.bpf_program__set_autoload(program, name == build)
        self.libbpf.log.clear()
        if lib.bpf_object__load(self._obj) != 0:
            raise self.libbpf.error("kernel rejected the algorithm-state program",
                                    fix="flows carry no algorithm state; `ccscope check` says what this kernel lacks")
        self._fd = lib.bpf_map__fd(states)
        self._changes_fd = lib.bpf_map__fd(lib.bpf_object__find_map_by_name(self._obj, b"ccstate_changes"))
        config = CcStateConfig(interval_ns=self.interval_ns)
        key = u32(0)
        self.libbpf.check_int(lib.bpf_map_update_elem(
            lib.bpf_map__fd(lib.bpf_object__find_map_by_name(self._obj, b"ccstate_config")), ctypes.byref(key),
            ctypes.byref(config), 0), "configure the algorithm-state program")
        link = lib.bpf_program__attach(programs[build])
        if not link:
            raise self.libbpf.error("cannot attach the algorithm-state program to tcp:tcp_probe")
        self._link = link
        self.libbpf.log.clear()

    def states(self, cookies: Iterable[int]) -> dict[int, AlgorithmState]:
        """The decoded state of each of these flows that has one (a flow of an algorithm without a decoder,
        or not seen yet, has none)."""
        lib, found = self.libbpf.lib, {}
        key, value = u64(), CcState()
        for cookie in cookies:
            key.value = cookie
            if lib.bpf_map_lookup_elem(self._fd, ctypes.byref(key), ctypes.byref(value)) == 0:
                state = decode(value)
                if state is not None:
                    found[cookie] = state
        return found

    def changes(self, handler: Callable[[list[bytes]], None]) -> MappedRing | RingBuffer:
        """Every change of a flow's key (changes.py reads the records), once per poll."""
        return open_ring(self.libbpf, self._changes_fd, handler)

    def raw(self, cookie: int) -> CcState | None:
        """The kernel's record as it is (tests compare it with the kernel's own formulas)."""
        key, value = u64(cookie), CcState()
        return value if self.libbpf.lib.bpf_map_lookup_elem(self._fd, ctypes.byref(key), ctypes.byref(value)) == 0 \
            else None

    def close(self) -> None:
        if self.libbpf is None:
            return
        lib = self.libbpf.lib
        if self._link:
            lib.bpf_link__destroy(self._link)
            self._link = None
        if self._obj:
            lib.bpf_object__close(self._obj)
            self._obj = None
        self._fd = self._changes_fd = -1


def open_optional(max_flows: int, interval_ns: int, libbpf: Libbpf | None = None
                  ) -> tuple[StateProbe | None, str | None]:
    """The state probe, or None and the one-line reason it is not there."""
    probe = StateProbe(max_flows, interval_ns, libbpf)
    try:
        probe.open()
    except (BpfError, PrerequisiteError) as error:
        probe.close()
        return None, error.line()
    return probe, None


@contextlib.contextmanager
def optional_state(max_flows: int, interval_ns: int, libbpf: Libbpf | None, where: str = ""
                   ) -> Iterator[StateProbe | None]:
    """The state probe while the block runs, or None after one warning line that says why (`where`: what goes
    without it, as " in the results")."""
    probe, why = open_optional(max_flows, interval_ns, libbpf)
    if why:
        print(f"ccscope: warning: no algorithm state (BBR's mode, CUBIC's W_max){where}: {why}", file=sys.stderr,
              flush=True)
    try:
        yield probe
    finally:
        if probe:
            probe.close()
