"""Boot the kernel under qemu (TCG), run one command in the guest and bring back its status and output."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import EXIT_LAB, EXIT_TIMEOUT, LabError, cache_dir
from .kernel import Kernel

# KERNEL_LAB_QEMU picks another qemu binary (and lets the tests check the error when there is none).
QEMU = os.environ.get("KERNEL_LAB_QEMU", "qemu-system-x86_64")
GUEST_CTL = "/run/kernel-lab"
GUEST_PATH = f"{GUEST_CTL}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host variables the command sees in the guest as well (CI decides skip-versus-fail in tests),
# besides every CCSCOPE_* and KERNEL_LAB_* one.
PASSED_ENV = ("CI", "TERM", "LANG", "LC_ALL", "PYTHONPATH")
PR_SET_PDEATHSIG = 1
PANIC = re.compile(r"Kernel panic - [^\r\n]*")
PANIC_CONSOLE = "last-panic-console.log"


@dataclass
class RunSpec:
    argv: list[str]
    cwd: str
    timeout: float = 600.0
    memory_mb: int = 2048
    cpus: int = 2
    shares: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    show_console: bool = False


def _die_with_parent() -> None:
    """qemu must not outlive the lab, even when the lab is SIGKILLed."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def guest_home() -> Path:
    """HOME in the guest: a writable share that persists, so caches (matplotlib's font list, which takes
    a minute to build under TCG) survive between boots."""
    return cache_dir() / "guest-home"


def _command_script(spec: RunSpec, kernel: Kernel) -> str:
    env = {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith(("CCSCOPE_", "KERNEL_LAB_"))}
    # Python's compiled modules go to the guest's home, which persists: the read-only host root has none where
    # the host wrote none (CI's fresh clone), and each `ccscope scenario run` compiled ~100 modules, 1.3 s
    # under TCG, every time. With a prefix Python reads no __pycache__ beside the sources, so the first boot
    # also compiles the standard library's and the venv's modules, once.
    env.update({
        "PATH": GUEST_PATH, "HOME": str(guest_home()), "PYTHONPYCACHEPREFIX": str(guest_home() / "pycache"),
        "PYTHONUNBUFFERED": "1", "KERNEL_LAB": "1",
        "KERNEL_LAB_KERNEL": kernel.version,
    })
    env.update(spec.env)
    lines = ["# written by tools/kernel-lab"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    cwd = shlex.quote(spec.cwd)
    lines.append(f"cd {cwd} || {{ echo 'kernel-lab: cannot cd to '{cwd}' in the guest' >&2; exit {EXIT_LAB}; }}")
    lines.append("exec " + " ".join(shlex.quote(a) for a in spec.argv))
    return "\n".join(lines) + "\n"


def _prepare_ctl(ctl: Path, spec: RunSpec, kernel: Kernel) -> None:
    shares = "\n".join(f"klabshare{i}={path}" for i, path in enumerate(_all_shares(spec)))
    (ctl / "config.sh").write_text(f"KLAB_SHARES={shlex.quote(shares)}\n")
    (ctl / "cmd.sh").write_text(_command_script(spec, kernel))
    (ctl / "bin").mkdir()
    # `modprobe X` typed in the guest: the host has no /lib/modules for this kernel.
    wrapper = ctl / "bin" / "modprobe"
    wrapper.write_text(f"#!/bin/sh\nexec /sbin/modprobe -d {shlex.quote(str(kernel.root))} \"$@\"\n")
    wrapper.chmod(0o755)
    for name in ("stdout", "stderr"):
        (ctl / name).touch()


def qemu_command(kernel: Kernel, initrd: Path, ctl: Path, spec: RunSpec) -> list[str]:
    # thread=single: all vCPUs take turns in one host thread. With one thread per vCPU (qemu's default), a 7.2
    # guest panicked now and then (the fresh-clone CI of 454a740, mid-scenario, its console lost); here, once
    # in two boots, of "Oops: int3" 2.2 s into boot at a static branch that the kernel had just patched live
    # (sched_clock_idle_wakeup_event): a vCPU ran an int3 that the kernel's text_poke had already taken back
    # and no longer claimed. qemu can link a block translated from the int3 after another vCPU's write has
    # invalidated the page's blocks (tb_gen_code reads the bytes unlocked and does not read them again).
    # Taking turns, no translation overlaps another vCPU's write (the mechanism is read from qemu's source, not
    # traced in qemu; about 35 boots since, none panicked). What it costs: nothing in throughput (twelve
    # prague+cubic runs through the kernel's DualPI2 carried 1.903 Mbit/s on average either way, in 150 s of
    # guest either way); a guest process runs a little later, and ccscope's delay line in the guest held
    # prague's queue 0.8-1.8 ms above the kernel's DualPI2 over four boots, against up to 1 ms before.
    cmd = [
        QEMU, "-machine", "pc", "-accel", "tcg,thread=single", "-cpu", "max", "-smp", str(spec.cpus),
        "-m", str(spec.memory_mb),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-monitor", "none",
        "-serial", f"file:{ctl / 'console.log'}", "-nic", "none",
        "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd),
        # idle=halt: with -cpu max the guest idles in MWAIT, which qemu's TCG runs as a no-op when there is more
        # than one vCPU, so an idle vCPU spun in its turn until qemu's 100 ms round-robin kick. A guest process
        # waking from time.sleep(0.001) then waited up to 112 ms (p99 12.9 ms); with HLT, 4.7 ms (p99 1.7).
        "-append", "console=ttyS0 panic=-1 loglevel=3 quiet idle=halt",
        # The host root, read-only; multidevs=remap keeps inode numbers unique across host mounts.
        "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=klabctl,path={ctl},security_model=none",
        "-device", "virtio-9p-pci,fsdev=klabctl,mount_tag=klabctl",
        "-device", "virtio-rng-pci",
    ]
    for i, path in enumerate(_all_shares(spec)):
        cmd += ["-fsdev", f"local,id=klabshare{i},path={path},security_model=none",
                "-device", f"virtio-9p-pci,fsdev=klabshare{i},mount_tag=klabshare{i}"]
    return cmd


GUEST_TMPFS = ("/tmp", "/run")  # the guest mounts its own tmpfs over these


def _all_shares(spec: RunSpec) -> list[str]:
    """guest HOME, then the working directory if the guest's tmpfs would hide it (a checkout under /tmp, as
    CI may use), then the --share directories (after it, so ones nested in it are mounted on top)."""
    cwd = os.path.realpath(spec.cwd)
    hidden = any(cwd == d or cwd.startswith(d + "/") for d in GUEST_TMPFS)
    return [str(guest_home()), *([cwd] if hidden else []), *spec.shares]


class _Forwarder:
    """Copies what the guest appends to a file in the control share to one of our streams."""

    def __init__(self, path: Path, stream) -> None:
        self.path, self.stream, self.offset = path, stream, 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        if data:
            self.offset += len(data)
            self.stream.buffer.write(data)
            self.stream.flush()


def run(kernel: Kernel, initrd: Path, spec: RunSpec) -> int:
    if shutil.which(QEMU) is None:
        raise LabError(f"{QEMU} not found (install it: apt-get install qemu-system-x86)", 3)
    for share in spec.shares:
        if not os.path.isdir(share):
            raise LabError(f"--share {share}: not a directory", 2)
    guest_home().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kernel-lab-") as tmp:
        ctl = Path(tmp)
        _prepare_ctl(ctl, spec, kernel)
        return _boot(kernel, initrd, ctl, spec)


def _boot(kernel: Kernel, initrd: Path, ctl: Path, spec: RunSpec) -> int:
    out = [_Forwarder(ctl / "stdout", sys.stdout), _Forwarder(ctl / "stderr", sys.stderr)]
    if spec.show_console:
        out.append(_Forwarder(ctl / "console.log", sys.stderr))
    with open(ctl / "qemu.log", "wb") as qemu_log:
        try:
            proc = subprocess.Popen(qemu_command(kernel, initrd, ctl, spec), stdin=subprocess.DEVNULL,
                                    stdout=qemu_log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        except OSError as err:
            raise LabError(f"cannot start {QEMU}: {err.strerror}", 3) from None
    started = time.monotonic()
    timed_out = False
    try:
        while proc.poll() is None:
            if time.monotonic() - started > spec.timeout:
                timed_out = True
                break
            for f in out:
                f.pump()
            time.sleep(0.1)
    finally:
        # On timeout, Ctrl-C or any error: nothing stays running.
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in out:
            f.pump()
        kept = _keep_console(ctl, kernel)
    if timed_out:
        raise LabError(f"guest did not finish within {spec.timeout:g} s; killed qemu (console: {kept})",
                       EXIT_TIMEOUT)
    return _exit_status(ctl, proc.returncode, kept)


def _keep_console(ctl: Path, kernel: Kernel) -> Path:
    """Copies the console to the cache, where its error line points: last-console-VERSION.log (the suite boots
    two kernels at once), and last-panic-console.log too when the guest panicked, which the boots that follow
    do not overwrite (the CI run of 454a740 lost its oops so)."""
    kept = cache_dir() / f"last-console-{kernel.version}.log"
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctl / "console.log", kept)
        if PANIC.search((ctl / "console.log").read_text(errors="replace")):
            shutil.copyfile(ctl / "console.log", cache_dir() / PANIC_CONSOLE)
    except OSError:
        pass
    return kept


# What starts an oops report: 6.x's "BUG: ...", "general protection fault, ...", "kernel BUG at f:l!", "Oops: int3:
# 0000 [#1]", and before ~6.10 the same without "Oops: " ("int3: 0000 [#1] SMP NOPTI", "invalid opcode: ...").
OOPS = re.compile(r"(?:BUG: |general protection fault|kernel BUG at |Oops: |[a-z][a-z0-9 ]*: [0-9a-f]{4} \[#\d+\])"
                  r"[^\r\n]*")
RIP = re.compile(r"RIP: [0-9a-f]{4}:([^\r\n]+)")


def crash_site(console: str) -> str:
    """The cause of the oops that led to the panic and the function it stopped in, from a panicked guest's
    console: "BUG: kernel NULL pointer dereference, address: 0000000000000008 at dualpi2_timer+0x6a/0x1f0
    [sch_dualpi2]", or "" when it has neither. The oops is the first numbered one ("[#1]"; a second CPU's may
    follow) or else the last report before the panic; the RIP is the first after it (an earlier warning prints
    a RIP of its own)."""
    panic = PANIC.search(console)
    before = console[:panic.start()] if panic else console
    reports = list(OOPS.finditer(before))
    if not reports:
        return ""
    first = next((i for i, m in enumerate(reports) if "[#1]" in m.group(0)), len(reports) - 1)
    shown = reports[first - 1] if first and _names_the_cause(before, reports[first - 1], reports[first]) \
        else reports[first]
    rip = RIP.search(before, reports[first].end())
    return shown.group(0).strip() + (f" at {rip.group(1).strip()}" if rip else "")


def _names_the_cause(console: str, line: re.Match, oops: re.Match) -> bool:
    """Whether the report line before the oops says more than it: "kernel BUG at f:l!" right before its
    "invalid opcode: 0000 [#1]", or a page fault's "BUG: ..." (what was touched) with only #PF and page table
    lines between."""
    between = console[line.end():oops.start()].splitlines()[1:-1]  # the lines wholly between the two
    if line.group(0).startswith("kernel BUG at "):
        return not between
    return line.group(0).startswith("BUG: ") and len(between) <= 6 and any("#PF:" in x for x in between)


def _exit_status(ctl: Path, qemu_status: int, kept: Path) -> int:
    try:
        return int((ctl / "rc").read_text().strip())
    except (OSError, ValueError):
        pass
    console = (ctl / "console.log").read_text(errors="replace") if (ctl / "console.log").exists() else ""
    marker = re.search(r"KERNEL-LAB-EXIT (\d+)", console)
    if marker:
        return int(marker.group(1))
    failure = re.search(r"KERNEL-LAB-FAIL (.*)", console)
    panic = PANIC.search(console)
    where = f"(console: {kept})"
    if failure:
        raise LabError(f"guest init failed: {failure.group(1).strip()} {where}")
    if panic:
        site = crash_site(console)
        raise LabError(f"guest {panic.group(0).strip()}{'; ' + site if site else ''} "
                       f"(console: {cache_dir() / PANIC_CONSOLE})")
    qemu_said = (ctl / "qemu.log").read_text(errors="replace").strip().splitlines()
    if qemu_status != 0 and qemu_said:
        raise LabError(f"qemu exited with status {qemu_status}: {qemu_said[-1]}")
    raise LabError(f"guest stopped without reporting an exit status {where}")
