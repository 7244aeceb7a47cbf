"""Modules a series' Debian config leaves out, built from the kernel's own source against its headers.

Debian's 7.2 has no sch_dualpi2 (CONFIG_NET_SCH_DUALPI2 unset), which ccscope compares its DualPI2 with. Its
source is in linux-source-7.2, and it builds out of tree against linux-headers-7.2 with this machine's gcc
once three things are worked around (each found by trying, 2026-11-27):
- the headers' Makefile names /usr/src/...: the unpacked copy is pointed at where it was unpacked;
- gcc 12 lacks -fmin-function-alignment (the kernel was built with gcc 16): CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT
  is cleared on make's command line, and the Makefile falls back to -falign-functions (the same 16 bytes);
- sid's objtool, modpost and resolve_btfids need glibc 2.38 (bookworm has 2.36): they run through sid's own
  dynamic loader and libc, unpacked beside them (nothing is installed); pahole is not needed, since module BTF
  is left out (CONFIG_DEBUG_INFO_BTF_MODULES cleared).
The module is unsigned and out of tree: loading it taints the guest kernel (O, E), nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import LabError
from .kernel import Kernel, apt_run, config_value, run_tool

# series -> (module, its source file, the config option that Debian leaves unset)
EXTRA = {"7.2": (("sch_dualpi2", "net/sched/sch_dualpi2.c", "NET_SCH_DUALPI2"),)}
# sid's tools that need its C library, relative to the kbuild tree
SID_TOOLS = ("tools/objtool/objtool.real-x86", "scripts/mod/modpost.real-lsb-64",
             "tools/bpf/resolve_btfids/resolve_btfids")


def built(kernel: Kernel, module: str) -> Path:
    return kernel.modules_dir / "extra" / f"{module}.ko"


def ensure(kernel: Kernel, series: str) -> None:
    """Builds the series' missing modules into the kernel's tree (lib/modules/V/extra) once."""
    wanted = [(m, src) for m, src, option in EXTRA.get(series, ())
              if config_value(kernel, option) is None and not built(kernel, m).is_file()]
    if not wanted:
        return
    names = " ".join(m for m, _ in wanted)
    print(f"kernel-lab: building {names} from linux-source-{series} (once)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=kernel.root.parent, prefix="build-") as tmp:
        work = Path(tmp)
        headers = _unpack_build_tree(kernel, series, work)
        for module, source in wanted:
            _build(kernel, headers, work, module, source)
    run_tool(["depmod", "-b", str(kernel.root), kernel.version], "depmod")


def _unpack_build_tree(kernel: Kernel, series: str, work: Path) -> Path:
    base = kernel.version.rsplit("-", 1)[0]  # 7.2.13+deb14
    debs = work / "debs"
    debs.mkdir()
    debs.chmod(0o777)  # apt downloads as _apt
    apt_run(["apt-get", "download", "-q", f"linux-headers-{kernel.version}", f"linux-headers-{base}-common",
          f"linux-kbuild-{base}", f"linux-source-{series}", "libc6/sid"], "apt-get download (the build tree)",
         cwd=debs)
    for deb in sorted(debs.glob("linux-*.deb")):
        run_tool(["dpkg", "-x", str(deb), str(work / "root")], f"dpkg -x {deb.name}")
    (libc,) = debs.glob("libc6_*.deb")
    run_tool(["dpkg", "-x", str(libc), str(work / "sidlibc")], f"dpkg -x {libc.name}")
    headers = work / "root" / "usr" / "src" / f"linux-headers-{kernel.version}"
    makefile = headers / "Makefile"
    makefile.write_text(makefile.read_text().replace("/usr/src/", f"{work}/root/usr/src/"))
    kbuild = work / "root" / "usr" / "lib" / f"linux-kbuild-{base}"
    libdir = work / "sidlibc" / "usr" / "lib" / "x86_64-linux-gnu"
    for tool in SID_TOOLS:
        path = kbuild / tool
        path.rename(path.with_name(path.name + ".bin"))
        path.write_text(f'#!/bin/sh\nexec {libdir}/ld-linux-x86-64.so.2 --library-path '
                        f'{libdir}:/lib/x86_64-linux-gnu "$0.bin" "$@"\n')
        path.chmod(0o755)
    shutil.rmtree(debs)
    return headers


def _build(kernel: Kernel, headers: Path, work: Path, module: str, source: str) -> None:
    tarball = next((work / "root" / "usr" / "src").glob("linux-source-*.tar.xz"))
    mod = work / module
    mod.mkdir()
    run_tool(["tar", "-xJf", str(tarball), "-C", str(mod), "--strip-components", str(source.count("/") + 1),
          "--wildcards", f"*/{source}"], f"tar (the source of {module})")
    (mod / "Kbuild").write_text(f"obj-m := {module}.o\n")
    result = subprocess.run(["make", "-C", str(headers), f"M={mod}", "CC=gcc", "CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=",
                             "CONFIG_DEBUG_INFO_BTF_MODULES=", "modules"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()] or \
            result.stderr.strip().splitlines() or ["no output"]
        raise LabError(f"building {module} failed: {errors[0].strip()}", 3)
    target = built(kernel, module)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(mod / f"{module}.ko", target)
