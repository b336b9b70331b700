"""OC20 LMDB format: pickle-free round trip, pickle opt-in, converter, corrupt files, per-file sizes."""
from __future__ import annotations

import io
import re
import pickle
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

from hpcbench.common.errors import ConfigError, DataError
from hpcbench.workloads.opencatalyst import datagen, graph, lmdbio, record
from tests.conftest import run_cli


def sample(seed: int = 0) -> dict:
    return datagen.make_sample(datagen.GenSpec(size=(2, 2, 2), cutoff=5.0, max_neighbors=20), seed, "train", seed)


def assert_same(a: dict, b: dict) -> None:
    assert set(record.ARRAY_FIELDS) <= set(b)
    for k in record.ARRAY_FIELDS:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    assert int(a["natoms"]) == int(b["natoms"]) and float(a["y"]) == pytest.approx(float(b["y"]))


def test_record_round_trip_and_fields() -> None:
    s = sample()
    out = record.decode(record.encode(s), "mem")
    assert_same(s, out)
    assert out["sid"] == s["sid"] and out["pos"].dtype == np.float32 and out["edge_index"].dtype == np.int64
    assert s["tags"].max() == 2 and (s["fixed"][s["tags"] == 0] == 1).all()  # adsorbate tag, sub-surface fixed


def test_record_corruption_is_named() -> None:
    raw = record.encode(sample())
    with pytest.raises(DataError, match="truncated|needs bytes"):
        record.decode(raw[: len(raw) - 40], "f.lmdb key '3'")
    with pytest.raises(DataError, match="f.lmdb key '3'.*magic"):
        record.decode(b"garbage" * 4, "f.lmdb key '3'")
    import struct

    for head in (b"[1, 2]", b'{"pos": 3}'):  # valid JSON, not an object of field entries
        with pytest.raises(DataError, match=r"k: corrupt record header \(expected an object of field entries\)"):
            record.decode(record.MAGIC + struct.pack("<BI", record.VERSION, len(head)) + head, "k")
    bad = dict(sample())
    bad["force"] = bad["force"][:-1]
    with pytest.raises(DataError, match="'force' has shape"):
        record.decode(record.encode(bad), "x")


@pytest.mark.parametrize("field,value,msg", [
    ("force", np.nan, r"'force' is not finite at index \[1, 2\]"),
    ("pos", np.inf, r"'pos' is not finite at index \[1, 2\]"),
    ("cell", -np.inf, r"'cell' is not finite"),
    ("y", np.nan, r"'y' \(the energy\) is nan"),
])
def test_non_finite_values_are_refused_at_read_with_file_and_field(field: str, value: float, msg: str) -> None:
    bad = dict(sample())
    if field == "y":
        bad["y"] = value
    else:
        arr = np.array(bad[field], copy=True)
        arr.reshape(-1, 3)[1, 2] = value
        bad[field] = arr
    with pytest.raises(DataError, match=rf"data\.0000\.lmdb key '7': field {msg}"):
        record.decode(record.encode(bad), "data.0000.lmdb key '7'")


def encode_in_order(sample: dict, order: list[str]) -> bytes:
    """A record as the documented layout has it, fields in ``order`` (the writer before the real-valued fields
    were put first wrote them in the sample's order): a second writer, independent of record.encode."""
    import json
    import struct

    header, chunks, offset = {}, [], 0
    for name in order:
        arr = np.asarray(sample[name])
        if arr.ndim == 0:
            header[name] = {"value": arr.item()}
            continue
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "offset": offset}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    return b"HPCBOC20" + struct.pack("<BI", 1, len(head)) + head + b"".join(chunks)


def test_real_valued_fields_are_one_run_of_bytes_checked_at_once() -> None:
    """encode puts pos, cell, cell_offsets, force back to back (float32), so decode checks them in one pass; a
    record of another layout (interleaved with integer fields) decodes the same and is checked field by field:
    either way a non-finite value is named by its field."""
    s = sample()
    head, body = header_and_body(record.encode(s))
    assert [n for n in head if "offset" in head[n]][:4] == list(record.FLOAT_FIELDS)
    span = record._float_span(head, body)
    assert span is not None and np.array_equal(span, np.concatenate([np.asarray(s[f], np.float32).ravel()
                                                                      for f in record.FLOAT_FIELDS]))
    interleaved = list(s)  # pos, atomic_numbers, cell, edge_index, ...: the float fields apart
    assert record._float_span(*header_and_body(encode_in_order(s, interleaved))) is None
    assert_same(s, record.decode(encode_in_order(s, interleaved), "old"))
    for layout in (lambda d: record.encode(d), lambda d: encode_in_order(d, interleaved)):
        bad = dict(s)
        bad["cell_offsets"] = np.array(s["cell_offsets"], copy=True)
        bad["cell_offsets"][3, 1] = np.nan
        with pytest.raises(DataError, match=r"k: field 'cell_offsets' is not finite at index \[3, 1\]"):
            record.decode(layout(bad), "k")


def header_and_body(raw: bytes) -> tuple[dict, memoryview]:
    """The JSON header and the array bytes of an encoded record (the documented layout)."""
    import json

    n = len(record.MAGIC)
    hlen = int.from_bytes(raw[n + 1:n + 5], "little")
    return json.loads(raw[n + 5:n + 5 + hlen]), memoryview(raw)[n + 5 + hlen:]


def test_integer_positions_or_forces_are_refused() -> None:
    bad = dict(sample())
    bad["pos"] = np.rint(bad["pos"]).astype(np.int32)
    with pytest.raises(DataError, match=r"x: field 'pos' is stored as int32; expected floating point \(float32\)"):
        record.decode(record.encode(bad), "x")


def write_pickled_oc20(path: Path, samples: list[dict]) -> None:
    """An original-style OC20 LMDB: pickled torch_geometric Data values and a pickled length."""
    from torch_geometric.data import Data

    env = lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False)
    with env.begin(write=True) as txn:
        for i, s in enumerate(samples):
            d = Data(pos=torch.from_numpy(s["pos"]), atomic_numbers=torch.from_numpy(s["atomic_numbers"]).float(),
                     cell=torch.from_numpy(s["cell"]), natoms=s["natoms"], edge_index=torch.from_numpy(s["edge_index"]),
                     cell_offsets=torch.from_numpy(s["cell_offsets"]), y=s["y"], force=torch.from_numpy(s["force"]),
                     fixed=torch.from_numpy(s["fixed"]).float(), tags=torch.from_numpy(s["tags"]), sid=s["sid"], fid=0)
            txn.put(str(i).encode(), pickle.dumps(d, protocol=4))
        txn.put(b"length", pickle.dumps(len(samples), protocol=4))
    env.close()


def test_pickle_needs_opt_in_and_converter(tmp_path: Path) -> None:
    src = tmp_path / "orig" / "train"
    src.mkdir(parents=True)
    samples = [sample(k) for k in range(3)]
    write_pickled_oc20(src / "data.0000.lmdb", samples)
    with pytest.raises(DataError, match="pickled.*--trust-pickle"):
        lmdbio.Shard(src / "data.0000.lmdb")
    trusted = lmdbio.Shard(src / "data.0000.lmdb", trust_pickle=True)
    assert_same(samples[1], trusted[1])
    # the CLI refuses without the opt-in, converts with it
    proc = run_cli(["convert", "oc20", "--src", str(tmp_path / "orig"), "--out", str(tmp_path / "safe")])
    assert proc.returncode == 2 and "--trust-pickle" in proc.stderr
    proc = run_cli(["convert", "oc20", "--src", str(tmp_path / "orig"), "--out", str(tmp_path / "safe"),
                    "--trust-pickle", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    ds = lmdbio.SplitDataset(lmdbio.shard_paths(tmp_path / "safe" / "train"))
    assert len(ds) == 3
    for k in range(3):
        assert_same(samples[k], ds[k])
    meta = ds.sizes()
    assert meta["natoms"].tolist() == [s["natoms"] for s in samples]
    assert meta["triplets"][0] == graph.count_triplets(samples[0]["edge_index"], samples[0]["cell_offsets"],
                                                       samples[0]["natoms"])
    lmdbio.close_all()  # LMDB allows one open environment per file and process
    with lmdb.open(str(tmp_path / "safe" / "train" / "data.0000.lmdb"), subdir=False, readonly=True, lock=False) as env:
        with env.begin() as txn:
            assert all(not record.is_pickled(v) for _, v in txn.cursor())


def test_corrupt_and_inconsistent_lmdb(tmp_path: Path) -> None:
    split = tmp_path / "train"
    split.mkdir()
    junk = split / "data.0000.lmdb"
    junk.write_bytes(b"\x00not an lmdb file" * 500)
    with pytest.raises(DataError, match="data.0000.lmdb"):
        lmdbio.SplitDataset(lmdbio.shard_paths(split))
    junk.unlink()
    lmdbio.write_shard(split / "data.0000.lmdb", [sample(0), sample(1)])
    env = lmdb.open(str(split / "data.0000.lmdb"), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"length", b"5")
    env.close()
    with pytest.raises(DataError, match="'length' says 5 samples"):
        lmdbio.Shard(split / "data.0000.lmdb")
    assert not list(split.glob("*.tmp")) and not list(split.glob(".*"))  # no partial files left


def test_a_truncated_lmdb_file_is_named_before_any_read(tmp_path: Path) -> None:
    """LMDB maps the file: a read past the end of a file cut short (an interrupted copy) would kill the process
    with SIGBUS and no message. The file's length is checked against its header's last page first."""
    path = tmp_path / "data.0000.lmdb"
    lmdbio.write_shard(path, [sample(i) for i in range(40)])
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 3)
    lmdbio.close_all()
    with pytest.raises(DataError, match=rf"data.0000.lmdb: truncated LMDB file: {size // 3} bytes, but its header "
                                        rf"says pages up to \d+ of \d+ bytes are in use \({size} bytes\)"):
        lmdbio.Shard(path)
    assert not lmdbio._OPEN  # the refused environment is not kept open


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("atomic_numbers", 120, "1..94"), ("atomic_numbers", 0, "1..94"), ("atomic_numbers", -3, "1..94"),
    ("tags", 3, "0..2"), ("fixed", 2, "0..1"),
])
def test_per_atom_integers_outside_their_range_are_named(field: str, value: int, expected: str) -> None:
    """An atomic number past the model's embedding (rows 0..94) failed inside the model with a bare IndexError;
    0 (the padding atom of static shapes) trained silently."""
    bad = dict(sample())
    bad[field] = np.array(bad[field], copy=True)
    bad[field][1] = value
    with pytest.raises(DataError, match=rf"k: field '{field}' is {value} at atom 1; expected integers {expected}"):
        record.decode(record.encode(bad), "k")
    ok = dict(sample())
    ok["atomic_numbers"] = np.asarray(ok["atomic_numbers"], np.float32)  # original OC20 files store them as floats
    assert_same(ok, record.decode(record.encode(ok), "k"))
    ok["atomic_numbers"][0] = 7.5
    with pytest.raises(DataError, match="'atomic_numbers' is 7.5 at atom 0"):
        record.decode(record.encode(ok), "k")


def put(path: Path, key: bytes, value: bytes) -> None:
    lmdbio.close_all()  # LMDB allows one open environment per file and process
    with lmdb.open(str(path), subdir=False, lock=False) as env, env.begin(write=True) as txn:
        txn.put(key, value)


def test_corrupt_or_wrong_length_sizes_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "data.0000.lmdb"
    sizes = lmdbio.write_shard(path, [sample(0), sample(1)])
    assert lmdbio.Shard(path).stored_sizes.tolist() == sizes.tolist()
    put(path, lmdbio.SIZES_KEY, b"\x93NUMPY garbage")
    with pytest.raises(DataError, match="data.0000.lmdb: key 'sizes' is not the .npy bytes"):
        lmdbio.SplitDataset([path])
    put(path, lmdbio.SIZES_KEY, lmdbio.encode_sizes(sizes[:1]))
    with pytest.raises(DataError, match=r"data.0000.lmdb: key 'sizes' holds .* shape \(1, 3\), expected int64 \(2, 3\)"):
        lmdbio.SplitDataset([path])
    as_float = io.BytesIO()
    np.save(as_float, sizes.astype(np.float64))
    put(path, lmdbio.SIZES_KEY, as_float.getvalue())
    with pytest.raises(DataError, match="data.0000.lmdb: key 'sizes' holds a float64"):
        lmdbio.SplitDataset([path])


def test_sizes_per_file_and_computed_for_original_files(tmp_path: Path) -> None:
    samples = [sample(k) for k in range(3)]
    lmdbio.write_shard(tmp_path / "data.0000.lmdb", samples[:2])
    write_pickled_oc20(tmp_path / "data.0001.lmdb", samples[2:])  # an original file: no 'sizes' key
    ds = lmdbio.SplitDataset(lmdbio.shard_paths(tmp_path), trust_pickle=True, cost="triplets")
    assert ds.shards[1].stored_sizes is None
    expected = lmdbio.sizes_of(samples)
    assert [ds.sizes()[k].tolist() for k in lmdbio.SIZE_COLUMNS] == expected.T.tolist()
    assert ds.costs().tolist() == expected[:, 2].tolist() and ds.costs().dtype == np.float64
    node = lmdbio.SplitDataset([tmp_path / "data.0001.lmdb"], trust_pickle=True)  # a node holding one file
    assert node.sizes()["edges"].tolist() == [samples[2]["edge_index"].shape[1]]


def test_preload_matches_lazy(tmp_path: Path) -> None:
    for i in range(2):
        lmdbio.write_shard(tmp_path / lmdbio.shard_name(i), [sample(2 * i), sample(2 * i + 1)])
    lazy, pre = (lmdbio.SplitDataset(lmdbio.shard_paths(tmp_path)) for _ in range(2))
    pre.preload(threads=2)
    assert len(pre) == 4
    for k in range(4):
        assert_same(lazy[k], pre[k])


def test_convert_errors(tmp_path: Path) -> None:
    from hpcbench.workloads.opencatalyst.convert import convert

    with pytest.raises(ConfigError, match="does not exist"):
        convert(tmp_path / "nope", tmp_path / "out", trust_pickle=True)
    with pytest.raises(ConfigError, match="no data.NNNN.lmdb"):
        convert(tmp_path, tmp_path / "out", trust_pickle=True)


def test_fewer_training_samples_than_the_global_batch_is_named(tmp_path: Path) -> None:
    from hpcbench.common.workload import DataShard
    from hpcbench.workloads.opencatalyst.workload import OC20Workload

    for split, n in (("train", 3), ("validation", 1)):
        (tmp_path / split).mkdir()
        lmdbio.write_shard(tmp_path / split / lmdbio.shard_name(0), [sample(k) for k in range(n)])
    wl = OC20Workload(OC20Workload.load_config("mini", [f"data.root={tmp_path}"]))
    shard = DataShard(rank=0, size=2, seed=0, local_batch_size=2, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"3 training samples in \S+/train cannot fill one batch per rank: local "
                                          r"batch 2 x 2 rank\(s\) reading them = 4 .*'train.global_batch_size'.* "
                                          r"at most 1"):
        wl.train_loader(shard)


def _originals(root: Path, files: int = 1, per_file: int = 3) -> Path:
    src = root / "orig" / "train"
    src.mkdir(parents=True)
    for f in range(files):
        write_pickled_oc20(src / lmdbio.shard_name(f), [sample(10 * f + k) for k in range(per_file)])
    return src


def _count(split: Path) -> int:
    n = len(lmdbio.SplitDataset(lmdbio.shard_paths(split)))
    lmdbio.close_all()
    return n


def test_convert_refuses_a_non_empty_output_folder_unless_replace(tmp_path: Path) -> None:
    _originals(tmp_path)  # data.0000.lmdb, 3 samples
    out = tmp_path / "safe" / "train"
    out.mkdir(parents=True)
    lmdbio.write_shard(out / lmdbio.shard_name(1), [sample(100 + k) for k in range(9)])  # an older conversion
    (out / "NOTES.txt").write_text("kept")
    args = ["convert", "oc20", "--src", str(tmp_path / "orig"), "--out", str(tmp_path / "safe"), "--trust-pickle",
            "--no-progress"]
    proc = run_cli(args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"--out \S+/safe/train: the output folder is not empty \(it holds NOTES.txt, data.0001.lmdb\)"
                     r".*--replace", proc.stderr), proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.txt", "data.0001.lmdb"] and _count(out) == 9
    proc = run_cli([*args, "--replace"])
    assert proc.returncode == 0, proc.stderr
    # the stale file's 9 samples are gone, the user's other file stays, nothing staged is left over
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.txt", "data.0000.lmdb"] and _count(out) == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["train"]


def test_a_failed_convert_leaves_no_output_that_looks_complete(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcbench.workloads.opencatalyst import convert as conv

    src = _originals(tmp_path, files=2)
    verified: list[str] = []

    def verify_then_crash(tmp: Path, job: object) -> None:
        verified.append(tmp.name)
        if len(verified) == 2:
            raise KeyboardInterrupt  # e.g. the job killed while the second file is written
        conv.lmdbio.verify_shard(tmp, 3)

    monkeypatch.setattr(conv, "verify_file", verify_then_crash)
    with pytest.raises(KeyboardInterrupt):
        conv.convert(src, tmp_path / "safe", trust_pickle=True, progress=False)
    assert list(tmp_path.glob("safe*")) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["orig"]
    monkeypatch.undo()
    # converting into an empty existing folder is fine; it ends up with both files
    (tmp_path / "safe").mkdir()
    assert conv.convert(src, tmp_path / "safe", trust_pickle=True, progress=False) == {"train": 6}
    assert _count(tmp_path / "safe") == 6 and sorted(p.name for p in tmp_path.iterdir()) == ["orig", "safe"]
