"""LARS on the flat buffer against a per-tensor reference written from the published algorithm, with and
without the BatchNorm/bias exemption mask; SGD's weight-decay mask against torch's SGD param groups;
the 2-rank gradient sync under mpiexec."""
from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from hpcbench.common.errors import ConfigError
from hpcbench.common.flat import FlatParams
from hpcbench.common.optim import LARS, SGD, build_optimizer
from hpcbench.common.runconfig import OptimConfig
from hpcbench.workloads.mlperf_training.resnet.model import TINY, ResNet, no_weight_decay
from tests.conftest import run_mpi


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 5, 3, bias=False), nn.BatchNorm2d(5), nn.Flatten(), nn.Linear(5 * 4, 7),
                          nn.Linear(7, 3))
    with torch.no_grad():
        model[4].weight.zero_()  # a zero weight: its trust ratio falls back to 1
    return model


def _exempt(model: nn.Module) -> list[bool]:
    return [n.endswith("bias") or n.startswith("1.") for n, _ in model.named_parameters()]  # 1 = the BatchNorm


def _grads(step: int, like: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) * (1 + i) for i, p in enumerate(like)]


def _lrs(steps: int) -> list[float]:
    return [0.5 * (s + 1) / 3 if s < 3 else 0.5 * (1 - (s - 2) / steps) ** 2 for s in range(steps)]  # warmup, decay


def _reference_lars(params: list[torch.Tensor], cfg: OptimConfig, lrs: list[float],
                    exempt: list[bool]) -> list[torch.Tensor]:
    """LARS per tensor (You et al. 2017, Algorithm 1, with MLPerf's options): exempt tensors are
    plain momentum SGD without decay; the rate and local rate go into the momentum."""
    p = [t.detach().clone() for t in params]
    v = [torch.zeros_like(t) for t in p]
    for step, lr in enumerate(lrs):
        g = _grads(step, p)
        for i in range(len(p)):
            if exempt[i]:
                local, d = 1.0, g[i]
            else:
                wn, gn = float(p[i].norm()), float(g[i].norm())
                local = cfg.trust_coefficient * wn / (gn + cfg.weight_decay * wn + cfg.eps) if wn > 0 and gn > 0 else 1.0
                d = g[i] + cfg.weight_decay * p[i]
            v[i] = cfg.momentum * v[i] + lr * local * d
            p[i] = p[i] - (cfg.momentum * v[i] + lr * local * d if cfg.nesterov else v[i])
    return p


def _run(model: nn.Module, cfg: OptimConfig, lrs: list[float], exempt: list[bool] | None) -> FlatParams:
    flat = FlatParams(model)
    opt = build_optimizer(flat, cfg, decay_exempt=exempt or ())
    assert isinstance(opt, LARS)
    for step, lr in enumerate(lrs):
        for p, g in zip(model.parameters(), _grads(step, list(model.parameters()))):
            p.grad.copy_(g)
        opt.step(torch.tensor(lr))
    assert opt.step_count.item() == len(lrs)
    return flat


@pytest.mark.parametrize("masked,nesterov,wd,eps", [(False, False, 1e-4, 0.0), (True, False, 5e-2, 0.0),
                                                    (True, True, 1e-4, 1e-9), (True, False, 0.0, 0.0)])
def test_flat_lars_matches_the_per_tensor_reference(masked: bool, nesterov: bool, wd: float, eps: float) -> None:
    cfg = OptimConfig(name="lars", momentum=0.9, nesterov=nesterov, weight_decay=wd, eps=eps, trust_coefficient=0.01)
    lrs = _lrs(8)
    model = _model()
    exempt = _exempt(model) if masked else [False] * len(list(model.parameters()))
    expected = _reference_lars(list(_model().parameters()), cfg, lrs, exempt)
    flat = _run(model, cfg, lrs, exempt if masked else None)
    for (name, a), b in zip(model.named_parameters(), expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    start = list(_model().parameters())
    assert all(not torch.equal(a, b) for a, b in zip(model.parameters(), start))  # every tensor moved
    gaps = torch.ones(flat.size, dtype=torch.bool)
    for off, n in zip(flat.offsets, flat.numels):
        gaps[off : off + n] = False
    assert gaps.any() and not flat.params[gaps].any()  # the alignment gaps stay zero


def test_the_mask_changes_exempt_tensors_even_without_weight_decay() -> None:
    """Exempt tensors skip the trust ratio too (MLPerf's skip_list): with wd = 0 the mask still matters."""
    cfg = OptimConfig(name="lars", weight_decay=0.0, trust_coefficient=0.001)
    lrs = _lrs(4)
    masked, plain = _model(), _model()
    _run(masked, cfg, lrs, _exempt(masked))
    _run(plain, cfg, lrs, None)
    for (name, a), b, e in zip(masked.named_parameters(), plain.parameters(), _exempt(masked)):
        assert torch.equal(a, b) != e, name  # only the exempt tensors differ


def test_lars_on_the_resnet_with_its_no_weight_decay_mask_and_channels_last_weights() -> None:
    torch.manual_seed(0)
    model = ResNet(TINY).to(memory_format=torch.channels_last)
    names = [n for n, _ in model.named_parameters()]
    exempt = [no_weight_decay(n) for n in names]
    cfg = OptimConfig(name="lars", momentum=0.9, weight_decay=1e-4, eps=0.0)
    start = [p.detach().clone() for p in model.parameters()]
    lrs = [0.1, 0.3, 0.2]
    expected = _reference_lars(start, cfg, lrs, exempt)
    _run(model, cfg, lrs, exempt)
    for name, a, b in zip(names, model.parameters(), expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_build_optimizer_lars_options_and_refusals() -> None:
    flat = FlatParams(_model())
    opt = build_optimizer(flat, OptimConfig(name="lars", momentum=0.0))
    assert type(opt) is LARS and opt.state_numel() == 0
    with pytest.raises(ConfigError, match="optim.distributed"):
        build_optimizer(flat, OptimConfig(name="lars", distributed=True))
    with pytest.raises(ConfigError, match="optim.trust_coefficient"):
        OptimConfig(name="lars", trust_coefficient=0.0).validate()
    with pytest.raises(ConfigError, match="weight-decay flags"):
        build_optimizer(flat, OptimConfig(name="lars"), decay_exempt=[True, False])


def test_sgd_weight_decay_mask_equals_torch_sgd_with_undecayed_groups() -> None:
    """MLPerf ResNet's SGD alternative decays only convolution and classifier weights."""
    ours, ref = _model(), _model()
    exempt = _exempt(ours)
    flat = FlatParams(ours)
    opt = build_optimizer(flat, OptimConfig(name="sgd", momentum=0.9, nesterov=True, weight_decay=0.05),
                          decay_exempt=exempt)
    assert type(opt) is SGD and len(opt.exempt) == sum(exempt)
    params = list(ref.parameters())
    torch_opt = torch.optim.SGD([{"params": [p for p, e in zip(params, exempt) if not e], "weight_decay": 0.05},
                                 {"params": [p for p, e in zip(params, exempt) if e], "weight_decay": 0.0}],
                                lr=0.1, momentum=0.9, nesterov=True)
    for step, lr in enumerate(_lrs(6)):
        for p, g in zip(params, _grads(step, params)):
            p.grad = g
        for group in torch_opt.param_groups:
            group["lr"] = lr
        torch_opt.step()
        for p, g in zip(ours.parameters(), _grads(step, list(ours.parameters()))):
            p.grad.copy_(g)
        opt.step(torch.tensor(lr))
    for a, b in zip(ours.parameters(), params):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.mpi
def test_two_rank_lars_equals_single_process_lars_on_the_mean_gradient() -> None:
    proc = run_mpi(2, ["tests/mpi_scripts/harness_lars.py", "6"], timeout=120)
    rows = [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', proc.stdout)]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for row in rows:
        assert row["moved"] > 1e-3 and row["max_diff"] <= 1e-6
