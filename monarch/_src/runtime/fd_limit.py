"""This process's descriptor limit, raised when its runtime starts.

Every peer that replies to a thread's or a loop's own reply address (``thread_replies``,
``loop_replies``) keeps a connection to it, and each costs a few descriptors here: a client
calling 16 workers from a pool of 32 threads holds about 2,000 of them. Many Linux systems
still start processes with a soft limit of 1,024 (and a hard limit far above), where
accepting a connection fails (``EMFILE``) and replies wait until descriptors come free. So a
runtime raises the soft limit to the hard one, at most ``TARGET``, as it starts (the job's
processes inherit it); ``MONARCH_RAISE_FD_LIMIT=0`` leaves it as it is. The hard limit is the
administrator's and is never touched.
"""

from __future__ import annotations

#: The soft limit a runtime asks for (where the hard limit allows).
TARGET = 65536


def raise_fd_limit() -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = TARGET if hard == resource.RLIM_INFINITY else min(hard, TARGET)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):  # e.g. a sandbox refusing it: the limit stays as it was
        pass
