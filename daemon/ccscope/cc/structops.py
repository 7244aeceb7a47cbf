"""Registering a BPF congestion control with the kernel through libbpf 1.1 (struct_ops maps).

Mechanism, and why: libbpf 1.1 knows only SEC(".struct_ops") maps, not ".struct_ops.link" (libbpf 1.3,
Linux 6.4). For such a map, bpf_map__attach_struct_ops() updates the map's single element; the kernel then
registers the tcp_congestion_ops and the map holds a reference on itself. The registration therefore
outlives the process and its file descriptors (a bpf_link__destroy() would delete the element; we
disconnect the link instead), and it ends only when someone deletes the element again: we find the map by
its id (bpf_map_get_fd_by_id) and delete key 0. That works on every kernel from 5.13 (struct_ops
congestion controls with kfuncs) on; pinning is not needed, and ccscope records who uses each
registration in its state directory (see registry.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from functools import cache
from pathlib import Path

from ccscope import loader
from ccscope.errors import BpfError, PrerequisiteError
from ccscope.host import algorithms
from ccscope.libbpf import Libbpf

from . import catalog

BPF_MAP_TYPE_STRUCT_OPS = 26
BPF_OBJ_NAME_LEN = 16
_BTF_MARKERS = (b"bpf_struct_ops_tcp_congestion_ops", b"tcp_reno_cong_avoid")


class _MapInfo(ctypes.Structure):
    """The head of struct bpf_map_info; the kernel fills as much as we ask for."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("name", ctypes.c_char * BPF_OBJ_NAME_LEN)]


@cache
def _libbpf() -> Libbpf:
    return Libbpf()


def supported() -> bool:
    """Does the kernel's BTF describe struct_ops congestion controls and the Reno kfuncs (Linux >= 5.13)?"""
    try:
        data = Path(loader.btf_path()).read_bytes()
    except OSError:
        return False
    return all(marker in data for marker in _BTF_MARKERS)


def require_supported(name: str) -> None:
    if not supported():
        raise PrerequisiteError(
            f"{name}: this kernel cannot run BPF congestion controls (no struct_ops tcp_congestion_ops "
            f"in {loader.btf_path()})", "needs Linux >= 5.13 built with BTF; use the kernel's own algorithms")


def register(name: str) -> int:
    """Registers ccscope's BPF program for kernel name `name`; returns the struct_ops map's id."""
    algorithm = catalog.bpf_source(name)
    if algorithm is None:
        raise PrerequisiteError(f"ccscope has no BPF implementation of {name}",
                                f"BPF ones: {', '.join(catalog.BPF_ALGORITHMS)}")
    require_supported(name)
    path = catalog.object_path(algorithm)
    if not path.is_file():
        raise PrerequisiteError(f"BPF object missing at {path}", "build it: make bpf")
    if name in algorithms.available_algorithms():
        raise _exists(name)
    lb = _libbpf()
    lib = lb.lib
    obj = lib.bpf_object__open_file(str(path).encode(), None)
    if not obj:
        raise BpfError(f"cannot open {path}: {os.strerror(ctypes.get_errno())}", lb.last_log() or None)
    try:
        ret = lib.bpf_object__load(obj)
        if ret < 0:
            raise BpfError(f"the kernel refused {path.name}: {os.strerror(-ret)}", lb.last_log() or None)
        map_ptr = lib.bpf_object__find_map_by_name(obj, name.encode())
        if not map_ptr:
            raise BpfError(f"{path.name} has no struct_ops map {name}")
        link = lib.bpf_map__attach_struct_ops(map_ptr)
        if not link:
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                raise _exists(name)
            raise BpfError(f"registering {name} failed: {os.strerror(err)}", lb.last_log() or None)
        lib.bpf_link__disconnect(link)  # keep the registration when the link goes (see the module doc)
        lib.bpf_link__destroy(link)
        return _info(lib.bpf_map__fd(map_ptr)).id
    finally:
        lib.bpf_object__close(obj)


def _exists(name: str) -> PrerequisiteError:
    return PrerequisiteError(f"the kernel already has a congestion control named {name} (EEXIST)",
                             f"use bpf:{catalog.bpf_source(name) or name} to run ccscope's BPF one next to it")


def _info(fd: int) -> _MapInfo:
    info = _MapInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    _libbpf().check_int(_libbpf().lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)),
                        "bpf_obj_get_info_by_fd")
    return info


@contextlib.contextmanager
def _map_fd(map_id: int, name: str):
    """An fd of struct_ops map `map_id` if it still is our registration of `name`, else None."""
    fd = _libbpf().lib.bpf_map_get_fd_by_id(map_id)
    if fd < 0:
        yield None
        return
    try:
        info = _info(fd)
        ours = info.type == BPF_MAP_TYPE_STRUCT_OPS and info.name.decode() == name[:BPF_OBJ_NAME_LEN - 1]
        yield fd if ours else None
    finally:
        os.close(fd)


def is_registered(map_id: int, name: str) -> bool:
    with _map_fd(map_id, name) as fd:
        return fd is not None and name in algorithms.available_algorithms()


def unregister(map_id: int, name: str) -> bool:
    """Unregisters `name` if map `map_id` still holds it; False if it was already gone."""
    with _map_fd(map_id, name) as fd:
        if fd is None:
            return False
        key = ctypes.c_uint32(0)
        ret = _libbpf().lib.bpf_map_delete_elem(fd, ctypes.byref(key))
        if ret < 0 and -ret != errno.ENOENT:
            _libbpf().check_int(ret, f"unregistering {name}")
        return ret == 0
