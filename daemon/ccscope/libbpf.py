"""A small ctypes binding over libbpf.so.1: just the calls ccscope needs.

libbpf ≥ 1.0 returns NULL (pointers) or -errno (ints) and sets errno. Every
failure becomes one BpfError through Libbpf.error(): what failed, and why in
libbpf's own words (the verifier's verdict for a rejected program) or errno's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import weakref
from collections.abc import Callable

from .errors import BpfError, CcscopeError, PrerequisiteError

LIBBPF_NAMES = ("libbpf.so.1", "libbpf.so")

# enum libbpf_print_level: WARN, INFO, DEBUG
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
RingBufferCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


def _signatures(lib: ctypes.CDLL) -> None:
    p, i, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
    table: dict[str, tuple[list, object]] = {
        "libbpf_set_print": ([_PRINT_FN], p),
        "bpf_object__open_file": ([ctypes.c_char_p, p], p),
        "bpf_object__load": ([p], i),
        "bpf_object__close": ([p], None),
        "bpf_object__find_map_by_name": ([p, ctypes.c_char_p], p),
        "bpf_object__next_map": ([p, p], p),
        "bpf_map__name": ([p], ctypes.c_char_p),
        "bpf_object__find_program_by_name": ([p, ctypes.c_char_p], p),
        "bpf_object__next_program": ([p, p], p),
        "bpf_program__name": ([p], ctypes.c_char_p),
        "bpf_program__attach": ([p], p),
        "bpf_link__destroy": ([p], i),
        "bpf_link__disconnect": ([p], None),
        "bpf_map__attach_struct_ops": ([p], p),
        "bpf_map_get_fd_by_id": ([u32], i),
        "bpf_enable_stats": ([i], i),
        "bpf_obj_get_info_by_fd": ([i, p, ctypes.POINTER(u32)], i),
        "bpf_link__fd": ([p], i),
        "bpf_iter_create": ([i], i),
        "bpf_program__set_autoload": ([p, ctypes.c_bool], i),
        "bpf_map__set_max_entries": ([p, u32], i),
        "bpf_map__key_size": ([p], u32),
        "bpf_map__value_size": ([p], u32),
        "bpf_map__fd": ([p], i),
        "bpf_map_lookup_elem": ([i, p, p], i),
        "bpf_map_update_elem": ([i, p, p, ctypes.c_uint64], i),
        "bpf_map_delete_elem": ([i, p], i),
        "bpf_map_get_next_key": ([i, p, p], i),
        "bpf_map_lookup_batch": ([i, p, p, p, p, ctypes.POINTER(u32), p], i),
        "libbpf_num_possible_cpus": ([], i),
        "btf__load_vmlinux_btf": ([], p),
        "btf__find_by_name_kind": ([p, ctypes.c_char_p, u32], ctypes.c_int32),
        "btf__free": ([p], None),
        "ring_buffer__new": ([i, RingBufferCallback, p, p], p),
        "ring_buffer__poll": ([p, i], i),
        "ring_buffer__consume": ([p], i),
        "ring_buffer__free": ([p], None),
    }
    for name, (argtypes, restype) in table.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def _route_print(level: int, fmt: bytes, va_list: int) -> int:
    target = _logging_to() if _logging_to else None
    return target._on_print(level, fmt, va_list) if target else 0


_logging_to: weakref.ref | None = None
_PRINT_THUNK = _PRINT_FN(_route_print)


class Libbpf:
    """Loaded libbpf with its log captured (libbpf prints to stderr by default)."""

    def __init__(self) -> None:
        global _logging_to
        self.lib = self._open()
        _signatures(self.lib)
        self.log: list[str] = []
        # libbpf has one print callback per process: the newest instance takes the log. The callback itself is
        # module-level, so no instance's end can leave libbpf calling a freed ctypes thunk.
        _logging_to = weakref.ref(self)
        self.lib.libbpf_set_print(_PRINT_THUNK)

    @staticmethod
    def _open() -> ctypes.CDLL:
        candidates = list(LIBBPF_NAMES)
        found = ctypes.util.find_library("bpf")
        if found:
            candidates.append(found)
        for name in candidates:
            try:
                return ctypes.CDLL(name, use_errno=True)
            except OSError:
                continue
        raise PrerequisiteError(
            "libbpf is not installed (libbpf.so.1 not found)",
            "install it: apt-get install libbpf1",
        )

    def _on_print(self, level: int, fmt: bytes, va_list: int) -> int:
        # libbpf hands the verifier log over as one message of many lines
        buf = ctypes.create_string_buffer(1 << 16)
        _libc.vsnprintf(buf, len(buf), fmt, va_list)
        lines = [line.rstrip() for line in buf.value.decode(errors="replace").splitlines()]
        self.log.extend(line for line in lines if line)
        del self.log[:-500]
        return 0

    def last_log(self) -> str:
        """The most telling line: the verifier's verdict if a program was rejected, else libbpf's last."""
        verdict = self._verifier_verdict()
        if verdict:
            return verdict
        return self.log[-1] if self.log else ""

    def _verifier_verdict(self) -> str:
        """In a program load log, the line before the `processed N insns` summary says why."""
        for index in range(len(self.log) - 1, 0, -1):
            if self.log[index].startswith("processed ") and " insns " in self.log[index]:
                program = next((line.split("'")[1] for line in reversed(self.log[:index])
                                if "BEGIN PROG LOAD LOG" in line and "'" in line), "")
                reason = self.log[index - 1].strip()
                return f"program {program}: {reason}" if program else reason
        return ""

    def error(self, what: str, ret: int | None = None, fix: str | None = None,
              kind: type[CcscopeError] = BpfError) -> CcscopeError:
        """The one report of a failed call: `what: why`, why being what libbpf logged since the last report
        (it logs on open, load and attach), else errno (map operations log nothing)."""
        err = -ret if ret is not None and ret < -1 else (ctypes.get_errno() or errno.EINVAL)
        said = self.last_log()
        self.log.clear()
        reason = said.removeprefix("libbpf: ").rstrip(".") if said else os.strerror(err)
        return kind(f"{what}: {reason}", fix)

    def check_ptr(self, ptr: int | None, what: str) -> int:
        if not ptr:
            raise self.error(what)
        return ptr

    def check_int(self, ret: int, what: str) -> int:
        if ret < 0:
            raise self.error(what, ret)
        return ret


class RingBuffer:
    """Consumes a BPF ring buffer, calling `handler(records)` once per poll with the records it drained.

    libbpf calls back per record; the callback only copies the record out, so the per-record Python work
    (decoding, filtering, encoding) runs in one loop over the batch, not in a C-to-Python call each."""

    def __init__(self, libbpf: Libbpf, map_fd: int, handler: Callable[[list[bytes]], None]) -> None:
        self._libbpf = libbpf
        self._handler = handler
        self._records: list[bytes] = []
        self._cb = RingBufferCallback(self._on_record)
        self._rb = libbpf.check_ptr(
            libbpf.lib.ring_buffer__new(map_fd, self._cb, None, None), "ring_buffer__new"
        )

    def _on_record(self, _ctx: int, data: int, size: int) -> int:
        self._records.append(ctypes.string_at(data, size))
        return 0

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms, then drain the buffer. The BPF side does not wake us per sample (only when
        the buffer fills up), so the drain after the wait is what delivers most records."""
        ret = self._libbpf.lib.ring_buffer__poll(self._rb, timeout_ms)
        if ret >= 0:
            consumed = self._libbpf.lib.ring_buffer__consume(self._rb)
            ret = ret + consumed if consumed > 0 else ret
        if self._records:
            records, self._records = self._records, []
            self._handler(records)
        if ret < 0 and ret != -errno.EINTR:
            self._libbpf.check_int(ret, "ring_buffer__poll")
        return max(ret, 0)

    def close(self) -> None:
        if self._rb:
            self._libbpf.lib.ring_buffer__free(self._rb)
            self._rb = None
