"""A store's directory, confined: every file a store reads or writes is opened relative to
one descriptor of its directory (``dir_fd``), by a bare name, with ``O_NOFOLLOW``, and checked
to be a regular file before it is used; new files are created with ``O_EXCL``; files written
in place must have one link. So a symbolic link (or a hard link, or a FIFO) planted in a
store is a :class:`StoreError` naming it, and nothing outside the store is created,
truncated or overwritten through it. The store directory itself must not be a symbolic link
either (its parents may be): pass the directory it points to.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from mi_core.scale._common import StoreError, write_all

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a planted FIFO must not block an open
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def not_ours(path: Path, mode: int) -> StoreError:
    """The error for something planted under a store file's name."""
    return StoreError(f"{path} is {_kind(mode)}, not a file of the store: remove it (a store "
                      f"opens only its own regular files and never follows a link)")


def oserror(exc: OSError, path: Path | str, doing: str) -> StoreError:
    """A StoreError for a failed file operation on `path`, saying why in words."""
    e = exc.errno
    if e in (errno.EACCES, errno.EPERM):
        why = "permission denied (a read-only directory or file?)"
    elif e == errno.EROFS:
        why = "the file system is read-only"
    elif e in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        why = "the disk is full"
    elif e == errno.EISDIR:
        why = "it is a directory"
    elif e == errno.ENOTDIR:
        why = "a part of the path is not a directory"
    else:
        why = exc.strerror or str(exc)
    return StoreError(f"cannot {doing} {path}: {why}")


class StoreDir:
    """An open store directory. ``StoreDir(path, create=True)`` makes it (and its parents)
    when missing. Names are bare file names; every method raises StoreError naming the
    file. Use as a context manager, or :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str], create: bool = False) -> None:
        self.path = Path(path)
        self.fd = -1
        if create:
            self._mkdir()
        self.fd = self._open_dir()

    # -- the directory ----------------------------------------------------------------------
    def _mkdir(self) -> None:
        p = self.path
        try:
            if p.parent != p:
                p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent that is a file, a read-only parent
            raise oserror(exc, p.parent, "create the directory") from None
        try:
            os.mkdir(p, 0o755)
        except FileExistsError:
            pass  # a directory, a file or a link: _open_dir says which
        except OSError as exc:
            raise oserror(exc, p, "create the store directory") from None

    def _open_dir(self) -> int:
        p = self.path
        try:
            return os.open(p, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
        except OSError as exc:
            try:
                st = os.lstat(p)
            except OSError:
                raise StoreError(f"{p}: no such store directory") from None
            if stat.S_ISLNK(st.st_mode):
                raise StoreError(
                    f"{p} is a symbolic link (to {os.path.realpath(p)}); a store is never "
                    f"reached through a link: pass the directory itself") from None
            if not stat.S_ISDIR(st.st_mode):
                raise StoreError(f"{p} is {_kind(st.st_mode)}, not a store directory") from None
            raise oserror(exc, p, "open the store directory") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "StoreDir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def sync(self) -> None:
        """fsync the directory (a rename or a new file survives an OS crash)."""
        try:
            os.fsync(self.fd)
        except OSError:
            pass  # some file systems cannot fsync a directory; the files are fsynced

    def file(self, name: str) -> Path:
        """The path of `name` in the store (for messages and for readers outside mi-core)."""
        return self.path / name

    def _name(self, name: str) -> str:
        if not name or name in (".", "..") or "/" in name or "\0" in name or (
                os.altsep and os.altsep in name):
            raise StoreError(f"{self.path}: {name!r} is not a file name in the store")
        return name

    def names(self) -> list[str]:
        """The names in the directory (links and all: callers check what they use)."""
        try:
            return os.listdir(self.fd)
        except OSError as exc:
            raise oserror(exc, self.path, "list") from None

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry's own status (a link is not followed); None when absent."""
        try:
            return os.stat(self._name(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise oserror(exc, self.file(name), "examine") from None

    def is_file(self, name: str) -> bool:
        """True for a regular file, False when absent; StoreError for anything else (a
        link, a directory, a FIFO) under a store's own file name."""
        st = self.lstat(name)
        if st is None:
            return False
        if not stat.S_ISREG(st.st_mode):
            raise not_ours(self.file(name), st.st_mode)
        return True

    # -- opening files --------------------------------------------------------------------
    def _open(self, name: str, flags: int, doing: str, single_link: bool = False) -> int:
        path = self.file(self._name(name))
        try:
            fd = os.open(name, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644, dir_fd=self.fd)
        except OSError as exc:
            st = None if exc.errno == errno.ENOENT else self.lstat(name)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise not_ours(path, st.st_mode) from None
            if exc.errno == errno.EEXIST:
                raise StoreError(f"{path} already exists (another writer, or a planted file: "
                                 f"remove it)") from None
            raise oserror(exc, path, doing) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise not_ours(path, st.st_mode)
            if single_link and st.st_nlink != 1:
                raise StoreError(f"{path} has {st.st_nlink} hard links: writing it would change "
                                 f"a file outside the store; remove it")
            if _NONBLOCK:
                os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_read(self, name: str) -> int:
        """A descriptor of an existing regular file `name` (FileNotFoundError when absent)."""
        try:
            return self._open(name, os.O_RDONLY, "read")
        except StoreError as exc:
            if self.lstat(name) is None:
                raise FileNotFoundError(str(self.file(name))) from exc
            raise

    def open_write(self, name: str, append: bool = False) -> int:
        """A read-write descriptor of an existing file with one link (to append or truncate)."""
        return self._open(name, os.O_RDWR | (os.O_APPEND if append else 0), "write",
                          single_link=True)

    def create(self, name: str, lock: bool = False, append: bool = False) -> int:
        """A new empty file `name` (``O_CREAT | O_EXCL``: never an existing file or a link),
        opened read-write (appending with `append`). With `lock`: open or create the lock
        file, read-only (a flock needs no write access)."""
        if lock:
            return self._open(name, os.O_RDONLY | os.O_CREAT, "create")
        return self._open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL
                          | (os.O_APPEND if append else 0), "create")

    def create_fresh(self, name: str) -> int:
        """:meth:`create` after removing a leftover regular file `name` (the temporary file
        of a killed run); a link or anything else under that name is a StoreError."""
        self.unlink(name)
        return self.create(name)

    # -- whole files ----------------------------------------------------------------------
    def read_bytes(self, name: str, limit: int | None = None) -> bytes | None:
        """The content of regular file `name`, None when absent; more than `limit` bytes is
        a StoreError (a store's small files are read whole)."""
        try:
            fd = self.open_read(name)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if limit is not None and size > limit:
                raise StoreError(f"{self.file(name)}: {size} bytes, more than a store's "
                                 f"{name} can be ({limit}); not a store file")
            chunks, got = [], 0
            while True:
                b = os.read(fd, max(1 << 16, size - got + 1))
                if not b:
                    return b"".join(chunks)
                chunks.append(b)
                got += len(b)
                if limit is not None and got > limit:
                    raise StoreError(f"{self.file(name)}: more than {limit} bytes")
        except OSError as exc:
            raise oserror(exc, self.file(name), "read") from None
        finally:
            os.close(fd)

    def write_atomic(self, name: str, data: bytes) -> None:
        """Replace `name` by `data` through ``name.tmp`` + fsync + rename: never half-written,
        never written through a link (the rename replaces the name, not what it points to)."""
        tmp = name + ".tmp"
        fd = self.create_fresh(tmp)
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            self.unlink(tmp)
            raise oserror(exc, self.file(name), "write") from None
        os.close(fd)
        self.replace(tmp, name)
        self.sync()

    def replace(self, src: str, dst: str) -> None:
        """Rename `src` to `dst`; `dst` must be absent or a regular file (a link or a
        directory planted there is a StoreError naming it)."""
        self.is_file(dst)
        try:
            os.replace(self._name(src), self._name(dst), src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            raise oserror(exc, self.file(dst), "write") from None

    def unlink(self, name: str) -> None:
        """Remove the regular file `name` if present. Anything else under a store file's
        name (a link, a directory, a FIFO) is a StoreError naming it: a store never touches
        what it did not write, not even to remove it."""
        if not self.is_file(name):
            return
        try:
            os.unlink(self._name(name), dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise oserror(exc, self.file(name), "remove") from None


class StoreLock:
    """An exclusive ``flock`` on ``<store>/.lock`` while a run writes: two writers of one
    store would break the one-record-per-key guarantee, so the second is refused. The lock
    file is opened without following links and never written."""

    def __init__(self, directory: StoreDir) -> None:
        self.directory = directory
        self.fd: int | None = None

    def __enter__(self) -> "StoreLock":
        import fcntl

        self.fd = self.directory.create(".lock", lock=True)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise StoreError(f"{self.directory.path}: another process is writing this store "
                             f"(it holds {self.directory.file('.lock')})") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None
