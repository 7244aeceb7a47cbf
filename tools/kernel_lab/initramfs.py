"""Build the guest's initramfs: static busybox, our init, and the modules, in load order."""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import PACKAGE_DIR, LabError
from .kernel import Kernel
from .prereqs import BUSYBOX

# Needed to mount the host root: a missing one is an error unless built in. What they need comes with them
# from modules.dep (9p needs netfs and fscache on 6.1, netfs alone since fscache moved into it in 6.12).
BOOT_MODULES = ("virtio_ring", "virtio", "virtio_pci", "9pnet", "9pnet_virtio", "9p")
# What ccscope's tests and emulation use; each is skipped when built in or absent. Anything else
# still loads on demand (the guest kernel's modprobe helper reads the cached module tree).
NET_MODULES = (
    "sch_netem", "sch_fq", "sch_tbf", "sch_htb", "sch_prio", "sch_ingress", "veth", "ifb",
    "tcp_vegas", "tcp_westwood", "tcp_bbr", "tcp_dctcp",
    "sch_codel", "sch_fq_codel", "sch_pie", "sch_fq_pie", "sch_cake", "sch_dualpi2",
    "act_mirred", "cls_u32", "cls_bpf", "cls_matchall",
    "nfnetlink_queue", "nf_tables", "nft_compat", "nft_queue", "xt_NFQUEUE", "xt_statistic",
    "iptable_filter", "iptable_mangle", "ip6table_filter", "ip6table_mangle",
    "virtio_rng",
)
# Module parameters: no ifb0/ifb1 appearing behind the back of code that makes its own.
PARAMS = {"ifb": "numifbs=0"}


@dataclass
class ModulePlan:
    order: list[tuple[str, str]] = field(default_factory=list)  # (name, path relative to modules dir)
    builtin: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)


def _name(path: str) -> str:
    base = os.path.basename(path)
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base.replace("-", "_")


def _read_dep(kernel: Kernel) -> dict[str, tuple[str, list[str]]]:
    deps: dict[str, tuple[str, list[str]]] = {}
    try:
        text = (kernel.modules_dir / "modules.dep").read_text()
    except OSError:
        raise LabError(f"{kernel.modules_dir}/modules.dep missing (run: tools/kernel-lab fetch --refresh)",
                       3) from None
    for line in text.splitlines():
        path, _, rest = line.partition(":")
        deps[_name(path)] = (path, [_name(d) for d in rest.split()])
    return deps


def _builtin(kernel: Kernel) -> set[str]:
    try:
        return {_name(line) for line in (kernel.modules_dir / "modules.builtin").read_text().split()}
    except OSError:
        return set()


def plan(kernel: Kernel) -> ModulePlan:
    """Modules to insmod, dependencies first (insmod resolves nothing by itself)."""
    deps, builtin = _read_dep(kernel), _builtin(kernel)
    result, seen = ModulePlan(), set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        path, needs = deps[name]
        for dep in needs:
            visit(dep)
        result.order.append((name, path))

    for name in (*BOOT_MODULES, *NET_MODULES):
        if name in deps:
            visit(name)
        elif name in builtin:
            result.builtin.append(name)
        elif name in BOOT_MODULES:
            raise LabError(f"kernel {kernel.version} has no {name} module: cannot mount the host root", 3)
        else:
            result.absent.append(name)
    return result


def _fingerprint(kernel: Kernel, modules: ModulePlan) -> str:
    digest = hashlib.sha256(kernel.version.encode())
    for name in ("init.sh", "klab-modprobe"):
        digest.update((PACKAGE_DIR / name).read_bytes())
    digest.update(repr(modules.order).encode() + repr(PARAMS).encode())
    stat = os.stat(BUSYBOX)
    digest.update(f"{stat.st_size}:{stat.st_mtime_ns}:{kernel.root}".encode())
    return digest.hexdigest()[:12]


def path_for(kernel: Kernel) -> Path:
    return kernel.root.parent / f"initrd-{_fingerprint(kernel, plan(kernel))}.gz"


def ensure(kernel: Kernel) -> Path:
    """The cached initramfs for this kernel and this version of the lab, built when missing."""
    modules = plan(kernel)
    target = kernel.root.parent / f"initrd-{_fingerprint(kernel, modules)}.gz"
    if target.is_file():
        return target
    for old in kernel.root.parent.glob("initrd-*.gz"):
        old.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=kernel.root.parent, prefix="initrd-") as tmp:
        tree = Path(tmp) / "tree"
        _populate(tree, kernel, modules)
        archive = Path(tmp) / "initrd.gz"
        _pack(tree, archive)
        archive.rename(target)
    return target


def _populate(tree: Path, kernel: Kernel, modules: ModulePlan) -> None:
    for sub in ("bin", "sbin", "etc", "proc", "sys", "dev", "run", "modules"):
        (tree / sub).mkdir(parents=True)
    shutil.copy2(BUSYBOX, tree / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=False).stdout.split()
    if "sh" not in applets:
        raise LabError(f"{BUSYBOX} has no sh applet (install busybox-static)", 3)
    for applet in applets:
        if applet != "busybox":
            (tree / "bin" / applet).symlink_to("busybox")
    shutil.copy2(PACKAGE_DIR / "init.sh", tree / "init")
    shutil.copy2(PACKAGE_DIR / "klab-modprobe", tree / "sbin" / "klab-modprobe")
    os.chmod(tree / "init", 0o755)
    os.chmod(tree / "sbin" / "klab-modprobe", 0o755)
    (tree / "etc" / "klab.conf").write_text(f"KLAB_MODROOT='{kernel.root}'\n")
    lines = []
    for name, rel in modules.order:
        _copy_module(kernel.modules_dir / rel, tree / "modules" / f"{name}.ko")
        lines.append(f"{name}.ko {PARAMS.get(name, '')}".rstrip())
    (tree / "modules" / "load.order").write_text("\n".join(lines) + "\n")


def _copy_module(source: Path, dest: Path) -> None:
    # busybox insmod takes plain .ko files only.
    if source.suffix == ".xz":
        dest.write_bytes(lzma.decompress(source.read_bytes()))
    elif source.suffix == ".gz":
        dest.write_bytes(gzip.decompress(source.read_bytes()))
    elif source.suffix == ".zst":
        raise LabError(f"{source.name}: zstd-compressed modules are not supported", 3)
    else:
        shutil.copy2(source, dest)


def _pack(tree: Path, archive: Path) -> None:
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    result = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"], cwd=tree,
                            input="\n".join([".", *files]).encode() + b"\n",
                            capture_output=True, check=False)
    if result.returncode != 0:
        raise LabError(f"cpio failed: {result.stderr.decode(errors='replace').strip()}", 3)
    archive.write_bytes(gzip.compress(result.stdout, compresslevel=6))
