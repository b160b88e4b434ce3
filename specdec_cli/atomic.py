"""Every file specdec writes where the user says: checked before the work starts, written so that a
reader sees the old content or the new, never half of it.

One rule for every output path (--report, --profile, --markdown, --plot, --out): missing parent
directories are created when the file is written, so the nearest existing one must be a directory this
process can write in; an existing directory is never taken for a file name. The path must be a regular
file or a new name: a device, FIFO or socket is refused (``--report /dev/null`` run as root would
otherwise replace the machine's /dev/null with a plain file). A symlink is followed: its target is
what gets written, so the link stays a link. An existing file is replaced only when it is what specdec
writes there (each command names its recogniser, in commands/own_files.py) or empty; anything else, a notes file
or a config handed to the wrong option, is refused before any work and left alone. A file that several
runs update (a profile holding one section per pair) is read, changed and written under a lock
(``updating``), so none of them loses another's section.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

SPECIAL = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
           (stat.S_ISSOCK, "socket"))


def resolved(path: str | Path) -> Path:
    """The file a write to ``path`` lands in: every symlink followed, a dangling one to where it points."""
    return Path(os.path.realpath(Path(path).expanduser()))


def special_kind(path: Path) -> str | None:
    """"character device", "FIFO", … for what is not a regular file, a directory or a new name."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in SPECIAL if test(mode)), None)


def check_writable(path: str | Path, option: str, directory: bool = False,
                   ours: Callable[[Path], bool] | None = None) -> Path:
    """Refuse now, before any model loads, an output path that could not be written at the end, or
    whose writing would destroy what is there: ``ours`` says whether an existing non-empty file (with
    ``directory``, a non-empty directory) is what specdec writes there (None: the caller checks the
    content itself). Returns the path as given (expanded), which messages name; writes follow its symlinks."""
    path = Path(path).expanduser()
    target = resolved(path)
    kind = special_kind(target)
    if kind:
        shown = path if target == path.absolute() else f"{path} (-> {target})"
        raise UserError(f"{option} {shown}: is a {kind}, not a file; give a file name")
    if not directory and target.is_dir():
        raise UserError(f"{option} {path}: is a directory; give a file name")
    if directory and target.exists() and not target.is_dir():
        raise UserError(f"{option} {path}: exists and is not a directory")
    existing = target if directory and target.is_dir() else target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{option} {path}: {existing} is not a directory")
    if ours is not None and foreign(target, directory, ours):
        what, undo = ("not empty and not a directory", "empty it") if directory else ("not a file", "delete it")
        raise UserError(f"{option} {path}: {what} specdec wrote, so it is left alone; give another name or {undo}")
    try:  # os.access says yes to root everywhere, even in /proc: only a real file tells
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".specdec-probe-"):
            pass
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot write in {existing}: {exc.strerror or exc}") from None
    return path


def foreign(target: Path, directory: bool, ours: Callable[[Path], bool]) -> bool:
    """Whether writing ``target`` would replace something specdec did not write: a non-empty file (or
    directory) that ``ours`` does not recognise. A new name or an empty one is never foreign; one that
    cannot be read cannot be recognised, so it is. A recogniser may raise UserError to say more."""
    try:
        if directory:
            if not target.is_dir():
                return False
            with os.scandir(target) as entries:
                if next(entries, None) is None:
                    return False
        elif not target.is_file() or target.stat().st_size == 0:
            return False
        return not ours(target)
    except (OSError, UnicodeDecodeError):
        return True


def read_at_most(path: str | Path, limit: int) -> tuple[bytes | None, int]:
    """A file's bytes, or None when it has more than ``limit`` (read no further); and how many it has.
    What a reader of a file the user names uses before judging it, so that no file costs more than its bound."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
        if len(data) <= limit:
            return data, len(data)
        handle.seek(0, 2)
        return None, handle.tell()


def write_atomically(path: str | Path, content: str | bytes, mode: int | None = None) -> None:
    """A temp file beside the target (the symlink's target, for a link), flushed to disk, then
    os.replace over it. OSError for a target that is not a regular file, as for a failed write.

    The temp file is private (0600); the result keeps the old file's mode, or the usual one, unless
    ``mode`` is given (0o600: a file that holds the user's text stays private whatever it was).
    """
    path = resolved(path)
    kind = special_kind(path)
    if kind:
        raise OSError(errno.EINVAL, f"{path} is a {kind}, not a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~_umask()
    binary = isinstance(content, bytes)
    handle = tempfile.NamedTemporaryFile("wb" if binary else "w", encoding=None if binary else "utf-8",
                                         dir=path.parent, prefix=f".{path.name}.", delete=False)
    try:
        with handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, mode)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


@contextmanager
def updating(path: str | Path) -> Iterator[Path]:
    """Hold the lock for a read-change-write of ``path`` (yields the file to read and write).

    The lock is on the file's directory, not the file: every write replaces the file by a rename, so
    a lock on the old file would not hold a second writer off the new one. flock is released when
    the process dies, so a killed writer never leaves the file locked."""
    path = resolved(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(descriptor)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
