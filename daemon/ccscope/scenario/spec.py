"""Scenario files: YAML schema, validation, built-in lookup.

Every error is one UsageError line naming the file and the dotted path of the field, e.g.
`wired.yaml: profiles.wireless.loss: 150% is not a loss fraction between 0 and 100%`.
Validation happens completely before anything is created (namespaces, output directory).
"""

from __future__ import annotations

import copy
import re
import stat
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ccscope import safe_input
from ccscope.cc.catalog import normalize as normalize_algorithm
from ccscope.emulation.profile import PathProfile, check_text
from ccscope.errors import UsageError
from ccscope.units import parse_duration, parse_size

from . import models, realpath

TOP_KEYS = ("name", "description", "algorithms", "optional_algorithms", "duration", "warmup", "runs", "seed",
            "sample_interval", "profiles", "traffic", "expected", "quick")
EXPECTED_KINDS = ("share",)  # expected: {share: {ALG: MODEL or {PROFILE: number}}}
TRAFFIC_KEYS = ("bulk", "ping", "downloads")
BULK_KEYS = ("flows", "stagger")
PING_KEYS = ("interval", "l4s")
DOWNLOAD_KEYS = ("sizes", "every", "start", "timeout")
MAX_DURATION_S = 3600.0
MAX_RUNS = 100
MAX_FLOWS = 16
MAX_PROFILES = 64  # every profile is runs x algorithm sets of runs: 64 already means hours
MAX_DOWNLOAD_BYTES = 1 << 30
_ALG = re.compile(r"^[a-z][a-z0-9_]{0,14}$")  # TCP_CA_NAME_MAX is 16 with the NUL


@dataclass(frozen=True)
class Downloads:
    """Short transfers from the sender side to the receiver, each with a time limit.

    With `every`, one starts every `every` seconds from `start` until the bulk flows end, cycling
    through `sizes`; without it, each size runs once, one after another (the run lasts until they finish).
    """

    sizes: tuple[int, ...]
    timeout_s: float
    every_s: float | None = None
    start_s: float = 0.0


@dataclass(frozen=True)
class Traffic:
    flows: int = 1  # bulk iperf3 flows per run (0: none)
    stagger_s: float = 0.0  # start of flow i is i * stagger
    ping_interval_s: float | None = None
    ping_l4s: bool = False  # a second ping, ECT(1): what a DualPI2's L queue gives it (traffic.ping_streams)
    downloads: Downloads | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    source: str  # file the scenario came from
    profiles: dict[str, PathProfile | realpath.RealPath]  # emulated, or a real path (realpath.py)
    algorithms: tuple[tuple[str, ...], ...]  # each entry one unit; several names compete in one run
    optional_algorithms: frozenset[str]
    duration_s: float
    warmup_s: float
    runs: int
    seed: int
    sample_interval_s: float
    traffic: Traffic
    raw: dict = field(default_factory=dict, compare=False)  # the merged YAML, recorded in results

    @property
    def all_algorithms(self) -> list[str]:
        return sorted({a for mix in self.algorithms for a in mix})

    def without(self, unavailable: set[str]) -> Scenario:
        kept = tuple(mix for mix in self.algorithms if not set(mix) & unavailable)
        return replace(self, algorithms=kept)


def mix_label(mix: tuple[str, ...]) -> str:
    return "+".join(mix)


# --- locating scenario files ------------------------------------------------------------------------


def builtin_dir() -> Path:
    """scenarios/ of the repo checkout (editable install) first, then the copy shipped as package data."""
    checkout = Path(__file__).resolve().parents[3] / "scenarios"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("ccscope") / "scenarios"))


def builtin_scenarios() -> dict[str, Path]:
    folder = builtin_dir()
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def resolve(name_or_path: str) -> Path:
    builtins = builtin_scenarios()
    if name_or_path in builtins:
        return builtins[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or _exists(path):
        check_file(path)
        return path
    known = ", ".join(builtins) or "none installed"
    raise UsageError(f"{name_or_path!r} is neither a built-in scenario ({known}) nor a YAML file")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # ENAMETOOLONG and the like: not a file we could read
        return False


def check_file(path: Path) -> None:
    """A scenario file must be an existing regular file (not a directory, FIFO or device)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"{path}: no such scenario file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the scenario file: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise UsageError(f"{path}: not a scenario file ({kind})")


# --- loading ----------------------------------------------------------------------------------------


def load(path: Path, *, quick: bool = False, duration: str | None = None, runs: int | None = None,
         algorithms: str | None = None, target: str | None = None, via: list[str] | None = None) -> Scenario:
    """Read, merge the `quick:` overlay and command-line overrides, validate."""
    text = safe_input.read_text(path, "a scenario file")
    data = parse_yaml(text, path.name)
    if target is not None or via:
        data = realpath.override(data, target, via or [])
    return from_dict(data, path.name, source=str(path), quick=quick, duration=duration, runs=runs,
                     algorithms=algorithms)


def parse_yaml(text: str, where: str) -> dict:
    data = safe_input.load_yaml(text, where)
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of {', '.join(TOP_KEYS[:4])}, ... at the top, "
                         f"got {type(data).__name__}")
    return data


def from_dict(data: dict, where: str, *, source: str = "", quick: bool = False, duration: str | None = None,
              runs: int | None = None, algorithms: str | None = None) -> Scenario:
    _known(data, TOP_KEYS, where, "")
    data = copy.deepcopy(data)
    overlay = data.pop("quick", None)
    if overlay is not None and not isinstance(overlay, dict):
        raise UsageError(f"{where}: quick: expected a mapping of overrides, got {overlay!r}")
    if overlay:
        _known(overlay, tuple(k for k in TOP_KEYS if k not in ("quick", "name")), where, "quick")
        merged = _merge_quick(copy.deepcopy(data), overlay, where)
        if quick:
            data = merged
    if duration is not None:
        data["duration"] = parse_duration(duration, "--duration", 1.0, MAX_DURATION_S)
        if data["duration"] != int(data["duration"]):
            raise UsageError(f"--duration {duration!r}: must be whole seconds (iperf3 -t/-O take seconds)")
    if runs is not None:
        data["runs"] = runs
    if algorithms is not None:
        if "" in [a.strip() for a in algorithms.split(",")] and algorithms.strip(" ,"):
            raise UsageError(f"--algorithms {algorithms!r}: an empty name between commas (e.g. cubic,bbr)")
        names = [a.strip() for a in algorithms.split(",") if a.strip()]
        if not names:
            raise UsageError("--algorithms: give a comma-separated list such as reno,cubic,bbr "
                             "(cubic+bbr: competing in one run)")
        # "cubic+bbr" is a competing set, spelled as results and reports label it
        data["algorithms"] = [name.split("+") if "+" in name else name for name in names]
        data["optional_algorithms"] = []
        _algorithms(data["algorithms"], f"--algorithms {algorithms!r}")  # its mistakes are the flag's
    if overlay and not quick:  # the quick variant is checked too, not only when --quick is given
        flagged = {"duration": duration, "runs": runs, "algorithms": algorithms, "optional_algorithms": algorithms}
        _build({**merged, **{k: data[k] for k, flag in flagged.items() if flag is not None}}, f"{where}: quick",
               source)
    return _build(data, where, source)


def _merge_quick(data: dict, overlay: dict, where: str) -> dict:
    for key, value in overlay.items():
        if key == "profiles" and isinstance(value, list):  # a subset of the profiles, by name
            profiles = data.get("profiles") or {}
            if not isinstance(profiles, dict):
                raise UsageError(f"{where}: profiles: expected a mapping of profile names to links, got {profiles!r}")
            for name in value:
                if not isinstance(name, str) or name not in profiles:
                    raise UsageError(f"{where}: quick.profiles: {name!r} is not one of the profiles "
                                     f"({', '.join(profiles)})")
            data["profiles"] = {name: profiles[name] for name in value}
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = _deep_merge(data[key], value)
        else:
            data[key] = value
    return data


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) \
            else value
    return out


def _known(data: dict, keys: tuple[str, ...], where: str, path: str) -> None:
    for key in data:
        if key not in keys:
            at = f"{path}.{safe_input.shown_key(key)}" if path else safe_input.shown_key(key)
            raise UsageError(f"{where}: {at}: unknown key (known: {', '.join(keys)})")


def _build(data: dict, where: str, source: str) -> Scenario:
    name = data.get("name", Path(source).stem if source else "scenario")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise UsageError(f"{where}: name: {name!r} must be letters, digits, '-', '_' or '.' (at most 64)")
    description = check_text(data.get("description", ""), f"{where}: description")
    algorithms = _algorithms(data.get("algorithms"), where)
    optional = data.get("optional_algorithms", []) or []
    if not isinstance(optional, list) or not all(isinstance(a, str) for a in optional):
        raise UsageError(f"{where}: optional_algorithms: expected a list of algorithm names, got {optional!r}")
    optional = [_check_alg(alg, f"{where}: optional_algorithms") for alg in optional]
    mixes = list(algorithms) + [(a,) for a in optional if (a,) not in algorithms]
    traffic = _traffic(data.get("traffic"), where)
    needs_duration = traffic.flows > 0 or (traffic.downloads is not None and traffic.downloads.every_s is not None)
    if "duration" in data:
        duration = parse_duration(data["duration"], f"{where}: duration", 1.0, MAX_DURATION_S)
    elif needs_duration:
        raise UsageError(f"{where}: duration: missing (how long the bulk flows run, e.g. 20s)")
    else:
        duration = 0.0
    warmup = parse_duration(data.get("warmup", 0), f"{where}: warmup", 0.0, MAX_DURATION_S)
    if traffic.flows > 0:
        for key, value in (("duration", duration), ("warmup", warmup)):
            if value != int(value):
                raise UsageError(f"{where}: {key}: {data[key]!r} must be whole seconds (iperf3 -t/-O take seconds)")
    if needs_duration and warmup >= duration:
        raise UsageError(f"{where}: warmup: {data.get('warmup')!r} must be shorter than the duration "
                         f"{data.get('duration')!r}")
    if traffic.stagger_s * max(0, traffic.flows - 1) >= max(duration, 1e-9) and traffic.flows > 1:
        raise UsageError(f"{where}: traffic.bulk.stagger: the last flow would start after the duration")
    runs = _int(data.get("runs", 1), f"{where}: runs", 1, MAX_RUNS)
    seed = _int(data.get("seed", 1), f"{where}: seed", 0, 2**32 - 1)
    interval = parse_duration(data.get("sample_interval", "10ms"), f"{where}: sample_interval", 0.001, 1.0)
    profiles = _profiles(data.get("profiles"), where)
    _expected(data.get("expected"), where, profiles, mixes)
    return Scenario(name=name, description=description.strip(), source=source, profiles=profiles,
                    algorithms=tuple(mixes), optional_algorithms=frozenset(optional), duration_s=duration,
                    warmup_s=warmup, runs=runs, seed=seed, sample_interval_s=interval, traffic=traffic, raw=data)


def _expected(raw: Any, where: str, profiles: dict, mixes: list[tuple[str, ...]]) -> None:
    """`expected: {share: {ALG: MODEL | {PROFILE: number}}}`: what a model or a paper says an algorithm's share
    of a competing set is, shown in the report beside the measurement (models.py, docs/scenarios.md)."""
    if raw is None:
        return
    if not isinstance(raw, dict) or not raw:
        raise UsageError(f"{where}: expected: a mapping such as {{share: {{bbr: ware2019}}}}, got {raw!r}")
    _known(raw, EXPECTED_KINDS, where, "expected")
    shares = raw["share"]
    if not isinstance(shares, dict) or not shares:
        raise UsageError(f"{where}: expected.share: a mapping of algorithm to a model or per-profile numbers")
    competing = {alg for mix in mixes if len(mix) > 1 for alg in mix}
    for alg, value in shares.items():
        at = f"{where}: expected.share.{safe_input.shown_key(alg)}"
        if alg not in competing:
            raise UsageError(f"{at}: {alg!r} is in no competing set of this scenario")
        if isinstance(value, str):
            if value not in models.SHARE_MODELS:
                raise UsageError(f"{at}: unknown model {value!r} (known: {', '.join(models.SHARE_MODELS)})")
            continue
        if not isinstance(value, dict) or not value:
            raise UsageError(f"{at}: a model name ({', '.join(models.SHARE_MODELS)}) or {{PROFILE: share}}")
        for profile, number in value.items():
            if profile not in profiles:
                raise UsageError(f"{at}: {safe_input.shown_key(profile)} is not one of the profiles "
                                 f"({', '.join(profiles)})")
            if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number <= 1:
                raise UsageError(f"{at}.{profile}: a share between 0 and 1, got {number!r}")


def _check_alg(alg: Any, where: str) -> str:
    """A kernel congestion control name; `bpf:vegas` (ccscope's BPF Vegas, also next to a native one)
    becomes the name it is registered under, bpf_vegas."""
    name = normalize_algorithm(alg) if isinstance(alg, str) else alg
    if not isinstance(name, str) or not _ALG.match(name) or name == normalize_algorithm("bpf:"):
        raise UsageError(f"{where}: {alg!r} is not a congestion control name (like cubic, bbr, reno, bpf:vegas)")
    return name


def _algorithms(raw: Any, where: str) -> list[tuple[str, ...]]:
    if raw is None:
        raise UsageError(f"{where}: algorithms: missing (for example [reno, cubic, bbr])")
    if not isinstance(raw, list) or not raw:
        raise UsageError(f"{where}: algorithms: expected a non-empty list such as [reno, cubic, bbr], got {raw!r}")
    mixes = []
    for i, entry in enumerate(raw):
        at = f"{where}: algorithms[{i}]"
        if isinstance(entry, list):  # several algorithms competing in one run
            if not 2 <= len(entry) <= MAX_FLOWS:
                raise UsageError(f"{at}: a competing set needs 2 to {MAX_FLOWS} algorithms, got {entry!r}")
            mix = tuple(_check_alg(a, at) for a in entry)  # cubic+cubic: a flow of each, as fairness does
        else:
            mix = (_check_alg(entry, at),)
        if mix in mixes:
            raise UsageError(f"{at}: {mix_label(mix)} is listed twice")
        mixes.append(mix)
    return mixes


def _profiles(raw: Any, where: str) -> dict[str, PathProfile]:
    if not isinstance(raw, dict) or not raw:
        raise UsageError(f"{where}: profiles: expected a mapping of profile names to links "
                         f"(e.g. wired: {{rate: 100mbit, delay: 5ms}}), got {raw!r}")
    if len(raw) > MAX_PROFILES:
        raise UsageError(f"{where}: profiles: {len(raw)} profiles, more than {MAX_PROFILES} (split the scenario)")
    profiles = {}
    for name, body in raw.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}", name):
            raise UsageError(f"{where}: profiles: {name!r} is not a profile name (letters, digits, - _ .)")
        if realpath.is_real_body(body):
            profiles[name] = realpath.RealPath.from_dict(name, body, f"{where}: profiles.{name}")
            continue
        profiles[name] = PathProfile.from_dict(name, body, f"{where}: profiles.{name}")
        if profiles[name].up.effective_rate_bps() is None:
            raise UsageError(f"{where}: profiles.{name}.rate: missing (a scenario needs a bottleneck rate)")
    return profiles


def _traffic(raw: Any, where: str) -> Traffic:
    if raw is None:
        return Traffic()
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: traffic: expected a mapping of bulk, ping, downloads, got {raw!r}")
    _known(raw, TRAFFIC_KEYS, where, "traffic")
    flows, stagger = 1, 0.0
    bulk = raw.get("bulk", {})
    if bulk is False:
        flows = 0
    elif bulk is not None:
        if not isinstance(bulk, dict):
            raise UsageError(f"{where}: traffic.bulk: expected a mapping of flows, stagger (or false), got {bulk!r}")
        _known(bulk, BULK_KEYS, where, "traffic.bulk")
        flows = _int(bulk.get("flows", 1), f"{where}: traffic.bulk.flows", 0, MAX_FLOWS)
        stagger = parse_duration(bulk.get("stagger", 0), f"{where}: traffic.bulk.stagger", 0.0, MAX_DURATION_S)
    ping = raw.get("ping")
    interval, l4s = None, False
    if ping is True:
        interval = 0.1
    elif ping not in (None, False):
        if not isinstance(ping, dict):
            raise UsageError(f"{where}: traffic.ping: expected a mapping with interval (or true/false), got {ping!r}")
        _known(ping, PING_KEYS, where, "traffic.ping")
        interval = parse_duration(ping.get("interval", "100ms"), f"{where}: traffic.ping.interval", 0.01, 10.0)
        l4s = ping.get("l4s", False)
        if not isinstance(l4s, bool):
            raise UsageError(f"{where}: traffic.ping.l4s: expected true or false, got {l4s!r}")
    downloads = _downloads(raw.get("downloads"), where)
    if flows == 0 and downloads is None:
        raise UsageError(f"{where}: traffic: no traffic (give bulk flows or downloads)")
    return Traffic(flows=flows, stagger_s=stagger, ping_interval_s=interval, ping_l4s=l4s, downloads=downloads)


def _downloads(raw: Any, where: str) -> Downloads | None:
    if raw in (None, False):
        return None
    at = f"{where}: traffic.downloads"
    if not isinstance(raw, dict):
        raise UsageError(f"{at}: expected a mapping of sizes, every, start, timeout, got {raw!r}")
    _known(raw, DOWNLOAD_KEYS, where, "traffic.downloads")
    sizes = raw.get("sizes")
    if isinstance(sizes, str | int):
        sizes = [sizes]
    if not isinstance(sizes, list) or not sizes:
        raise UsageError(f"{at}.sizes: expected a list of sizes such as [10KB, 1MB], got {sizes!r}")
    parsed = tuple(parse_size(s, f"{at}.sizes[{i}]", 1, MAX_DOWNLOAD_BYTES,
                              too_high="is more than {high}, too large for a short download")
                   for i, s in enumerate(sizes))
    if "timeout" not in raw:
        raise UsageError(f"{at}.timeout: missing (every transfer needs a time limit, e.g. 30s)")
    timeout = parse_duration(raw["timeout"], f"{at}.timeout", 0.1, MAX_DURATION_S)
    every = parse_duration(raw["every"], f"{at}.every", 0.1, MAX_DURATION_S) if raw.get("every") is not None else None
    start = parse_duration(raw.get("start", 0), f"{at}.start", 0.0, MAX_DURATION_S)
    return Downloads(sizes=parsed, timeout_s=timeout, every_s=every, start_s=start)


def _int(raw: Any, where: str, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise UsageError(f"{where}: expected a whole number, got {raw!r}")
    if not low <= raw <= high:
        raise UsageError(f"{where}: {raw} is out of range {low}..{high}")
    return raw

