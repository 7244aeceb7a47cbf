"""How serve starts its iperf3 and download servers, so that none outlives it:

    python -m ccscope.serve.child PARENT -- ARGV...

asks the kernel for SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG: the test's session
thread, or serve itself on kill -9), checks that PARENT did not die before that (the signal would never
come), then becomes ARGV. In a process of its own, not in a preexec_fn, which is unsafe in a threaded
parent. The death signal survives the exec (iperf3 is not set-user-ID).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m ccscope.serve.child PARENT -- ARGV...", file=sys.stderr)
        return 2
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(argv[0]):
        return 1  # serve is gone already
    os.execvp(argv[2], argv[2:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
