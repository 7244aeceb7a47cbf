"""Opens, loads and attaches bpf/ccscope.bpf.o through libbpf, and reads its maps."""

from __future__ import annotations

import array
import ctypes
import errno
import itertools
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from . import bpf_types as bt
from .errors import BpfError, PrerequisiteError
from .flowscan import RECORD_BYTES, FlowColumns
from .libbpf import Libbpf, RingBuffer
from .ringbuf import MappedRing, open_ring

PROGRAMS = ("tcp_probe", "tcp_retransmit_skb", "inet_sock_set_state")
# tcp_probe is built twice from the same code (bpf/ccscope.bpf.c): `tcp_probe` reads the socket through the kfunc
# bpf_rdonly_cast (Linux >= 6.2, no call at run time), `tcp_probe_skc` through the helper bpf_skc_to_tcp_sock. One
# of them is loaded: the first this kernel takes.
PROBE_BUILDS = {"tcp_probe": "bpf_rdonly_cast", "tcp_probe_skc": None}  # program -> kernel function it needs
BTF_KIND_FUNC = 12
SEED_PROGRAM = "seed_owners"  # iter/task_file, run once after attaching; needs bpf_sock_from_file (5.11)
TRACEPOINTS = {
    "tcp_probe": "tcp:tcp_probe",
    "tcp_retransmit_skb": "tcp:tcp_retransmit_skb",
    "inet_sock_set_state": "sock:inet_sock_set_state",
}
DEFAULT_BTF = "/sys/kernel/btf/vmlinux"
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
BATCH = 4096  # flows per bpf_map_lookup_batch call: 768 KiB of records
REBUILD = "rebuild the BPF object with this ccscope: make bpf"


def btf_path() -> str:
    """Kernel BTF to use; CCSCOPE_BTF points at another file (e.g. from BTFHub) on kernels without it."""
    return os.environ.get("CCSCOPE_BTF", DEFAULT_BTF)


def object_path() -> Path:
    override = os.environ.get("CCSCOPE_BPF_OBJECT")
    if override:
        return Path(override)
    return Path(str(resources.files("ccscope") / "bpf" / "ccscope.bpf.o"))


def kernel_has_function(libbpf: Libbpf, name: str) -> bool:
    """Whether the running kernel's BTF has function `name`: the BTF libbpf resolves kfuncs against
    (/sys/kernel/btf/vmlinux), whatever CCSCOPE_BTF says for CO-RE."""
    lib = libbpf.lib
    btf = lib.btf__load_vmlinux_btf()
    if not btf:
        return False
    try:
        return lib.btf__find_by_name_kind(btf, name.encode(), BTF_KIND_FUNC) > 0
    finally:
        lib.btf__free(btf)


def probe_builds(libbpf: Libbpf) -> list[str]:
    """The builds of tcp_probe this kernel may take, the cheaper first."""
    return [name for name, needs in PROBE_BUILDS.items() if needs is None or kernel_has_function(libbpf, needs)]


def effective_capabilities() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def has_bpf_privileges(caps: int | None = None) -> bool:
    caps = effective_capabilities() if caps is None else caps

    def has(bit: int) -> bool:
        return bool(caps >> bit & 1)

    return has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON))


AMBIENT_CAPS_COMMAND = ("sudo setpriv --reuid=USER --regid=GROUP --init-groups --inh-caps=+bpf,+perfmon"
                        " --ambient-caps=+bpf,+perfmon")


def preflight() -> None:
    """Fail early, with the fix, on what would otherwise surface as a cryptic libbpf error."""
    if not has_bpf_privileges():
        raise PrerequisiteError(
            "not allowed to load BPF programs (needs root, or CAP_BPF and CAP_PERFMON)",
            # Not setcap: the kernel ignores file capabilities on a script (the ccscope entry point is one),
            # and on the Python interpreter they would give every Python program on the host BPF.
            f"run it as root (sudo), or with the two as ambient capabilities: `{AMBIENT_CAPS_COMMAND} ccscope ...`"
            " or AmbientCapabilities= in a systemd unit; setcap on the ccscope script does nothing",
        )
    if not Path(btf_path()).is_file():
        raise PrerequisiteError(
            f"kernel BTF not found at {btf_path()}",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or point CCSCOPE_BTF at a BTF file for this kernel",
        )
    if not object_path().is_file():
        raise PrerequisiteError(
            f"BPF object missing at {object_path()}",
            "build it: make bpf (needs clang and libbpf-dev)",
        )


class OpenOpts(ctypes.Structure):
    """struct bpf_object_open_opts of libbpf 1.x, up to btf_custom_path."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
        ("attach_prog_fd", ctypes.c_uint32),
        ("kconfig", ctypes.c_char_p),
        ("btf_custom_path", ctypes.c_char_p),
    ]


def open_options() -> OpenOpts:
    """Open options for ccscope's objects: CO-RE against CCSCOPE_BTF where it is set."""
    opts = OpenOpts(sz=ctypes.sizeof(OpenOpts))
    if btf_path() != DEFAULT_BTF:
        opts.btf_custom_path = btf_path().encode()
    return opts


def check_map_layouts(libbpf: Libbpf, obj: int, layouts: dict[str, tuple[type, type]], path: Path) -> None:
    """Refuse an opened object whose maps' key or value sizes differ from their ctypes mirrors."""
    lib = libbpf.lib
    for name, (key_type, value_type) in layouts.items():
        bpf_map = lib.bpf_object__find_map_by_name(obj, name.encode())
        if not bpf_map:
            raise BpfError(f"BPF object {path} has no map {name}", REBUILD)
        found = (lib.bpf_map__key_size(bpf_map), lib.bpf_map__value_size(bpf_map))
        expected = (ctypes.sizeof(key_type), ctypes.sizeof(value_type))
        if found != expected:
            raise BpfError(f"map {name} in {path} has {found[0]}-byte keys and {found[1]}-byte values, "
                           f"this ccscope reads {expected[0]} and {expected[1]}", REBUILD)


@dataclass
class ProbeOptions:
    max_flows: int = 16384
    ringbuf_bytes: int = 4 << 20
    sample_interval_ns: int = 10_000_000
    emit_samples: bool = False
    cgroup_stats: bool = False  # host aggregates by cgroup (cgroup_stats map)
    max_cgroups: int = 128      # cgroups with their own aggregates; the rest share CGROUP_OTHER


class TelemetryProbe:
    """The loaded and attached BPF side. Use as a context manager: links detach on exit."""

    def __init__(self, options: ProbeOptions | None = None) -> None:
        self.options = options or ProbeOptions()
        self.libbpf: Libbpf | None = None
        self._obj: int | None = None
        self._links: list[int] = []
        self._maps: dict[str, int] = {}
        self._ncpus = 1
        self._batch: tuple | None = None  # key and value buffers of read_flow_columns, kept between scrapes
        # One reader of the buffers at a time: the scrape and the live page's table read the map from different
        # threads, and the kernel fills the buffers outside the GIL (two readers got each other's batches).
        self._batch_lock = threading.Lock()
        self.seeded = False  # whether owners of sockets older than the probe were looked up
        self.programs = {name: name for name in PROGRAMS}  # PROGRAMS -> the program in the object that runs it

    def __enter__(self) -> TelemetryProbe:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        preflight()
        self.libbpf = Libbpf()
        lib = self.libbpf.lib
        self._ncpus = max(1, lib.libbpf_num_possible_cpus())
        opts = open_options()
        path = str(object_path()).encode()
        failure = None
        # Kernels before 5.11 lack bpf_sock_from_file: then run without owners of pre-existing sockets.
        for seed, probe in itertools.product((True, False), probe_builds(self.libbpf)):
            if self._load(path, opts, probe, seed):
                break
            failure = failure or self.libbpf.error("kernel rejected the BPF programs",
                                                   fix="run `ccscope check` to see what this kernel lacks")
            lib.bpf_object__close(self._obj)
            self._obj = None
        else:
            raise failure
        for name in ("flows", "samples", "cc_stats", "hists", "counters", "config", "cgroup_stats", "cgroup_slots",
                     "free_slots", "retrans_causes"):
            self._maps[name] = lib.bpf_map__fd(lib.bpf_object__find_map_by_name(self._obj, name.encode()))
        for slot in range(1, self.options.max_cgroups + 1):
            self._free_slot(slot)
        self.set_config(self.options.sample_interval_ns, self.options.emit_samples)
        for name in PROGRAMS:
            self._attach(name)
        if self.seeded:
            self._seed_owners()
        self.libbpf.log.clear()

    def _load(self, path: bytes, opts: OpenOpts, probe: str, seed: bool) -> bool:
        """Open the object and load `probe` (one of PROBE_BUILDS) as tcp_probe, with or without the seed."""
        lib = self.libbpf.lib
        self._obj = self.libbpf.check_ptr(lib.bpf_object__open_file(path, ctypes.byref(opts)),
                                          f"cannot open BPF object {object_path()}")
        self._check_map_layouts()
        if not lib.bpf_object__find_program_by_name(self._obj, probe.encode()):
            raise BpfError(f"BPF object {object_path()} has no program {probe}", REBUILD)
        for name in PROBE_BUILDS:  # the others, where the object has them (an older build has only tcp_probe)
            prog = lib.bpf_object__find_program_by_name(self._obj, name.encode())
            if prog:
                lib.bpf_program__set_autoload(prog, name == probe)
        if not seed:
            lib.bpf_program__set_autoload(lib.bpf_object__find_program_by_name(self._obj, SEED_PROGRAM.encode()),
                                          False)
        self._size_maps()
        self.seeded = seed
        self.programs["tcp_probe"] = probe
        self.libbpf.log.clear()  # what open logged is not why a later call fails
        return lib.bpf_object__load(self._obj) == 0

    def _seed_owners(self) -> None:
        """One pass of the task_file iterator: owners of the sockets that were open before we attached."""
        lib = self.libbpf.lib
        link = lib.bpf_program__attach(lib.bpf_object__find_program_by_name(self._obj, SEED_PROGRAM.encode()))
        if not link:
            self.seeded = False
            return
        try:
            fd = lib.bpf_iter_create(lib.bpf_link__fd(link))
            if fd < 0:
                self.seeded = False
                return
            try:
                while os.read(fd, 1 << 16):
                    pass
            finally:
                os.close(fd)
        finally:
            lib.bpf_link__destroy(link)

    def _check_map_layouts(self) -> None:
        check_map_layouts(self.libbpf, self._obj, bt.MAP_LAYOUTS, object_path())

    def _size_maps(self) -> None:
        lib = self.libbpf.lib
        sizes = {"flows": self.options.max_flows, "owners": self.options.max_flows,
                 "retrans_causes": self.options.max_flows,
                 "samples": _ringbuf_size(self.options.ringbuf_bytes),
                 "cgroup_stats": self.options.max_cgroups + 1, "cgroup_slots": self.options.max_cgroups,
                 "free_slots": self.options.max_cgroups}
        for name, size in sizes.items():
            bpf_map = lib.bpf_object__find_map_by_name(self._obj, name.encode())
            ret = lib.bpf_map__set_max_entries(bpf_map, size) if bpf_map else -errno.ENOENT
            self.libbpf.check_int(ret, f"cannot size map {name} to {size}")

    def _attach(self, name: str) -> None:
        lib = self.libbpf.lib
        prog = lib.bpf_object__find_program_by_name(self._obj, self.programs[name].encode())
        link = lib.bpf_program__attach(prog) if prog else None
        if not link:
            raise self.libbpf.error(f"cannot attach to tracepoint {TRACEPOINTS[name]}",
                                    fix="needs Linux >= 5.8 with BTF; run `ccscope check`", kind=PrerequisiteError)
        self._links.append(link)

    def close(self) -> None:
        if self.libbpf is None:
            return
        lib = self.libbpf.lib
        for link in self._links:
            lib.bpf_link__destroy(link)
        self._links.clear()
        if self._obj:
            lib.bpf_object__close(self._obj)
            self._obj = None
        self._maps.clear()

    # --- configuration -------------------------------------------------------

    def _free_slot(self, slot: int) -> None:
        """A cgroup_stats slot, zeroed, back on the BPF side's free list."""
        lib, key = self.libbpf.lib, ctypes.c_uint32(slot)
        self._check(lib.bpf_map_update_elem(self._maps["cgroup_stats"], ctypes.byref(key),
                                            (bt.CgroupStats * self._ncpus)(), 0), "zero a cgroup_stats slot")
        self._check(lib.bpf_map_update_elem(self._maps["free_slots"], None, ctypes.byref(key), 0),
                    "free a cgroup_stats slot")

    def set_config(self, sample_interval_ns: int, emit_samples: bool) -> None:
        cfg = bt.Config(sample_interval_ns=sample_interval_ns, emit_samples=int(emit_samples),
                        cgroup_stats=int(self.options.cgroup_stats))
        key = ctypes.c_uint32(0)
        self._check(self.libbpf.lib.bpf_map_update_elem(
            self._maps["config"], ctypes.byref(key), ctypes.byref(cfg), 0), "update config")

    # --- map readers -------------------------------------------------------------

    def read_flows(self) -> list[bt.Flow]:
        """All tracked flows as ctypes records (the scrape path reads columns: read_flow_columns)."""
        columns = self.read_flow_columns()
        return [columns.raw(i) for i in range(len(columns))]

    def read_flow_columns(self) -> FlowColumns:
        """All tracked flows in one buffer, read in batches (one syscall per BATCH flows); thread-safe."""
        with self._batch_lock:
            return self._read_flow_columns()

    def _read_flow_columns(self) -> FlowColumns:
        lib, fd = self.libbpf.lib, self._maps["flows"]
        if self._batch is None:
            self._batch = ((ctypes.c_uint64 * BATCH)(), (bt.Flow * BATCH)())
        keys, values = self._batch
        in_batch, out_batch = ctypes.c_uint64(0), ctypes.c_uint64(0)
        data = bytearray()
        first = True
        while True:
            count = ctypes.c_uint32(BATCH)
            ret = lib.bpf_map_lookup_batch(
                fd, None if first else ctypes.byref(in_batch), ctypes.byref(out_batch),
                keys, values, ctypes.byref(count), None)
            err = ctypes.get_errno() if ret < 0 else 0
            data += memoryview(values).cast("B")[: count.value * RECORD_BYTES]
            if ret < 0:
                if err == errno.ENOENT or -ret == errno.ENOENT:
                    return FlowColumns(data, len(data) // RECORD_BYTES)
                self._check(ret, "read flows")
            in_batch.value, first = out_batch.value, False

    def delete_flow(self, cookie: int) -> None:
        key = ctypes.c_uint64(cookie)
        self.libbpf.lib.bpf_map_delete_elem(self._maps["flows"], ctypes.byref(key))
        self.libbpf.lib.bpf_map_delete_elem(self._maps["retrans_causes"], ctypes.byref(key))

    def retransmit_causes(self, cookies: Iterable[int]) -> dict[int, dict[bt.RetransCause, int]]:
        """Each of these flows' retransmitted segments by cause, for the flows that retransmitted."""
        lib, fd, found = self.libbpf.lib, self._maps["retrans_causes"], {}
        key, value = ctypes.c_uint64(), bt.RetransCauses()
        for cookie in cookies:
            key.value = cookie
            if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(value)) == 0:
                found[cookie] = {cause: value.segments[cause] for cause in bt.RetransCause}
        return found

    def cc_stats(self) -> dict[str, bt.CcStats]:
        return {
            _cstr(key.name): value
            for key, value in self._iterate("cc_stats", bt.CcKey, bt.CcStats)
        }

    def hists(self) -> dict[tuple[str, bt.HistKind], bt.Hist]:
        return {
            (_cstr(key.name), bt.HistKind(key.kind)): value
            for key, value in self._iterate("hists", bt.HistKey, bt.Hist)
        }

    def cgroup_stats(self) -> dict[int, bt.CgroupStats]:
        """cgroup id -> its aggregates (summed over CPUs); bt.CGROUP_OTHER holds the cgroups without a slot."""
        slots = {key.value: value.value for key, value in self._iterate("cgroup_slots", ctypes.c_uint64,
                                                                        ctypes.c_uint32)}
        slots[bt.CGROUP_OTHER] = bt.CGROUP_OTHER
        fd, values = self._maps["cgroup_stats"], (bt.CgroupStats * self._ncpus)()
        stats = {}
        for cgroup_id, slot in slots.items():
            key = ctypes.c_uint32(slot)
            self._check(self.libbpf.lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values), "read cgroup_stats")
            stats[cgroup_id] = _sum_cgroup_stats(values)
        return stats

    def delete_cgroup(self, cgroup_id: int) -> None:
        """An expired cgroup's slot goes back, zeroed, to the free list for a new cgroup."""
        key, slot = ctypes.c_uint64(cgroup_id), ctypes.c_uint32()
        lib, fd = self.libbpf.lib, self._maps["cgroup_slots"]
        if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(slot)) != 0:
            return
        lib.bpf_map_delete_elem(fd, ctypes.byref(key))  # first, so no new flow takes the slot meanwhile
        self._free_slot(slot.value)

    def counters(self) -> dict[bt.Counter, int]:
        fd = self._maps["counters"]
        values = (ctypes.c_uint64 * self._ncpus)()
        totals: dict[bt.Counter, int] = {}
        for counter in bt.Counter:
            key = ctypes.c_uint32(counter)
            self._check(self.libbpf.lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values), "read counters")
            totals[counter] = sum(values)
        return totals

    def ring_buffer(self, handler: Callable[[list], None], raw: bool = False) -> MappedRing | RingBuffer:
        """Samples reach `handler` once per poll, as a list of bt.FlowTuple (fields named as in struct flow), or
        with raw=True as the records' bytes (for consumers that skip most samples before unpacking them)."""
        if raw:
            return open_ring(self.libbpf, self._maps["samples"], handler)
        return open_ring(self.libbpf, self._maps["samples"], lambda records: handler(bt.unpack_flows(records)))

    def _iterate(self, name: str, key_type: type, value_type: type) -> list[tuple]:
        lib, fd = self.libbpf.lib, self._maps[name]
        items = []
        key, next_key = key_type(), key_type()
        first = True
        while lib.bpf_map_get_next_key(fd, None if first else ctypes.byref(key), ctypes.byref(next_key)) == 0:
            value = value_type()
            if lib.bpf_map_lookup_elem(fd, ctypes.byref(next_key), ctypes.byref(value)) == 0:
                items.append((key_type.from_buffer_copy(next_key), value))
            ctypes.memmove(ctypes.byref(key), ctypes.byref(next_key), ctypes.sizeof(key_type))
            first = False
        return items

    def _check(self, ret: int, what: str) -> None:
        self.libbpf.check_int(ret, what)


def _sum_cgroup_stats(values: ctypes.Array) -> bt.CgroupStats:
    """Per-CPU copies -> one: the array seen as u64 words, each field summed with one strided slice (fast
    also with hundreds of CPUs)."""
    words = memoryview(values).cast("B").cast("Q")
    width = ctypes.sizeof(bt.CgroupStats) // 8
    return bt.CgroupStats.from_buffer_copy(array.array("Q", (sum(words[i::width]) for i in range(width))))


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace") or "unknown"


def _ringbuf_size(requested: int) -> int:
    """Ring buffers must be a power of two pages; at least 1 MiB."""
    size = max(requested, 1 << 20)  # >= 4x the BPF side's wakeup threshold
    return 1 << (size - 1).bit_length()
