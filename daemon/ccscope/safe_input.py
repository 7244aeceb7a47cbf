"""Files a user hands us, read so that they cannot hurt: size limits, UTF-8, YAML with limits.

Every problem is one UsageError line naming the file (and the line where it is known).

YAML: PyYAML's SafeLoader already refuses arbitrary Python objects. It still accepts what hurts a tool that runs
unattended: aliases (a few nested anchors expand to gigabytes, the "billion laughs"), duplicate keys
(the last one silently wins), nesting deep enough for a RecursionError, and files of any size. The
loader here refuses each of them with the line where it happens.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from ccscope.errors import UsageError

MAX_FILE_BYTES = 1 << 20  # YAML: a scenario is a few KB; 1 MiB leaves room for long comments
MAX_DEPTH = 32  # nesting of mappings and lists (scenarios need about 6)


class _Refused(yaml.MarkedYAMLError):
    """A document this loader refuses (alias, duplicate key, depth), with the mark of the node."""


class LimitedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, duplicate keys and nesting beyond MAX_DEPTH."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(problem=f"alias *{event.anchor} (anchors and aliases are not accepted: write the "
                                   "value out)", problem_mark=event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(problem=f"nested deeper than {MAX_DEPTH} levels",
                               problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # unhashable: the base class reports it with its mark
            if duplicate:
                raise _Refused(problem=f"duplicate key {key!r} (each key may appear once in a mapping)",
                               problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_text(path: Path, what: str, limit: int = MAX_FILE_BYTES, where: str | None = None) -> str:
    """A regular file as UTF-8 text, refused when it is larger than `limit` bytes or not UTF-8; errors begin
    with `where` (default: the path), e.g. the flag that named the file."""
    text = read_utf8(path, limit, where or str(path), what=what)
    assert text is not None  # missing_ok is off: a missing file is an error above
    return text


def read_utf8(path: Path, limit: int, where: str, *, what: str | None = None, follow_symlinks: bool = True,
              missing_ok: bool = False) -> str | None:
    """The one reader of files we are handed: a regular file (never a FIFO or device, even one swapped in
    after a check: the checks are on the open descriptor), at most `limit` bytes, UTF-8. None for a missing
    file when `missing_ok`. Every refusal is one UsageError line that begins with `where`."""
    purpose = f" {what}" if what else ""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO must not wait for a writer
    except FileNotFoundError as exc:
        if missing_ok:
            return None
        raise UsageError(f"{where}: cannot read{purpose}: {exc.strerror}") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot read{purpose}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # /dev/zero, a FIFO, a directory (which os.fdopen refuses)
        os.close(fd)
        raise UsageError(f"{where}: not a regular file" + (f" (expected {what})" if what else ""))
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)  # the file may grow while it is read
        except OSError as exc:
            raise UsageError(f"{where}: cannot read{purpose}: {exc.strerror}") from None
    if len(data) > limit:
        raise UsageError(f"{where}: larger than {_size(limit)}" + (f", too large for {what}" if what else ""))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"{where}: line {line}: byte 0x{data[exc.start]:02x} is not UTF-8"
                         + (f" ({what} must be UTF-8 text)" if what else "")) from None


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def shown_key(key: object) -> str:
    """A mapping key for an error line: a name as it is; anything else (the first line of /etc/shadow, read as
    root, parses as one key) is never quoted back."""
    return str(key) if isinstance(key, str) and _NAME.fullmatch(key) else "(a key that is not a name)"


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def load_yaml(text: str, where: str) -> Any:
    """Parses one YAML document; every problem is a UsageError naming `where` and the line."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise UsageError(f"{where}: larger than {_size(MAX_FILE_BYTES)}, too large for a YAML document")
    loader = None
    try:
        loader = LimitedLoader(text)  # the reader already refuses control characters here
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise UsageError(f"{where}: {line}not valid YAML: {problem}") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of more than 4300 digits, 2024-13-45
        raise UsageError(f"{where}: not valid YAML: {str(exc).split(';')[0]}") from None
    except RecursionError:  # a backstop: MAX_DEPTH stops nesting long before this
        raise UsageError(f"{where}: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
