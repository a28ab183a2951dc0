"""Whether a directory with a predictable name in a shared place (``/tmp``) is this user's alone.

Another user can create ``/tmp/<name>`` first, or a symbolic link by that name, and then read,
remove, replace or redirect what we put in it. Such a directory is checked with ``lstat``
(never through a link) before any file of ours goes into it.
"""

from __future__ import annotations

import os
import stat

#: Permission bits a directory for our sockets must not have: it is 700.
OPEN_TO_OTHERS = 0o077
#: Permission bits a directory for our log files must not have: others may look, not write.
WRITABLE_BY_OTHERS = 0o022


def untrusted(path: str, forbidden_bits: int = OPEN_TO_OTHERS) -> str | None:
    """Why ``path`` must not hold this user's files, or None where it is a directory of this
    user (not a link) without any of ``forbidden_bits``."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be inspected ({e})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & forbidden_bits:
        return f"has mode {mode:o}, open to other users (it must be {0o777 & ~forbidden_bits:o} or stricter)"
    return None
