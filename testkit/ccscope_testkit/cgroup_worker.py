"""A process that joins a cgroup, takes a name, then listens or connects and keeps its flows busy.

    python cgroup_worker.py CGROUP_DIR NAME serve PORT
    python cgroup_worker.py CGROUP_DIR NAME connect PORT

It joins the cgroup before it opens any socket (a socket's cgroup is fixed when it is created) and sets its
name before connect/listen (that is when ccscope records the owner). It prints one line, `ready PID LOCALPORT`,
then sends a few bytes every 20 ms on each connection until stdin closes or it is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import sys
import threading
import time

PR_SET_NAME = 15


def main() -> None:
    cgroup, name, mode, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
    conns: list[socket.socket] = []
    if mode == "serve":
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(16)
        local = port

        def accept() -> None:
            while True:
                conns.append(server.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
    else:
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        conns.append(client)
        local = client.getsockname()[1]
    print(f"ready {os.getpid()} {local}", flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    while True:
        for conn in list(conns):
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(b"x" * 200)
                with contextlib.suppress(BlockingIOError):
                    conn.recv(1 << 16)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
