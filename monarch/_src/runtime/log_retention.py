"""Old jobs' framework log directories are removed, so ``/tmp/$USER/monarch-logs`` stays bounded.

Every client makes a directory there (``framework_log``); nothing else ever removes them, so
a machine that runs many short jobs (a test suite, a sweep) piles up thousands. A client that
makes a new one keeps the newest ``MONARCH_LOG_KEEP_JOBS`` of them (default 100; 0 keeps
all) and removes the rest, but never one whose client is still running (its pid is in the
name), nor anything that is not a plain directory of this user named like a job's.
"""

from __future__ import annotations

import os
import re
import shutil
import stat

KEEP_ENV = "MONARCH_LOG_KEEP_JOBS"
DEFAULT_KEEP = 100

#: ``job-<date>-<time>-<client pid>``, as ``framework_log.log_dir`` names them.
_JOB_DIR = re.compile(r"job-\d{8}-\d{6}-(\d+)")


def keep_from_env(problems: list[str]) -> int:
    """How many job directories to keep; a bad value is reported and the default used."""
    raw = os.environ.get(KEEP_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP
    try:
        keep = int(raw)
        if keep < 0:
            raise ValueError
    except ValueError:
        problems.append(
            f"{KEEP_ENV}={raw!r} is not a count of job log directories to keep (0 keeps all). "
            f"Using the default, {DEFAULT_KEEP}."
        )
        return DEFAULT_KEEP
    return keep


def sweep(base: str, keep: int) -> list[str]:
    """(a client about to make its own job directory in ``base``) Remove the job directories
    there beyond the newest ``keep``, its own counted, whose client is gone; the names removed."""
    if keep == 0:
        return []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    jobs: list[tuple[float, str, int]] = []
    for name in names:
        match = _JOB_DIR.fullmatch(name)
        if match is None:
            continue
        try:
            st = os.lstat(os.path.join(base, name))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            jobs.append((st.st_mtime, name, int(match.group(1))))
    jobs.sort(reverse=True)
    removed = []
    for _, name, pid in jobs[keep - 1 :]:
        if _running(pid):
            continue
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        removed.append(name)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, someone else's
        return True
    return True
