"""`hpcbench train --data DIR` checks staging's completion marker whenever DIR carries `hpcbench stage`'s
state (not only with --stage-to or data.node_local): a deleted marker, a file added or removed after
staging are named errors; a folder made by hand trains as before; data.require_staged=false skips."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcbench.common.errors import DataError
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("staged_check")
    for args in (["datagen", "cosmoflow", "--out", str(root / "raw"), "--samples", "64", "--val-samples", "8",
                  "--size", "16", "--plain", "--quiet"],
                 ["pack", "--dataset", "cosmoflow", "--source", str(root / "raw"), "--dest", str(root / "packed")],
                 ["stage", "--source", str(root / "packed"), "--dest", str(root / "staged")]):
        proc = run_cli(args, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def staged_copy(data: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(data / "staged", tmp_path / "x"))


def train(folder: Path, tmp_path: Path, *extra: str) -> tuple[bool, str]:
    """(whether it trained, its output). One epoch does not reach the target: exit status 4 either way."""
    proc = run_cli(["train", "cosmoflow", "--config", "mini", "--data", str(folder), "--set", "train.max_epochs=1",
                    "--device", "cpu", "--no-progress", "--results", str(tmp_path / "results"), *extra], timeout=300)
    out = proc.stdout + proc.stderr
    return proc.returncode in (0, 4) and "instance 0: aborted after 1 epochs" in out and "FAILED" not in out, out


def test_a_staged_folder_without_its_marker_is_refused(data: Path, tmp_path: Path) -> None:
    x = staged_copy(data, tmp_path)
    ok, out = train(x, tmp_path)
    assert ok, out  # complete: trains
    (x / ".hpcbench" / "staged_manifest.json").unlink()
    ok, out = train(x, tmp_path)
    assert not ok
    assert f"{x}: not a completely staged folder (no .hpcbench/staged_manifest.json" in out
    assert "hpcbench stage" in out and "data.require_staged=false" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_file_added_or_removed_after_staging_is_refused(data: Path, tmp_path: Path, change: str) -> None:
    x = staged_copy(data, tmp_path)
    if change == "added":
        shutil.copy(x / "train" / "univ_0000000.tfrecord", x / "train" / "univ_0009999.tfrecord")
        expect = "1 files in the staged folders are not in the completion marker (train/univ_0009999.tfrecord)"
    else:
        (x / "validation" / "univ_0000003.tfrecord").unlink()
        expect = "staged files are missing or changed since staging: 1 missing (validation/univ_0000003.tfrecord)"
    ok, out = train(x, tmp_path)
    assert not ok and f"{x}: {expect}" in out, out
    assert "data.require_staged=false" in out


def test_a_hand_made_folder_trains_and_require_staged_false_bypasses(data: Path, tmp_path: Path) -> None:
    ok, out = train(data / "raw", tmp_path)  # no staging state: trained as before
    assert ok, out
    x = staged_copy(data, tmp_path)
    (x / ".hpcbench" / "staged_manifest.json").unlink()
    (x / "train" / "univ_0000001.tfrecord").unlink()
    ok, out = train(x, tmp_path, "--set", "data.require_staged=false")
    assert ok, out


def test_any_stage_state_makes_a_folder_staged(tmp_path: Path) -> None:
    """The state folder alone (a journal, the owner, the lock, or an empty .hpcbench/) is enough;
    a folder staged as one node's part is refused when read as the whole dataset."""
    from hpcbench.staging.marker import NodeLayout, require_staged, stage_state, write_marker

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.tfrecord").write_bytes(b"abc")
    data = SimpleNamespace(root=str(tmp_path), node_local=False, require_staged=True)
    rank = SimpleNamespace(node_index=0, instance_node_index=0, nodes_per_instance=1)
    assert stage_state(tmp_path) == []
    require_staged(data, rank, "cosmoflow")  # made by hand
    (tmp_path / ".hpcbench").mkdir()
    assert stage_state(tmp_path) == [".hpcbench/"]
    with pytest.raises(DataError, match="not a completely staged folder"):
        require_staged(data, rank, "cosmoflow")
    (tmp_path / ".hpcbench" / "staged.jsonl").write_text("")
    with pytest.raises(DataError, match=r"it holds \.hpcbench/staged\.jsonl\)"):
        require_staged(data, rank, "cosmoflow")
    write_marker(tmp_path, "cosmoflow", "f" * 64, NodeLayout(1, 1, 2, 1, 2), ["train"], [["train/a.tfrecord", 3, 0]])
    with pytest.raises(DataError, match="holds only shard-set 1 of 2 .* data.node_local=true"):
        require_staged(data, rank, "cosmoflow")
    write_marker(tmp_path, "cosmoflow", "f" * 64, NodeLayout(0, 0, 1, 1, 1), ["train"], [["train/a.tfrecord", 3, 0]])
    require_staged(data, rank, "cosmoflow")
    with pytest.raises(DataError, match="staged with dataset 'cosmoflow', not 'deepcam'"):
        require_staged(data, rank, "deepcam")
    require_staged(SimpleNamespace(**{**vars(data), "require_staged": False}), rank, "deepcam")
