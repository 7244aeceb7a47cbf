"""The page's one third-party asset, uPlot (MIT), pinned by version and npm integrity in this one place.

`make assets` (part of `make all`, so tools/bootstrap, the Dockerfile and the wheel build get it) runs this file:
it downloads the npm tarball with the Python standard library (no node needed), checks its sha512 integrity,
and extracts the minified script, its stylesheet and its LICENSE into static/vendor/ (git-ignored build output,
like the BPF object). Offline: put uplot-VERSION.tgz in $CCSCOPE_VENDOR_DIR (or the cache directory) first.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

UPLOT_VERSION = "1.6.32"
UPLOT_INTEGRITY = "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
UPLOT_URL = f"https://registry.npmjs.org/uplot/-/uplot-{UPLOT_VERSION}.tgz"
# tarball member -> file in static/vendor/
UPLOT_FILES = {
    "package/dist/uPlot.iife.min.js": "uPlot.iife.min.js",
    "package/dist/uPlot.min.css": "uPlot.min.css",
    "package/LICENSE": "uPlot.LICENSE",
}
VENDOR_DIR = Path(__file__).resolve().parent / "static" / "vendor"


def missing_files(directory: Path = VENDOR_DIR) -> list[str]:
    return [name for name in UPLOT_FILES.values() if not (directory / name).is_file()]


def _verified(data: bytes) -> bool:
    algorithm, _, expected = UPLOT_INTEGRITY.partition("-")
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode() == expected


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ccscope"


def tarball() -> bytes:
    """The verified tarball: from $CCSCOPE_VENDOR_DIR or the cache when there, else from the npm registry."""
    name = f"uplot-{UPLOT_VERSION}.tgz"
    places = [Path(os.environ["CCSCOPE_VENDOR_DIR"])] if os.environ.get("CCSCOPE_VENDOR_DIR") else []
    for place in [*places, _cache_dir()]:
        path = place / name
        if path.is_file() and _verified(path.read_bytes()):
            return path.read_bytes()
    try:
        with urllib.request.urlopen(UPLOT_URL, timeout=60) as response:
            data = response.read()
    except OSError as exc:
        raise SystemExit(f"assets: cannot download {UPLOT_URL}: {exc}; offline, put {name} in "
                         "$CCSCOPE_VENDOR_DIR") from None
    if not _verified(data):
        raise SystemExit(f"assets: {UPLOT_URL} does not match the pinned integrity {UPLOT_INTEGRITY}")
    try:
        _cache_dir().mkdir(parents=True, exist_ok=True)
        (_cache_dir() / name).write_bytes(data)
    except OSError:
        pass  # a cache is a convenience
    return data


def extract(data: bytes, directory: Path = VENDOR_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member, target in UPLOT_FILES.items():
            source = tar.extractfile(member)
            if source is None:
                raise SystemExit(f"assets: {member} missing from uplot-{UPLOT_VERSION}.tgz")
            (directory / target).write_bytes(source.read())


def main() -> int:
    extract(tarball())
    print(f"assets: uPlot {UPLOT_VERSION} in {VENDOR_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
