"""benchmarks/capfs.py: the emulated shared filesystem mounts, serves the same bytes read-only through one
shared cap, bypasses the page cache, and is gone (no mount, no process) after stop. Skipped with the
reason where FUSE cannot be mounted (no /dev/fuse, not root, mount refused)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.capfs import CappedMount, TokenBucket, unavailable

ROOT = Path(__file__).resolve().parents[1]


def _mount_or_skip(backing: Path, mnt: Path, mbps: float) -> CappedMount:
    why = unavailable()
    if why:
        pytest.skip(f"capfs unavailable: {why}")
    m = CappedMount(backing, mnt, mbps)
    try:
        return m.start()
    except OSError as exc:
        if "EPERM" in str(exc) or "not permitted" in str(exc).lower():
            pytest.skip(f"capfs unavailable: the kernel refused the FUSE mount ({exc})")
        raise


def test_token_bucket_holds_the_rate() -> None:
    b = TokenBucket(rate=10e6, burst=1e6)
    t0 = time.monotonic()
    for _ in range(4):
        b.take(1_000_000)
    # 1 MB of credit, then 3 MB at 10 MB/s: at least 0.3 s (a lower bound, never a speed claim)
    assert time.monotonic() - t0 >= 0.29


def test_serves_same_bytes_capped_shared_and_uncached(tmp_path: Path) -> None:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    (backing / "sub").mkdir(parents=True)
    data = os.urandom(3_000_000)
    (backing / "sub" / "a.bin").write_bytes(data)
    (backing / "b.txt").write_text("hello\n")
    m = _mount_or_skip(backing, mnt, mbps=10)
    pid = m.proc.pid if m.proc else None
    try:
        assert os.path.ismount(mnt)
        assert sorted(os.listdir(mnt)) == ["b.txt", "sub"]
        assert (mnt / "b.txt").read_text() == "hello\n"
        assert (mnt / "sub" / "a.bin").stat().st_size == len(data)
        with pytest.raises(OSError):  # read-only
            (mnt / "new.txt").write_text("x")
        got: list[bytes] = []
        t0 = time.monotonic()
        readers = [threading.Thread(target=lambda: got.append((mnt / "sub" / "a.bin").read_bytes())) for _ in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        took = time.monotonic() - t0
        assert got == [data, data]
        # the second reader is not served from the page cache, and both share one 10 MB/s bucket:
        # 6 MB (+ 6 B of b.txt) minus 1 MB of credit needs at least 0.5 s
        assert took >= 0.45, f"6 MB through a shared 10 MB/s cap took only {took:.2f} s"
        time.sleep(0.6)
    finally:
        stats = m.stop()
    assert stats["read_bytes"] >= 2 * len(data)
    assert not os.path.ismount(mnt)
    assert pid is not None and m.proc is not None and m.proc.poll() is not None  # the server exited
    assert not Path(f"{mnt}.capfs-pid").exists()


def test_cli_start_stop(tmp_path: Path) -> None:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    (backing / "x").write_bytes(b"12345")
    why = unavailable()
    if why:
        pytest.skip(f"capfs unavailable: {why}")
    cli = [sys.executable, str(ROOT / "benchmarks" / "capfs.py")]
    r = subprocess.run(cli + ["start", "--backing", str(backing), "--mount", str(mnt), "--mbps", "100"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    try:
        assert "capped at 100 MB/s" in r.stdout
        assert (mnt / "x").read_bytes() == b"12345"
        pid = int(Path(f"{mnt}.capfs-pid").read_text())
    finally:
        s = subprocess.run(cli + ["stop", "--mount", str(mnt)], capture_output=True, text=True, timeout=30)
    assert s.returncode == 0, s.stderr
    assert not os.path.ismount(mnt)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    r = subprocess.run(cli + ["start", "--backing", str(tmp_path / "missing"), "--mount", str(mnt), "--mbps", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not a folder" in r.stderr
