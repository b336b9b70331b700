"""Atomic file output: write to a temporary sibling, flush and fsync, verify, then rename.

A reader never sees a partially written file under the final name, whatever happens to the writer.
The temporary file is made 0600 by ``mkstemp``; it gets the mode a plain ``open()`` would give
(0666 less the umask) before it is renamed, so data written on shared storage stays readable by the
users the umask allows.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from .pagecache import evict


def _read_umask() -> int:
    """The process umask, read without changing it (Linux: /proc), else by the set-and-restore trick
    (safe here: it runs once, at import, before any writer thread exists)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


_UMASK = _read_umask()


def file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (e.g. 0644 for umask 022)."""
    return 0o666 & ~_UMASK


def make_temp(dest: Path) -> tuple[int, Path]:
    """A temporary sibling ``.NAME.XXXX.tmp`` of ``dest`` (fd, path) with the umask's file mode."""
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, file_mode())
    except OSError:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
        raise
    return fd, Path(name)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    mode: str = "wb",
    verify: Callable[[Path], None] | None = None,
    drop_cache: bool = False,
) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success fsync, run ``verify(tmp)``, rename.

    On any exception (including a failed ``verify``) the temporary file is removed and the
    destination is left untouched. ``drop_cache``: the written pages leave the page cache once durable
    (staged files: training's first read then reads the disk).
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temp(dest)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
            if drop_cache:  # clean after the fsync: its pages leave the page cache (hpcbench.common.pagecache)
                evict(fh.fileno())
        if verify is not None:
            verify(tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)
