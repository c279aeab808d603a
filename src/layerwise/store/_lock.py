"""One writer per store: an exclusive ``flock`` on ``STORE/.lock``.

The lock file is never removed or replaced by layerwise, so a second writer always meets the same
inode as the first (0.1 cleared the folder after locking, so two writers each held a lock on a
different file). It is opened without following a symbolic link and without truncating what it
opens; a lock file that is a link, not a regular file, or has other hard links is refused, so that
the pid written into it can never overwrite a file outside the store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..errors import StoreError
from ._format import LOCK


def _open_lock_file(lock_path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(lock_path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(
                f"{str(lock_path)!r} is a symbolic link; layerwise does not follow it. Remove the link and "
                "run again"
            ) from None
        raise StoreError(
            f"cannot create the lock file {str(lock_path)!r}: {exc.strerror}; choose a writable path"
        ) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise StoreError(
            f"{str(lock_path)!r} is not a plain file of its own (a device, FIFO or hard link); remove it and "
            "run again"
        )
    return fd


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        if text:
            return text
    return "unknown pid"


@contextlib.contextmanager
def writer_lock(path: Path, what: str = "store") -> Iterator[None]:
    """Hold an exclusive flock on ``path/.lock``; the OS releases it if the process dies.
    ``what`` names the folder in the message ("store", "cache")."""
    lock_path = path / LOCK
    while True:
        fd = _open_lock_file(lock_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise StoreError(
                f"{what} {str(path)!r} is being written by another process ({holder}); wait for it to "
                "finish, or write to another path"
            ) from None
        # Someone may have removed or replaced the file between open and flock: then our lock
        # guards nothing, so take the lock again on the file that is there now.
        try:
            current = os.stat(lock_path, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            continue
        mine = os.fstat(fd)
        if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)
            continue
        break
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)


def writer_active(path: Path) -> str | None:
    """Who holds the writer lock of the store at ``path`` ("pid N"), or None when no process does.
    Opens the lock file read-only, never creating it, and takes no lock itself."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def being_rewritten(path: Path) -> StoreError | None:
    """The error to give a reader whose store changed under it, when a writer holds the store."""
    holder = writer_active(path)
    if holder is None:
        return None
    return StoreError(
        f"store {str(path)!r} is being rewritten by another process ({holder}); open it again when that "
        "run is done"
    )


def remove_lock_if_alone(path: Path, made_folder: bool) -> None:
    """After a refused run, with the lock held: the lock file, when nothing else is left in the
    folder, and the folder when the run made it (a folder the user made is left as it was, empty).
    A writer waiting on the lock finds its file gone and takes a new one (:func:`writer_lock`)."""
    with contextlib.suppress(OSError):
        if {p.name for p in path.iterdir()} <= {LOCK}:
            (path / LOCK).unlink(missing_ok=True)
            if made_folder:
                path.rmdir()
