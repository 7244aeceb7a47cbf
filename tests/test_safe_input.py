"""Files a user hands us cannot hurt: YAML aliases, duplicate keys, deep nesting, huge files and
fields, non-UTF-8 bytes and special files are refused fast, as one line naming the file and line."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from ccscope import safe_input
from ccscope.emulation.profile import MAX_TEXT_CHARS, PathProfile
from ccscope.errors import UsageError
from ccscope.scenario import spec

HEAD = "algorithms: [cubic]\nduration: 5s\nprofiles: {a: {rate: 1mbit, delay: 5ms}}\n"


def billion_laughs(levels: int = 9) -> str:
    """Nested anchors: 9 levels of 9 aliases each expand to 9**9 (387 million) strings."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    return HEAD + "\n".join(lines) + f"\ndescription: *l{levels - 1}\n"


def refused(tmp_path: Path, text: str | bytes, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError) as info:
        spec.load(path)
    line = info.value.line()
    assert "\n" not in line and len(line) <= 400
    assert line.startswith(f"{name}:") or line.startswith(str(path)), line
    return line


def test_alias_bomb_is_refused_fast_without_memory(tmp_path):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    line = refused(tmp_path, billion_laughs())
    # before: 3.1 GB and 29 s (the error message's repr of the expansion), then a MemoryError traceback
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 50_000  # KiB
    assert "line 5: not valid YAML: alias *l0" in line


def test_any_alias_is_refused_even_a_harmless_one(tmp_path):
    line = refused(tmp_path, HEAD + "x: &x 5s\nwarmup: *x\n")
    assert "line 5: not valid YAML: alias *x" in line
    line = refused(tmp_path, HEAD + "base: &b {rate: 1mbit}\nmore: {<<: *b}\n")
    assert "alias *b" in line


def test_duplicate_keys_are_refused_at_any_level(tmp_path):
    # before: the second duration silently won
    line = refused(tmp_path, HEAD + "duration: 10s\n")
    assert "line 4: not valid YAML: duplicate key 'duration'" in line
    line = refused(tmp_path, HEAD.replace("delay: 5ms", "delay: 5ms, rate: 2mbit"))
    assert "line 3: not valid YAML: duplicate key 'rate'" in line
    # same value written differently is still the same key
    assert "duplicate key 1" in refused(tmp_path, HEAD + "x: {1: a, 0x1: b}\n")


@pytest.mark.parametrize("text", [
    "algorithms: " + "[" * 100_000 + "]" * 100_000 + "\n",  # before: RecursionError traceback
    "algorithms: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n",
    "a:\n" + "".join(" " * (i + 1) + "- \n" for i in range(200)),
], ids=["flow-lists", "flow-maps", "block"])
def test_deep_nesting_is_refused(tmp_path, text):
    assert f"nested deeper than {safe_input.MAX_DEPTH} levels" in refused(tmp_path, text)


def test_ordinary_nesting_still_loads():
    data = safe_input.load_yaml("a:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(20)), "x")
    assert "a" in data


def test_huge_file_and_huge_description_are_refused(tmp_path):
    line = refused(tmp_path, HEAD + "description: " + "x" * (2 << 20) + "\n")
    assert "larger than 1 MiB, too large for a scenario file" in line
    # before: a 50 MB description was accepted and copied twice into results.json
    line = refused(tmp_path, HEAD + "description: " + "x" * (MAX_TEXT_CHARS + 1) + "\n")
    assert f"description: {MAX_TEXT_CHARS + 1} characters, more than the {MAX_TEXT_CHARS}" in line
    ok = tmp_path / "ok.yaml"
    ok.write_text(HEAD + "description: " + "x" * MAX_TEXT_CHARS + "\n")
    assert len(spec.load(ok).description) == MAX_TEXT_CHARS


def test_profile_description_must_be_short_text():
    for value, needle in ((123, "expected text, got int"), ("y" * 5000, "5000 characters")):
        with pytest.raises(UsageError, match=needle):
            PathProfile.from_dict("a", {"rate": "1mbit", "description": value}, "profiles.a")


def test_non_utf8_scenario_names_the_line(tmp_path):
    # before: UnicodeDecodeError traceback
    line = refused(tmp_path, HEAD.encode() + b"description: caf\xe9\n")
    assert "line 4: byte 0xe9 is not UTF-8" in line


def test_yaml_values_python_cannot_build_are_one_line(tmp_path):
    assert "not valid YAML: Exceeds the limit" in refused(tmp_path, HEAD + "runs: " + "9" * 5000 + "\n")
    assert "not valid YAML: month must be in 1..12" in refused(tmp_path, HEAD + "seed: 2024-13-45\n")
    assert "not valid YAML" in refused(tmp_path, HEAD + "x: !!python/object:os.system {}\n")


def trace_profile(path: Path) -> None:
    PathProfile.from_dict("t", {"delay": "5ms", "up": {"trace": str(path)}}, "profiles.t")


def test_trace_file_non_utf8_special_or_huge(tmp_path):
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"1\n2\n\xff\xfe\n")
    with pytest.raises(UsageError, match=r"profiles\.t\.up\.trace: .*bad\.trace: line 3: byte 0xff is not UTF-8"):
        trace_profile(bad)  # before: UnicodeDecodeError traceback
    with pytest.raises(UsageError, match="/dev/zero: not a regular file"):
        trace_profile(Path("/dev/zero"))  # before: read until memory ran out
    huge = tmp_path / "huge.trace"
    with huge.open("wb") as f:
        f.truncate((64 << 20) + 1)
    with pytest.raises(UsageError, match="larger than 64 MiB"):
        trace_profile(huge)


def test_error_lines_quoting_huge_values_stay_short():
    with pytest.raises(UsageError) as info:
        spec.from_dict({"algorithms": "x" * 100_000, "duration": "5s"}, "x.yaml")
    line = info.value.line()
    assert len(line) <= 400 and line.startswith("x.yaml: algorithms: expected a non-empty list")
    assert "\n" not in UsageError("a\nb\r\nc").line()


def test_found_by_the_fuzzer(tmp_path):
    # a NUL byte: PyYAML's reader refused it before the loader's error handling (ReaderError traceback)
    assert "not valid YAML: unacceptable character #x0000" in refused(tmp_path, HEAD + "x: a\x00b\n")
    # quick.profiles naming profiles of a `profiles` that is no mapping (TypeError traceback)
    text = HEAD.replace("profiles: {a: {rate: 1mbit, delay: 5ms}}", "profiles: 1") + "quick: {profiles: [a]}\n"
    path = tmp_path / "q.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="profiles: expected a mapping"):
        spec.load(path, quick=True)
