"""Whose flow is it: cgroup id -> cgroup path -> container and Kubernetes pod, and the labels they become.

The kernel side records, per flow, the socket's cgroup v2 id (the inode number of the cgroup's directory)
and the process that connected or listened. Here the id is resolved to a path with a cache that follows
cgroup creations and deletions through inotify (no walk of the hierarchy per scrape); container IDs and pod
UIDs are parsed from the path by a table of the names kubelet, containerd, CRI-O and docker give their
cgroups; pod names and namespaces come from the kubelet's pod log directory
(/var/log/pods/<namespace>_<pod>_<uid>/), so no API server access is needed.

A deleted cgroup keeps its path while anything still refers to it; `expired()` says which ids have been
gone for longer than the grace period, so their series can vanish as closed flows' do.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import re
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import PrerequisiteError, UsageError

DEFAULT_POD_LOGS = Path("/var/log/pods")
LABEL_OPTIONS = ("comm", "cgroup", "container", "pod")
POD_LABELS = ("pod", "namespace", "pod_uid")
OTHER = "other"  # the cgroup label of aggregates beyond --max-cgroups; no cgroup path looks like it
RESCAN_INTERVAL_S = 1.0  # at most one walk of the hierarchy (or the pod log directory) per second


def cgroup2_mount(mounts: str | None = None) -> Path:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified in hybrid mode."""
    if mounts is None:
        mounts = Path("/proc/mounts").read_text()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1].replace("\\040", " "))
    raise PrerequisiteError("no cgroup v2 hierarchy is mounted (needed for --labels cgroup, container, pod)",
                            "mount it: mount -t cgroup2 none /sys/fs/cgroup/unified, or drop those labels")


def hierarchy_root(path: Path) -> Path:
    """--cgroup-root DIR: the cgroup v2 root itself, or a host's /sys/fs/cgroup mounted elsewhere (e.g. in a
    container at /host/sys/fs/cgroup), where a hybrid host keeps v2 in `unified/`."""
    for candidate in (path, path / "unified"):
        if (candidate / "cgroup.controllers").is_file():
            return candidate
    raise UsageError(f"--cgroup-root {path} is not a cgroup v2 hierarchy (no cgroup.controllers there or in "
                     f"{path / 'unified'})")


# --- container and pod from a cgroup path -------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One way a runtime names a cgroup directory. `parent` restricts a bare ID to where that layout puts it."""

    field: str      # "pod" (a pod UID) or "container" (a container ID)
    layout: str     # for humans and tests: which driver/runtime names it so
    pattern: re.Pattern[str]
    parent: re.Pattern[str] | None = None


_HEX64 = r"(?P<id>[0-9a-f]{64})"
_UID = r"(?P<id>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"

RULES: tuple[Rule, ...] = (
    # kubelet, systemd driver: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice
    Rule("pod", "systemd", re.compile(rf"^kubepods(?:-[a-z]+)*-pod{_UID}\.slice$")),
    # kubelet, cgroupfs driver: kubepods/burstable/pod<uid>
    Rule("pod", "cgroupfs", re.compile(rf"^pod{_UID}$")),
    # systemd driver scopes: containerd, CRI-O, docker (also docker's own system.slice/docker-<id>.scope)
    Rule("container", "containerd", re.compile(rf"^cri-containerd-{_HEX64}\.scope$")),
    Rule("container", "cri-o", re.compile(rf"^crio-{_HEX64}\.scope$")),
    Rule("container", "docker", re.compile(rf"^docker-{_HEX64}\.scope$")),
    # cgroupfs driver: the bare ID under its pod, and plain docker's /docker/<id>
    Rule("container", "cgroupfs", re.compile(rf"^{_HEX64}$"), parent=re.compile(rf"^pod{_UID}$")),
    Rule("container", "docker-cgroupfs", re.compile(rf"^{_HEX64}$"), parent=re.compile(r"^docker$")),
)


@dataclass(frozen=True)
class Workload:
    container: str = ""  # container ID (64 hex digits), "" outside containers
    pod_uid: str = ""    # Kubernetes pod UID with dashes, "" outside pods


def parse_workload(path: str) -> Workload:
    """Container ID and pod UID named by a cgroup path (the innermost match of each wins)."""
    found = {"pod": "", "container": ""}
    parent = ""
    for part in path.strip("/").split("/"):
        for rule in RULES:
            if rule.parent is not None and not rule.parent.match(parent):
                continue
            if match := rule.pattern.match(part):
                found[rule.field] = match.group("id").replace("_", "-")
                break
        parent = part
    return Workload(container=found["container"], pod_uid=found["pod"])


def truncate(path: str, depth: int) -> str:
    """The first `depth` components of a cgroup path (0: all): bounds the cgroup label's cardinality."""
    if depth <= 0:
        return path
    parts = path.strip("/").split("/")
    return "/" + "/".join(parts[:depth])


# --- cgroup id -> path -------------------------------------------------------------------------------------


_libc = ctypes.CDLL(None, use_errno=True)
IN_CREATE, IN_DELETE, IN_DELETE_SELF = 0x100, 0x200, 0x400
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x4000, 0x8000, 0x40000000
IN_ONLYDIR = 0x1000000
_EVENT = struct.Struct("iIII")


class _Inotify:
    """Directory creations and deletions under watched directories; non-blocking, drained by the caller."""

    def __init__(self) -> None:
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")

    def watch(self, path: str) -> int:
        """Watch descriptor, or -1 (directory gone already, or out of watches: rescans then cover it)."""
        return _libc.inotify_add_watch(self.fd, os.fsencode(path), IN_CREATE | IN_DELETE | IN_ONLYDIR)

    def read(self) -> list[tuple[int, int, str]]:
        events = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                events.append((wd, mask, os.fsdecode(name)))
                offset += _EVENT.size + length

    def close(self) -> None:
        os.close(self.fd)


class CgroupResolver:
    """cgroup v2 id -> path (relative to the mount, "/" for the root), following mkdir and rmdir.

    A walk of the hierarchy happens at start, after an inotify queue overflow, and on a lookup miss, at
    most once per RESCAN_INTERVAL_S: a storm of unknown ids costs one walk, not one each. Thread-safe: the
    daemon's scrapes, its maintenance loop and the live page's sample thread (--cgroup) all ask.
    """

    def __init__(self, root: Path | None = None, clock=time.monotonic, follow: bool = True) -> None:
        self.root = hierarchy_root(Path(root)) if root is not None else cgroup2_mount()
        self._clock = clock
        self._paths: dict[int, str] = {}
        self._ids: dict[str, int] = {}
        self._watches: dict[int, str] = {}  # inotify watch descriptor -> path
        self._watched: set[str] = set()
        self._gone: dict[int, float] = {}  # id -> when it was deleted (or first found unresolvable)
        self._last_scan = float("-inf")
        self._lock = threading.RLock()
        self.scans = 0
        self._inotify: _Inotify | None = None  # without it: rescans on misses only
        if follow:
            with contextlib.suppress(OSError):
                self._inotify = _Inotify()
        self._scan()

    def close(self) -> None:
        with self._lock:
            if self._inotify:
                self._inotify.close()
                self._inotify = None

    def path(self, cgroup_id: int) -> str | None:
        """The cgroup's path; a deleted cgroup keeps its last path until forget(); None if never seen."""
        with self._lock:
            self.refresh()
            path = self._paths.get(cgroup_id)
            if path is None and cgroup_id and self._clock() - self._last_scan >= RESCAN_INTERVAL_S:
                self._scan()
                path = self._paths.get(cgroup_id)
            if path is None and cgroup_id:
                self._gone.setdefault(cgroup_id, self._clock())  # it will not appear later: ids are not reused
            return path

    def refresh(self) -> None:
        """Apply the creations and deletions inotify has queued since the last call."""
        with self._lock:
            for wd, mask, name in self._inotify.read() if self._inotify else ():
                if mask & IN_Q_OVERFLOW:
                    self._scan()
                    continue
                if mask & IN_IGNORED:
                    self._watched.discard(self._watches.pop(wd, ""))
                    continue
                parent = self._watches.get(wd)
                if parent is None or not mask & IN_ISDIR:
                    continue
                path = f"{parent.rstrip('/')}/{name}"
                if mask & IN_CREATE:
                    self._add_tree(path)
                elif mask & IN_DELETE:
                    self._mark_deleted(path)

    def expired(self, grace_s: float) -> set[int]:
        """Ids deleted (or never resolvable) for longer than grace_s."""
        now = self._clock()
        with self._lock:
            return {cid for cid, since in self._gone.items() if now - since > grace_s}

    def forget(self, ids: Iterable[int]) -> None:
        """Drop deleted ids nothing refers to any more."""
        with self._lock:
            for cid in ids:
                self._gone.pop(cid, None)
                path = self._paths.pop(cid, None)
                if path is not None and self._ids.get(path) == cid:
                    del self._ids[path]

    def __len__(self) -> int:
        return len(self._paths)

    # --- internals ---------------------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return str(self.root) + ("" if path == "/" else path)

    def _scan(self) -> None:
        self._last_scan = self._clock()
        self.scans += 1
        seen = set(self._walk("/"))
        for path, cid in list(self._ids.items()):
            if path not in seen or self._ids.get(path) != cid:
                self._mark_deleted(path)

    def _walk(self, top: str) -> Iterable[str]:
        """Record `top` and every cgroup below it; yields their paths."""
        stack = [top]
        while stack:
            path = stack.pop()
            try:
                cid = os.stat(self._full(path)).st_ino
                entries = list(os.scandir(self._full(path)))
            except OSError:
                continue  # removed while we walked
            self._record(path, cid)
            yield path
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(f"{path.rstrip('/')}/{entry.name}")

    def _add_tree(self, path: str) -> None:
        for _ in self._walk(path):
            pass

    def _record(self, path: str, cid: int) -> None:
        old = self._ids.get(path)
        if old is not None and old != cid:
            self._gone.setdefault(old, self._clock())  # same name, new cgroup
        self._ids[path] = cid
        self._paths[cid] = path
        self._gone.pop(cid, None)
        if self._inotify and path not in self._watched:
            wd = self._inotify.watch(self._full(path))
            if wd >= 0:
                self._watches[wd] = path
                self._watched.add(path)

    def _mark_deleted(self, path: str) -> None:
        prefix = path.rstrip("/") + "/"
        for known, cid in list(self._ids.items()):
            if known == path or known.startswith(prefix):
                del self._ids[known]
                self._gone.setdefault(cid, self._clock())


# --- pod UID -> namespace and name ------------------------------------------------------------------------


class PodDirectory:
    """The kubelet's pod log directory, /var/log/pods/<namespace>_<pod>_<uid>/, read on a miss (rate-limited)."""

    def __init__(self, root: Path = DEFAULT_POD_LOGS, clock=time.monotonic) -> None:
        self.root = Path(root)
        self._clock = clock
        self._pods: dict[str, tuple[str, str]] = {}
        self._last_scan = float("-inf")

    def lookup(self, uid: str) -> tuple[str, str]:
        """(namespace, name) of a pod UID; ("", "") when its directory is not (yet) there."""
        if uid not in self._pods and self._clock() - self._last_scan >= RESCAN_INTERVAL_S:
            self._scan()
        return self._pods.get(uid, ("", ""))

    def _scan(self) -> None:
        self._last_scan = self._clock()
        try:
            names = os.listdir(self.root)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise UsageError(f"--pod-logs {self.root}: {exc.strerror}") from None
            return
        for name in names:
            parts = name.split("_")  # namespaces and pod names are DNS names: no "_" in them
            if len(parts) == 3:
                namespace, pod, uid = parts
                self._pods[uid] = (namespace, pod)


# --- labels ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attribution:
    cgroup: str = ""     # path, truncated to --cgroup-depth
    container: str = ""
    pod: str = ""
    namespace: str = ""
    pod_uid: str = ""


UNATTRIBUTED = Attribution()


@dataclass(frozen=True)
class LabelOptions:
    """--labels comm,cgroup,container,pod and --cgroup-depth: which attribution labels series carry."""

    chosen: tuple[str, ...] = ()
    cgroup_depth: int = 0

    @classmethod
    def parse(cls, text: str | None, cgroup_depth: int = 0) -> LabelOptions:
        chosen = cls._names(text) if text is not None else ()
        if not 0 <= cgroup_depth <= 64:
            raise UsageError(f"--cgroup-depth {cgroup_depth} is out of range 0..64")
        return cls(tuple(c for c in LABEL_OPTIONS if c in chosen), cgroup_depth)

    @staticmethod
    def _names(text: str) -> tuple[str, ...]:
        """The flag's list as typed: an empty list, an empty name or a name given twice is a mistake, said so."""
        names = [p.strip() for p in text.split(",")]
        if not any(names):
            raise UsageError(f"--labels {text!r}: no label named (any of {','.join(LABEL_OPTIONS)}; "
                             "leave the flag out for none)")
        for i, name in enumerate(names):
            if not name:
                raise UsageError(f"--labels {text!r}: an empty name between commas (e.g. comm,pod)")
            if name not in LABEL_OPTIONS:
                raise UsageError(f"--labels {name!r} is not one of {','.join(LABEL_OPTIONS)}")
            if name in names[:i]:
                raise UsageError(f"--labels {text!r}: {name} is listed twice")
        return tuple(names)

    @property
    def enabled(self) -> bool:
        return bool(self.chosen)

    @property
    def needs_cgroups(self) -> bool:
        """cgroup, container and pod all come from the cgroup path."""
        return any(c != "comm" for c in self.chosen)

    @functools.cached_property
    def flow_labels(self) -> tuple[str, ...]:
        """Label names added to ccscope_flow_* series, in this order."""
        return tuple(n for c in self.chosen for n in (POD_LABELS if c == "pod" else (c,)))

    @functools.cached_property
    def group_labels(self) -> tuple[str, ...]:
        """Label names of the by-cgroup host aggregates: the flow labels that depend on the cgroup only."""
        return tuple(n for n in self.flow_labels if n != "comm")

    def values(self, attribution: Attribution, comm: str = "") -> list[str]:
        return [comm if n == "comm" else getattr(attribution, n) for n in self.flow_labels]

    def group_values(self, attribution: Attribution) -> tuple[str, ...]:
        return tuple(getattr(attribution, n) for n in self.group_labels)


class Attributor:
    """cgroup id -> Attribution, cached per id; the one object exporter, flows and trace ask."""

    def __init__(self, resolver: CgroupResolver, pods: PodDirectory, cgroup_depth: int = 0) -> None:
        self.resolver = resolver
        self.pods = pods
        self.cgroup_depth = cgroup_depth
        self._cache: dict[int, Attribution] = {}

    def __call__(self, cgroup_id: int) -> Attribution:
        cached = self._cache.get(cgroup_id)
        if cached is not None and (cached.pod or not cached.pod_uid):
            return cached
        path = self.resolver.path(cgroup_id) if cgroup_id else None
        if path is None:
            return UNATTRIBUTED
        workload = parse_workload(path)
        namespace, pod = self.pods.lookup(workload.pod_uid) if workload.pod_uid else ("", "")
        found = Attribution(cgroup=truncate(path, self.cgroup_depth), container=workload.container,
                            pod=pod, namespace=namespace, pod_uid=workload.pod_uid)
        self._cache[cgroup_id] = found
        return found

    def refresh(self) -> None:
        self.resolver.refresh()

    def expired(self, grace_s: float, in_use: set[int]) -> set[int]:
        """Deleted cgroups gone longer than grace_s that no flow refers to; forgotten here."""
        done = self.resolver.expired(grace_s) - in_use
        self.resolver.forget(done)
        for cid in done:
            self._cache.pop(cid, None)
        return done

    def close(self) -> None:
        self.resolver.close()

    @classmethod
    def open(cls, cgroup_root: str | None, pod_logs: str | None, cgroup_depth: int = 0,
             follow: bool = True) -> Attributor:
        """`follow=False`: no inotify watches (one per cgroup directory, from the user's shared budget, which
        kubelet and containerd need on a node); lookups of unknown ids rescan instead, at most once a second."""
        resolver = CgroupResolver(Path(cgroup_root) if cgroup_root else None, follow=follow)
        return cls(resolver, PodDirectory(Path(pod_logs) if pod_logs else DEFAULT_POD_LOGS), cgroup_depth)
