"""A folder only this user can change: where a root process keeps state it acts on.

A state dir under a world-writable parent (``/tmp``) can be made first by another user, who
then owns what root later reads and writes there: records that name processes to kill,
snapshots of settings to put back, a ``.tmp`` name that is a symlink to a root-owned file.
Every such folder is checked before use: a real folder (not a symlink), owned by this user,
writable by no one else.
"""

from __future__ import annotations

import os
import stat

from platforms.errors import HidvfsError


class StateDirUnsafe(HidvfsError):
    """The state dir is not this user's alone."""


def check_private_dir(path: str) -> None:
    """Raise :class:`StateDirUnsafe` unless ``path`` (which exists) is a folder owned by this
    user that no other user can write."""
    st = os.lstat(path)
    fix = "remove it (or give another --state-dir)"
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise StateDirUnsafe(f"state dir {path} is {kind}; {fix}")
    if st.st_uid != os.geteuid():
        raise StateDirUnsafe(
            f"state dir {path} belongs to uid {st.st_uid}, not to this user (uid "
            f"{os.geteuid()}): another user may have made it; {fix}"
        )
    if st.st_mode & 0o022:
        raise StateDirUnsafe(
            f"state dir {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); {fix}"
        )


def private_dir(path: str) -> str:
    """``path``, made (mode 0700) if missing, and checked by :func:`check_private_dir`."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_private_dir(path)
    return path
