"""Original OC20 S2EF LMDBs as published (pickled torch_geometric ``Data``, usually without a graph):
convert builds the periodic graph (checked against a brute-force search) and the size metadata,
training works on the converted set and directly on the originals, and every command a message
suggests parses with the real CLI."""
from __future__ import annotations

import itertools
import json
import pickle
import re
import shlex
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

from hpcbench.common.errors import DataError
from hpcbench.workloads.opencatalyst import datagen, graph, lmdbio, record
from tests.conftest import result_log, run_cli

SPEC = datagen.GenSpec(size=(2, 2, 3), cutoff=6.0, max_neighbors=50, metals=("Cu", "Ni"))  # dense: > 50 within 6 A


def published_data(s: dict, names: str = "ocp") -> object:
    """A sample as the published preprocessing pickles it (``AtomsToGraphs``, r_edges=False): float
    atomic numbers and fixed flags, a [1, 3, 3] cell, no edge_index / cell_offsets. ``names="fairchem"``
    uses the later field names ``energy`` and ``forces``."""
    from torch_geometric.data import Data

    energy, forces = ("energy", "forces") if names == "fairchem" else ("y", "force")
    return Data(pos=torch.from_numpy(s["pos"]), cell=torch.from_numpy(s["cell"]),
                atomic_numbers=torch.from_numpy(s["atomic_numbers"]).float(), natoms=int(s["natoms"]),
                tags=torch.from_numpy(s["tags"]), fixed=torch.from_numpy(s["fixed"]).float(),
                sid=int(s["sid"]), fid=0, **{energy: float(s["y"]), forces: torch.from_numpy(s["force"])})


def write_published(path: Path, objects: list[object], length_key: bool = True) -> None:
    """The published LMDB layout: keys "0".. with pickled values and a pickled "length"."""
    with lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False) as env, env.begin(write=True) as txn:
        for i, obj in enumerate(objects):
            txn.put(str(i).encode("ascii"), pickle.dumps(obj, protocol=-1))
        if length_key:
            txn.put(b"length", pickle.dumps(len(objects), protocol=-1))


def brute_force_neighbours(pos: np.ndarray, cell: np.ndarray, cutoff: float) -> list[list[tuple[float, int, tuple]]]:
    """For each atom i, every (distance, j, image) with 0 < |pos_i - pos_j - image @ cell| < cutoff,
    trying every periodic image in a box wide enough for the cell (independent of graph.py)."""
    pos, cell = pos.astype(np.float64), cell.reshape(3, 3).astype(np.float64)
    heights = abs(np.linalg.det(cell)) / np.linalg.norm(np.cross(cell[[1, 2, 0]], cell[[2, 0, 1]]), axis=1)
    ranges = [range(-r, r + 1) for r in (int(np.ceil(cutoff / h)) + 1 for h in heights)]
    out: list[list[tuple[float, int, tuple]]] = [[] for _ in pos]
    for image in itertools.product(*ranges):
        shifted = pos + np.asarray(image, np.float64) @ cell
        for i in range(len(pos)):
            d = np.linalg.norm(pos[i] - shifted, axis=1)
            for j in np.nonzero((d < cutoff) & (d > 1e-8))[0]:
                out[i].append((float(d[j]), int(j), image))
    return [sorted(n) for n in out]


def check_graph_against_brute_force(s: dict, cutoff: float = 6.0, max_neighbors: int = 50) -> int:
    """Assert the sample's graph is the brute-force one (nearest ``max_neighbors`` per centre);
    returns how many centres had more neighbours than that."""
    pos, cell = np.asarray(s["pos"], np.float64), np.asarray(s["cell"], np.float64).reshape(3, 3)
    j, i = np.asarray(s["edge_index"])
    offsets = np.asarray(s["cell_offsets"])
    assert np.array_equal(offsets, np.round(offsets))
    dist = np.linalg.norm(pos[i] - pos[j] - offsets @ cell, axis=1)
    truth = brute_force_neighbours(pos, cell, cutoff)
    capped = 0
    for centre, found in enumerate(truth):
        mine = np.sort(dist[i == centre])
        keep = min(len(found), max_neighbors)
        capped += len(found) > max_neighbors
        assert mine.size == keep, f"atom {centre}: {mine.size} edges, brute force keeps {keep} of {len(found)}"
        np.testing.assert_allclose(mine, [d for d, _, _ in found[:keep]], atol=1e-4)  # the nearest ones
        mine_set = {(int(a), tuple(int(v) for v in o)) for a, o in zip(j[i == centre], offsets[i == centre])}
        all_set = {(a, o) for _, a, o in found}
        assert mine_set <= all_set  # every edge is a real periodic neighbour (right atom, right image)
    return capped


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    which = [("train", k) for k in range(4)] + [("validation", k) for k in range(2)]
    return [datagen.make_sample(SPEC, 5, split, k) for split, k in which]


@pytest.fixture()
def originals(tmp_path: Path, samples: list[dict]) -> Path:
    """A dataset root as published: train/ (two files, one with fairchem's field names and no
    "length" key) and validation/, no graph in any sample."""
    root = tmp_path / "orig"
    for split in ("train", "validation"):
        (root / split).mkdir(parents=True)
    write_published(root / "train" / "data.0000.lmdb", [published_data(s) for s in samples[:2]])
    write_published(root / "train" / "data.0001.lmdb", [published_data(s, "fairchem") for s in samples[2:4]],
                    length_key=False)
    write_published(root / "validation" / "data.0000.lmdb", [published_data(s) for s in samples[4:]])
    return root


def tiny_train(data: Path, results: Path, *extra: str) -> dict:
    proc = run_cli(["train", "oc20", "--config", "mini", "--data", str(data), "--results", str(results),
                    "--device", "cpu", "--no-progress", "--set", "train.max_epochs=1", "--set", "train.target=10",
                    "--set", "train.global_batch_size=2", "--set", "model.hidden=8", "--set", "model.out_emb=8",
                    "--set", "model.int_emb=4", "--set", "model.basis_emb=4", "--set", "model.blocks=1",
                    "--set", "model.cutoff=6.0", "--set", "data.balance=edges", *extra])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x.split(":::MLLOG ", 1)[1]) for x in result_log(results).read_text().splitlines()
             if ":::MLLOG" in x]
    return {x["key"]: x for x in lines}


def test_convert_builds_missing_graph_and_sizes_then_trains(tmp_path: Path, originals: Path,
                                                           samples: list[dict]) -> None:
    assert "edge_index" not in published_data(samples[0]).to_dict()
    proc = run_cli(["convert", "oc20", "--src", str(originals), "--out", str(tmp_path / "safe"),
                    "--trust-pickle", "--workers", "2", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "converted train: 4 samples" in proc.stdout and "converted validation: 2 samples" in proc.stdout
    train = lmdbio.SplitDataset(lmdbio.shard_paths(tmp_path / "safe" / "train"))
    assert len(train) == 4
    capped = 0
    for k in range(4):
        got = train[k]
        capped += check_graph_against_brute_force(got)
        assert float(got["y"]) == pytest.approx(samples[k]["y"])  # fairchem's 'energy' read as y
        np.testing.assert_array_equal(got["force"], samples[k]["force"])
        assert got["atomic_numbers"].dtype == np.int64 and got["fixed"].dtype == np.int8
    assert capped > 0  # some atoms have more than 50 neighbours within 6 A: the cap was exercised
    # size metadata: each file's "sizes" key, what the edge-balanced sampler reads
    for shard in train.shards:
        assert shard.stored_sizes is not None
    sizes = train.sizes()
    assert sizes["natoms"].tolist() == [s["natoms"] for s in samples[:4]]
    assert sizes["edges"].tolist() == [train[k]["edge_index"].shape[1] for k in range(4)]
    assert sizes["triplets"].tolist() == [graph.count_triplets(train[k]["edge_index"], train[k]["cell_offsets"],
                                                               samples[k]["natoms"]) for k in range(4)]
    assert train.costs().tolist() == sizes["edges"].astype(float).tolist()
    keys = tiny_train(tmp_path / "safe", tmp_path / "results")
    assert keys["train_samples"]["value"] == 4 and keys["eval_samples"]["value"] == 2
    assert keys["run_stop"]["metadata"]["status"] == "success" and np.isfinite(keys["eval_error"]["value"])


def test_train_directly_on_published_files(tmp_path: Path, originals: Path) -> None:
    ds = lmdbio.SplitDataset(lmdbio.shard_paths(originals / "train"), trust_pickle=True)
    assert len(ds) == 4 and all(s.stored_sizes is None for s in ds.shards)
    check_graph_against_brute_force(ds[3])  # built when read
    assert ds.sizes()["edges"].tolist() == [ds[k]["edge_index"].shape[1] for k in range(4)]
    keys = tiny_train(originals, tmp_path / "results", "--set", "data.trust_pickle=true")
    assert keys["train_samples"]["value"] == 4 and keys["run_stop"]["metadata"]["status"] == "success"


def test_half_a_graph_and_missing_module_are_named(tmp_path: Path, samples: list[dict]) -> None:
    d = published_data(samples[0])
    d.edge_index = torch.from_numpy(samples[0]["edge_index"])
    with pytest.raises(DataError, match="k '0': has 'edge_index' but not 'cell_offsets'"):
        record.decode_pickled(pickle.dumps(d), "f.lmdb k '0'")
    # a pickle naming a module that is not installed (e.g. a Data class of a package this box lacks)
    raw = b"\x80\x04cnot_installed_pkg.data\nData\n)\x81."  # GLOBAL not_installed_pkg.data.Data, NEWOBJ
    with pytest.raises(DataError, match="needs the Python module 'not_installed_pkg"):
        record.decode_pickled(raw, "f.lmdb k '0'")


def suggested_commands(message: str) -> list[list[str]]:
    return [shlex.split(c) for c in re.findall(r"`hpcbench ([^`]+)`", message)]


def test_every_suggested_command_parses(tmp_path: Path, originals: Path) -> None:
    """The refusals name commands and flags that exist: each suggested command is parsed by the real
    `hpcbench` parser, and its --set keys load into the workload's config."""
    from hpcbench import registry
    from hpcbench.cli import build_parser

    messages = []
    for call in (lambda: lmdbio.Shard(originals / "train" / "data.0000.lmdb"),  # pickled 'length'
                 lambda: record.decode(pickle.dumps({"pos": 1}), "f.lmdb key '0'")):  # pickled value
        with pytest.raises(DataError) as err:
            call()
        messages.append(str(err.value))
    proc = run_cli(["convert", "oc20", "--src", str(originals), "--out", str(tmp_path / "safe")])
    assert proc.returncode == 2
    messages.append(proc.stderr)
    parser = build_parser()
    seen = set()
    for message in messages:
        commands = suggested_commands(message)
        assert commands, message
        for argv in commands:
            args = parser.parse_args(argv)  # SystemExit on an unknown flag
            seen.add(args.command)
            if args.command == "train":
                cfg = registry.get(args.workload).load_config(args.config, list(args.overrides))
                assert cfg.data.trust_pickle is True
    assert seen == {"convert", "train"}


class _OldPygData:
    """Pickles as torch_geometric 1.x did (the published OC20 LMDBs): a ``Data`` whose state is a
    plain attribute dict with no ``_store``, on which a newer PyG's ``to_dict()`` raises."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def __reduce__(self):  # noqa: ANN204
        from torch_geometric.data import Data

        return (object.__new__, (Data,), self.state)


def test_convert_reads_data_pickled_by_old_torch_geometric(tmp_path: Path, samples: list[dict]) -> None:
    root = tmp_path / "old"
    for split, part in (("train", samples[:2]), ("validation", samples[4:])):
        (root / split).mkdir(parents=True)
        write_published(root / split / "data.0000.lmdb", [_OldPygData(dict(published_data(s).to_dict())) for s in part])
    obj = pickle.loads(pickle.dumps(_OldPygData(dict(published_data(samples[0]).to_dict()))))
    assert "_store" not in vars(obj)  # really the old form
    proc = run_cli(["convert", "oc20", "--src", str(root), "--out", str(tmp_path / "safe"), "--trust-pickle",
                    "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    got = lmdbio.Shard(tmp_path / "safe" / "train" / "data.0000.lmdb")[0]
    np.testing.assert_allclose(got["pos"], samples[0]["pos"])
    np.testing.assert_array_equal(got["force"], samples[0]["force"])
    assert float(got["y"]) == pytest.approx(samples[0]["y"])
    check_graph_against_brute_force(got)  # the graph built for it is the reference's (asserts inside)


def test_convert_refuses_an_empty_original_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "empty" / "train"
    root.mkdir(parents=True)
    write_published(root / "data.0000.lmdb", [])
    proc = run_cli(["convert", "oc20", "--src", str(root), "--out", str(tmp_path / "safe"), "--trust-pickle",
                    "--no-progress"])
    assert proc.returncode == 2 and "data.0000.lmdb hold(s) no samples" in proc.stderr, proc.stderr
    assert not (tmp_path / "safe").exists()


# torch_geometric 1.x's Data.__init__ assigns these whatever it is given: None unless passed
_PYG1_DEFAULTS = {"x": None, "edge_index": None, "edge_attr": None, "y": None, "pos": None, "normal": None,
                  "face": None}


def test_old_torch_geometric_data_without_edges_decodes_and_gets_the_references_graph(samples: list[dict]) -> None:
    """The usual published S2EF value: pickled by torch_geometric 1.x from AtomsToGraphs(r_edges=False), so its state
    holds edge_index None (and x, edge_attr, normal, face None): the Nones are absent fields, the graph is built; a
    field that is not a number or array is named with the file."""
    state = {**_PYG1_DEFAULTS, **dict(published_data(samples[0]).to_dict())}
    assert state["edge_index"] is None and state["x"] is None
    got = record.decode_pickled(pickle.dumps(_OldPygData(state), protocol=-1), "data.0000.lmdb key 0")
    np.testing.assert_allclose(got["pos"], samples[0]["pos"])
    np.testing.assert_array_equal(got["force"], samples[0]["force"])
    assert float(got["y"]) == pytest.approx(samples[0]["y"])
    check_graph_against_brute_force(got)
    bad = {**state, "natoms": "seventy"}
    with pytest.raises(DataError, match=r"data.0000.lmdb key 0: field 'natoms' holds a str that is not a number"):
        record.decode_pickled(pickle.dumps(_OldPygData(bad), protocol=-1), "data.0000.lmdb key 0")
