"""Host tools the lab needs, installed through apt when missing (as tools/bootstrap --dev does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from . import LabError

# apt package -> a file it installs that we use.
PACKAGES = {
    "qemu-system-x86": "/usr/bin/qemu-system-x86_64",
    "busybox-static": None,  # the static busybox; the dynamic `busybox` package has the same path
    "cpio": "/usr/bin/cpio",
    "kmod": "/usr/sbin/depmod",
    # building what a series' config leaves out (extra_modules.py)
    "gcc": "/usr/bin/gcc",
    "make": "/usr/bin/make",
    "xz-utils": "/usr/bin/xz",
}
BUSYBOX = "/bin/busybox"


def _installed(package: str) -> bool:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                             capture_output=True, text=True, check=False).stdout
    except OSError:
        return False
    return "ok installed" in out


def missing() -> list[str]:
    absent = []
    for package, path in PACKAGES.items():
        present = os.path.exists(path) if path else _installed(package)
        if not present:
            absent.append(package)
    return absent


def ensure(install: bool = True) -> None:
    """Install missing prerequisites (root only) or fail with the command that would."""
    absent = missing()
    if not absent:
        return
    hint = f"apt-get install {' '.join(absent)}"
    if not install or os.environ.get("KERNEL_LAB_NO_INSTALL") == "1":
        raise LabError(f"missing {', '.join(absent)} (install with: {hint})", 3)
    if os.geteuid() != 0:
        raise LabError(f"missing {', '.join(absent)}; needs root to install them (run: sudo {hint})", 3)
    if shutil.which("apt-get") is None:
        raise LabError(f"missing {', '.join(absent)} and no apt-get to install them", 3)
    print(f"kernel-lab: installing {' '.join(absent)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *absent]
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["unknown apt failure"])[-1]
            raise LabError(f"cannot install {', '.join(absent)}: {last}", 3)
    still = missing()
    if still:
        raise LabError(f"still missing after apt-get install: {', '.join(still)}", 3)
