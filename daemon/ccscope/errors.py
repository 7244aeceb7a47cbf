"""Typed errors. Each reaches the user as one line naming the problem and the fix."""

from __future__ import annotations

MAX_LINE = 400  # an error quoting a huge value stays readable; both ends keep the field and the fix


class CcscopeError(Exception):
    """Base of every error ccscope reports to the user; `exit_code` is the process status."""

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        """One line, however long or multi-line the offending input it quotes."""
        text = f"{self.problem} ({self.fix})" if self.fix else self.problem
        text = " ".join(text.split())
        if len(text) > MAX_LINE:
            keep = MAX_LINE // 2 - 3
            text = f"{text[:keep]} ... {text[-keep:]}"
        return text


class UsageError(CcscopeError):
    """Bad flags or bad input files."""

    exit_code = 2


class PrerequisiteError(CcscopeError):
    """Something the host lacks: privileges, BTF, libbpf, a tool, a kernel feature."""

    exit_code = 3


class BpfError(CcscopeError):
    """libbpf failed to open, load or attach the BPF object."""

    exit_code = 4


class Interrupted(CcscopeError):
    """SIGINT/SIGTERM/SIGHUP ended a command after it saved what it had: exit 128 + the signal's number."""

    def __init__(self, signum: int, problem: str, fix: str) -> None:
        super().__init__(problem, fix)
        self.exit_code = 128 + signum
