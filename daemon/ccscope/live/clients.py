"""The live page's clients: one bounded queue of encoded SSE messages per open page.

A client is a bounded queue (drop-oldest): a slow reader loses updates, counted and shown on its page as
"lagging", and never holds up the sample consumer or the broadcaster, which only append. Memory is bounded
by MAX_CLIENTS x CLIENT_QUEUE messages.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable

MAX_CLIENTS = 16
CLIENT_QUEUE = 64           # messages, ~6 s of pushes; older ones are dropped first


class TooManyClients(Exception):
    pass


class Client:
    """One page's bounded queue of encoded SSE messages."""

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.queue: deque[bytes] = deque(maxlen=CLIENT_QUEUE)
        self.dropped = 0
        self._unreported = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()

    def put(self, message: bytes) -> bool:
        """Queues a message; False when that pushed the oldest one out."""
        with self._lock:
            full = len(self.queue) == CLIENT_QUEUE
            if full:
                self.dropped += 1
                self._unreported += 1
            self.queue.append(message)
        self._wake.set()
        return not full

    def take(self, timeout: float) -> list[bytes]:
        """Everything queued (waits up to `timeout`), led by a `lag` event when updates were dropped."""
        self._wake.wait(timeout)
        with self._lock:
            self._wake.clear()
            messages = list(self.queue)
            self.queue.clear()
            lost, self._unreported = self._unreported, 0
        if lost:
            messages.insert(0, event("lag", {"dropped": lost, "dropped_total": self.dropped}))
        return messages


def event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Clients:
    """The open pages; `lock` is the hub's, so that a page's hello and the pushes after it come in order."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._by_id: dict[int, Client] = {}
        self._ids = itertools.count(1)
        self.connections = 0       # ever connected
        self.updates_dropped = 0   # messages pushed out of a slow page's queue

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, hello: Callable[[], bytes]) -> tuple[Client, int]:
        """A new client with `hello()` queued first; it and how many are open now. TooManyClients past the bound."""
        with self._lock:
            if len(self._by_id) >= MAX_CLIENTS:
                raise TooManyClients(f"{MAX_CLIENTS} live pages are open already")
            client = Client(next(self._ids))
            self._by_id[client.ident] = client
            self.connections += 1
            client.put(hello())
            return client, len(self._by_id)

    def remove(self, client: Client) -> int:
        with self._lock:
            self._by_id.pop(client.ident, None)
            return len(self._by_id)

    def send_all(self, message: bytes) -> None:
        for client in list(self._by_id.values()):
            if not client.put(message):
                self.updates_dropped += 1
