"""Dropping root once what needs it is done (BPF loaded, sockets bound): the process, and every process it
starts, goes on as an unprivileged user with only the capabilities it names, and can never gain more
(no_new_privs). Linux only; ctypes for prctl and capset, which Python's os module lacks.

Threads: setresuid applies to every thread (glibc), capabilities and PR_SET_KEEPCAPS to the calling one, so
call this from the thread that starts the others (threads already running lose every capability).
"""

from __future__ import annotations

import ctypes
import os
import pwd
from dataclasses import dataclass

from ccscope.errors import PrerequisiteError, UsageError

PR_SET_KEEPCAPS = 8
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAPABILITIES = {"CAP_NET_ADMIN": 12}
_libc = ctypes.CDLL(None, use_errno=True)


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclass(frozen=True)
class Identity:
    user: str
    uid: int
    gid: int


def identity(user: str) -> Identity:
    """The user to become (its primary group with it); one line if there is none."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise UsageError(f"--user {user!r}: no such user on this host") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise UsageError(f"--user {user!r}: uid or gid 0 is root; name an unprivileged user (a dedicated one "
                         "is best)")
    return Identity(user, entry.pw_uid, entry.pw_gid)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise PrerequisiteError(f"cannot drop privileges: {what}: {os.strerror(errno)}")


def drop(to: Identity, keep: tuple[str, ...] = ()) -> None:
    """Becomes `to` with only `keep` (names in CAPABILITIES), passed on to children (ambient)."""
    mask = 0
    for name in keep:
        mask |= 1 << CAPABILITIES[name]
    _check(_libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "PR_SET_KEEPCAPS")
    try:
        os.setgroups([])
        os.setresgid(to.gid, to.gid, to.gid)
        os.setresuid(to.uid, to.uid, to.uid)
    except OSError as exc:
        raise PrerequisiteError(f"cannot drop privileges to {to.user}: {exc.strerror}",
                                "it needs CAP_SETUID and CAP_SETGID") from None
    header, data = _Header(_LINUX_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    data[0].effective = data[0].permitted = data[0].inheritable = mask
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    for name in keep:
        _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAPABILITIES[name], 0, 0), f"ambient {name}")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
