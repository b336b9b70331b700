"""llama31_8b parallelism under mpiexec on CPU (gloo), float64: FSDP2 over 2 ranks, tensor parallelism over 2
ranks and FSDP x TP over 4 ranks (2 x 2) each train a tiny Llama for 4 steps through the harness's TrainStep
(ShardedAdamW with global-norm clipping, cosine schedule with warmup, activation checkpointing, gradient
accumulation) and match the single-process model on the whole global batch: the global gradient norm and every
parameter (gathered) to 1e-12 relative. Each run checkpoints after step 2 through the CheckpointManager
(torch.distributed.checkpoint shards + manifest), resumes a fresh model from it, and ends equal as well."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_mpi

SCRIPT = "tests/mpi_scripts/llama_parallel.py"
TIGHT = 1e-12  # float64: only the order of the sums changes
LOSS_TOL = 1e-6  # the loss a step returns is cast to float32 (the harness logs it so)


@pytest.mark.parametrize("ranks, tp, accum", [(2, 1, 2), (2, 2, 1), (4, 2, 2)], ids=["fsdp2", "tp2", "fsdp2xtp2"])
def test_sharded_training_equals_one_process_and_resumes(tmp_path: Path, ranks: int, tp: int, accum: int) -> None:
    out = run_mpi(ranks, [SCRIPT, str(tp), str(accum), str(tmp_path / "ckpt")], timeout=240).stdout
    rows = [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', out)]
    steps = [r for r in rows if "step" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4], out
    for r in steps:
        assert abs(r["norm"] - r["ref_norm"]) <= TIGHT * r["ref_norm"], r
        assert r["params"] <= TIGHT, r
        assert abs(r["loss"] - r["ref_loss"]) <= LOSS_TOL * r["ref_loss"], r  # the steps return float32 losses
    (resumed,) = [r for r in rows if "resumed" in r]
    assert resumed["resumed"] <= TIGHT and resumed["steps"] == 4.0, resumed
    manifest = json.loads((tmp_path / "ckpt" / "epoch_0001" / "manifest.json").read_text())
    assert manifest["sharded"] == ["model", "optimizer"]
    assert {f"sharded/__{r}_0.distcp" for r in range(ranks)} | {"sharded/.metadata"} <= set(manifest["files"])


def test_a_damaged_shard_is_refused_by_name(tmp_path: Path) -> None:
    run_mpi(2, [SCRIPT, "1", "1", str(tmp_path / "ckpt")], timeout=240)
    shard = tmp_path / "ckpt" / "epoch_0001" / "sharded" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = run_mpi(2, [SCRIPT, "1", "1", str(tmp_path / "ckpt"), "load"], timeout=240, check=False)
    assert proc.returncode != 0 and "__1_0.distcp is damaged" in proc.stdout + proc.stderr


@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp2", "tp2"])
def test_a_meta_built_sharded_model_equals_the_whole_model_init(tp: int) -> None:
    """build_sharded on 2 ranks (meta device, FSDP2 or TP, to_empty, per-shard init) holds bitwise the shards of the
    whole model built with the same seed, gathered parameters equal, and each rank allocated about half of it."""
    out = run_mpi(2, ["tests/mpi_scripts/llama_meta_init.py", str(tp)], timeout=180).stdout
    (row,) = [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', out)]
    assert row["compared"] == 21 and row["all_dtensor"] and row["rope_equal"], row
    assert row["shard_diff"] == 0 and row["gathered_diff"] == 0, row
    assert row["max_local_elems"] <= 0.51 * row["total_elems"], row
