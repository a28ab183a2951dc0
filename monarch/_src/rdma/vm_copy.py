"""One-sided copies between processes of one host: ``process_vm_readv``/``process_vm_writev``.

The reading (or writing) process copies straight from (into) the owner's memory; the owner's
threads take no part, so a busy actor, or its busy event loop, does not slow the transfer.
The kernel allows it where the caller may ptrace the owner (same user, and Yama's
``ptrace_scope`` permitting): ``VmCopyForbidden`` says when it does not, for the caller to
fall back to chunks served by the owner's runtime.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable


class VmCopyForbidden(OSError):
    """The kernel refused a cross-process copy (EPERM: another user, or ptrace rules)."""


class OwnerGone(OSError):
    """The owner's process no longer exists (ESRCH), or its memory is no longer mapped."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


@functools.cache
def _syscalls() -> tuple[Callable[..., int], Callable[..., int]]:
    libc = ctypes.CDLL(None, use_errno=True)
    calls = (libc.process_vm_readv, libc.process_vm_writev)
    for call in calls:
        call.restype = ctypes.c_ssize_t
        call.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
    return calls


@functools.cache
def host_identity() -> str:
    """Equal for two processes exactly when one can copy the other's memory by pid: the same
    kernel (boot id), PID namespace and network namespace (a network namespace stands for a
    host in tests, and its processes reach each other over TCP, not by pid)."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}/{os.stat('/proc/self/ns/net').st_ino}"


def copy(
    pid: int, local: int, remote: int, size: int, *, write: bool, piece: int, keep_going: Callable[[], bool]
) -> None:
    """Copy ``size`` bytes between ``local`` (this process) and ``remote`` (process ``pid``),
    ``piece`` bytes per system call, stopping early once ``keep_going()`` is False."""
    call = _syscalls()[1 if write else 0]
    done = 0
    while done < size and keep_going():
        n = min(piece, size - done)
        local_iov = _IoVec(local + done, n)
        remote_iov = _IoVec(remote + done, n)
        moved = call(pid, ctypes.byref(local_iov), 1, ctypes.byref(remote_iov), 1, 0)
        if moved < 0:
            err = ctypes.get_errno()
            if err == errno.EPERM:
                raise VmCopyForbidden(
                    err, f"process_vm_{'writev' if write else 'readv'} of pid {pid}: {os.strerror(err)}"
                )
            if err in (errno.ESRCH, errno.EFAULT):
                raise OwnerGone(err, f"pid {pid}: {os.strerror(err)}")
            raise OSError(err, os.strerror(err))
        if moved == 0:
            raise OwnerGone(errno.EFAULT, f"pid {pid}: no byte could be copied at {remote + done:#x}")
        done += moved
