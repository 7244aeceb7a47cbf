"""Fetch a stock Debian kernel package with apt, unpack it (no install) and index its modules."""

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

DEFAULT_PATTERN = r"^linux-image-6\.1\.0-[0-9]+-amd64$"
PACKAGE_RE = re.compile(r"^linux-image-(?P<version>[0-9][0-9.]*-[0-9]+-[a-z0-9]+)$")


@dataclass(frozen=True)
class Kernel:
    version: str  # e.g. 6.1.0-56-amd64
    package: str
    root: Path  # the unpacked package: boot/, lib/modules/<version>/

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.version

    @property
    def config(self) -> Path:
        return self.root / "boot" / f"config-{self.version}"


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


def _sort_key(package: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", package))


def _apt_candidates(pattern: str) -> list[str]:
    try:
        out = subprocess.run(["apt-cache", "search", "--names-only", pattern],
                             capture_output=True, text=True, check=False).stdout
    except OSError:
        raise LabError("apt-cache not found: the lab fetches Debian kernel packages with apt", 3) from None
    names = [line.split(" - ", 1)[0].strip() for line in out.splitlines()]
    return sorted((n for n in names if re.search(pattern, n)), key=_sort_key)


def newest_package(pattern: str = DEFAULT_PATTERN) -> str:
    """The newest package matching `pattern` that apt knows; refreshes the lists once if none."""
    candidates = _apt_candidates(pattern)
    if not candidates and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
        candidates = _apt_candidates(pattern)
    if not candidates:
        raise LabError(f"apt knows no kernel package matching {pattern} (try: apt-get update)", 3)
    return candidates[-1]


def _current_file() -> Path:
    return cache_dir() / "current"


def cached() -> Kernel | None:
    """The kernel the last fetch chose, if its files are still there."""
    try:
        package = _current_file().read_text().strip()
    except OSError:
        return None
    kernel = _kernel_for(package)
    if kernel.vmlinuz.is_file() and (kernel.modules_dir / "modules.dep").is_file():
        return kernel
    return None


def _kernel_for(package: str) -> Kernel:
    match = PACKAGE_RE.match(package)
    if not match:
        raise LabError(f"not a kernel image package name: {package} (e.g. linux-image-6.1.0-26-amd64)", 2)
    version = match["version"]
    return Kernel(version=version, package=package, root=cache_dir() / version / "root")


def fetch(package: str | None = None, refresh: bool = False) -> Kernel:
    """Return a cached kernel, downloading and unpacking it first when needed."""
    if package is None and not refresh:
        kernel = cached()
        if kernel:
            return kernel
    with locked():
        chosen = package is None
        if chosen:
            kernel = cached() if not refresh else None
            if kernel:
                return kernel
            package = newest_package()
        kernel = _kernel_for(package)
        if not (kernel.vmlinuz.is_file() and (kernel.modules_dir / "modules.dep").is_file()):
            try:
                _download_and_unpack(kernel)
            except LabError:
                if not chosen or os.geteuid() != 0:
                    raise
                # Stale apt lists name a package the mirror no longer has: refresh and choose again.
                subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
                kernel = _kernel_for(newest_package())
                _download_and_unpack(kernel)
            package = kernel.package
        _current_file().write_text(package + "\n")
        return kernel


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise LabError(f"{what}: cannot run {cmd[0]}: {err.strerror}", 3) from None
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()
        errors = [line for line in lines if line.startswith(("E:", "dpkg", "depmod"))] or lines
        raise LabError(f"{what} failed: {errors[-1].strip()}", 3)


def _known_to_apt(package: str) -> bool:
    result = subprocess.run(["apt-cache", "show", "--no-all-versions", package],
                            capture_output=True, text=True, check=False)
    return result.returncode == 0 and "Package:" in result.stdout


def _download_and_unpack(kernel: Kernel) -> None:
    if not _known_to_apt(kernel.package):
        raise LabError(f"apt has no package {kernel.package} (list them: apt-cache search "
                       f"'^linux-image-6.1.0-.*-amd64$'; or run apt-get update)", 3)
    print(f"kernel-lab: fetching {kernel.package}", file=sys.stderr, flush=True)
    target = kernel.root.parent
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target, prefix="fetch-") as tmp:
        work = Path(tmp)
        # apt drops privileges to _apt for downloads; a world-writable dir avoids its warning.
        os.chmod(work, 0o777)
        _run(["apt-get", "download", "-q", kernel.package], f"apt-get download {kernel.package}", cwd=work)
        debs = sorted(work.glob("*.deb"))
        if not debs:
            raise LabError(f"apt-get download {kernel.package} produced no .deb", 3)
        unpacked = work / "root"
        _run(["dpkg", "-x", str(debs[0]), str(unpacked)], f"dpkg -x {debs[0].name}")
        # The package ships no modules.dep: the postinst would make it.
        _run(["depmod", "-b", str(unpacked), kernel.version], "depmod")
        if kernel.root.exists():
            shutil.rmtree(kernel.root)
        unpacked.rename(kernel.root)
    if not kernel.vmlinuz.is_file():
        raise LabError(f"{kernel.package} has no {kernel.vmlinuz.name}", 3)


def config_value(kernel: Kernel, option: str) -> str | None:
    """CONFIG_<option> from the kernel's config: 'y', 'm', a value, or None when unset."""
    try:
        for line in kernel.config.read_text().splitlines():
            if line.startswith(f"CONFIG_{option}="):
                return line.split("=", 1)[1]
    except OSError:
        return None
    return None
