"""``hpcbench stage --method copy`` finds changed sources: a file rewritten in place (same size, new
mtime), a changed size, a deleted and an added file are restaged (the deleted file's node copy is
removed), on one rank and under mpiexec on 2 emulated nodes; ``--verify`` compares with the source
itself, not only with the journal."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from benchmarks.synth_data import write_cosmoflow
from tests.conftest import project_env, run_cli, run_mpi


@pytest.fixture(scope="module")
def raw_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("copyraw") / "raw"
    write_cosmoflow(root, 6, 2, size=16)
    return root


@pytest.fixture()
def raw(raw_data: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(raw_data, tmp_path / "raw"))


def stage1(src: Path, dest: Path, *extra: str, shard_mb: str = "0.05") -> dict:
    """One rank; returns the report."""
    rep = dest.parent / f"{dest.name}-report.json"
    proc = run_cli(["stage", "--method", "copy", "--dataset", "cosmoflow", "--source", str(src), "--dest", str(dest),
                    "--shard-mb", shard_mb, "--timeout", "60", "--report", str(rep), *extra], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(rep.read_text())


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and ".hpcbench" not in p.parts}


def rewrite_same_size(p: Path) -> None:
    """Flip the last byte in place: same size, a new mtime (and ctime)."""
    old = p.stat().st_mtime_ns
    b = bytearray(p.read_bytes())
    b[-1] ^= 0xFF
    with open(p, "r+b") as fh:
        fh.write(b)
    if p.stat().st_mtime_ns == old:  # a coarse clock: make the new mtime visible
        os.utime(p, ns=(old + 1_000_000_000, old + 1_000_000_000))


def marker_names(dest: Path) -> list[str]:
    return [e["name"] for e in json.loads((dest / ".hpcbench" / "staged_manifest.json").read_text())["entries"]]


@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
def test_copy_restages_a_file_rewritten_in_place(raw: Path, tmp_path: Path, verify: bool) -> None:
    """The issue's reproduction: it used to say "0 files written" and keep the old bytes."""
    dest = tmp_path / "x"
    first = stage1(raw, dest)
    assert first["totals"]["write_files"] == 8
    victim = raw / "train" / "univ_00002.tfrecord"
    rewrite_same_size(victim)
    rep = stage1(raw, dest, *(["--verify"] if verify else []))
    assert rep["totals"]["write_files"] == 1  # only the changed file is copied again
    assert files(dest) == files(raw)
    again = stage1(raw, dest)  # and then it is up to date
    assert again["totals"]["write_files"] == 0 and files(dest) == files(raw)


@pytest.mark.parametrize("shard_mb", ["256", "0.05"], ids=["one-group", "regrouped"])
def test_copy_changed_size_deleted_and_added_files(raw: Path, tmp_path: Path, shard_mb: str) -> None:
    """A grown file is copied again, a deleted source file's node copy is removed (training lists the
    folder: it would read it), an added file is copied; the marker lists exactly the source's files.
    With small groups the deletion shifts the grouping: a file whose group is gone is copied again."""
    dest = tmp_path / "x"
    stage1(raw, dest, shard_mb=shard_mb)
    grown = raw / "train" / "univ_00001.tfrecord"
    grown.write_bytes(grown.read_bytes() + b"more")
    (raw / "train" / "univ_00004.tfrecord").unlink()
    shutil.copy(raw / "validation" / "univ_00000.tfrecord", raw / "validation" / "univ_00009.tfrecord")
    rep = stage1(raw, dest, shard_mb=shard_mb)
    assert rep["totals"]["write_files"] == (2 if shard_mb == "256" else 3)  # regrouped: + univ_00005
    assert rep["nodes_detail"][0]["removed_files"] == 1
    assert files(dest) == files(raw)
    assert sorted(marker_names(dest)) == sorted(files(raw))
    assert stage1(raw, dest, "--verify", shard_mb=shard_mb)["totals"]["write_files"] == 0


def test_copy_verify_compares_with_the_source(raw: Path, tmp_path: Path) -> None:
    """An edit the stats cannot show (a filesystem with coarse timestamps: emulated by recording the new
    stat in the journal) passes a plain restage, but --verify re-reads the source and restages it."""
    dest = tmp_path / "x"
    stage1(raw, dest)
    victim = raw / "train" / "univ_00003.tfrecord"
    rewrite_same_size(victim)
    journal = dest / ".hpcbench" / "staged.jsonl"
    st = victim.stat()
    recs = [json.loads(ln) for ln in journal.read_text().splitlines()]
    for r in recs:
        if "train/univ_00003.tfrecord" in r["source"]:
            r["source"]["train/univ_00003.tfrecord"] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            from hpcbench.staging.copy import fingerprint

            r["crc32c"] = fingerprint([(f[0], *r["source"][f[0]]) for f in r["files"]])
    journal.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert stage1(raw, dest)["totals"]["write_files"] == 0  # the stats match: trusted
    assert files(dest)["train/univ_00003.tfrecord"] != victim.read_bytes()
    rep = stage1(raw, dest, "--verify")
    assert rep["nodes_detail"][0]["repaired_files"] == 1 and rep["totals"]["write_files"] == 1
    assert files(dest) == files(raw)


def test_copy_two_nodes_under_mpiexec(raw: Path, tmp_path: Path) -> None:
    """2 ranks = 2 emulated nodes, each holding the whole dataset (2 instances): both get the new
    bytes, with and without --verify; a deleted file leaves both nodes."""
    def stage2(*extra: str) -> dict:
        rep = tmp_path / "r.json"
        run_mpi(2, ["-m", "hpcbench", "stage", "--method", "copy", "--dataset", "cosmoflow", "--source", str(raw),
                    "--dest", str(tmp_path / "x" / "node{node}"), "--ranks-per-node", "1", "--instances", "2",
                    "--shard-mb", "0.05", "--timeout", "60", "--report", str(rep), *extra],
                timeout=150, env=project_env())
        return json.loads(rep.read_text())

    stage2()
    nodes = [tmp_path / "x" / "node0", tmp_path / "x" / "node1"]
    rewrite_same_size(raw / "train" / "univ_00000.tfrecord")
    assert stage2()["totals"]["write_files"] == 2  # one per node
    assert all(files(n) == files(raw) for n in nodes)
    rewrite_same_size(raw / "validation" / "univ_00001.tfrecord")
    (raw / "train" / "univ_00005.tfrecord").unlink()
    rep = stage2("--verify")
    assert rep["totals"]["write_files"] == 2 and [r["removed_files"] for r in rep["nodes_detail"]] == [1, 1]
    assert all(files(n) == files(raw) for n in nodes)
