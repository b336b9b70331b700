"""Staged files leave the page cache once durable (``hpcbench.common.pagecache``): training's first
read of a staged file reads the node-local disk, as after a cache clear, on both staging methods.
``resident_fraction`` itself is checked against a file read into and dropped from the cache."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.synth_data import write_cosmoflow
from hpcbench.common.pagecache import evict_path, resident_fraction
from hpcbench.staging.manifest import STATE_DIR
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(resident_fraction(Path(__file__)) is None, reason="no mincore(2) here")


def _staged(dest: Path) -> list[Path]:
    return [p for p in dest.rglob("*") if p.is_file() and STATE_DIR not in p.parts]


def test_resident_fraction_sees_a_read_and_an_eviction(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(os.urandom(16 << 20))
    evict_path(p)
    assert resident_fraction(p) == 0.0
    with open(p, "rb") as fh:
        fh.read(1 << 20)  # the first MiB (readahead brings a little more)
    assert 1 / 16 <= resident_fraction(p) < 0.5
    p.read_bytes()
    assert resident_fraction(p) == 1.0
    (tmp_path / "empty").touch()
    assert resident_fraction(tmp_path / "empty") == 0.0


@pytest.mark.parametrize("method", ["packed", "copy"])
def test_staged_files_are_not_left_in_the_page_cache(tmp_path: Path, method: str) -> None:
    raw = tmp_path / "raw"
    write_cosmoflow(raw, 6, 2, size=16)
    dest = tmp_path / "local"
    if method == "packed":
        proc = run_cli(["pack", "--dataset", "cosmoflow", "--source", str(raw), "--dest", str(tmp_path / "packed"),
                        "--shard-mb", "0.05"], timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        args = ["stage", "--source", str(tmp_path / "packed"), "--dest", str(dest), "--timeout", "60"]
    else:
        args = ["stage", "--method", "copy", "--dataset", "cosmoflow", "--source", str(raw), "--dest", str(dest),
                "--shard-mb", "0.05", "--timeout", "60"]
    proc = run_cli(args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    staged = _staged(dest)
    assert len(staged) == 8
    cached = {p.name: resident_fraction(p) for p in staged}
    assert all(f == 0.0 for f in cached.values()), cached
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in staged} == \
        {p.relative_to(raw).as_posix(): p.read_bytes() for p in raw.rglob("*") if p.is_file()}
