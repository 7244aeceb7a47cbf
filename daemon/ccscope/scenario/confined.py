"""Reading a results directory as untrusted input: only regular files inside it, size-limited, UTF-8.

A results directory may come from anyone (a colleague's tarball, a CI artifact), and results.json names
further files (per-flow CSVs) by path. Every read goes through read_text(), so a path like
`../../etc/passwd`, an absolute path, a symlink out of the directory, /dev/zero or a FIFO is refused
with one line instead of being followed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ccscope.errors import UsageError
from ccscope.safe_input import read_utf8

MAX_JSON_BYTES = 64 << 20  # results.json / runs.jsonl: a 100-run scenario writes a few MB
MAX_CSV_BYTES = 256 << 20  # one flow at 1 ms sampling for an hour is ~360 MB; at the default 10 ms, ~36 MB


def inside(root: Path, relative: Any, what: str) -> Path:
    """`relative` resolved under `root`; UsageError if it is not a relative path that stays inside."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise UsageError(f"{what}: {relative!r} is not a file name in the results directory")
    if os.path.isabs(relative):
        raise UsageError(f"{what}: {relative!r} is an absolute path; results files must be inside the directory")
    base = root.resolve()
    try:
        target = (base / relative).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise UsageError(f"{what}: {relative!r}: cannot resolve: {exc}") from None
    if not target.is_relative_to(base):
        raise UsageError(f"{what}: {relative!r} points outside the results directory {root}")
    return target


def read_text(root: Path, relative: str, what: str, limit: int) -> str | None:
    """The UTF-8 text of a regular file inside `root`, or None if it does not exist. Errors start with
    `what` (e.g. "results.json: runs[0].flows[0].csv"), then the file if `what` does not name it."""
    path = inside(root, relative, what)
    at = what if what.endswith(relative) else f"{what}: {relative}"
    # no symlinks: the path was resolved inside root, so a symlink here appeared after the check
    return read_utf8(path, limit, at, follow_symlinks=False, missing_ok=True)


def parse_json(text: str, what: str) -> Any:
    """json.loads with every failure (syntax, recursion depth, huge integers) as one UsageError line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise UsageError(f"{what}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer beyond sys.get_int_max_str_digits()
        raise UsageError(f"{what}: not valid JSON: {exc}") from None
