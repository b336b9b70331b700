"""pack: real shards round-trip to the original bytes; resume; file layouts of all three datasets; plan."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import zstandard

from benchmarks.synth_data import write_cosmoflow, write_deepcam, write_lmdb
from hpcbench.common.data.layout import REPLICATED
from hpcbench.common.errors import DataError
from hpcbench import registry
from hpcbench.staging.manifest import MANIFEST, Manifest, decode_header, safe_relpath
from hpcbench.staging.pack import Packer, group_files
from hpcbench.staging.plan import balance, node_volume, plan_split
from tests.conftest import run_cli

MiB = 1 << 20


def unpack_all(packed: Path) -> dict[str, bytes]:
    """Decode every shard with plain zstandard (independent of the staging code path)."""
    man = Manifest.load(packed / MANIFEST)
    out = {}
    for sp in man.splits.values():
        for sh in sp.shards:
            data = (packed / sh.name).read_bytes()
            assert len(data) == sh.bytes
            for f in decode_header(data[: sh.header_bytes], sh.name):
                parts = sorted(f.frames, key=lambda fr: fr.raw_offset)
                out[f.name] = b"".join(zstandard.ZstdDecompressor().decompress(data[fr.offset: fr.offset + fr.length])
                                       for fr in parts)
    return out


def pack(src: Path, dst: Path, dataset: str, shard_mb: float = 0.1, chunk: int | None = None) -> Packer:
    p = Packer(src, dst, registry.layout(dataset), int(shard_mb * MiB), chunk_bytes=chunk, threads=2, progress=False)
    p.run()
    return p


def test_cosmoflow_roundtrip_and_compression(tmp_path: Path) -> None:
    write_cosmoflow(tmp_path / "raw", 7, 3, size=16)
    pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    man = Manifest.load(tmp_path / "packed" / MANIFEST)
    assert set(man.splits) == {"train", "validation"} and man.splits["train"].files == 7
    got = unpack_all(tmp_path / "packed")
    raw = {p.relative_to(tmp_path / "raw").as_posix(): p.read_bytes() for p in (tmp_path / "raw").rglob("*.tfrecord")}
    assert got == raw
    ratio = man.splits["train"].bytes / man.splits["train"].raw_bytes
    assert ratio < 0.5  # Poisson counts with mean ~1 in int16 compress well
    assert not list((tmp_path / "packed").rglob("*.tmp"))
    listing = (tmp_path / "packed" / "listing.tsv").read_text().splitlines()
    assert len(listing) == 1 + 10


def test_pack_resume_skips_done_shards_and_repacks_changed(tmp_path: Path) -> None:
    write_cosmoflow(tmp_path / "raw", 6, 0, size=16)
    first = pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    assert first.written >= 2 and first.reused == 0
    again = pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    assert again.written == 0 and again.reused == first.written
    victim = tmp_path / "raw" / "train" / "univ_00000.tfrecord"
    victim.write_bytes(victim.read_bytes()[::-1])  # same size, new content and mtime
    third = pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    assert third.written == 1
    assert unpack_all(tmp_path / "packed")["train/univ_00000.tfrecord"] == victim.read_bytes()


def test_deepcam_stats_replicated_and_lmdb_chunked(tmp_path: Path) -> None:
    write_deepcam(tmp_path / "dc", 3, 2)
    pack(tmp_path / "dc", tmp_path / "dcp", "deepcam")
    man = Manifest.load(tmp_path / "dcp" / MANIFEST)
    assert man.splits[REPLICATED].replicate and man.splits[REPLICATED].files == 1
    assert unpack_all(tmp_path / "dcp")["stats.h5"] == (tmp_path / "dc" / "stats.h5").read_bytes()

    write_lmdb(tmp_path / "oc" / "train" / "data.0000.lmdb", 200, 3000)
    pack(tmp_path / "oc", tmp_path / "ocp", "oc20", chunk=64 * 1024)
    hdr_files = unpack_all(tmp_path / "ocp")
    src = (tmp_path / "oc" / "train" / "data.0000.lmdb").read_bytes()
    assert hdr_files == {"train/data.0000.lmdb": src}
    sh = Manifest.load(tmp_path / "ocp" / MANIFEST).splits["train"].shards[0]
    entry = decode_header((tmp_path / "ocp" / sh.name).read_bytes()[: sh.header_bytes], sh.name)[0]
    assert len(entry.frames) == -(-len(src) // (64 * 1024)) > 1


def test_pack_errors_are_clear(tmp_path: Path) -> None:
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no cosmoflow sample files"):
        pack(tmp_path / "empty", tmp_path / "out", "cosmoflow")
    with pytest.raises(DataError, match="must not be inside"):
        pack(tmp_path / "empty", tmp_path / "empty" / "p", "cosmoflow")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(DataError, match="not a hpcbench-packed"):
        Manifest.load(tmp_path / "bad.json")


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", ""])
def test_member_names_with_traversal_are_refused(name: str) -> None:
    with pytest.raises(DataError, match="refusing member name"):
        safe_relpath(name, "shard s")


def test_plan_covers_each_shard_once_and_reads_are_disjoint() -> None:
    from hpcbench.staging.manifest import ShardInfo

    shards = [ShardInfo(f"s{i}", 100 + i % 3, 1000, 10, 0, 0) for i in range(23)]
    p = plan_split("train", False, shards, instances=3, nodes_per_instance=4)
    assert sorted(i for s in p.sets for i in s) == list(range(23))
    for need in p.sets:
        readers = p.readers(need)
        assert len(readers) == 3 and sorted(i for r in readers for i in r) == need
    total_read = sum(node_volume(p, k, j).read_bytes for k in range(3) for j in range(4))
    assert total_read == sum(s.bytes for s in shards)  # every shard read exactly once per job
    assert balance([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]
    assert group_files([("a", 3), ("b", 3), ("c", 3)], 6) == [[("a", 3), ("b", 3)], [("c", 3)]]


def test_dry_run_full_scale_cosmoflow_is_fast() -> None:
    proc = run_cli(["stage", "--dry-run", "--nodes", "512", "--instances", "128", "--dataset", "cosmoflow"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "512 nodes = 128 instances x 4 nodes" in proc.stdout
    assert "524,288 files" in proc.stdout and "job total" in proc.stdout
    # no rates: the plan, and the model refuses to predict the cluster from this box's probe
    assert "model (staging.model): not run" in proc.stdout and "--fs-GBps" in proc.stdout
    assert "total s" not in proc.stdout and "WARNING" not in proc.stdout


def test_dry_run_model_from_this_boxs_probe_says_so_loudly() -> None:
    rates = ["--fabric-GBps", "200", "--write-GBps", "6", "--decompress-GBps", "24"]
    proc = run_cli(["stage", "--dry-run", "--nodes", "8", "--instances", "2", "--dataset", "cosmoflow", *rates,
                    "--rates-from-probe"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.split("model (staging.model)")[0]
    assert "WARNING: fs_GBps measured on THIS machine" in first and "not on the 8-node cluster" in first
    assert "fs_GBps" in proc.stdout and "(probe)" in proc.stdout and "write_GBps 6 (given)" in proc.stdout


def test_dry_run_model_with_given_rates_and_plot(tmp_path: Path) -> None:
    """The model's lines with every rate given (no probe): the v2.0 layout is write-bound, copy read-bound."""
    rates = ["--fs-GBps", "500", "--fabric-GBps", "200", "--write-GBps", "6", "--decompress-GBps", "24"]
    proc = run_cli(["stage", "--dry-run", "--nodes", "512", "--instances", "128", "--dataset", "cosmoflow", *rates,
                    "--plot", str(tmp_path / "curve.png")], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "fs_GBps 500 (given)" in proc.stdout and "probe" not in proc.stdout.split("model (staging.model)")[1].split("\n")[0]
    rows = {ln.split()[0]: ln.split() for ln in proc.stdout.splitlines() if ln.strip().startswith(("packed", "copy"))}
    assert rows["packed"][-1] == "write" and rows["copy"][-1] == "read"
    assert float(rows["copy"][-2]) > 5 * float(rows["packed"][-2])
    assert "scaling curve (4 nodes per instance)" in proc.stdout
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_cli(["stage", "--dry-run", "--nodes", "4", "--instances", "2", "--dataset", "cosmoflow",
                   "--fs-GBps", "0", "--fabric-GBps", "1", "--write-GBps", "1", "--decompress-GBps", "1"], timeout=60)
    assert bad.returncode == 2 and "--fs-GBps must be a finite number > 0" in bad.stderr


def test_pack_cli_and_dry_run_from_a_manifest(tmp_path: Path) -> None:
    write_cosmoflow(tmp_path / "raw", 8, 2, size=16)
    proc = run_cli(["pack", "--dataset", "cosmoflow", "--source", str(tmp_path / "raw"), "--dest",
                    str(tmp_path / "packed"), "--shard-mb", "0.07", "--no-progress"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "train: 8 files" in proc.stdout and "0 reused" in proc.stdout
    proc = run_cli(["stage", "--dry-run", "--nodes", "4", "--instances", "2", "--source", str(tmp_path / "packed")])
    assert proc.returncode == 0, proc.stderr
    assert "4 nodes = 2 instances x 2 nodes" in proc.stdout and "split train" in proc.stdout
    proc = run_cli(["pack", "--dataset", "cosmoflow", "--source", str(tmp_path / "nope"), "--dest", str(tmp_path / "x")])
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_leftover_temporaries_are_swept(tmp_path: Path) -> None:
    from hpcbench.staging.nodelocal import sweep_temporaries

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / ".univ_1.tfrecord.abc123.tmp").write_bytes(b"half")
    (tmp_path / "train" / "univ_0.tfrecord").write_bytes(b"whole")
    assert sweep_temporaries(tmp_path) == 1
    assert [p.name for p in (tmp_path / "train").iterdir()] == ["univ_0.tfrecord"]


def test_allgatherv_rounds_stay_below_the_mpi_int_limit() -> None:
    from hpcbench.staging.distribute import INT_MAX, round_bytes

    assert round_bytes(64 * MiB, 4) == 64 * MiB
    for g in (1, 3, 128, 4096):
        c = round_bytes(4 << 30, g)
        assert c * g <= INT_MAX and c > 0


def test_training_refuses_a_folder_that_is_not_completely_staged(tmp_path: Path) -> None:
    """hpcbench.staging.marker.require_staged: the training entry's check of a node-local data root."""
    from types import SimpleNamespace

    from hpcbench.staging.marker import NodeLayout, require_staged, write_marker

    root = tmp_path / "node1"
    (root / "train").mkdir(parents=True)
    (root / "train" / "a.tfrecord").write_bytes(b"abc")
    data = SimpleNamespace(root=str(tmp_path / "node{node}"), node_local=True, require_staged=True)
    rank = SimpleNamespace(node_index=1, instance_node_index=1, nodes_per_instance=2)
    with pytest.raises(DataError, match="not a completely staged folder"):
        require_staged(data, rank, "cosmoflow")
    require_staged(SimpleNamespace(**{**vars(data), "require_staged": False}), rank, "cosmoflow")  # by hand
    write_marker(root, "cosmoflow", "f" * 64, NodeLayout(1, 1, 2, 2, 4), ["train"], [["train/a.tfrecord", 3, 0]])
    require_staged(data, rank, "cosmoflow")
    with pytest.raises(DataError, match="staged with dataset 'cosmoflow', not 'deepcam'"):
        require_staged(data, rank, "deepcam")
    with pytest.raises(DataError, match="this rank trains as node 0 of 2"):
        require_staged(data, SimpleNamespace(node_index=1, instance_node_index=0, nodes_per_instance=2), "cosmoflow")
    with pytest.raises(DataError, match="holds only part of the dataset"):
        require_staged(data, SimpleNamespace(node_index=1, instance_node_index=0, nodes_per_instance=1), "cosmoflow")
    (root / "train" / "a.tfrecord").write_bytes(b"ab")
    with pytest.raises(DataError, match="missing or changed since staging"):
        require_staged(data, rank, "cosmoflow")


def test_manifest_self_check_and_v1_repack_message(tmp_path: Path) -> None:
    write_cosmoflow(tmp_path / "raw", 3, 1, size=8)
    pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    path = tmp_path / "packed" / MANIFEST
    d = json.loads(path.read_text())
    assert Manifest.load(path).sha256 == d["sha256"]
    d["splits"]["train"]["shards"][0]["crc32c"] ^= 1
    path.write_text(json.dumps(d))
    with pytest.raises(DataError, match="corrupt manifest"):
        Manifest.load(path)
    path.write_text(json.dumps({**d, "version": 1}))
    with pytest.raises(DataError, match="repack it"):
        Manifest.load(path)
    for bad in ("[]", "null", "3"):
        path.write_text(bad)
        with pytest.raises(DataError, match="a JSON object was expected"):
            Manifest.load(path)
    for name in (".hpcbench/staged.jsonl", "train/.x.tmp"):
        with pytest.raises(DataError, match="reserved"):
            safe_relpath(name, "test")


def test_packed_files_follow_the_umask(tmp_path: Path) -> None:
    import stat

    from hpcbench.common import atomic

    write_cosmoflow(tmp_path / "raw", 2, 1, size=8)
    old = atomic._UMASK
    atomic._UMASK = 0o027
    try:
        pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    finally:
        atomic._UMASK = old
    for p in (tmp_path / "packed").rglob("*"):
        if p.is_file():
            assert stat.S_IMODE(p.stat().st_mode) == 0o640, p


def test_batched_durability_renames_only_after_the_shards_fsync(tmp_path: Path) -> None:
    """A finished member stays a hidden temporary until sync_all + commit; a temporary that vanished
    before its fsync is a named error and nothing appears under the member's name."""
    import crc32c

    from hpcbench.staging.manifest import FileEntry, Frame
    from hpcbench.staging.nodelocal import FileAssembly, sync_all

    raw = bytes(range(256)) * 512
    blob = zstandard.ZstdCompressor().compress(raw)
    fr = Frame(0, len(blob), 0, len(raw), crc32c.crc32c(raw))
    entry = FileEntry("train/a.tfrecord", len(raw), fr.crc32c, [fr])
    out = tmp_path / "train" / "a.tfrecord"
    asm = FileAssembly(out, entry, 0)
    assert asm.write_frame(memoryview(blob), fr, "train/shard-00000.zst")
    assert not out.exists() and asm.tmp.read_bytes() == raw  # written and checked, not yet in place
    sync_all([asm])
    asm.commit()
    assert out.read_bytes() == raw and not asm.tmp.exists()

    lost = FileAssembly(tmp_path / "train" / "b.tfrecord", FileEntry("train/b.tfrecord", len(raw), fr.crc32c, [fr]), 0)
    assert lost.write_frame(memoryview(blob), fr, "train/shard-00000.zst")
    lost.tmp.unlink()
    with pytest.raises(DataError, match="cannot write .*b.tfrecord"):
        sync_all([lost])
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["a.tfrecord"]


# ---- messages (staging issue, item 5) -------------------------------------------------------------
@pytest.mark.parametrize("name,normal", [("train/./x.tfrecord", "train/x.tfrecord"), ("train//x", "train/x"),
                                         ("./x", "x"), ("train/", "train"), (".", None)])
def test_member_names_not_in_normal_form_are_refused(name: str, normal: str | None) -> None:
    """'train/./x' would be written as train/x and then reported as a file that "appeared during
    staging": such a name is refused where the header is read, naming the spelling to use."""
    hint = f"write '{normal}'" if normal else "it names no file"
    with pytest.raises(DataError, match=f"not a normal relative path .*{hint}"):
        safe_relpath(name, "shard s")


def _header(entries: list[dict]) -> bytes:
    from hpcbench.staging.manifest import MAGIC, _HDR

    body = json.dumps({"shard": "train/shard-00000.zst", "files": entries}).encode()
    return _HDR.pack(MAGIC, len(body)) + body


def test_header_key_edits_are_named_errors() -> None:
    good = {"name": "train/a", "size": 3, "crc32c": 7, "frames": [{"offset": 90, "length": 5, "raw_offset": 0,
                                                                   "raw_length": 3, "crc32c": 7}]}
    assert decode_header(_header([good]), "shard S")[0].frames[0].offset == 90
    frame = good["frames"][0]
    cases = [
        ({**good, "frames": [{"offzet" if k == "offset" else k: v for k, v in frame.items()}]},
         "corrupt shard S: header member 0 ('train/a') frame 0 has no key 'offset'"),
        ({**good, "frames": [{**frame, "extra": 1}]}, "frame 0 has an unknown key 'extra'"),
        ({"nmae" if k == "name" else k: v for k, v in good.items()}, "header member 0 has no key 'name'"),
        ({**good, "size": "3"}, "key 'size' must be an integer >= 0, got '3'"),
        ({**good, "frames": [{**frame, "length": -1}]}, "key 'length' must be an integer >= 0, got -1"),
        ({**good, "frames": 5}, "key 'frames' must be a list"),
        ([1], "header member 0 is not a JSON object"),
    ]
    for entry, msg in cases:
        with pytest.raises(DataError, match=re.escape(msg)) as exc:
            decode_header(_header([entry]), "shard S")
        assert "TypeError" not in str(exc.value) and "KeyError" not in str(exc.value)


def test_manifest_totals_and_shard_keys_are_cross_checked(tmp_path: Path) -> None:
    from hpcbench.staging.manifest import content_hash

    write_cosmoflow(tmp_path / "raw", 4, 1, size=8)
    pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow", shard_mb=0.01)
    path = tmp_path / "packed" / MANIFEST
    good = json.loads(path.read_text())

    def load_edited(edit) -> None:  # noqa: ANN001
        d = json.loads(json.dumps(good))
        edit(d)
        d["sha256"] = content_hash(d)  # resealed: only the cross-checks can find it
        path.write_text(json.dumps(d))
        Manifest.load(path)

    def files_plus_one(d: dict) -> None:
        d["splits"]["train"]["files"] += 1

    with pytest.raises(DataError, match=r"malformed manifest: split 'train' lists 5 files but its \d+ shards hold 4"):
        load_edited(files_plus_one)
    with pytest.raises(DataError, match="split 'train' lists .* raw bytes but"):
        load_edited(lambda d: d["splits"]["train"].update(raw_bytes=1))
    with pytest.raises(DataError, match="split 'train' shard 0 has no key 'bytes'"):
        load_edited(lambda d: d["splits"]["train"]["shards"][0].update(bytez=d["splits"]["train"]["shards"][0].pop("bytes")))
    with pytest.raises(DataError, match="split 'train' shard 1 has an unknown key 'note'"):
        load_edited(lambda d: d["splits"]["train"]["shards"][1].update(note=1))
    path.write_text(json.dumps(good))
    assert Manifest.load(path).splits["train"].files == 4


def test_pack_resume_repacks_a_damaged_shard(tmp_path: Path) -> None:
    """A shard of an earlier run with the right size but a changed byte is packed again, not reused."""
    write_cosmoflow(tmp_path / "raw", 6, 0, size=16)
    first = pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    man = Manifest.load(tmp_path / "packed" / MANIFEST)
    victim = man.splits["train"].shards[1]
    data = bytearray((tmp_path / "packed" / victim.name).read_bytes())
    data[-5] ^= 0x20
    (tmp_path / "packed" / victim.name).write_bytes(bytes(data))
    again = pack(tmp_path / "raw", tmp_path / "packed", "cosmoflow")
    assert again.damaged == [victim.name] and again.written == 1 and again.reused == first.written - 1
    assert Manifest.load(tmp_path / "packed" / MANIFEST).sha256 == man.sha256
    raw = {p.relative_to(tmp_path / "raw").as_posix(): p.read_bytes() for p in (tmp_path / "raw").rglob("*.tfrecord")}
    assert unpack_all(tmp_path / "packed") == raw


@pytest.mark.parametrize("args,msg", [
    (["--shard-mb", "nan"], "--shard-mb must be a finite number of MiB > 0"),
    (["--shard-mb", "1e-9"], "--shard-mb must be a finite number of MiB > 0 (at least one byte), got 1e-09"),
    (["--chunk-mb", "inf"], "--chunk-mb must be a finite number of MiB > 0"),
    (["--chunk-mb", "-1"], "--chunk-mb must be a finite number of MiB > 0"),
    (["--level", "23"], "--level must be from -131072 to 22"),
    (["--threads", "0"], "--threads must be from 1 to 1024 (leave it out for all CPUs), got 0"),
])
def test_pack_numeric_options_are_range_checked(tmp_path: Path, args: list[str], msg: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from hpcbench.cli import main

    rc = main(["pack", "--dataset", "cosmoflow", "--source", str(tmp_path / "raw"), "--dest", str(tmp_path / "p"),
               "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("args,msg", [
    (["--chunk-mb", "4096"], "--chunk-mb must be from 1 to 2047"),
    (["--threads", "100000"], "--threads must be from 1 to 1024"),
    (["--shard-mb", "1e-9"], "--shard-mb must be a finite number of MiB > 0 (at least one byte)"),
    (["--fs-GBps", "-1"], "--fs-GBps must be a finite number > 0"),  # checked without --dry-run too
])
def test_stage_numeric_options_are_range_checked(tmp_path: Path, args: list[str], msg: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from hpcbench.cli import main

    rc = main(["stage", "--source", str(tmp_path / "p"), "--dest", str(tmp_path / "d"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err
