"""`ccscope merge OUT DIR...`: the results directories of a plan's shards (`--shard K/N`, shard.py) as one
results directory, as if one machine had run every run: results.json, the per-flow CSVs, report.html.

Every shard is read and checked before anything is written. Refused, one line each: a directory that is
not a shard or does not read (store.load treats it as untrusted input), shards of different plans (naming
the first difference), two directories holding the same shard, and a run that is not where the plan puts it.
Missing shards, or shards that stopped early, are no error: the merged report is marked incomplete and names
every missing run. Shards from hosts with different kernels, emulation backends or algorithm implementations,
or real paths to different far hosts, are merged too, but the report says so at the top, because their runs
are not directly comparable.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ccscope.errors import UsageError

from . import analysis, confined, results, store
from .document import ResultsDocument
from .environment import now_iso
from .shard import far_ends, plan_hash, without_far_ends
from .store import check_out_dir


@dataclass
class Part:
    directory: Path
    doc: dict

    @property
    def index(self) -> int:
        return self.doc["shard"]["index"]

    @property
    def count(self) -> int:
        return self.doc["shard"]["count"]


def read(directory: Path) -> Part:
    """One shard's results, checked against its own plan; UsageError naming the directory otherwise."""
    if not directory.is_dir():
        raise UsageError(f"{directory}: no such results directory")
    doc = store.load(directory)
    part = doc.get("shard")
    if not part:
        raise UsageError(f"{directory}: not a shard (written without --shard K/N); nothing to merge it with")
    if not 0 <= part["index"] < part["count"]:
        raise UsageError(f"{directory}: shard {part['index']}/{part['count']} does not exist")
    header = {**doc, "shard": None}
    if part["plan_hash"] != plan_hash(header):
        raise UsageError(f"{directory}: results.json does not match its own plan hash (edited, or corrupt)")
    order = doc["run_order"]
    if part["runs"] != [label for position, label in enumerate(order, 1) if (position - 1) % part["count"] ==
                        part["index"]]:
        raise UsageError(f"{directory}: the runs of shard {part['index']}/{part['count']} are not the plan's")
    for run in doc["runs"]:  # store.load checked each against the schema, not against the plan
        label, position = run["label"], run["position"]
        if label not in order or order.index(label) + 1 != position:
            raise UsageError(f"{directory}: run {label!r} at position {position} conflicts with the plan")
        if label not in part["runs"]:
            raise UsageError(f"{directory}: run {label} belongs to shard {(position - 1) % part['count']}/"
                             f"{part['count']}, not to this shard {part['index']}/{part['count']}")
    return Part(directory, doc)


def check_same_plan(parts: list[Part]) -> None:
    """One plan, one split, each shard once; else the first difference, naming the directories."""
    first = parts[0]
    for other in parts[1:]:
        a, b = first.doc, other.doc
        where = f"{first.directory} and {other.directory}"
        if a["tool"]["version"] != b["tool"]["version"]:
            raise UsageError(f"{where} are shards of different plans: ccscope {a['tool']['version']} in "
                             f"{first.directory}, {b['tool']['version']} in {other.directory}")
        if differs := results.identity_mismatch(without_far_ends({**a, "shard": None}),
                                                without_far_ends({**b, "shard": None})):
            raise UsageError(f"{where} are shards of different plans: {_named(differs, first, other)}")
        if first.count != other.count:
            raise UsageError(f"{where} split the plan differently: into {first.count} shards there, "
                             f"{other.count} here (merge shards of one --shard K/N split)")
    seen: dict[int, Path] = {}
    for part in parts:
        if part.index in seen:
            raise UsageError(f"{seen[part.index]} and {part.directory} are both shard {part.index}/{part.count}",
                             "give each shard once")
        seen[part.index] = part.directory


def _named(difference: str, first: Part, other: Part) -> str:
    """identity_mismatch's "X: a there, b now" (written for --resume) as "X: a in DIR1, b in DIR2"."""
    head, found, tail = difference.rpartition(" there, ")
    if not found or not tail.endswith(" now"):
        return difference
    return f"{head} in {first.directory}, {tail.removesuffix(' now')} in {other.directory}"


def merged_document(parts: list[Part]) -> ResultsDocument:
    """The document one machine would have written, plus `merged`: which shard ran where."""
    parts = sorted(parts, key=lambda p: p.index)
    base = parts[0].doc
    doc = {key: value for key, value in base.items() if key != "shard"}
    doc["runs"] = [run for part in parts for run in part.doc["runs"]]  # disjoint: read() and check_same_plan()
    doc["environment"] = dict(base["environment"])
    doc["emulation_checks"] = _checks(parts)
    doc["warnings"] = [f"shard {p.index}/{p.count}: {w}" for p in parts for w in p.doc["warnings"]]
    implementations, uneven = _implementations(parts)
    if implementations:
        doc["implementations"] = implementations
    doc["started_at"] = min(p.doc["started_at"] for p in parts)
    present = {p.index for p in parts}
    missing_shards = [i for i in range(parts[0].count) if i not in present]
    finished = [p.doc["finished_at"] for p in parts]
    done = not missing_shards and all(p.doc["complete"] for p in parts)
    doc["finished_at"] = max(finished) if done and all(finished) else None
    doc["interrupted"] = None
    doc["resumed_at"] = sorted(t for p in parts for t in p.doc["resumed_at"])
    hosts = [_host(p) for p in parts]
    doc["merged"] = {"plan_hash": base["shard"]["plan_hash"], "count": parts[0].count, "shards": hosts,
                     "missing_shards": missing_shards, "mixed": _mixed(hosts) + uneven, "merged_at": now_iso()}
    analysis.derive(doc)
    results.validate(doc)
    return doc


def _host(part: Part) -> dict:
    env = part.doc["environment"]
    return {"index": part.index, "directory": str(part.directory), "hostname": env.get("hostname"),
            "kernel": env.get("kernel"), "machine": env.get("machine"), "cpus": env.get("cpus"),
            "ccscope_version": env.get("ccscope_version"),
            "backends": sorted({r["backend"] for r in part.doc["runs"] if r["backend"]}),
            "far_ends": far_ends(part.doc),
            "runs": len(part.doc["runs"]), "complete": part.doc["complete"]}


def _mixed(hosts: list[dict]) -> list[str]:
    """What differs between the hosts that makes their runs uneven to compare."""
    out = []
    for key, what in (("kernel", "kernels"), ("backends", "emulation backends"), ("machine", "architectures"),
                      ("far_ends", "far ends of the real paths")):
        values = {tuple(h[key]) if isinstance(h[key], list) else h[key] for h in hosts}
        values.discard(())
        if len(values) > 1:
            shown = "; ".join(f"shard {h['index']}: {', '.join(h[key]) if isinstance(h[key], list) else h[key]}"
                              for h in hosts)
            out.append(f"mixed {what} ({shown})")
    return out


def _implementations(parts: list[Part]) -> tuple[dict, list[str]]:
    """Which implementation ran each algorithm; a kernel module on one host and ccscope's BPF on another is
    flagged."""
    found: dict[str, dict] = {}
    uneven = []
    for part in parts:
        for name, impl in (part.doc.get("implementations") or {}).items():
            if name in found and found[name].get("implementation") != impl.get("implementation"):
                uneven.append(f"mixed implementations of {name}: {found[name].get('display')} and "
                              f"{impl.get('display')} (shard {part.index})")
            found.setdefault(name, impl)
    return found, uneven


def _checks(parts: list[Part]) -> dict:
    """Each profile's emulation check; a failed check on any host is the one kept (its warning says where)."""
    checks: dict[str, dict] = {}
    for part in parts:
        for profile, check in part.doc["emulation_checks"].items():
            if profile not in checks or (checks[profile]["ok"] and not check["ok"]):
                checks[profile] = check
    return checks


def _files(part: Part) -> list[str]:
    """The files inside a shard that its runs name (per-flow and ping CSVs), each checked to stay inside."""
    names = []
    for i, run in enumerate(part.doc["runs"]):
        for where, name in results.run_files(run, i):
            confined.inside(part.directory, name, f"{part.directory}/{where}")
            names.append(name)
    return names


def raw_files(part: Part) -> list[Path]:
    """The raw tool output under the shard's raw/<run>/ (paths relative to the shard): regular files only.
    Anything else there (a device, a FIFO, a socket) is refused: copying a device node reads it without end."""
    raw = part.directory / "raw"
    if not raw.is_dir() or raw.is_symlink():
        return []
    found = []
    for run_dir in sorted(raw.iterdir()):
        if not run_dir.is_dir() or run_dir.is_symlink():
            continue
        for path in sorted(run_dir.rglob("*")):
            if path.is_symlink() or path.is_dir():
                continue
            if not path.is_file():
                raise UsageError(f"{path}: not a regular file (a device, FIFO or socket); merge copies only files "
                                 "a scenario writes", "remove it from the shard")
            found.append(path.relative_to(part.directory))
    return found


def _copy(parts: list[Part], out: Path, raw: dict[int, list[Path]]) -> int:
    """The runs' CSVs and raw tool output into `out`: no two runs share a file name (lifecycle.stem)."""
    copied = 0
    for part in parts:
        for name in [*_files(part), *raw[part.index]]:
            source = part.directory / name
            if source.is_file() and not source.is_symlink():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, out / name)
                copied += 1
    return copied


def merge(out: Path, directories: list[Path]) -> dict:
    """Reads and checks every shard, then writes OUT (new or empty): results.json, flows/, raw/. The document."""
    if not directories:
        raise UsageError("ccscope merge OUT DIR...: no shard directories given")
    try:
        check_out_dir(out)
    except UsageError as exc:  # worded for `scenario --out`; here OUT is the first argument
        raise UsageError(exc.problem.replace(f"--out {out}", f"OUT {out}", 1), exc.fix) from None
    parts = [read(d) for d in directories]
    check_same_plan(parts)
    doc = merged_document(parts)
    raw = {part.index: raw_files(part) for part in parts}
    existed = out.exists()
    try:
        (out / "flows").mkdir(parents=True, exist_ok=True)
        _copy(parts, out, raw)
        store.write_atomic(out / store.RESULTS, store._dumps(doc))
    except BaseException as exc:  # nothing half-written is left: OUT was new or empty
        _remove(out, existed)
        if isinstance(exc, OSError):
            raise UsageError(f"{out}: cannot write: {exc.strerror or exc}") from None
        raise
    return doc


def _remove(out: Path, existed: bool) -> None:
    if not existed:
        shutil.rmtree(out, ignore_errors=True)
        return
    for entry in out.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
