"""stage under real mpiexec (4 ranks, 2 instances): byte-for-byte results, resume, corruption,
truncation, path traversal, free space, and a rank that dies or hangs."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.synth_data import write_cosmoflow, write_deepcam, write_lmdb
from hpcbench import registry
from hpcbench.staging.manifest import MANIFEST, FileEntry, Frame, Manifest, decode_header
from hpcbench.staging.pack import Packer
from tests.conftest import mpiexec_path, one_member_pack, project_env, run_mpi

import sys

MiB = 1 << 20


@pytest.fixture(scope="module")
def cosmo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cosmo")
    write_cosmoflow(root / "raw", 12, 5, size=16)
    Packer(root / "raw", root / "packed", registry.layout("cosmoflow"), int(0.07 * MiB), threads=2, progress=False).run()
    return root / "raw", root / "packed"


def stage(source: Path, dest: Path, *extra: str, n: int = 4, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    args = ["-m", "hpcbench", "stage", "--source", str(source), "--dest", f"{dest}/node{{node}}",
            "--instances", "2", "--ranks-per-node", "1", "--chunk-mb", "1", "--timeout", "30", *extra]
    return run_mpi(n, args, timeout=120, check=check, env=project_env(**env))


def staged(dest: Path) -> dict[str, dict[str, bytes]]:
    return {d.name: {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*")
                     if p.is_file() and ".hpcbench" not in p.parts} for d in sorted(dest.iterdir())}


def check_instances(raw: Path, nodes: dict[str, dict[str, bytes]], per_instance: int) -> None:
    """Each instance's nodes hold disjoint parts that together are the whole dataset, byte for byte."""
    src = {p.relative_to(raw).as_posix(): p.read_bytes() for p in raw.rglob("*") if p.is_file()}
    names = sorted(nodes)
    for i in range(0, len(names), per_instance):
        union: dict[str, bytes] = {}
        for nd in names[i: i + per_instance]:
            assert not set(union) & set(nodes[nd])
            union.update(nodes[nd])
        assert union == src
    for j in range(per_instance):  # node j of every instance got the same shard-set
        sets = [nodes[names[i + j]] for i in range(0, len(names), per_instance)]
        assert all(s == sets[0] for s in sets)


def test_stage_two_instances_byte_for_byte_and_read_once(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    raw, packed = cosmo
    rep = tmp_path / "report.json"
    proc = stage(packed, tmp_path / "st", "--report", str(rep), "--verify")
    assert "staging report" in proc.stdout
    check_instances(raw, staged(tmp_path / "st"), per_instance=2)
    r = json.loads(rep.read_text())
    man = Manifest.load(packed / MANIFEST)
    assert r["totals"]["read_bytes"] == sum(s.bytes for s in man.splits.values())  # once per job
    assert r["totals"]["write_files"] == 2 * 17
    assert not list((tmp_path / "st").rglob("*.tmp"))
    local = json.loads((tmp_path / "st" / "node0" / ".hpcbench" / "staged_manifest.json").read_text())
    assert local["files"] == len(staged(tmp_path / "st")["node0"])


def test_independent_method_reads_once_per_instance(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    """--method independent (the v1.0 way): the same files land, but every instance reads its own copy
    of the packed data (no Allgatherv), so the job reads the packed size once per instance."""
    raw, packed = cosmo
    rep = tmp_path / "report.json"
    stage(packed, tmp_path / "st", "--method", "independent", "--report", str(rep))
    check_instances(raw, staged(tmp_path / "st"), per_instance=2)
    r = json.loads(rep.read_text())
    man = Manifest.load(packed / MANIFEST)
    assert r["method"] == "independent"
    assert r["totals"]["read_bytes"] == 2 * sum(s.bytes for s in man.splits.values())
    assert r["totals"]["recv_bytes"] == 0


def test_resume_restages_only_what_is_missing(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    raw, packed = cosmo
    stage(packed, tmp_path / "st")
    victim = next((tmp_path / "st" / "node3" / "train").iterdir())
    victim.unlink()
    rep = tmp_path / "r.json"
    stage(packed, tmp_path / "st", "--report", str(rep))
    r = json.loads(rep.read_text())
    assert r["totals"]["write_files"] >= 1 and r["totals"]["skipped_shards"] > 0
    assert r["totals"]["read_bytes"] < sum(s.bytes for s in Manifest.load(packed / MANIFEST).splits.values())
    check_instances(raw, staged(tmp_path / "st"), per_instance=2)
    size = (raw / victim.relative_to(tmp_path / "st" / "node3")).stat().st_size
    victim.write_bytes(b"\0" * size)  # same size, wrong bytes: only --verify (crc32c) sees it
    stage(packed, tmp_path / "st", "--verify", "--report", str(rep))
    assert json.loads(rep.read_text())["nodes_detail"][3]["repaired_files"] == 1
    check_instances(raw, staged(tmp_path / "st"), per_instance=2)


def _copy_packed(packed: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(packed, to)
    return to


def test_corrupt_shard_names_shard_and_member(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    bad = _copy_packed(cosmo[1], tmp_path / "bad")
    sh = Manifest.load(bad / MANIFEST).splits["train"].shards[1]
    data = bytearray((bad / sh.name).read_bytes())
    f = decode_header(data[: sh.header_bytes], sh.name)[1]
    data[f.frames[0].offset + f.frames[0].length // 2] ^= 0xFF
    (bad / sh.name).write_bytes(bytes(data))
    proc = stage(bad, tmp_path / "st", check=False)
    assert proc.returncode != 0
    assert f"corrupt shard {sh.name}: member {f.name}" in proc.stderr
    for node in (tmp_path / "st").iterdir():
        assert not (node / f.name).exists()  # never left looking complete
        assert not list(node.rglob("*.tmp"))


def test_truncated_shard_names_shard_and_member(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    bad = _copy_packed(cosmo[1], tmp_path / "bad")
    sh = Manifest.load(bad / MANIFEST).splits["train"].shards[2]
    files = decode_header((bad / sh.name).read_bytes()[: sh.header_bytes], sh.name)
    with open(bad / sh.name, "r+b") as fh:
        fh.truncate(files[-1].frames[0].offset + 5)
    proc = stage(bad, tmp_path / "st", check=False)
    assert proc.returncode != 0
    assert f"truncated shard {sh.name}" in proc.stderr and f"member {files[-1].name} is cut off" in proc.stderr
    assert not any(p.name == Path(files[-1].name).name for p in (tmp_path / "st").rglob("*"))


def test_path_traversal_member_is_refused(tmp_path: Path) -> None:
    # a consistent (checksummed) but malicious dataset: the member name itself is refused
    pk = one_member_pack(tmp_path / "packed", "../../escape.tfrecord")
    proc = stage(pk, tmp_path / "st", check=False)
    assert proc.returncode != 0 and "refusing member name '../../escape.tfrecord'" in proc.stderr
    assert not list(tmp_path.rglob("escape.tfrecord"))


def test_free_space_checked_before_start(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    proc = stage(cosmo[1], tmp_path / "st", "--reserve-mb", "1e12", check=False)
    assert proc.returncode != 0 and "not enough free space" in proc.stderr
    assert not any(p.is_file() for p in (tmp_path / "st").rglob("*.tfrecord"))


def test_disk_full_during_write_keeps_nothing_half_written(tmp_path: Path) -> None:
    """A real full filesystem (a 256 KiB tmpfs, needs root); the write fails cleanly."""
    import zstandard

    import crc32c
    from hpcbench.common.errors import DataError
    from hpcbench.staging.nodelocal import FileAssembly

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        raw = os.urandom(1 << 20)
        blob = zstandard.ZstdCompressor().compress(raw)
        fr = Frame(0, len(blob), 0, len(raw), crc32c.crc32c(raw))
        asm = FileAssembly(mnt / "train" / "big.tfrecord", FileEntry("train/big.tfrecord", len(raw), fr.crc32c, [fr]), 0)
        with pytest.raises(DataError, match="disk full while writing"):
            asm.write_frame(memoryview(blob), fr, "train/shard-00000.zst")
        assert [p.name for p in (mnt / "train").iterdir()] == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_several_ranks_per_node_deepcam_and_lmdb(tmp_path: Path) -> None:
    write_deepcam(tmp_path / "raw", 5, 2)
    oc = tmp_path / "oc"
    write_lmdb(oc / "raw" / "train" / "data.0000.lmdb", 100, 2000)
    Packer(tmp_path / "raw", tmp_path / "packed", registry.layout("deepcam"), int(0.06 * MiB), threads=2,
           chunk_bytes=32 * 1024, progress=False).run()
    Packer(oc / "raw", oc / "packed", registry.layout("oc20"), MiB, chunk_bytes=32 * 1024,
           threads=2, progress=False).run()
    # 4 ranks, 2 instances, 2 ranks per node: one node per instance, so each node gets everything
    args = ["--ranks-per-node", "2"]
    run_mpi(4, ["-m", "hpcbench", "stage", "--source", str(tmp_path / "packed"), "--dest", f"{tmp_path}/st/node{{node}}",
                "--instances", "2", *args, "--dataset", "deepcam", "--timeout", "30"], timeout=120)
    nodes = staged(tmp_path / "st")
    src = {p.relative_to(tmp_path / "raw").as_posix(): p.read_bytes() for p in (tmp_path / "raw").rglob("*.h5")}
    assert nodes["node0"] == nodes["node1"] == src
    # 4 ranks as 2 instances x 2 nodes, the LMDB (many frames) replicated to every node
    run_mpi(4, ["-m", "hpcbench", "stage", "--source", str(oc / "packed"), "--dest", f"{oc}/st/node{{node}}",
                "--instances", "2", "--ranks-per-node", "1", "--replicate", "train", "--timeout", "30"], timeout=120)
    lm = (oc / "raw" / "train" / "data.0000.lmdb").read_bytes()
    for node in staged(oc / "st").values():
        assert node == {"train/data.0000.lmdb": lm}


@pytest.mark.parametrize("kind", ["exit", "hang"])
def test_a_rank_dying_or_hanging_ends_the_job_in_bounded_time(cosmo: tuple[Path, Path], tmp_path: Path, kind: str) -> None:
    # tests/stage_fault_job.py makes rank 1 die or hang at round 0 of its reads, then runs `hpcbench stage`
    cmd = [mpiexec_path(), "-n", "4", sys.executable, str(Path(__file__).with_name("stage_fault_job.py")),
           f"{kind}:1:0", "stage", "--source", str(cosmo[1]),
           "--dest", f"{tmp_path}/st/node{{node}}", "--instances", "2", "--ranks-per-node", "1",
           "--chunk-mb", "1", "--timeout", "4"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=project_env(), capture_output=True, text=True, timeout=90)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert took < 60
    out = proc.stdout + proc.stderr
    assert "injected fault" in out
    if kind == "hang":
        assert "no progress for 4s" in out and "aborting the job" in out


def test_staging_inside_a_job_logs_mlperf_staging_events(cosmo: tuple[Path, Path], tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(f"""
from pathlib import Path
from hpcbench.common.dist import init_distributed
from hpcbench.common.mllog import MLPerfLogger
from hpcbench.staging.stage import StageOptions, stage
env = init_distributed(2, 1, torch_backend=None)
log = MLPerfLogger(Path(r"{tmp_path}") / f"result_{{env.layout.instance}}.txt" if env.layout.instance_rank == 0 else None)
stage(env, StageOptions(Path(r"{cosmo[1]}"), r"{tmp_path}/st/node{{node}}", timeout_s=30), mllog=log)
log.close()
""")
    run_mpi(4, [str(script)], timeout=120)
    for inst in (0, 1):
        text = (tmp_path / f"result_{inst}.txt").read_text()
        assert '"key": "staging_start"' in text and '"key": "staging_stop"' in text
