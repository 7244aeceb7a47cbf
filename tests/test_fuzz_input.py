"""Property-based fuzzing of what a user can hand ccscope: scenario documents (wrong types and values,
unknown keys, aliases, duplicate keys, deep nesting, non-UTF-8 bytes, truncation) and command lines.

Bad input must end as one line `ccscope: error: ...` with the exit code of its error class (2 for bad
input), never a traceback, and must leave nothing behind. The parsers and the CLI run in-process for
speed, with the point where real work would start (BPF probe, testbed, results directory) replaced by a
sentinel; a few real `ccscope` processes check the same end to end. Bounded and derandomized: the whole
module runs in well under a minute.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import yaml
from ccscope import cli
from ccscope.errors import CcscopeError, UsageError
from ccscope.scenario import runner, spec
from emulation_helpers import left_by
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # only writes the test documents

GOOD = {
    "name": "fuzz",
    "description": "a scenario to mutate",
    "algorithms": ["cubic", ["cubic", "bbr"]],
    "optional_algorithms": ["vegas"],
    "duration": "5s",
    "warmup": "1s",
    "runs": 2,
    "seed": 7,
    "sample_interval": "10ms",
    "profiles": {
        "wired": {"rate": "10mbit", "delay": "5ms", "queue": "1bdp", "description": "clean"},
        "lossy": {"rate": "5mbit", "delay": "20ms", "jitter": "2ms", "loss": "1%", "isolate": {"queue": "20p"},
                  "up": {"rate": "4mbit"}, "down": {"delay": "10ms"}},
    },
    "traffic": {"bulk": {"flows": 2, "stagger": "1s"}, "ping": {"interval": "100ms"},
                "downloads": {"sizes": ["10KB", "1MB"], "every": "2s", "start": "1s", "timeout": "5s"}},
    "quick": {"duration": "3s", "profiles": ["wired"], "traffic": {"bulk": {"flows": 1}}},
}
PATHS = [
    "name", "description", "algorithms", "algorithms.0", "algorithms.1", "algorithms.1.0", "optional_algorithms",
    "duration", "warmup", "runs", "seed", "sample_interval", "profiles", "profiles.wired", "profiles.wired.rate",
    "profiles.wired.delay", "profiles.wired.queue", "profiles.wired.description", "profiles.wired.trace",
    "profiles.lossy.jitter", "profiles.lossy.loss", "profiles.lossy.isolate", "profiles.lossy.isolate.queue",
    "profiles.lossy.isolate.ports", "profiles.lossy.up", "profiles.lossy.up.rate", "profiles.lossy.down",
    "profiles.lossy.down.delay", "traffic", "traffic.bulk", "traffic.bulk.flows", "traffic.bulk.stagger",
    "traffic.ping", "traffic.ping.interval", "traffic.ping.l4s", "traffic.downloads", "traffic.downloads.sizes",
    "traffic.downloads.sizes.0", "traffic.downloads.every", "traffic.downloads.start", "traffic.downloads.timeout",
    "quick", "quick.duration", "quick.profiles", "quick.traffic.bulk.flows", "unknown", "profiles.wired.unknown",
]
UNITS = ["", "s", "ms", "us", "µs", "m", "min", "h", "ns", "kbit", "mbit", "gbit", "%", "p", "packets", "KB", "MiB",
         "bdp", "/s"]
NASTY = ["-5s", "0", "-0", "1e400", "nan", "inf", "-inf", ".inf", "", " ", "100us", "0.1ms", "1e-9s", "99999999h",
         "cubic,,bbr", "/dev/zero", "/proc/version", "/nonexistent.trace", "x" * 5000, "ÿ", "1_000",
         "0x10", "1:30", "2024-13-45", "~", "null", "yes", "[", "{", "*a", "&a", "!!binary ZZZ"]
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), text, st.dates(),
                   st.sampled_from(NASTY),
                   st.builds(lambda n, u: f"{n}{u}", st.floats(allow_nan=True, allow_infinity=True) | st.integers(),
                             st.sampled_from(UNITS)))
junk = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                    max_leaves=6)


def _set(doc: dict, path: str, value: object, delete: bool) -> None:
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        child = node[int(key)] if isinstance(node, list) and key.isdigit() and int(key) < len(node) else \
            node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict | list):
            return
        node = child
    if isinstance(node, list):
        if last.isdigit() and int(last) < len(node):
            node[int(last)] = value
    elif delete:
        node.pop(last, None)
    else:
        node[last] = value


@st.composite
def documents(draw) -> bytes:
    """A mutated scenario as bytes, sometimes with YAML-level damage the loader must refuse."""
    doc = copy.deepcopy(GOOD)
    for _ in range(draw(st.integers(1, 3))):
        _set(doc, draw(st.sampled_from(PATHS)), draw(junk), draw(st.booleans()))
    body = yaml.dump(doc, Dumper=DUMPER, allow_unicode=True).encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none", "none", "duplicate", "alias", "deep", "bytes", "truncate"]))
    if damage == "duplicate":
        body += b"\n" + draw(st.sampled_from(["duration", "runs", "profiles", "name"])).encode() + b": 1\n"
    elif damage == "alias":
        body = b"x: &x " + body.splitlines()[0] + b"\n" + body.replace(b"duration: 5s", b"duration: *x", 1) + \
            b"\nwarmup: *x\n"
    elif damage == "deep":
        depth = draw(st.integers(30, 200))
        body += b"\ndeep: " + b"[" * depth + b"]" * depth + b"\n"
    elif damage == "bytes":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(min_size=1, max_size=4).filter(lambda b: not _utf8(b))) + body[at:]
    elif damage == "truncate":
        body = body[: draw(st.integers(0, len(body)))]
    return body


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _one_line(exc: CcscopeError) -> None:
    line = exc.line()
    assert "\n" not in line and "\r" not in line and 0 < len(line) <= 400, line
    assert "Traceback" not in line


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="ccscope-fuzz-") as d:
        yield Path(d)


@SETTINGS
@given(body=documents(), quick=st.booleans())
def test_scenario_documents_load_or_fail_in_one_line(workdir, body, quick):
    path = workdir / "fuzz.yaml"
    path.write_bytes(body)
    try:
        scenario = spec.load(path, quick=quick)
    except UsageError as exc:
        _one_line(exc)
        assert exc.exit_code == 2
    else:
        assert scenario.profiles and scenario.algorithms and len(scenario.description) <= 2000
    assert sorted(p.name for p in workdir.iterdir()) == ["fuzz.yaml"]  # parsing creates nothing


@SETTINGS
@given(raw=st.binary(max_size=300) | text.map(lambda t: t.encode("utf-8")))
def test_arbitrary_bytes_as_a_scenario_file(workdir, raw):
    path = workdir / "raw.yaml"
    path.write_bytes(raw)
    with contextlib.suppress(UsageError):
        spec.load(path)


class Reached(Exception):
    """The CLI accepted its input and would now start real work."""


def _flags(command: str) -> list[str]:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    # --basic-auth-file is being replaced by --web.config.file (issue 9, another part)
    return [opt for a in sub.choices[command]._actions for opt in a.option_strings
            if opt.startswith("--") and opt != "--basic-auth-file"]


COMMANDS = ["daemon", "flows", "trace", "scenario"]
FLAGS = {c: _flags(c) for c in COMMANDS}
# an argv byte that is not UTF-8 reaches Python as a lone surrogate (surrogateescape)
argument = st.one_of(scalar.map(str), st.sampled_from([*NASTY, "\udcff", "caf\udce9.yaml"]),
                     st.sampled_from(["fast-vs-slow", "list", "run"]))


@st.composite
def command_lines(draw) -> list[str]:
    command = draw(st.sampled_from(COMMANDS))
    argv = [command]
    if command == "scenario":
        argv += draw(st.sampled_from([["fast-vs-slow"], ["run", "/nonexistent.yaml"], ["list"], [], ["run"]]))
    for _ in range(draw(st.integers(0, 4))):
        flag = draw(st.sampled_from([*FLAGS[command], "--bogus", "-x"]))
        argv.append(flag)
        if draw(st.integers(0, 9)):  # usually with a value, sometimes without
            argv.append(draw(argument))
    return argv


@contextlib.contextmanager
def _no_real_work():
    """Where each command would start real work, raise Reached instead (no BPF, no namespaces, no files)."""
    def reached(*_args, **_kwargs):
        raise Reached

    with mock.patch.object(cli, "_stop_event", reached), mock.patch.object(cli, "cmd_check", reached), \
            mock.patch.object(runner, "check_prerequisites", lambda: None), \
            mock.patch.object(runner, "_open", reached):
        yield


@SETTINGS
@given(argv=command_lines())
def test_command_lines_are_accepted_or_one_line(workdir, argv):
    workdir = workdir / "cli"  # its own, empty: the other fuzz tests leave their inputs in workdir
    workdir.mkdir(exist_ok=True)
    err = io.StringIO()
    old = os.getcwd()
    os.chdir(workdir)
    try:
        with _no_real_work(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except Reached:
        return
    except SystemExit as exc:  # --help and --version
        assert exc.code == 0, (argv, err.getvalue())
        return
    finally:
        os.chdir(old)
    lines = err.getvalue().splitlines()
    if code == 0:  # `scenario list`
        return
    errors = [line for line in lines if line.startswith("ccscope: error: ")]
    assert len(errors) == 1 and code in (2, 3), (argv, code, err.getvalue())
    assert not [line for line in lines if not line.startswith("ccscope: ")], (argv, err.getvalue())
    assert len(errors[0]) <= 420
    assert not any(workdir.iterdir()), list(workdir.iterdir())


def _run(*argv: str | bytes, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "ccscope.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    out, err = proc.communicate(timeout=60)
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    res.pid = proc.pid
    return res


@pytest.mark.parametrize("name, content, args", [
    ("alias-bomb.yaml", b"a: &a [x, x, x]\nb: &b [*a, *a, *a]\ndescription: *b\n", []),
    ("dup.yaml", b"algorithms: [cubic]\nduration: 5s\nduration: 9s\nprofiles: {a: {rate: 1mbit}}\n", []),
    ("latin1.yaml", b"algorithms: [cubic]\ndescription: caf\xe9\n", []),
    ("deep.yaml", b"algorithms: " + b"[" * 50000 + b"]" * 50000 + b"\n", []),
    ("ok.yaml", b"algorithms: [cubic]\nduration: 5s\nprofiles: {a: {rate: 1mbit}}\n", ["--algorithms", "cubic,,bbr"]),
    ("ok.yaml", b"algorithms: [cubic]\nduration: 5s\nprofiles: {a: {rate: 1mbit}}\n", ["--duration", "-5s"]),
    ("ok.yaml", b"algorithms: [cubic]\nduration: 5s\nprofiles: {a: {rate: 1mbit}}\n", ["--out", b"/proc/\xff/x"]),
])
def test_real_ccscope_bad_input_is_one_line_and_leaves_nothing(tmp_path, name, content, args):
    (tmp_path / name).write_bytes(content)
    res = _run("scenario", "run", name, *args, "--listen", "off", cwd=tmp_path)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("ccscope: error: ") and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no results directory
    assert not left_by(res.pid)
