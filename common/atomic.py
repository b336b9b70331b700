"""Atomic file output: write to a temporary sibling, flush and fsync, verify, then rename.

A reader never sees a partially written file under the final name, whatever happens to the writer.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    mode: str = "wb",
    verify: Callable[[Path], None] | None = None,
) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success fsync, run ``verify(tmp)``, rename.

    On any exception (including a failed ``verify``) the temporary file is removed and the
    destination is left untouched.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
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
