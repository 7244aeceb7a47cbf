"""Lines to a file descriptor (trace's stdout) without a stalled reader stopping the writer's caller.

A blocking write to a full pipe returns only when the reader reads: `ccscope trace --duration 5s | sleep 60` sat
in write() for the whole minute, deaf to --duration, SIGTERM and SIGINT (Python retries a write that a signal
interrupts, PEP 475, and a signal handler only runs between bytecodes). Here a thread does the writing, from a
queue bounded in bytes, and the caller only hands lines over and never waits. A reader that falls behind by more
than the bound loses the lines that do not fit, counted. At the end, what is queued is written for as long as the
reader keeps taking it, within bounds: DRAIN_STALL_S without progress, DRAIN_MAX_S in all, or the caller's
`give_up()` (a further signal) end the wait, and what was left is counted too. The thread may then still sit in
its write(); it is a daemon thread, so the process exits anyway.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

MAX_QUEUED_BYTES = 4 << 20  # ~10,000 JSON samples: seconds of a busy host's samples, a bounded 4 MiB of memory
DRAIN_STALL_S = 1.0  # at the end: a reader that takes nothing for this long is taken to have stopped reading
DRAIN_MAX_S = 5.0    # at the end: the longest a slow but reading reader is waited for


class LineWriter:
    """Writes batches of lines (bytes, without their newline) to `fd` from a thread of its own."""

    def __init__(self, fd: int, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self.fd = fd
        self.max_bytes = max_bytes
        self.dropped = 0            # lines not written: the queue was full, or the end came first
        self.reader_gone = False    # the reader closed its end (EPIPE), or writing failed: nothing more gets out
        self.error: OSError | None = None  # why writing failed, when it was not EPIPE (e.g. ENOSPC, EIO)
        self._batches: deque[tuple[bytes, int]] = deque()  # (bytes, lines in them)
        self._queued_bytes = 0
        self._writing_lines = 0     # lines of the batch being written
        self._progress_at = time.monotonic()
        self._closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="line-writer", daemon=True)
        self._thread.start()

    def put(self, lines: list[bytes]) -> bool:
        """Queue what fits of `lines` (counting the rest as dropped) and return at once; False once the reader
        is gone, so that the caller can stop (`ccscope trace | head`)."""
        with self._changed:
            if self.reader_gone:
                return False
            room, size, taken = self.max_bytes - self._queued_bytes, 0, 0
            for line in lines:
                if size + len(line) + 1 > room:
                    break
                size += len(line) + 1
                taken += 1
            self.dropped += len(lines) - taken
            if taken:
                self._batches.append((b"\n".join(lines[:taken]) + b"\n", taken))
                self._queued_bytes += size
                self._changed.notify()
        return True

    def finish(self, give_up: Callable[[], bool] = lambda: False) -> None:
        """Let the queue drain within the bounds of the module's docstring, then count what is left as dropped."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        started = time.monotonic()
        while self._thread.is_alive():
            self._thread.join(0.05)
            now = time.monotonic()
            if give_up() or now - started > DRAIN_MAX_S or now - self._progress_at > DRAIN_STALL_S:
                break
        with self._changed:
            self.dropped += self._writing_lines + sum(lines for _, lines in self._batches)
            self._batches.clear()
            self._writing_lines = 0

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._batches and not self._closing:
                    self._changed.wait()
                if not self._batches:
                    return
                data, self._writing_lines = self._batches.popleft()
                self._progress_at = time.monotonic()
            if not self._write(data):
                return
            with self._changed:
                self._writing_lines = 0

    def _write(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except OSError as exc:  # EPIPE (the reader closed), or the descriptor failed: nothing more gets out
                with self._changed:
                    self.reader_gone = True
                    self.error = None if isinstance(exc, BrokenPipeError) else exc
                    self.dropped += self._writing_lines + sum(lines for _, lines in self._batches)
                    self._batches.clear()
                    self._writing_lines = 0
                return False
            view = view[written:]
            with self._changed:
                self._queued_bytes -= written
                self._progress_at = time.monotonic()
        return True
