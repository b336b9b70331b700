"""Settings chosen for the hardware (common/auto.py) and the progress lines (common/progress.py)."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch
from torch import nn

from hpcbench.common.auto import (Choice, choose_channels_last, choose_precision, cpu_bf16_native, has_conv_weights,
                         probe_channels_last)
from hpcbench.common.progress import Progress, resolve_mode
from tests.conftest import first_events, project_env, result_log, run_mpi

CPU = torch.device("cpu")


def test_explicit_settings_are_kept_as_configured() -> None:
    assert choose_precision("fp32", CPU) == Choice("train.precision", "fp32", "fp32", "as configured")
    if cpu_bf16_native()[0]:
        assert choose_precision("bf16", CPU).reason == "as configured"
    c = choose_channels_last(True, CPU, nn.Linear(2, 2), "fp32", probe=None)
    assert c.value is True and c.reason == "as configured"


def test_precision_auto_follows_native_bf16() -> None:
    native, why = cpu_bf16_native()
    c = choose_precision("auto", CPU)
    assert c.value == ("bf16" if native else "fp32") and c.reason == why
    assert c.describe().startswith(f"train.precision = {c.value} (auto: ")


def test_kernels_capped_at_avx2_give_fp32_with_the_reason() -> None:
    """What a user of an AVX2-only CPU gets: torch's kernels capped below AVX-512 mean emulated bf16."""
    code = ("from common.auto import choose_precision; import torch; "
            "c = choose_precision('auto', torch.device('cpu')); print(c.value); print(c.reason)")
    env = project_env(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    value, reason = out.stdout.splitlines()[:2]
    assert value == "fp32"
    assert "emulated" in reason or "no bf16" in reason or "not" in reason, reason
    # bf16 asked for explicitly on that CPU: kept, with a warning that names the cause and the way out
    out = subprocess.run([sys.executable, "-c", code.replace("'auto'", "'bf16'")], env=env, capture_output=True,
                         text=True, timeout=120)
    value, reason = out.stdout.splitlines()[:2]
    assert value == "bf16" and "WARNING" in reason and "precision auto would pick fp32" in reason, reason


def test_channels_last_auto_without_convolutions_is_off() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    assert not has_conv_weights(model)
    c = choose_channels_last("auto", CPU, model, "fp32", probe=lambda: pytest.fail("no probe without convolutions"))
    assert c.value is False and "no 4-D/5-D" in c.reason


@pytest.mark.parametrize("timings,expected", [((1.0, 0.5), True), ((1.0, 0.99), False), ((1.0, 1.5), False)])
def test_channels_last_auto_on_cpu_follows_the_probe(timings: tuple[float, float], expected: bool) -> None:
    model = nn.Conv3d(2, 2, 3)
    c = choose_channels_last("auto", CPU, model, "fp32", probe=lambda: timings)
    assert c.value is expected
    assert f"{timings[0] / timings[1]:.2f}x" in c.reason


def test_probe_times_both_layouts_and_leaves_model_and_random_state_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten(), nn.LazyLinear(1))
    x = torch.randn(2, 3, 8, 8)
    model(x)  # materialize the lazy layer
    before = [p.detach().clone() for p in model.parameters()]
    stats = model[1].running_mean.clone()
    rng = torch.get_rng_state()
    plain, cl = probe_channels_last(model, x, lambda m, b: m(b).sum(), budget_s=0.2, max_rounds=2)
    assert plain > 0 and cl > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert torch.equal(stats, model[1].running_mean)  # the probe trained a copy
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


def test_progress_modes() -> None:
    assert resolve_mode(False, 1) == "none"
    assert resolve_mode("auto", 2) == "lines"  # several instances: one line each, never interleaved bars
    assert resolve_mode("lines", 1) == "lines"
    with pytest.raises(ValueError, match="progress mode"):
        resolve_mode("loud", 1)


def test_progress_lines_have_a_heartbeat_inside_a_long_epoch() -> None:
    out = io.StringIO()
    p = Progress("lines", "toy #3", world_leader=False, instance_leader=True, every_s=0.0, stream=out)
    e = p.epoch(2, steps=10, max_epochs=5)
    e.step(4, 16)
    e.done(64, 2.0, 0.5)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[toy #3] epoch 2/5: step 4/10, ")
    assert lines[1] == "[toy #3] epoch 2/5: 64 samples in 2.0 s = 32.0 samples/s, train loss 0.5"
    silent = io.StringIO()
    Progress("lines", "toy #3", world_leader=False, instance_leader=False, stream=silent).say("x")
    assert silent.getvalue() == ""  # only an instance's leader speaks


def test_cosmoflow_auto_is_resolved_logged_and_shown(tmp_path) -> None:
    """Two instances of the mini preset (precision and channels-last "auto"): each instance's leader
    prints its choices and epochs; the MLPerf log records what was chosen and why."""
    from tests.conftest import run_cli

    data, results = tmp_path / "data", tmp_path / "results"
    proc = run_cli(["datagen", "cosmoflow", "--out", str(data), "--samples", "16", "--val-samples", "4",
                    "--size", "8", "--quiet", "--workers", "1"])
    assert proc.returncode == 0, proc.stderr
    proc = run_mpi(2, ["-m", "hpcbench", "train", "cosmoflow", "--config", "mini", "--data", str(data), "--device", "cpu",
                       "--instances", "2", "--results", str(results), "--progress", "lines", "--set", "data.size=8",
                       "--set", "model.conv_layers=2", "--set", "train.max_epochs=1",
                       "--set", "train.global_batch_size=4"], timeout=240, check=False)
    assert proc.returncode in (0, 4), proc.stderr
    for inst in (0, 1):
        assert f"[cosmoflow #{inst}] train.precision = " in proc.stdout
        assert f"[cosmoflow #{inst}] train.channels_last = " in proc.stdout
        assert f"[cosmoflow #{inst}] epoch 1/1: 16 samples in " in proc.stdout
        assert f"[cosmoflow #{inst}] epoch 1/1: eval_error " in proc.stdout
        assert f"[cosmoflow #{inst}] run_stop: " in proc.stdout
        events = first_events(result_log(results, inst))
        prec, cl = events["hpcbench_precision"], events["hpcbench_channels_last"]
        assert prec["requested"] == "auto" and prec["value"] in ("bf16", "fp32") and prec["reason"]
        assert cl["requested"] == "auto" and cl["value"] in (True, False) and "measured here" in cl["reason"]
