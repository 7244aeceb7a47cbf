"""`ccscope cc list | load NAME | unload NAME`."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from ccscope.errors import PrerequisiteError, UsageError
from ccscope.host import algorithms

from . import catalog, provide, registry, structops


def register(sub) -> None:
    cc = sub.add_parser("cc", help="congestion controls: list | load NAME | unload NAME (ccscope's BPF ones)",
                        description="Show which congestion controls this kernel has, and register ccscope's "
                                    "BPF ones (vegas, westwood, copa; bpf:NAME for the BPF one next to a "
                                    "native NAME) for general use on this host.")
    cc.add_argument("action", choices=("list", "load", "unload"))
    cc.add_argument("name", nargs="?", help="algorithm (load/unload), e.g. vegas or bpf:vegas")
    cc.add_argument("--foreground", action="store_true",
                    help="load: stay in the foreground and unregister on Ctrl-C or SIGTERM")
    cc.set_defaults(func=cmd_cc)


def cmd_cc(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.name:
            raise UsageError("`ccscope cc list` takes no name")
        return _list()
    if not args.name:
        raise UsageError(f"`ccscope cc {args.action}` needs an algorithm name, e.g. vegas or bpf:vegas")
    name = catalog.normalize(args.name)
    if catalog.bpf_source(name) is None:
        raise UsageError(f"{args.name}: ccscope has no BPF implementation of it "
                         f"(BPF ones: {', '.join(catalog.BPF_ALGORITHMS)}; bpf:NAME forces one)")
    if os.geteuid() != 0:
        raise PrerequisiteError("registering congestion controls needs root", "run with sudo")
    if args.action == "load":
        return _load(args.name, name, args.foreground)
    return _unload(args.name, name)


def _list() -> int:
    kernel = provide.kernel_algorithms()
    loaded = set(algorithms.AVAILABLE.read_text().split())
    regs = registry.registrations()
    bpf_ok = structops.supported()
    names = sorted(kernel | set(catalog.BPF_ALGORITHMS) | set(regs))
    print(f"{'algorithm':<14} {'kernel':<10} {'ccscope BPF':<13} registered by ccscope now")
    for name in names:
        native = ("yes" if name in loaded and name not in regs else
                  "module" if name in kernel else "-")
        source = catalog.bpf_source(name)
        bpf = ("-" if source is None else "yes" if bpf_ok else "no struct_ops")
        reg = regs.get(name)
        now = "-"
        if reg:
            users = len(reg.live_users())
            now = f"yes (map {reg.map_id}, {users} user{'s' * (users != 1)}{', held by cc load' * reg.held})"
        print(f"{name:<14} {native:<10} {bpf:<13} {now}")
    if bpf_ok:
        print("\nbpf:NAME runs ccscope's BPF version next to a native one (registered as bpf_NAME).")
    return 0


def _load(spelled: str, name: str, foreground: bool) -> int:
    structops.require_supported(spelled)
    if foreground:
        return _load_foreground(spelled, name)
    reg, new = registry.hold(name)
    verb = "registered" if new else "already registered by ccscope; now held"
    print(f"{name}: {verb} (ccscope BPF {reg.algorithm}, map {reg.map_id}, sha256 {reg.sha256[:12]}); "
          f"stays until `ccscope cc unload {spelled}`")
    return 0


def _load_foreground(spelled: str, name: str) -> int:
    with provide.provided([name], "ccscope cc load --foreground") as chosen:
        impl = chosen[name]
        if impl.implementation != "bpf":
            raise UsageError(f"{name} is the kernel's own here; use bpf:{name} for ccscope's BPF version")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGHUP, lambda *_: stop.set())
        print(f"{name}: registered (ccscope BPF, sha256 {impl.sha256[:12]}); Ctrl-C unregisters it", flush=True)
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
    print(f"{name}: unregistered")
    return 0


def _unload(spelled: str, name: str) -> int:
    result = registry.unhold(name)
    if result is None:
        raise UsageError(f"{spelled}: not registered by ccscope (see `ccscope cc list`)")
    gone, users = result
    if gone:
        print(f"{name}: unregistered")
    else:
        whats = ", ".join(sorted({f"{u['what']} (pid {u['pid']})" for u in users}))
        print(f"{name}: still in use by {whats}; it is unregistered when they finish")
    return 0
