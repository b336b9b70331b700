"""Learning-rate schedules on a device step tensor against their closed forms."""
from __future__ import annotations

import math

import pytest
import torch

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import OptimConfig
from hpcbench.common.schedule import Schedule


def test_warmup_then_multistep_in_epochs() -> None:
    cfg = OptimConfig(lr=0.4, schedule="multistep", unit="epochs", warmup=2, milestones=(4, 6), decay_factor=0.5)
    s = Schedule.from_config(cfg, steps_per_epoch=10, max_epochs=8)
    for step in range(80):
        if step < 20:
            expected = 0.4 * (step + 1) / 20
        else:
            expected = 0.4 * 0.5 ** ((step >= 40) + (step >= 60))
        assert s.value(step) == pytest.approx(expected, rel=1e-12), step


def test_warmup_factor_sets_the_starting_rate() -> None:
    cfg = OptimConfig(lr=1.0, schedule="constant", unit="steps", warmup=100, warmup_factor=4.0)
    s = Schedule.from_config(cfg, steps_per_epoch=7, max_epochs=3)
    assert s.value(0) == pytest.approx(0.25)
    assert s.value(50) == pytest.approx(0.25 + 0.75 * 0.5)
    assert s.value(100) == s.value(1000) == pytest.approx(1.0)
    low = Schedule.from_config(OptimConfig(lr=1.0, unit="steps", warmup=100, warmup_factor=0.1), 7, 3)
    assert [low.value(k) for k in (0, 50, 100)] == pytest.approx([0.1, 0.55, 1.0])


def test_warmup_then_cosine_in_steps() -> None:
    cfg = OptimConfig(lr=0.1, schedule="cosine", unit="steps", warmup=10, total=110, min_lr=0.001)
    s = Schedule.from_config(cfg, steps_per_epoch=3, max_epochs=99)
    for step in (10, 35, 60, 85, 109, 110, 500):
        t = min(1.0, (step - 10) / 100)
        assert s.value(step) == pytest.approx(0.001 + 0.099 * 0.5 * (1 + math.cos(math.pi * t)), rel=1e-9)
    assert s.value(4) == pytest.approx(0.1 * 5 / 10)


def test_cosine_defaults_to_run_length_and_evaluates_batched_on_device_tensors() -> None:
    cfg = OptimConfig(lr=1.0, schedule="cosine", unit="epochs")
    s = Schedule.from_config(cfg, steps_per_epoch=5, max_epochs=4)
    assert s.total_steps == 20
    steps = torch.arange(0, 21, dtype=torch.float32)
    values = s(steps)  # one tensor op, no host loop: the step counter can live on the GPU
    assert values.shape == steps.shape
    torch.testing.assert_close(values, 0.5 * (1 + torch.cos(math.pi * steps / 20)))


def test_cosine_shorter_than_warmup_is_a_config_error() -> None:
    cfg = OptimConfig(schedule="cosine", unit="steps", warmup=10, total=5)
    with pytest.raises(ConfigError, match="optim.total"):
        Schedule.from_config(cfg, steps_per_epoch=1, max_epochs=1)


def test_poly_decay_counts_from_step_zero_and_warmup_overrides_it() -> None:
    """BERT's reference: lr * (1 - step / T) ** power from the global step 0 (to min_lr at T), and a
    linear warmup in its place while it lasts."""
    s = Schedule.from_config(OptimConfig(lr=0.4, schedule="poly", unit="steps", total=100, power=1.0), 7, 3)
    assert [s.value(k) for k in (0, 25, 50, 100, 150)] == pytest.approx([0.4, 0.3, 0.2, 0.0, 0.0])
    sq = Schedule.from_config(OptimConfig(lr=1.0, schedule="poly", unit="steps", total=10, power=2.0, min_lr=0.1,
                                          warmup=4), 7, 3)
    assert sq.value(1) == pytest.approx(1.0 * 2 / 4)  # warmup
    for k in (4, 5, 9):
        assert sq.value(k) == pytest.approx(0.1 + 0.9 * (1 - k / 10) ** 2)
    run = Schedule.from_config(OptimConfig(lr=1.0, schedule="poly", unit="epochs"), steps_per_epoch=5, max_epochs=4)
    assert run.total_steps == 20 and run.value(10) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="poly length"):
        Schedule.from_config(OptimConfig(schedule="poly", unit="steps", warmup=10, total=5), 1, 1)


def _mlperf_resnet_poly(iteration: int, base: float, end: float, warmup: int, total: int, power: float) -> float:
    """NVIDIA's MLPerf ResNet ``PolySchedule`` of the 1-based iteration, written out."""
    if iteration <= warmup:
        return base * iteration / warmup
    return end + (base - end) * (1 - (iteration - warmup) / (total - warmup)) ** power


def test_poly_from_warmup_is_the_mlperf_resnet_schedule() -> None:
    cfg = OptimConfig(lr=10.0, schedule="poly", unit="epochs", warmup=2, total=6, power=2.0, min_lr=1e-4,
                      poly_from_warmup=True)
    s = Schedule.from_config(cfg, steps_per_epoch=7, max_epochs=9)
    assert (s.warmup_steps, s.total_steps, s.decay_steps) == (14, 42, 28)
    values = [s.value(k) for k in range(50)]
    expected = [_mlperf_resnet_poly(min(k + 1, 42), 10.0, 1e-4, 14, 42, 2.0) for k in range(50)]
    assert values == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert values[0] == pytest.approx(10.0 / 14) and values[13] == pytest.approx(10.0)  # the warmup's end: peak
    assert values[14] == pytest.approx(1e-4 + (10.0 - 1e-4) * (27 / 28) ** 2)  # decay starts right after it
    assert values[41] == pytest.approx(1e-4) and values[49] == pytest.approx(1e-4)  # end lr at T, held after
    steps = torch.arange(50, dtype=torch.float32)  # the device path: one tensor of steps, same values
    assert s(steps).tolist() == pytest.approx(expected, rel=1e-5, abs=1e-7)
    # without the option poly still counts from step 0 (BERT) and spans all T steps
    bert = Schedule.from_config(OptimConfig(**{**cfg.__dict__, "poly_from_warmup": False}), 7, 9)
    assert bert.decay_steps == 42 and bert.value(20) == pytest.approx(1e-4 + (10 - 1e-4) * (1 - 20 / 42) ** 2)


def test_poly_from_warmup_needs_the_poly_schedule() -> None:
    with pytest.raises(ConfigError, match="optim.poly_from_warmup"):
        Schedule.from_config(OptimConfig(schedule="cosine", poly_from_warmup=True), 7, 3)


def test_nemo_warmup_is_nemos_cosine_annealing() -> None:
    """warmup_style "nemo": NeMo's WarmupAnnealHoldPolicy (CosineAnnealing, constant_steps 0), written out here:
    lr (s + 1) / (W + 1) for s <= W, then min + (lr - min) (1 + cos(pi (s - W) / (T - W))) / 2, min after T."""
    lr, lo, w, t = 4e-4, 4e-5, 16, 1000
    s = Schedule.from_config(OptimConfig(lr=lr, schedule="cosine", unit="steps", warmup=w, total=t, min_lr=lo,
                                         warmup_style="nemo"), steps_per_epoch=7, max_epochs=3)

    def nemo(step: int) -> float:
        if step <= w:
            return lr * (step + 1) / (w + 1)
        if step > t:
            return lo
        return (lr - lo) * 0.5 * (1 + math.cos(math.pi * (step - w) / (t - w))) + lo

    for step in [*range(0, w + 3), 500, t - 1, t, t + 1, 5000]:
        assert s.value(step) == pytest.approx(nemo(step), rel=1e-12, abs=1e-15), step
    assert s.value(0) == pytest.approx(lr / 17) and s.value(w - 1) < lr == pytest.approx(s.value(w))


def test_linspace_warmup_is_the_openfold_references() -> None:
    """warmup_style "linspace": the OpenFold reference's OpenFoldBenchmarkLRScheduler, whose iteration i >= 1 (our
    step i - 1) takes torch.linspace(warmup_lr_init, base_lr, W)[i - 1] while i <= W, then base_lr."""
    lr, start = 1e-3, 1e-5
    for w in (1, 2, 10):
        s = Schedule.from_config(OptimConfig(lr=lr, unit="steps", warmup=w, warmup_style="linspace",
                                             warmup_start_lr=start), steps_per_epoch=5, max_epochs=9)
        ref = torch.linspace(start, lr, w, dtype=torch.float64).tolist()
        for iteration in range(1, w + 4):
            want = ref[iteration - 1] if iteration <= w else lr
            assert s.value(iteration - 1) == pytest.approx(want, rel=1e-12), (w, iteration)


def test_warmup_styles_are_checked_by_name() -> None:
    with pytest.raises(ConfigError, match=r"optim\.warmup_style.*'nemo' is a per-step warmup"):
        OptimConfig(unit="epochs", warmup_style="nemo", lr_per_epoch=True).validate()
    with pytest.raises(ConfigError, match=r"optim\.warmup_style.*warmup_factor 2"):
        OptimConfig(unit="steps", warmup_style="linspace", warmup_factor=2.0).validate()
    with pytest.raises(ConfigError, match=r"optim\.warmup_style': expected"):
        OptimConfig(unit="steps", warmup_style="cubic").validate()  # type: ignore[arg-type]
    OptimConfig(unit="steps", warmup=3, warmup_style="linspace", warmup_start_lr=1e-5).validate()


def test_deepcam_semantics_edge_cases_are_the_reference_schedulers() -> None:
    """schedule_semantics "held_warmup", written out from utils/schedulers.py and torch's MultiStepLR /
    CosineAnnealingLR as the DeepCAM reference builds them (scheduler count e = step + 1)."""
    def sched(**kw: object) -> Schedule:
        cfg = OptimConfig(lr=1.0, unit="steps", schedule_semantics="held_warmup", **kw)  # type: ignore[arg-type]
        cfg.validate()
        return Schedule.from_config(cfg, steps_per_epoch=10, max_epochs=100)

    # warmup factor 2: lr ((f - 1) e / W + 1) while e < W, the last (e = W - 1) held; milestone 10 at step 10 + W
    s = sched(schedule="multistep", warmup=4, warmup_factor=2.0, milestones=(10,), decay_factor=0.5)
    assert [s.value(k) for k in (0, 1, 2, 3, 13, 14)] == pytest.approx([1.25, 1.5, 1.75, 1.75, 1.75, 0.875])
    # one warmup step: the optimizer's own lr from step 0; no warmup: MultiStepLR from e = 1 (milestone 0 never)
    s = sched(schedule="multistep", warmup=1, milestones=(3,), decay_factor=0.1)
    assert [s.value(k) for k in (0, 3, 4)] == pytest.approx([1.0, 1.0, 0.1])
    s = sched(schedule="multistep", milestones=(0, 3), decay_factor=0.1)
    assert [s.value(k) for k in (0, 1, 2, 3)] == pytest.approx([1.0, 1.0, 0.1, 0.1])
    # cosine without warmup: CosineAnnealingLR from step 0 over T_max = total, periodic
    s = sched(schedule="cosine", total=8, min_lr=0.0)
    assert [s.value(k) for k in (0, 4, 8, 12, 16)] == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0], abs=1e-15)


def test_deepcam_semantics_are_checked() -> None:
    with pytest.raises(ConfigError, match="schedule_semantics"):
        OptimConfig(schedule="poly", schedule_semantics="held_warmup").validate()
    with pytest.raises(ConfigError, match="schedule_semantics"):
        OptimConfig(schedule="cosine", warmup_style="nemo", schedule_semantics="held_warmup").validate()
    with pytest.raises(ConfigError, match=r"optim\.warmup.*whole steps"):
        Schedule.from_config(OptimConfig(schedule="multistep", unit="epochs", warmup=0.5,
                                         schedule_semantics="held_warmup"), 7, 3)
    with pytest.raises(ConfigError, match=r"optim\.total"):
        Schedule.from_config(OptimConfig(schedule="cosine", unit="steps", warmup=10, total=10,
                                         schedule_semantics="held_warmup"), 7, 3)
