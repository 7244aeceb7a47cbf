"""Fetch a stock Debian kernel with the lab's own apt configuration, unpack it (no install), index its modules.

The lab never touches the host's apt: its sources (bookworm, bookworm-security and sid on deb.debian.org,
signed by the host's Debian archive keyring), package lists and downloads live under the cache directory
(`apt/`), and every apt command runs with APT_CONFIG pointing there. A kernel series names which suite and
which image packages serve it (SERIES). sid splits a kernel into linux-binary (vmlinuz), linux-modules and
linux-base (config, modules.builtin) under /usr/lib/modules/VERSION, which the image package depends on;
unpacking puts them where bookworm's packages have them (boot/, lib/modules/VERSION/).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import LabError, cache_dir


@dataclass(frozen=True)
class Series:
    name: str  # what --kernel takes
    suite: str  # the Debian suite that serves it
    pattern: str  # the image packages of the series (a regular expression)


SERIES = {s.name: s for s in (
    Series("6.1", "bookworm", r"^linux-image-6\.1\.0-[0-9]+-amd64$"),
    Series("6.12", "bookworm", r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$"),
    # sid's: codel, fq_codel, pie, fq_pie, cake, dctcp, AccECN (see docs/kernel-lab.md)
    Series("7.2", "sid", r"^linux-image-7\.2\.[0-9]+\+deb14-amd64$"),
)}
DEFAULT_SERIES = "6.1"
PACKAGE_RE = re.compile(r"^linux-image-(?P<version>[0-9][0-9.]*(-[0-9]+|\+deb[0-9]+)-[a-z0-9]+)$")
ARCHIVE = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
SOURCES = "".join(f"deb [signed-by={KEYRING}] {uri} {suite} main\n" for uri, suite in (
    (ARCHIVE, "bookworm"), (ARCHIVE, "bookworm-updates"), (ARCHIVE, "sid"),
    ("http://deb.debian.org/debian-security", "bookworm-security")))


def series(name: str) -> Series:
    try:
        return SERIES[name]
    except KeyError:
        raise LabError(f"no kernel series {name} (known: {', '.join(SERIES)})", 2) from None


@dataclass(frozen=True)
class Kernel:
    version: str  # e.g. 6.1.0-56-amd64, 7.2.13+deb14-amd64
    package: str
    root: Path  # the unpacked packages: boot/, lib/modules/<version>/

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.version

    @property
    def config(self) -> Path:
        return self.root / "boot" / f"config-{self.version}"

    @property
    def ready(self) -> bool:
        return self.vmlinuz.is_file() and (self.modules_dir / "modules.dep").is_file()


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise cache writers (two test runs may fetch at once)."""
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        handle = open(cache / "lock", "w")  # noqa: SIM115 - held for the block
    except OSError as err:
        raise LabError(f"cannot use the cache directory {cache}: {err.strerror}", 3) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _apt_dir() -> Path:
    return cache_dir() / "apt"


def _apt_env() -> dict[str, str]:
    """The lab's own apt configuration, written on first use."""
    base = _apt_dir()
    conf = base / "apt.conf"
    settings = {
        "Dir::Etc::sourcelist": base / "sources.list", "Dir::Etc::sourceparts": base / "sources.list.d",
        "Dir::Etc::parts": base / "apt.conf.d", "Dir::Etc::preferencesparts": base / "preferences.d",
        "Dir::State": base / "state", "Dir::State::lists": base / "lists", "Dir::State::status": base / "status",
        "Dir::Cache": base / "cache",
    }
    text = "".join(f'{key} "{value}";\n' for key, value in settings.items())
    # The archive served here is a snapshot whose Release files are past their Valid-Until date.
    text += 'Acquire::Check-Valid-Until "false";\nAcquire::Languages "none";\nAPT::Architectures { "amd64"; };\n'
    if not conf.is_file() or conf.read_text() != text or (base / "sources.list").read_text() != SOURCES:
        subdirs = ("sources.list.d", "apt.conf.d", "preferences.d", "state", "lists/partial", "cache/archives/partial")
        for sub in subdirs:
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "status").touch()
        (base / "sources.list").write_text(SOURCES)
        conf.write_text(text)
    return {**os.environ, "APT_CONFIG": str(conf)}


def _sort_key(package: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", package))


def apt_run(argv: list[str], what: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """An apt command under the lab's own configuration; a failure is one LabError line."""
    try:
        result = subprocess.run(argv, cwd=cwd, env=_apt_env(), capture_output=True, text=True, check=False)
    except OSError as err:
        raise LabError(f"{what}: cannot run {argv[0]}: {err.strerror} (the lab fetches kernels with apt)", 3) \
            from None
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()
        errors = [line for line in lines if line.startswith(("E:", "W:"))] or lines
        raise LabError(f"{what} failed: {errors[-1].strip()}", 3)
    return result


def _update_lists() -> None:
    print(f"kernel-lab: refreshing the lab's package lists ({ARCHIVE})", file=sys.stderr, flush=True)
    apt_run(["apt-get", "update", "-q"], "apt-get update (the lab's sources)")


def _apt_candidates(pattern: str) -> list[str]:
    out = apt_run(["apt-cache", "search", "--names-only", pattern], "apt-cache search").stdout
    names = [line.split(" - ", 1)[0].strip() for line in out.splitlines()]
    return sorted((n for n in names if re.search(pattern, n)), key=_sort_key)


def _have_lists() -> bool:
    return any((_apt_dir() / "lists").glob("*_Packages*"))


def newest_package(chosen: Series) -> str:
    """The newest image package of the series that the lab's lists know; refreshes them once if none."""
    candidates = _apt_candidates(chosen.pattern) if _have_lists() else []
    if not candidates:
        _update_lists()
        candidates = _apt_candidates(chosen.pattern)
    if not candidates:
        raise LabError(f"Debian {chosen.suite} has no kernel package matching {chosen.pattern}", 3)
    return candidates[-1]


def _current_file(chosen: Series) -> Path:
    return cache_dir() / f"current-{chosen.name}"


def cached(series_name: str = DEFAULT_SERIES) -> Kernel | None:
    """The kernel of the series that the last fetch chose, if its files are still there."""
    try:
        package = _current_file(series(series_name)).read_text().strip()
    except OSError:
        return None
    kernel = _kernel_for(package)
    return kernel if kernel.ready else None


def _kernel_for(package: str) -> Kernel:
    match = PACKAGE_RE.match(package)
    if not match:
        raise LabError(f"not a kernel image package name: {package} (e.g. linux-image-6.1.0-26-amd64)", 2)
    version = match["version"]
    return Kernel(version=version, package=package, root=cache_dir() / version / "root")


def _series_of(package: str) -> Series:
    for candidate in SERIES.values():
        if re.search(candidate.pattern, package):
            return candidate
    raise LabError(f"{package} is in no kernel series the lab knows ({', '.join(SERIES)})", 2)


def fetch(series_name: str = DEFAULT_SERIES, package: str | None = None, refresh: bool = False) -> Kernel:
    """Return a cached kernel of the series (or the given package), downloading and unpacking it when needed."""
    chosen = _series_of(package) if package else series(series_name)
    if package is None and not refresh:
        kernel = cached(chosen.name)
        if kernel:
            return kernel
    with locked():
        if package is None:
            kernel = cached(chosen.name) if not refresh else None
            if kernel:
                return kernel
            if refresh:
                _update_lists()
            package = newest_package(chosen)
        kernel = _kernel_for(package)
        if not kernel.ready:
            _download_and_unpack(kernel)
        _current_file(chosen).write_text(package + "\n")
        return kernel


def run_tool(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise LabError(f"{what}: cannot run {cmd[0]}: {err.strerror}", 3) from None
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()
        errors = [line for line in lines if line.startswith(("dpkg", "depmod"))] or lines
        raise LabError(f"{what} failed: {errors[-1].strip()}", 3)


def _packages_of(kernel: Kernel) -> list[str]:
    """The image package and the packages of the same kernel it depends on (sid: binary, modules, base)."""
    if not _have_lists():
        _update_lists()
    shown = apt_run(["apt-cache", "show", "--no-all-versions", kernel.package], f"apt-cache show {kernel.package}")
    depends = next((line.split(":", 1)[1] for line in shown.stdout.splitlines() if line.startswith("Depends:")), "")
    names = {alt.split()[0] for item in depends.split(",") for alt in item.split("|") if alt.strip()}
    return [kernel.package, *sorted(n for n in names if n.endswith(f"-{kernel.version}"))]


def _download_and_unpack(kernel: Kernel) -> None:
    packages = _packages_of(kernel)
    print(f"kernel-lab: fetching {' '.join(packages)}", file=sys.stderr, flush=True)
    target = kernel.root.parent
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target, prefix="fetch-") as tmp:
        work = Path(tmp)
        # apt drops privileges to _apt for downloads; a world-writable dir avoids its warning.
        os.chmod(work, 0o777)
        apt_run(["apt-get", "download", "-q", *packages], f"apt-get download {kernel.package}", cwd=work)
        unpacked = work / "root"
        for deb in sorted(work.glob("*.deb")):
            run_tool(["dpkg", "-x", str(deb), str(unpacked)], f"dpkg -x {deb.name}")
        _normalise_layout(unpacked, kernel.version)
        # The package ships no modules.dep: the postinst would make it.
        run_tool(["depmod", "-b", str(unpacked), kernel.version], "depmod")
        if kernel.root.exists():
            shutil.rmtree(kernel.root)
        unpacked.rename(kernel.root)
    if not kernel.vmlinuz.is_file():
        raise LabError(f"{kernel.package} has no vmlinuz-{kernel.version}", 3)


def _normalise_layout(root: Path, version: str) -> None:
    """sid's packages put everything under usr/lib/modules/VERSION: move it where bookworm's are."""
    usr_modules = root / "usr" / "lib" / "modules" / version
    if not usr_modules.is_dir():
        return
    (root / "lib" / "modules").mkdir(parents=True, exist_ok=True)
    usr_modules.rename(root / "lib" / "modules" / version)
    moved = root / "lib" / "modules" / version
    (root / "boot").mkdir(exist_ok=True)
    for name in ("vmlinuz", "config", "System.map"):
        if (moved / name).is_file():
            (moved / name).rename(root / "boot" / f"{name}-{version}")


def config_value(kernel: Kernel, option: str) -> str | None:
    """CONFIG_<option> from the kernel's config: 'y', 'm', a value, or None when unset."""
    try:
        for line in kernel.config.read_text().splitlines():
            if line.startswith(f"CONFIG_{option}="):
                return line.split("=", 1)[1]
    except OSError:
        return None
    return None
