"""Each static-shape workload's full training step replayed from a CUDA graph equals the eager step
(needs CUDA; skipped elsewhere). The CPU test runs the same comparison harness eager vs eager, so
the data path it uses (real files -> the spec's collate -> device -> transform) is checked here too.

Tolerance, stated: after 6 steps on the mini preset (its precision and memory format), every
parameter of the graph-replayed model is within 1e-4 + 1e-3 x (largest parameter) of the eager one,
and every loss within 1e-3 relative. Replay runs the same kernels as eager on the same inputs; cuDNN
is made deterministic for the test, so the differences seen are rounding-level.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.harness_graph import compare_workload

DATAGEN = {
    "cosmoflow": ["--samples", "16", "--val-samples", "8", "--size", "16"],
    "deepcam": ["--samples", "16", "--eval-samples", "8", "--height", "96", "--width", "144"],
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, args in DATAGEN.items():
        root = tmp_path_factory.mktemp(name)
        proc = run_cli(["datagen", name, "--out", str(root), "--workers", "1", *args], timeout=300)
        assert proc.returncode == 0, proc.stderr
        out[name] = root
    return out


def _check(out: dict[str, float]) -> None:
    assert out["max_diff"] <= 1e-4 + 1e-3 * out["param_scale"], out
    assert out["loss_diff"] <= 1e-3 * max(out["loss_scale"], 1e-6), out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(DATAGEN))
def test_graph_replayed_step_equals_eager(name: str, precision: str, datasets: dict[str, Path]) -> None:
    deterministic = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        out = compare_workload(name, str(datasets[name]), overrides=(f"train.precision={precision}",))
    finally:
        torch.backends.cudnn.deterministic = deterministic
    _check(out)


@pytest.mark.parametrize("name", sorted(DATAGEN))
def test_comparison_harness_on_cpu(name: str, datasets: dict[str, Path]) -> None:
    out = compare_workload(name, str(datasets[name]), steps=2, device="cpu", modes=("eager", "eager"))
    assert out["max_diff"] == 0.0 and out["loss_diff"] == 0.0 and out["loss_scale"] > 0
