"""tools/kernel-lab: fetch | info | run -- COMMAND..."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys

from . import EXIT_LAB, LabError, cache_dir, extra_modules, initramfs, kernel, prereqs, vm

USAGE_EXAMPLES = """examples:
  tools/kernel-lab fetch                      download the newest linux-image-6.1.0-*-amd64 into the cache
  tools/kernel-lab fetch --kernel 7.2         sid's 7.2 (codel, fq_codel, pie, cake, dctcp, AccECN)
  tools/kernel-lab info                       what is cached, which modules load
  tools/kernel-lab run -- uname -r            boot, run a command inside, exit with its status
  tools/kernel-lab run --share /tmp/out -- sh -c 'tc qdisc add dev lo root netem delay 5ms; ...'
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise LabError(f"{message} (see: tools/kernel-lab --help)", 2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kernel-lab", description=__doc__, epilog=USAGE_EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True, parser_class=_Parser)
    fetch = sub.add_parser("fetch", help="download and unpack the kernel, build the initramfs")
    fetch.add_argument("--package", help="a kernel image package (default: the series' newest)")
    fetch.add_argument("--refresh", action="store_true", help="look for a newer package than the cached one")
    info = sub.add_parser("info", help="show the cached kernel and its modules")
    info.add_argument("--json", action="store_true")
    run = sub.add_parser("run", help="boot and run COMMAND in the guest; exit with its status")
    known = ", ".join(f"{s.name} ({s.suite})" for s in kernel.SERIES.values())
    for action in (fetch, info, run):
        action.add_argument("--kernel", default=kernel.DEFAULT_SERIES, metavar="SERIES",
                            help=f"the kernel series: {known} (default {kernel.DEFAULT_SERIES})")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds for boot and command (default 600)")
    run.add_argument("--memory", type=int, default=2048, help="guest memory in MiB (default 2048)")
    run.add_argument("--cpus", type=int, default=2, help="guest CPUs (default 2)")
    run.add_argument("--share", action="append", default=[], metavar="DIR",
                     help="host directory mounted writable at the same path in the guest (repeatable)")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    run.add_argument("--cwd", help="working directory in the guest (default: the current one)")
    run.add_argument("--console", action="store_true", help="also show the guest console")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def _prepare(series: str) -> tuple[kernel.Kernel, object]:
    prereqs.ensure()
    k = kernel.fetch(series)
    _extra_modules(k, series)
    return k, initramfs.ensure(k)


def _extra_modules(k: kernel.Kernel, series: str) -> None:
    """What the series' config leaves out, built once; a failed build costs only those modules."""
    try:
        with kernel.locked():
            extra_modules.ensure(k, series)
    except LabError as err:
        print(f"kernel-lab: warning: {err}; booting without it", file=sys.stderr)


def _fetch(args: argparse.Namespace) -> int:
    prereqs.ensure()
    k = kernel.fetch(args.kernel, package=args.package, refresh=args.refresh)
    _extra_modules(k, args.kernel)
    initrd = initramfs.ensure(k)
    print(f"kernel-lab: {k.package} ready: {k.vmlinuz} {initrd}")
    return 0


def _info(args: argparse.Namespace) -> int:
    k = kernel.cached(kernel.series(args.kernel).name)
    qemu = subprocess.run([vm.QEMU, "--version"], capture_output=True, text=True, check=False) \
        if shutil.which(vm.QEMU) else None
    data: dict[str, object] = {
        "cache": str(cache_dir()),
        "missing_prerequisites": prereqs.missing(),
        "qemu": qemu.stdout.splitlines()[0] if qemu and qemu.stdout else None,
        "kernel": k.version if k else None,
    }
    if k:
        modules = initramfs.plan(k)
        initrd = initramfs.path_for(k)
        data.update({
            "package": k.package, "vmlinuz": str(k.vmlinuz),
            "initramfs": str(initrd) if initrd.is_file() else None,
            "modules_loaded_at_boot": [name for name, _ in modules.order],
            "builtin": modules.builtin, "absent": modules.absent,
            "btf": kernel.config_value(k, "DEBUG_INFO_BTF"),
        })
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for key, value in data.items():
        shown = " ".join(value) if isinstance(value, list) else value
        print(f"{key + ':':24} {shown if shown not in (None, '') else '-'}")
    if not k:
        print(f"(nothing cached yet: run tools/kernel-lab fetch --kernel {args.kernel})")
    return 0


def _run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise LabError("run needs a command: tools/kernel-lab run -- COMMAND [ARGS...]", 2)
    if args.timeout <= 0 or args.memory < 256 or args.cpus < 1:
        raise LabError("--timeout must be > 0, --memory >= 256, --cpus >= 1", 2)
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LabError(f"--env {item}: expected NAME=VALUE", 2)
        env[name] = value
    hidden = [d for d in ("/tmp", "/run", "/var/tmp", "/boot") if str(cache_dir()).startswith(d + "/")]
    if hidden:
        # The guest reads modules from the cache through the host root, where these are its own tmpfs.
        raise LabError(f"the cache {cache_dir()} is under {hidden[0]}, which the guest does not see; "
                       "set KERNEL_LAB_CACHE elsewhere", 2)
    k, initrd = _prepare(args.kernel)
    spec = vm.RunSpec(argv=command, cwd=args.cwd or os.getcwd(), timeout=args.timeout,
                      memory_mb=args.memory, cpus=args.cpus, env=env, show_console=args.console,
                      shares=[os.path.abspath(s) for s in args.share])
    return vm.run(k, initrd, spec)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (e.g. a test runner's timeout) unwinds like Ctrl-C, so qemu is killed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        args = _parser().parse_args(argv)
        return {"fetch": _fetch, "info": _info, "run": _run}[args.action](args)
    except LabError as err:
        print(f"kernel-lab: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("kernel-lab: error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the promise is one line, never a traceback
        print(f"kernel-lab: error: internal error: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_LAB
