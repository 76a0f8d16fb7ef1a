"""Output files' folders, checked (and made) before the work that writes them.

Every command option and daemon setting that names an output file (a trace, a database, a
status file, the registry socket, a model) goes through :func:`ensure_parent`, so a folder
that is missing is made, and one that cannot hold the file is said before any work rather
than when its results are written."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from typing import BinaryIO

__all__ = [
    "OutputFileError",
    "OutputFolderError",
    "PSEUDO_FILESYSTEMS",
    "ensure_parent",
    "is_stream_path",
    "open_output",
    "trusted_link",
]


def is_stream_path(path: str | os.PathLike[str]) -> bool:
    """``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N`` (a descriptor's name, also when the
    shell sent it to a file), a character or block device or a FIFO: a stream written as it
    is (no folder to make, nothing to rename over it: a rename would replace the device node
    or the link). A regular file elsewhere in /dev (/dev/shm) is a file like any other."""
    full = os.path.abspath(os.fspath(path))
    try:
        mode = os.stat(full).st_mode
    except OSError:
        return False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISBLK(mode):
        return True
    # a name that is, or leads through links to, a file of /proc (/dev/stdout is a link to
    # /proc/self/fd/1, /dev/fd one to /proc/self/fd)
    for _ in range(40):  # the kernel's own limit on links followed
        if os.path.realpath(os.path.dirname(full)).startswith("/proc/"):
            return True
        try:
            target = os.readlink(full)
        except OSError:
            return False
        full = os.path.normpath(os.path.join(os.path.dirname(full), target))
    return False


class OutputFolderError(ValueError):
    """An output option whose folder cannot be made or written: one line naming the option,
    the path and why (the CLI prints it, exit 2; the daemon refuses its start with it)."""


#: filesystems that hold the kernel's files, not the user's: no output folder is made there
#: (a mkdir under /sys/fs/cgroup would make a cgroup)
PSEUDO_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
     "configfs", "bpf", "efivarfs", "devpts"}
)  # fmt: skip


def _fs_type(path: str) -> str | None:
    """The type of the filesystem ``path`` is on (the longest mount point above it in
    /proc/self/mounts), or None when the mount table cannot be read."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    real, best, kind = os.path.realpath(path), "", None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def _why_not_writable(folder: str, err: OSError | None = None, *, named: bool = False) -> str:
    """Why no file can be made in ``folder``: a pseudo or read-only filesystem, else the
    error's reason, else no permission (``named``: said with the folder's name)."""
    fstype = _fs_type(folder)
    if fstype in PSEUDO_FILESYSTEMS:
        return f"{folder} is on the {fstype} pseudo filesystem"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only filesystem"
    except OSError:
        pass
    if err is not None:
        return err.strerror or str(err)
    return f"{folder} is not writable" if named else "permission denied"


def ensure_parent(
    option: str,
    path: str | os.PathLike[str],
    *,
    folder: bool = False,
    replace: str | None = "open",
    follow: bool = False,
) -> None:
    """Make the missing folders above the output ``path`` of ``option`` (mode 0o755) and check
    that a file can be made in its folder, or raise :class:`OutputFolderError`: a file in the
    way, no permission, a read-only or pseudo filesystem (/proc, /sys) are said before any
    work, not when its results are written. ``folder``: ``path`` is an output folder (the
    command makes it; an existing one is checked itself). Call it once the option's other
    checks have passed (an output that is an input, one inside a tree, see
    :func:`tools.common.check_outputs`) and before the long work. A device or a FIFO (``/dev/null``,
    ``/dev/stdout``) needs nothing made: it passes as it is.

    A file already at ``path`` is checked too (:func:`_why_not_replaceable`), as the command
    will write it: ``replace="open"`` (a trace, a database: opened for writing) needs write
    permission on the file; ``replace="rename"`` (a status file, a store: a new file renamed
    over it) needs, in a sticky folder such as /tmp, this user to own the file or the folder;
    ``None`` checks nothing (the socket: what is there is judged when it is bound).
    ``follow``: a symbolic link at ``path`` is judged by the file it leads to (the command
    replaces that file, not the link), in that file's folder; a link another user owns or
    could have placed (:func:`trusted_link`) is refused, as :func:`open_output` refuses it."""
    stream = is_stream_path(path)
    # a link followed, or one to a stream, is written through: another user's is refused
    # now, naming the option, not at the first write
    if (follow or stream) and os.path.islink(path) and not trusted_link(os.fspath(path)):
        instead = (
            " (it could point anywhere): remove it, or give the file's own path"
            if follow
            else ": remove it, or give the stream's own name (/dev/stdout, the FIFO's path)"
        )
        raise OutputFolderError(
            f"{option} {path}: is a symbolic link that another user owns or could have placed "
            f"(in a folder others can write); hidvfs writes no output through it{instead}"
        )
    if stream:
        return
    full = os.path.abspath(os.fspath(path))
    if follow:  # the file a link leads to is what gets written, in its own folder
        full = os.path.realpath(full)
    try:
        mode = os.stat(full).st_mode
    except OSError:
        mode = None
    is_dir = mode is not None and stat.S_ISDIR(mode)
    if mode is not None and is_dir != folder:
        kind, want = ("a folder", "a file") if is_dir else ("a file", "a folder")
        raise OutputFolderError(f"{option} {path}: is {kind}; give {want}")
    where = full if is_dir else os.path.dirname(full)
    if not folder and mode is not None and replace is not None:
        why = _why_not_replaceable(full, replace)
        if why is not None:
            linked = follow and os.path.islink(os.path.abspath(os.fspath(path)))
            led = f"leads to {full}, which " if linked else ""
            raise OutputFolderError(f"{option} {path}: {led}{why}; choose another {option}")
    # the nearest folder that exists: the missing ones are made in it
    there = where
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    why = None
    if not os.path.isdir(there):
        why = f"{there} is a file, not a folder"
    elif not os.access(there, os.W_OK | os.X_OK) or (
        there != where and _fs_type(there) in PSEUDO_FILESYSTEMS
    ):
        why = _why_not_writable(there, named=there != where)
    if why is None and there != where:
        try:
            os.makedirs(where, mode=0o755, exist_ok=True)
        except OSError as err:
            why = _why_not_writable(there, err)
    # an output folder that exists is said as itself, not as "its folder"
    said = f"{option} {path}:" if is_dir else f"{option} {path}: its folder {where}"
    if why is not None:
        what = "is not writable" if os.path.isdir(where) else "cannot be made"
        raise OutputFolderError(f"{said} {what} ({why}); choose another {option}")
    # os.access says yes to root anywhere (/proc, a read-only mount): make a file for real
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".hidvfs-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputFolderError(
            f"{said} is not writable ({_why_not_writable(where, err)}); choose another {option}"
        ) from None


def _owner(uid: int) -> str:
    """``uid 0 (root)``, or ``uid N`` for a uid without a name here."""
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _why_not_replaceable(full: str, replace: str) -> str | None:
    """Why this user cannot write the existing output file ``full`` the way the command will
    (``replace``, see :func:`ensure_parent`), else None (also when nothing is there, or it is
    a folder: said elsewhere). Root passes as it always did: it may open or replace any
    file (but one on a read-only filesystem)."""
    if replace not in ("open", "rename"):
        raise ValueError(f"replace must be 'open', 'rename' or None, not {replace!r}")
    try:  # a rename replaces the name; an open writes the file a link leads to
        st = os.lstat(full) if replace == "rename" else os.stat(full)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode) or (replace == "open" and not stat.S_ISREG(st.st_mode)):
        return None  # a folder is said by the caller, a device by open_output
    if replace == "rename":
        # unlink(2)/rename(2) in a sticky folder: only the file's or the folder's owner
        # (or CAP_FOWNER) may remove or replace a name in it
        euid = os.geteuid()
        try:
            parent = os.stat(os.path.dirname(full))
        except OSError:
            return None
        if euid != 0 and parent.st_mode & stat.S_ISVTX and euid not in (st.st_uid, parent.st_uid):
            return (
                f"belongs to {_owner(st.st_uid)} in the sticky folder "
                f"{os.path.dirname(full)}, where only its owner may replace or remove it"
            )
        return None
    effective = os.access in os.supports_effective_ids
    if not os.access(full, os.W_OK, effective_ids=effective):
        try:
            if os.statvfs(full).f_flag & os.ST_RDONLY:
                return "is on a read-only filesystem"
        except OSError:
            pass
        return (
            f"is not writable by this user (it belongs to {_owner(st.st_uid)}, "
            f"mode {stat.S_IMODE(st.st_mode):04o})"
        )
    return None


class OutputFileError(OSError):
    """An output file hidvfs will not write through (a symbolic link another user may have
    planted, a block device, a file with other hard links): its message names the option and
    the path and says what to give instead. An OSError, so the callers that report a file
    they cannot open report this one the same way."""

    def __init__(self, message: str, err: int = errno.EPERM):
        super().__init__(err, message)

    def __str__(self) -> str:
        return self.strerror


def trusted_link(path: str) -> bool:
    """A symlink this process may write through: owned by root or by this process's user, in
    a folder of theirs that nobody else can write (``/dev/stdout``, ``/proc/self/fd/N``, a
    user's own link in their own folder). Another user's link is what turned a root daemon's
    ``--record`` into a write to a file of the link's choosing; a folder others can write
    could have had a root-owned link hard-linked into it, or swapped after this look.

    The folder is judged as it resolves (its real owner and mode): ``/dev/fd`` is itself a
    link (to ``/proc/self/fd``), which ``/dev/fd/1`` and bash's ``>(cmd)`` go through. When
    the folder's name is a link, that link must be root's or this user's too, in a folder
    nobody else can write (else it could be made to lead to a folder of theirs)."""
    trusted = (0, os.geteuid())
    shut = stat.S_IWGRP | stat.S_IWOTH

    def mine(st: os.stat_result) -> bool:
        return st.st_uid in trusted and not (stat.S_ISDIR(st.st_mode) and st.st_mode & shut)

    folder = os.path.dirname(os.path.abspath(path))
    try:
        st = os.lstat(path)
        real = os.stat(os.path.realpath(folder))
        named = os.lstat(folder)
        above = os.lstat(os.path.dirname(folder)) if stat.S_ISLNK(named.st_mode) else None
    except OSError:
        return False
    return (
        stat.S_ISLNK(st.st_mode)
        and st.st_uid in trusted
        and stat.S_ISDIR(real.st_mode)
        and mine(real)
        and mine(named)
        and (above is None or mine(above))
    )


def open_output(
    path: str | os.PathLike[str], option: str = "the output", *, fifo_nonblocking: bool = False
) -> BinaryIO:
    """Open the output file ``path`` of ``option`` for writing from its start, made if
    missing (0666 less the umask, as ``open(path, "wb")``), without ever writing through a
    name another user controls:

    - the last component is opened with ``O_NOFOLLOW``: a symlink there is followed only
      when root or this process's user owns it and its folder, which nobody else can write
      (``/dev/stdout`` -> ``/proc/self/fd/1``); another user's link (a dangling one made a
      root daemon create its target) is refused;
    - what was opened is looked at before anything is written: a regular file is truncated
      only then, and refused when it has other hard links (one to a root file made in a
      folder the user could write); a FIFO or a character device (``/dev/null``, a pipe or
      terminal behind ``/dev/stdout``) is written as a stream; anything else (a block
      device) is refused.

    ``fifo_nonblocking``: a FIFO is opened and written without waiting (OSError ENXIO when no
    reader has it open, BlockingIOError when it is full), for a writer that must not stall on
    a reader (the daemon's status file, written from its control loop); anything else it
    opens is written blocking as usual.

    Raises :class:`OutputFileError` (naming ``option``) for a refusal, OSError for the rest."""
    path = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_NONBLOCK if fifo_nonblocking else 0)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o666)
        linked = False
    except OSError as err:
        # ELOOP for a symlink as the last component (EMLINK on some BSDs); EACCES for another
        # user's link in a sticky folder under fs.protected_symlinks, even with O_NOFOLLOW
        if err.errno not in (errno.ELOOP, errno.EMLINK, errno.EACCES) or not os.path.islink(path):
            raise
        if not trusted_link(path):
            raise OutputFileError(
                f"{option} {path}: is a symbolic link that another user owns or could have "
                "placed (in a folder others can write); hidvfs writes no output through it "
                "(it could point anywhere): remove it, or give the file's own path"
            ) from None
        fd = os.open(path, flags, 0o666)  # a trusted link: followed like /dev/stdout always was
        linked = True
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1 and not linked:
                raise OutputFileError(
                    f"{option} {path}: this file has {st.st_nlink - 1} other hard link(s); "
                    "hidvfs does not overwrite a file that is also elsewhere: remove it, or "
                    "choose another path"
                )
            os.ftruncate(fd, 0)
        elif not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
            kind = "a block device" if stat.S_ISBLK(st.st_mode) else "not a regular file"
            raise OutputFileError(
                f"{option} {path}: is {kind}; give a regular file, a FIFO or /dev/stdout"
            )
        if fifo_nonblocking and not stat.S_ISFIFO(st.st_mode):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
