"""Crash-safe results: an append-only journal (runs.jsonl) and an atomic results.json, both updated as
each run completes, so an interrupted scenario loses at most the run in progress.

runs.jsonl holds one JSON document per line, each written with a single write() and fsync'd:
  {"kind": "header", "document": <results.json as it was when the scenario started, no runs>}
  {"kind": "run", "run": <one run record>, "emulation_checks": ..., "warnings": ..., "environment": ...}
results.json is rewritten (temporary file, fsync, rename, fsync of the directory) after every run, and
at the end. A SIGKILL between the journal line and the rename leaves the journal one run ahead; load()
merges it back. A SIGKILL in the middle of a journal line leaves a torn last line: the run in progress,
which is ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from ccscope.errors import UsageError

from . import analysis, confined, results
from .document import ResultsDocument

JOURNAL = "runs.jsonl"
RESULTS = "results.json"
_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP wait until the block is done: a write is never cut short by Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Readers see the old file or the new one, never a part of either. The temporary file is created
    afresh (O_EXCL, no symlink followed) and renamed over `path`, which replaces a symlink there rather
    than writing through it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:  # a full disk or Ctrl-C: no temporary file left behind
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, default=str) + "\n"


_IDENTITY = ("label", "position", "profile", "algorithms", "repetition", "netns", "backend", "started_at")


def quarantined(doc: dict, record: dict) -> dict:
    """The record if the document can hold it; otherwise the run as failed, with what it measured left
    out, its errors kept, and a warning on the document that names the first bad value."""
    stored = json.loads(json.dumps(record, default=str))  # as the journal will hold it
    problems = results.check(stored, results.RUN_SCHEMA, "run") or results.non_finite(stored, "run")
    if not problems:
        return record
    reason = f"what the run measured was not kept: {problems[0]}"
    doc["warnings"].append(f"{record.get('label', '?')}: {reason}")
    duration = record.get("duration_s")
    errors = [e for e in record.get("errors", []) if isinstance(e, str)]
    return {**{k: record[k] for k in _IDENTITY if k in record},
            "duration_s": duration if results.check(duration, {"type": "number"}) == [] else 0.0,
            "flows": [], "downloads": [], "ping": None, "link": {}, "jain": None, "per_algorithm": {},
            "errors": [*errors, reason]}


def check_out_dir(out: Path) -> None:
    """The results directory must be new or empty, and creatable: checked before anything is created."""
    try:
        out.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass  # named below, with the part of the path that is in the way
    except OSError as exc:  # a name too long, a loop of symlinks, a file where a directory should be
        raise UsageError(f"--out {out}: {exc.strerror}") from None
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out {out}: exists and is not a directory")
        if any(out.iterdir()):
            raise UsageError(f"--out {out}: directory exists and is not empty")
        base = out
    else:
        base = next(p for p in out.absolute().parents if p.exists())
        if not base.is_dir():
            raise UsageError(f"--out {out}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        why = "read-only" if _read_only(base) else "no permission"
        raise UsageError(f"--out {out}: cannot write in {base} ({why})")


def _read_only(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _drop_torn_line(fd: int, path: Path) -> None:
    """A run killed while its journal line was written left a line without its newline: cut it off, or
    the next line would be appended to it."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        os.ftruncate(fd, data.rfind(b"\n") + 1)
        os.fsync(fd)


class Store:
    """The results directory of one running scenario; holds an exclusive lock on its journal."""

    def __init__(self, out: Path, journal_fd: int) -> None:
        self.out = out
        self._fd = journal_fd

    @classmethod
    def _lock(cls, out: Path) -> int:
        fd = os.open(out / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"{out}: another ccscope scenario is writing to this directory") from None
        return fd

    @classmethod
    def create(cls, out: Path, doc: dict) -> Store:
        store = cls(out, cls._lock(out))
        with signals_held():
            store._append({"kind": "header", "document": doc})
            write_atomic(out / RESULTS, _dumps(doc))
        return store

    @classmethod
    def resume(cls, out: Path, fresh: dict) -> tuple[Store, dict]:
        """Reopens a directory to add the missing runs of `fresh` (this invocation's plan); the document
        as far as its journal got (see resumable)."""
        if not (out / JOURNAL).is_file() and not (out / RESULTS).is_file():
            raise UsageError(f"--resume {out}: not a results directory (no {RESULTS} or {JOURNAL})")
        if not (out / JOURNAL).is_file():
            raise UsageError(f"--resume {out}: no {JOURNAL} (written before ccscope could resume scenarios)")
        fd = cls._lock(out)
        try:
            doc = resumable(out, fresh)
            _drop_torn_line(fd, out / JOURNAL)
        except BaseException:
            os.close(fd)
            raise
        return cls(out, fd), doc

    def _append(self, entry: dict) -> None:
        data = (json.dumps(entry, default=str, separators=(",", ":")) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"short write to {JOURNAL} ({written} of {len(data)} bytes)")
        os.fsync(self._fd)

    def add_run(self, doc: dict, record: dict) -> None:
        """Saves a completed run that `doc` already holds and derives from (analysis.derive): journal line
        first, then results.json. The caller holds the signals (signals_held) from adding the run to here."""
        self._append({"kind": "run", "run": record, "emulation_checks": doc["emulation_checks"],
                      "warnings": doc["warnings"], "environment": doc["environment"]})
        write_atomic(self.out / RESULTS, _dumps(doc))

    def write(self, doc: dict) -> None:
        with signals_held():
            results.validate(doc)
            write_atomic(self.out / RESULTS, _dumps(doc))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _journal(directory: Path) -> tuple[dict | None, list[dict]]:
    """The header document and every completed run's journal entry; a torn last line is dropped."""
    where = str(directory / JOURNAL)
    text = confined.read_text(directory, JOURNAL, where, confined.MAX_JSON_BYTES)
    if text is None:
        return None, []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # no newline yet: the write of the run in progress was cut short
    header, entries = None, []
    for number, line in enumerate(lines, 1):
        entry = confined.parse_json(line, f"{where}: line {number}")
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if kind == "header" and header is None and isinstance(entry.get("document"), dict):
            header = entry["document"]
        elif kind == "run" and isinstance(entry.get("run"), dict):
            problems = results.check(entry["run"], results.RUN_SCHEMA, "run")
            if problems:
                raise UsageError(f"{where}: line {number}: {problems[0]}")
            entries.append(entry)
        else:
            raise UsageError(f"{where}: line {number}: not a journal entry")
    return header, entries


def load(directory: Path) -> ResultsDocument:
    """The results of a directory: results.json, plus any completed run only the journal has (a kill
    between the two writes), or rebuilt from the journal alone if results.json was never written."""
    header, entries = _journal(directory)
    if (directory / RESULTS).exists() or (directory / RESULTS).is_symlink() or header is None:
        doc = results.load(directory)
    else:
        doc = results.parse(json.dumps(header), str(directory / JOURNAL))
    _refuse_repeats(doc["runs"], directory / RESULTS)
    _refuse_repeats([e["run"] for e in entries], directory / JOURNAL)
    known = {r["position"] for r in doc["runs"]}
    extra = [e for e in entries if e["run"]["position"] not in known]
    if not extra:
        return doc
    for entry in extra:
        doc["runs"].append(entry["run"])
        known.add(entry["run"]["position"])
    last = entries[-1]
    for key in ("emulation_checks", "warnings", "environment"):
        if key in last:
            doc[key] = last[key]
    try:
        analysis.derive(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"{directory / JOURNAL}: cannot merge the runs: {exc!r}") from None
    return results.parse(json.dumps(doc, default=str), str(directory / JOURNAL))


def _refuse_repeats(runs: list[dict], where: Path) -> None:
    """A run twice (a copied record) would count twice in every mean: the directory is refused."""
    seen: set[str] = set()
    positions: set[int] = set()
    for run in runs:
        if run["label"] in seen or run["position"] in positions:
            raise UsageError(f"{where}: run {_quoted(run['label'])} (position {run['position']}) is there twice")
        seen.add(run["label"])
        positions.add(run["position"])


def resumable(directory: Path, fresh: dict) -> dict:
    """The state of a directory to resume, derived from its journal and the plan, never from what
    results.json claims: the journal is written first and only ever appended to, results.json is a copy
    (and a hand-edited one must not decide which runs run). Whatever does not match is one UsageError."""
    where = f"--resume {directory}"
    header, entries = _journal(directory)
    if header is None:
        raise UsageError(f"{where}: {JOURNAL} has no header line")
    header = results.parse(json.dumps(header), f"{directory / JOURNAL}: header")
    if differs := results.identity_mismatch(header, fresh):
        raise UsageError(f"{where}: the scenario differs from the one that wrote it: {differs}")
    order = fresh["run_order"]
    journal: dict[str, dict] = {}
    for entry in entries:
        run = entry["run"]
        label = run["label"]
        if label not in results.planned(fresh):
            raise UsageError(f"{where}: {JOURNAL} holds run {_quoted(label)}, which the plan does not have")
        if run["position"] != order.index(label) + 1:
            raise UsageError(f"{where}: {JOURNAL} holds run {label} at position {run['position']}, "
                             f"planned at {order.index(label) + 1}")
        if label in journal:
            raise UsageError(f"{where}: {JOURNAL} holds run {label} twice")
        journal[label] = run
    doc = load(directory)
    if differs := results.identity_mismatch(doc, fresh):
        raise UsageError(f"{where}: the scenario differs from the one that wrote it: {differs}")
    claimed = [label for label in results.planned(doc) if label not in doc["missing_runs"]]
    for label in [*claimed, *(r["label"] for r in doc["runs"])]:
        if label not in journal:
            raise UsageError(f"{where}: {RESULTS} has run {_quoted(label)} done, {JOURNAL} does not "
                             f"({len(journal)} of {len(results.planned(fresh))} runs there)")
    for run in doc["runs"]:
        if run != journal[run["label"]]:
            raise UsageError(f"{where}: {RESULTS} differs from {JOURNAL} in run {run['label']}")
    doc["runs"] = [journal[label] for label in order if label in journal]
    analysis.derive(doc)
    if not doc["complete"]:
        doc["finished_at"] = None
    return doc


def _quoted(label: str) -> str:
    text = repr(label)
    return text if len(text) <= 60 else text[:57] + "..."


def _being_written(directory: Path) -> bool:
    """A scenario holds the journal's lock while it runs (and keeps results.json current itself)."""
    try:
        fd = os.open(directory / JOURNAL, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def rebuilt(directory: Path, doc: dict) -> bool:
    """Writes `doc` as results.json if it holds runs the file lacks (and no scenario is writing the
    directory); True if it did."""
    if _being_written(directory):
        return False
    try:
        on_disk = results.load(directory)
    except UsageError:
        on_disk = None
    if on_disk is not None and len(on_disk["runs"]) == len(doc["runs"]):
        return False
    with signals_held():
        write_atomic(directory / RESULTS, _dumps(doc))
    return True
