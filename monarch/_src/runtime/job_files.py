"""Where a job's files live, and when anyone may remove them.

A job is one client and the workers it spawned. Its files: a socket directory
``$TMPDIR/monarch-<uid>/job-XXXX`` and shared-memory buffers ``/dev/shm/monarch-job-XXXX-*``.

Whether a job is alive is decided by the job itself, never by file ages or pids (a job of
another ``$TMPDIR`` looks absent, pids get reused): its client holds an exclusive ``flock`` on
its socket directory and on ``/dev/shm/monarch-job-XXXX.lock`` from before its first file
until it has removed them all. The kernel drops both locks when the client dies, however it
dies (``kill -9`` included). Whoever takes a job's lock therefore knows the job is over and
may remove what it left: a later client's start-up sweep. Only files of the current user are
ever touched.

The workers of a job that lost its client clean up after themselves: every process of the job
holds a shared ``flock`` on ``job.lock`` in the socket directory, and whichever leaves last
(``last_to_leave``) removes the job's files, so nothing waits for another client to start.
"""

from __future__ import annotations

import fcntl
import logging
import os

from monarch._src.runtime import shm
from monarch._src.runtime.private_dir import untrusted

logger = logging.getLogger("monarch.runtime")

_JOB_PREFIX = "job-"
#: The lock file descriptors of the jobs this process is the client of, by socket directory.
_held: dict[str, list[int]] = {}


def try_lock(path: str, create: bool = False) -> int | None:
    """A descriptor holding the exclusive lock of ``path`` (a file or a directory of this user),
    or None where a live process holds it, or ``path`` is not ours, is a symlink or is gone.

    ``create`` creates the file (and fails if it exists). The lock is checked to still be
    ``path``'s after taking it: a sweeper may have removed the file in between.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    if create:
        flags |= os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return None
    try:
        opened = os.fstat(fd)
        if opened.st_uid == os.geteuid():
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            now = os.lstat(path)
            if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
                return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _socket_base() -> tuple[str, bool]:
    """The directory new job directories go in, and whether it is the shared per-user one
    (where earlier jobs are swept). An untrusted one (another user could remove or replace
    our sockets in it) is not used: the job directory then goes straight into ``$TMPDIR``."""
    import tempfile  # the client's alone: workers start faster without it

    tmp = tempfile.gettempdir()
    base = os.path.join(tmp, f"monarch-{os.getuid()}")
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        logger.warning("cannot create the socket directory %s (%s); using a private one in %s", base, e, tmp)
        return tmp, False
    problem = untrusted(base)
    if problem is None:
        return base, True
    logger.warning(
        "the socket directory %s %s: another user could remove or replace this job's sockets in it. "
        "Using a private directory in %s instead.\nHINT: remove %s (it is recreated private).",
        base,
        problem,
        tmp,
        base,
    )
    return tmp, False


def new_job_dir() -> str:
    """A private (0700) socket directory for a new job of this client, its liveness locks
    held (released by ``remove``); dead jobs of this user are swept first."""
    import shutil
    import tempfile

    base, shared = _socket_base()
    if shared:
        sweep_dead_jobs(base)
    sweep_dead_shm_files()
    prefix = _JOB_PREFIX if shared else f"monarch-{os.getuid()}-{_JOB_PREFIX}"
    for _ in range(10):
        try:
            path = tempfile.mkdtemp(prefix=prefix, dir=base)
        except FileNotFoundError:  # the last job in base removed it (empty) just now
            base, _ = _socket_base()
            continue
        locks = _lock_new_job(path)
        if locks is not None:
            _held[path] = locks
            return path
        shutil.rmtree(path, ignore_errors=True)  # a sweeper took it first, or the name is taken
    raise RuntimeError(f"could not create a locked job directory in {base}")


def _lock_new_job(path: str) -> list[int] | None:
    """The locks of the fresh job directory ``path`` and of its shared-memory files, or None
    where that name cannot be this job's."""
    dir_lock = try_lock(path)
    if dir_lock is None:
        return None
    if not shm.available():
        return [dir_lock]
    lock_path = shm.lock_path(os.path.basename(path))
    shm_lock = try_lock(lock_path, create=True)
    if shm_lock is not None:
        return [dir_lock, shm_lock]
    if not os.path.lexists(lock_path):  # /dev/shm refuses even an empty file: do without it
        shm.disable(f"cannot create {lock_path}")
        return [dir_lock]
    os.close(dir_lock)
    return None


def remove(socket_dir: str) -> None:
    """Remove a job's files (its socket directory and shared-memory files), then drop its
    locks if this process holds them (the lock file goes last, so the job looks alive until
    nothing of it is left), and the per-user base directory once no other job uses it."""
    import shutil  # workers start faster without it, and rarely get here

    socket_dir = socket_dir.rstrip("/")
    tag = os.path.basename(socket_dir)
    shutil.rmtree(socket_dir, ignore_errors=True)
    shm.sweep(tag)
    try:
        os.unlink(shm.lock_path(tag))
    except OSError:
        pass
    for fd in _held.pop(socket_dir, ()):
        os.close(fd)
    base = os.path.dirname(socket_dir)
    if os.path.basename(base) == f"monarch-{os.getuid()}":  # never a private job's $TMPDIR
        try:
            os.rmdir(base)  # fails while another job uses it
        except OSError:
            pass


#: Every process of a job holds a shared lock on this file of the job's socket directory.
JOB_LOCK_NAME = "job.lock"


def join_job(socket_dir: str) -> int | None:
    """Hold a shared lock on the job's lock file for as long as this process lives (the
    kernel drops it however the process ends); the descriptor, or None where the directory
    is gone."""
    try:
        fd = os.open(os.path.join(socket_dir, JOB_LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def last_to_leave(lock_fd: int) -> bool:
    """Drop this process's shared lock on the job and say whether no process of the job holds
    one any more. Every leaver drops its own lock before it tries for the exclusive one, so
    of processes leaving together at least the last one gets it."""
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def reap(socket_dir: str) -> bool:
    """Remove a job's files if its client is gone (nobody holds its lock); whether it did.
    For a worker that outlived its client, and for the start-up sweep."""
    fd = try_lock(socket_dir)
    if fd is None:
        return False
    try:
        remove(socket_dir)
    finally:
        os.close(fd)
    return True


def sweep_dead_jobs(base: str) -> None:
    """Remove what this user's dead jobs left in ``base`` (a client killed with -9 cannot clean
    up): their socket directories and shared-memory files."""
    try:
        jobs = [name for name in os.listdir(base) if name.startswith(_JOB_PREFIX)]
    except OSError:
        return
    for job in jobs:
        reap(os.path.join(base, job))


def sweep_dead_shm_files() -> None:
    """Remove the shared-memory files of this user's dead jobs, whatever their ``$TMPDIR``.

    A job whose lock file is missing is dead: a live client creates it before any other file
    of its job, and removes it last. The lock file of a dead job is taken while its other
    files go, so two sweepers never race on one job.
    """
    for tag, paths in shm.files_by_job().items():
        lock_path = shm.lock_path(tag)
        fd = None
        if os.path.lexists(lock_path):
            fd = try_lock(lock_path)
            if fd is None:  # held: the job is alive (or the lock is not ours)
                continue
        try:
            for path in [*paths, lock_path]:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        finally:
            if fd is not None:
                os.close(fd)
