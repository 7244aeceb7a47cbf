"""Real cgroup v2 trees for tests: cgroups named like kubelet's, containerd's and docker's, processes in them,
and a pod log directory; everything made is removed again (processes killed or moved out, rmdir) on exit."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ccscope.attribution import cgroup2_mount
from ccscope.errors import PrerequisiteError

from ccscope_testkit.net import wait_for
from ccscope_testkit.prereqs import require

WORKER = Path(__file__).with_name("cgroup_worker.py")


@dataclass
class Tree:
    """cgroups made under one top-level cgroup of this test run, removed (processes moved out) on exit."""

    root: Path
    top: Path
    made: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def cgroup(self, relative: str) -> Path:
        path = self.top
        for part in relative.strip("/").split("/"):
            path = path / part
            if not path.exists():
                path.mkdir()
                self.made.append(path)
        return path

    def path_of(self, cgroup: Path) -> str:
        return "/" + str(cgroup.relative_to(self.root))

    def start(self, cgroup: Path, name: str, mode: str, port: int) -> tuple[subprocess.Popen, int, int]:
        """A worker in `cgroup` named `name`; returns it, its pid and its local port."""
        proc = subprocess.Popen([sys.executable, str(WORKER), str(cgroup), name, mode, str(port)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], f"worker {name} did not start: {line}"
        return proc, int(line[1]), int(line[2])

    @staticmethod
    def command(cgroup: Path, *cmd: str) -> list[str]:
        """`cmd`, run from a shell that first moves itself into `cgroup` (so every socket it opens is in it)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *cmd]

    def stop(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()

    def remove(self, cgroup: Path) -> None:
        """rmdir once the kernel has seen the last process leave (it may lag the wait())."""
        assert wait_for(lambda: _try_rmdir(cgroup), timeout=10), f"cannot remove {cgroup}"
        self.made.remove(cgroup)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for cgroup in reversed(self.made):
            with contextlib.suppress(OSError):
                for pid in (cgroup / "cgroup.procs").read_text().split():  # strays: back to the root
                    (self.root / "cgroup.procs").write_text(pid)
            wait_for(lambda c=cgroup: not c.exists() or _try_rmdir(c), timeout=5)


def _try_rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def cgroup_tree() -> Iterator[Tree]:
    """A fresh top-level cgroup for one test; needs root and a cgroup v2 hierarchy."""
    try:
        root = cgroup2_mount()
    except PrerequisiteError as exc:
        require(False, f"no cgroup v2 hierarchy: {exc}")
    made = Tree(root, root / f"ccst-cg-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    made.top.mkdir()
    made.made.append(made.top)
    try:
        yield made
    finally:
        made.close()


def pod_logs(base: Path, namespace: str, pod: str, uid: str) -> Path:
    """A kubelet pod log directory under `base` with one pod; more can be added as <ns>_<pod>_<uid> dirs."""
    logs = base / "pods"
    (logs / f"{namespace}_{pod}_{uid}" / "app").mkdir(parents=True)
    return logs


def kubepods_systemd(pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """The cgroup kubelet (systemd driver) and containerd give a container."""
    return (f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{pod_uid.replace('-', '_')}.slice/"
            f"cri-containerd-{container_id}.scope")
