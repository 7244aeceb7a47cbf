"""Both ends of a TCP flow for tests/test_ccstate_*.py, each run in its namespace.

    python tests/ccstate_peer.py serve PORT ROUND_BYTES [CONNECTIONS]
        b: prints the accepted socket's cookie; reads ROUND_BYTES, waits 60 ms, answers one byte; then the next
        of CONNECTIONS (1)
    python tests/ccstate_peer.py rounds ADDR PORT CC ROUND_BYTES
        a: prints its socket cookie; for each line on stdin sends ROUND_BYTES and waits for the answer, then
        prints "ready". The answer reaches a after the ACK of the round's last byte (the 60 ms outlast a delayed
        ACK), so the state the kernel side copied on it is the state after every ACK: `ss` reads the same.
    python tests/ccstate_peer.py bulk ADDR PORT CC SECONDS   a: prints its cookie, sends for SECONDS
    python tests/ccstate_peer.py messages ADDR PORT CC SECONDS   a: as bulk, a 10 kB message (7 segments) per 50 ms
    python tests/ccstate_peer.py reconnect ADDR PORT CC SECONDS   a: as bulk for half of SECONDS, then the same
        socket disconnects (connect(AF_UNSPEC), tcp_disconnect()), connects again and sends for the other half
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import sys
import time

SO_COOKIE = 57


def serve(port: int, round_bytes: int, connections: int = 1) -> None:
    listener = socket.create_server(("0.0.0.0", port), reuse_port=True)
    for _ in range(connections):
        conn, _ = listener.accept()
        print_cookie(conn)
        with contextlib.suppress(ConnectionResetError):  # a disconnect resets the connection
            answer(conn, round_bytes)
        conn.close()


def answer(conn: socket.socket, round_bytes: int) -> None:
    while True:
        got = 0
        while got < round_bytes:
            data = conn.recv(min(1 << 20, round_bytes - got))
            if not data:
                return
            got += len(data)
        time.sleep(0.06)
        conn.sendall(b"k")


def connect(addr: str, port: int, cc: str, sock: socket.socket | None = None) -> socket.socket:
    reconnecting = sock is not None
    sock = sock or socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.connect((addr, port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if not reconnecting:
        print_cookie(sock)
    return sock


def print_cookie(sock: socket.socket) -> None:
    print(int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little"), flush=True)


def rounds(addr: str, port: int, cc: str, round_bytes: int) -> None:
    sock = connect(addr, port, cc)
    payload = b"x" * round_bytes
    for _ in sys.stdin:
        sock.sendall(payload)
        if sock.recv(1) != b"k":
            return
        print("ready", flush=True)


def bulk(addr: str, port: int, cc: str, seconds: float) -> None:
    sock = connect(addr, port, cc)
    send_for(sock, seconds)
    sock.close()


def send_for(sock: socket.socket, seconds: float) -> None:
    payload, end = b"x" * 65536, time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(payload)


def disconnect(sock: socket.socket) -> None:
    """connect() to an AF_UNSPEC address: the kernel's tcp_disconnect(), the socket kept for a new connect."""
    unspec = (ctypes.c_ushort * 8)()  # a struct sockaddr of family 0
    if ctypes.CDLL(None, use_errno=True).connect(sock.fileno(), ctypes.byref(unspec), ctypes.sizeof(unspec)):
        raise OSError(ctypes.get_errno(), "connect(AF_UNSPEC)")


def reconnect(addr: str, port: int, cc: str, seconds: float) -> None:
    sock = connect(addr, port, cc)
    send_for(sock, seconds / 2)
    disconnect(sock)
    send_for(connect(addr, port, cc, sock), seconds / 2)
    sock.close()


def messages(addr: str, port: int, cc: str, seconds: float) -> None:
    sock = connect(addr, port, cc)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(b"m" * 10_000)
        time.sleep(0.05)
    sock.close()


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "serve":
        serve(int(rest[0]), int(rest[1]), *(int(n) for n in rest[2:3]))
    elif mode == "rounds":
        rounds(rest[0], int(rest[1]), rest[2], int(rest[3]))
    else:
        senders = {"bulk": bulk, "messages": messages, "reconnect": reconnect}
        senders[mode](rest[0], int(rest[1]), rest[2], float(rest[3]))
