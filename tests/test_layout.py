"""The ctypes mirrors (bpf_types.SHARED_STRUCTS) match the compiled object's BTF: sizes, member names, offsets."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest
from ccscope import bpf_types as bt
from ccscope.ccstate import probe as state_probe
from ccscope.ccstate import record
from ccscope.errors import BpfError
from ccscope.libbpf import Libbpf
from ccscope.loader import TelemetryProbe, object_path
from ccscope_testkit.prereqs import ROOT, require_bpf_object, require_root, require_tools

_TYPE = re.compile(r"^\[(\d+)\] (\w+) '([^']*)'(.*)$")
_MEMBER = re.compile(r"^\s+'([^']*)' type_id=(\d+) bits_offset=(\d+)(?: bitfield_size=(\d+))?$")


def _btf_types(path: Path | None = None) -> dict[int, dict]:
    """`bpftool btf dump format raw` -> {type id: {kind, name, attrs, members}}."""
    require_tools("bpftool")
    require_bpf_object()
    out = subprocess.run(["bpftool", "btf", "dump", "file", str(path or object_path()), "format", "raw"],
                         capture_output=True, text=True, check=True).stdout
    types: dict[int, dict] = {}
    current = None
    for line in out.splitlines():
        if match := _TYPE.match(line):
            attrs = dict(re.findall(r"(\w+)=(\S+)", match.group(4)))
            current = {"kind": match.group(2), "name": match.group(3), "attrs": attrs, "members": []}
            types[int(match.group(1))] = current
        elif (match := _MEMBER.match(line)) and current is not None:
            name, type_id, bits, bitfield = match.groups()
            current["members"].append((name, int(type_id), int(bits), bitfield))
    return types


def _size(types: dict[int, dict], type_id: int) -> int:
    entry = types[type_id]
    kind = entry["kind"]
    if kind in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
        return _size(types, int(entry["attrs"]["type_id"]))
    if kind == "ARRAY":
        return _size(types, int(entry["attrs"]["type_id"])) * int(entry["attrs"]["nr_elems"])
    return int(entry["attrs"]["size"])


@pytest.fixture(scope="module")
def btf_structs() -> dict[str, tuple[dict, dict]]:
    types = _btf_types()
    return {t["name"]: (t, types) for t in types.values() if t["kind"] == "STRUCT"}


@pytest.mark.parametrize("name", sorted(bt.SHARED_STRUCTS))
def test_struct_matches_btf(btf_structs, name: str) -> None:
    mirror = bt.SHARED_STRUCTS[name]
    assert name in btf_structs, f"struct {name} is not in the object's BTF"
    struct, types = btf_structs[name]
    assert ctypes.sizeof(mirror) == int(struct["attrs"]["size"])
    assert not [m for m in struct["members"] if m[3] is not None], "bitfields in a shared struct"
    btf_members = [(m, bits // 8, _size(types, tid)) for m, tid, bits, _ in struct["members"]]
    py_members = [(f[0], getattr(mirror, f[0]).offset, getattr(mirror, f[0]).size) for f in mirror._fields_]
    assert py_members == btf_members


def test_algorithm_state_structs_match_btf() -> None:
    """bpf/ccstate.h against ccstate/record.py; the record's anonymous union is the mirror's `state`."""
    types = _btf_types(state_probe.object_path())
    structs = {t["name"]: t for t in types.values() if t["kind"] == "STRUCT"}
    for name, mirror in record.SHARED_STRUCTS.items():
        struct = structs[name]
        assert ctypes.sizeof(mirror) == int(struct["attrs"]["size"]), name
        btf_members = [("state" if m == "(anon)" else m, bits // 8, _size(types, tid))
                       for m, tid, bits, _ in struct["members"]]
        py_members = [(f[0], getattr(mirror, f[0]).offset, getattr(mirror, f[0]).size) for f in mirror._fields_]
        assert py_members == btf_members, name
    header = (ROOT / "bpf" / "ccstate.h").read_text()
    assert set(re.findall(r"^struct (\w+) \{", header, re.M)) == set(record.SHARED_STRUCTS)
    kinds = {k.removeprefix("CCSTATE_"): int(v) for k, v in re.findall(r"^\s*(CCSTATE_\w+) = (\d+),", header, re.M)}
    assert kinds == {m.name: m.value for m in record.Kind}
    assert f"#define CCSTATE_BYTES {record.STATE_BYTES}" in header


def test_every_struct_of_the_header_is_mirrored() -> None:
    header = (ROOT / "bpf" / "ccscope.h").read_text()
    assert set(re.findall(r"^struct (\w+) \{", header, re.M)) == set(bt.SHARED_STRUCTS)


def test_constants_and_enums_match_header() -> None:
    header = (ROOT / "bpf" / "ccscope.h").read_text()
    defines = dict(re.findall(r"^#define (CCSCOPE_\w+) (\d+)", header, re.M))
    assert int(defines["CCSCOPE_CA_NAME_LEN"]) == bt.CA_NAME_LEN
    assert int(defines["CCSCOPE_HIST_SLOTS"]) == bt.HIST_SLOTS
    assert int(defines["CCSCOPE_COMM_LEN"]) == bt.COMM_LEN
    assert int(defines["CCSCOPE_CGROUP_OTHER"]) == bt.CGROUP_OTHER
    enums = {k: int(v) for k, v in re.findall(r"^\s*(CCSCOPE_\w+) = (\d+),", header, re.M)}
    for prefix, enum in (("CCSCOPE_EV_", bt.Event), ("CCSCOPE_HIST_", bt.HistKind), ("CCSCOPE_CNT_", bt.Counter),
                         ("CCSCOPE_RETRANS_", bt.RetransCause)):
        declared = {k.removeprefix(prefix): v for k, v in enums.items()
                    if k.startswith(prefix) and k not in ("CCSCOPE_CNT_MAX", "CCSCOPE_RETRANS_CAUSES")}
        assert declared == {m.name: m.value for m in enum}, prefix
    assert enums["CCSCOPE_CNT_MAX"] == bt.COUNTER_SLOTS
    assert enums["CCSCOPE_RETRANS_CAUSES"] == bt.RETRANS_CAUSES


def _object_maps() -> dict[str, tuple[int, int]]:
    """Map name -> (key size, value size) as libbpf reads them from the object (open only: no root)."""
    require_bpf_object()
    libbpf = Libbpf()
    lib = libbpf.lib
    obj = libbpf.check_ptr(lib.bpf_object__open_file(str(object_path()).encode(), None), "open")
    try:
        maps, bpf_map = {}, None
        while bpf_map := lib.bpf_object__next_map(obj, bpf_map):
            name = lib.bpf_map__name(bpf_map).decode()
            if "." not in name:  # libbpf's own .rodata/.bss maps
                maps[name] = (lib.bpf_map__key_size(bpf_map), lib.bpf_map__value_size(bpf_map))
        return maps
    finally:
        lib.bpf_object__close(obj)


def test_every_map_has_a_mirror_of_the_same_size() -> None:
    maps = _object_maps()
    assert set(maps) == set(bt.MAP_LAYOUTS) | set(bt.KERNEL_ONLY_MAPS)
    for name, (key_type, value_type) in bt.MAP_LAYOUTS.items():
        assert maps[name] == (ctypes.sizeof(key_type), ctypes.sizeof(value_type)), name


def test_loader_refuses_a_map_whose_mirror_differs(monkeypatch) -> None:
    """A daemon whose Flow mirror drifted from the object's must stop before loading, naming the fix."""
    require_root()
    require_bpf_object()
    monkeypatch.setitem(bt.MAP_LAYOUTS, "flows", (bt.u64, bt.Hist))
    with pytest.raises(BpfError) as info, TelemetryProbe():
        pass
    line = info.value.line()
    assert f"map flows in {object_path()} has 8-byte keys and {ctypes.sizeof(bt.Flow)}-byte values" in line
    assert f"this ccscope reads 8 and {ctypes.sizeof(bt.Hist)}" in line and "make bpf" in line
