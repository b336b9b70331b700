"""Flat-buffer optimizers against independent references with the same weights and gradients."""
from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from hpcbench.common.errors import ConfigError
from hpcbench.common.flat import FlatParams, expand_segments, segment_sum
from hpcbench.common.optim import LAMB, Adam, DistributedLAMB, SGD, build_optimizer
from hpcbench.common.runconfig import OptimConfig
from tests.conftest import run_mpi


def _rows(stdout: str) -> list[dict]:
    """The JSON line of every rank (ranks' lines may interleave on the shared stdout)."""
    return [json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', stdout)]


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 9), nn.BatchNorm1d(9), nn.ReLU(), nn.Linear(9, 4))


def _grads(step: int, like: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return [torch.randn(p.shape, generator=g) for p in like]


def test_flat_buffer_holds_parameters_as_views_and_grads_accumulate_in_place() -> None:
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    flat = FlatParams(model)
    assert flat.size >= flat.numel == sum(p.numel() for p in before)
    for p, b, off in zip(model.parameters(), before, flat.offsets):
        assert torch.equal(p, b)
        assert p.data_ptr() == flat.params.data_ptr() + off * 4
    old = flat.params[0].item()
    flat.params[0] = 42.0
    assert next(model.parameters()).reshape(-1)[0].item() == 42.0
    flat.params[0] = old
    x = torch.randn(8, 6)
    model(x).sum().backward()
    flat.check_grads()
    ref = _model()
    ref(x).sum().backward()
    for p, r, off in zip(model.parameters(), ref.parameters(), flat.offsets):
        assert p.grad.data_ptr() == flat.grads.data_ptr() + off * 4
        torch.testing.assert_close(p.grad, r.grad)


def test_segment_helpers() -> None:
    lengths = torch.tensor([2, 0, 3])
    s = segment_sum(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), lengths)
    assert s.tolist() == [3.0, 0.0, 12.0]
    assert expand_segments(torch.tensor([1.0, 2.0, 3.0]), lengths, 5).tolist() == [1, 1, 3, 3, 3]


@pytest.mark.parametrize("nesterov,wd", [(False, 0.0), (True, 1e-3)])
def test_sgd_matches_torch_optim(nesterov: bool, wd: float) -> None:
    cfg = OptimConfig(name="sgd", lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=wd)
    ours, ref = _model(), _model()
    flat = FlatParams(ours)
    opt = SGD(flat, cfg)
    torch_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=wd)
    for step in range(10):
        lr = 0.1 / (1 + step)
        for p, g in zip(ref.parameters(), _grads(step, list(ref.parameters()))):
            p.grad = g
        for group in torch_opt.param_groups:
            group["lr"] = lr
        torch_opt.step()
        for p, g in zip(ours.parameters(), _grads(step, list(ours.parameters()))):
            p.grad.copy_(g)
        opt.step(torch.tensor(lr))
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert opt.step_count.item() == 10


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_and_adamw_match_torch_optim(name: str) -> None:
    cfg = OptimConfig(name=name, lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    ours, ref = _model(), _model()
    flat = FlatParams(ours)
    opt = build_optimizer(flat, cfg)
    assert isinstance(opt, Adam)
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    torch_opt = cls(ref.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    for step in range(10):
        for p, g in zip(ref.parameters(), _grads(step, list(ref.parameters()))):
            p.grad = g
        torch_opt.step()
        for p, g in zip(ours.parameters(), _grads(step, list(ours.parameters()))):
            p.grad.copy_(g)
        opt.step(torch.tensor(0.01))
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _reference_lamb(params: list[torch.Tensor], grads_per_step, cfg: OptimConfig, steps: int,
                    exempt: tuple[bool, ...] = ()) -> list[torch.Tensor]:
    """LAMB written per tensor, straight from the paper plus the MLPerf options (``exempt``: tensors
    without weight decay and without the trust ratio, as the reference's LAMBOptimizer)."""
    b1, b2 = cfg.betas
    p = [t.detach().clone() for t in params]
    m = [torch.zeros_like(t) for t in p]
    v = [torch.zeros_like(t) for t in p]
    for step in range(steps):
        g = grads_per_step(step, p)
        if cfg.max_grad_norm > 0:
            norm = torch.sqrt(sum((x * x).sum() for x in g))
            g = [x / max(1.0, float(norm) / cfg.max_grad_norm) for x in g]
        for i in range(len(p)):
            m[i] = b1 * m[i] + ((1 - b1) if cfg.grad_averaging else 1.0) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            mh, vh = m[i], v[i]
            if cfg.bias_correction:
                mh, vh = mh / (1 - b1 ** (step + 1)), vh / (1 - b2 ** (step + 1))
            wd = 0.0 if exempt and exempt[i] else cfg.weight_decay
            u = mh / (vh.sqrt() + cfg.eps) + wd * p[i]
            pn, un = p[i].norm(), u.norm()
            adapted = not (exempt and exempt[i])  # exempt: ratio 1
            ratio = float(pn / un) if pn > 0 and un > 0 and adapted else 1.0
            p[i] = p[i] - cfg.lr * ratio * u
    return p


@pytest.mark.parametrize("clip,bias_correction,grad_averaging", [(0.0, True, True), (1.0, True, False), (0.5, False, True)])
def test_flat_lamb_matches_per_tensor_reference(clip: float, bias_correction: bool, grad_averaging: bool) -> None:
    cfg = OptimConfig(name="lamb", lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=clip,
                      bias_correction=bias_correction, grad_averaging=grad_averaging)
    model = _model()
    expected = _reference_lamb(list(model.parameters()), lambda s, like: _grads(s, like), cfg, 10)
    flat = FlatParams(model)
    for dist_cls in (LAMB, DistributedLAMB):  # 1-rank DistributedLAMB runs the sharded code path
        flat.params.copy_(flat.flatten(list(_model().parameters())))
        opt = dist_cls(flat, cfg)
        for step in range(10):
            for p, g in zip(model.parameters(), _grads(step, list(model.parameters()))):
                p.grad.copy_(g)
            opt.step(torch.tensor(cfg.lr))
        for a, b in zip(model.parameters(), expected):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_lamb_weight_decay_mask_exempts_biases_and_norms_per_tensor() -> None:
    """BERT's reference LAMB leaves biases and LayerNorm (here BatchNorm) weights out of the decay."""
    cfg = OptimConfig(name="lamb", lr=0.05, weight_decay=0.5, max_grad_norm=1.0)
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    exempt = tuple(n.endswith("bias") or n.startswith("1.") for n in names)  # 1 = the norm layer
    assert any(exempt) and not all(exempt)
    expected = _reference_lamb(list(model.parameters()), lambda s, like: _grads(s, like), cfg, 6, exempt)
    decayed_everywhere = _reference_lamb(list(model.parameters()), lambda s, like: _grads(s, like), cfg, 6)
    flat = FlatParams(model)
    assert flat.segment_values([1.0] * flat.num_tensors).numel() == flat.lengths.numel()
    for distributed in (False, True):  # 1-rank DistributedLAMB runs the sharded (per-shard segments) path
        flat.params.copy_(flat.flatten(list(_model().parameters())))
        opt = build_optimizer(flat, OptimConfig(**{**cfg.__dict__, "distributed": distributed}), decay_exempt=exempt)
        assert opt.decay is not None
        for step in range(6):
            for p, g in zip(model.parameters(), _grads(step, list(model.parameters()))):
                p.grad.copy_(g)
            opt.step(torch.tensor(cfg.lr))
        # 1e-5: exempt tensors step by lr * u, no ratio normalising u's scale, so the float32 bias correction
        # shows (tests/test_harness_lamb_exempt.py)
        for a, b in zip(model.parameters(), expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # the mask matters: the exempt tensors differ from a run that decays everything
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b, e in zip(model.parameters(), decayed_everywhere, exempt) if e)
    flat.params.copy_(flat.flatten(list(_model().parameters())))
    assert build_optimizer(flat, OptimConfig(name="lamb", weight_decay=0.0), decay_exempt=exempt).decay is None
    with pytest.raises(ConfigError, match="only the lamb, lars and sgd optimizers"):
        build_optimizer(flat, OptimConfig(name="adamw", weight_decay=0.01), decay_exempt=exempt)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "lamb", "lars"])
def test_skip_tensor_path_equals_in_place_path_and_a_skipped_step_changes_nothing(name: str) -> None:
    cfg = OptimConfig(name=name, weight_decay=0.01, lr=0.05)
    a, b = FlatParams(_model()), FlatParams(_model())
    opt_a, opt_b = build_optimizer(a, cfg), build_optimizer(b, cfg)
    for step in range(3):  # skip=None (in-place kernels) vs skip=0 (the fp16 masked path)
        g = torch.randn(a.size, generator=torch.Generator().manual_seed(step))
        a.grads.copy_(g)
        b.grads.copy_(g)
        opt_a.step(torch.tensor(0.05))
        opt_b.step(torch.tensor(0.05), skip=torch.tensor(0.0))
    torch.testing.assert_close(a.params, b.params, atol=1e-6, rtol=1e-5)
    before = [b.params.clone(), opt_b.step_count.clone(), *[v.clone() for v in opt_b.state.values()]]
    b.grads.normal_()
    opt_b.step(torch.tensor(0.05), skip=torch.tensor(1.0))
    after = [b.params, opt_b.step_count, *opt_b.state.values()]
    assert all(torch.equal(x, y) for x, y in zip(before, after))


def test_unknown_optimizer_and_non_fp32_model_are_config_errors() -> None:
    cfg = OptimConfig()
    cfg.name = "rmsprop"  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="optim.name"):
        build_optimizer(FlatParams(_model()), cfg)
    with pytest.raises(ConfigError, match="fp32"):
        FlatParams(_model().double())


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_distributed_lamb_equals_single_process_lamb(ranks: int) -> None:
    proc = run_mpi(ranks, ["tests/mpi_scripts/harness_lamb.py", "10"], timeout=120)
    rows = _rows(proc.stdout)
    assert len(rows) == ranks
    for row in rows:
        assert row["moved"] > 0.1  # the parameters really changed
        assert row["max_diff"] <= 1e-6
        # each rank holds ~1/N of the moments (the padding adds < N elements per moment)
        assert row["state"] == 2 * -(-row["numel"] // ranks)
        assert row["state"] <= row["ref_state"] / ranks + 2 * ranks


def test_apex_request_falls_back_to_the_built_in_lamb_without_cuda_apex(capsys: pytest.CaptureFixture[str]) -> None:
    opt = build_optimizer(FlatParams(_model()), OptimConfig(name="lamb", apex=True))
    assert type(opt) is LAMB
    if not torch.cuda.is_available():
        assert "apex LAMB needs a CUDA device" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="apex's fused LAMB runs on CUDA only")
def test_apex_lamb_matches_built_in_lamb_on_gpu() -> None:
    from hpcbench.common.apex_optim import ApexLAMB, apex_lamb_available

    if not apex_lamb_available(torch.device("cuda"))[0]:
        pytest.skip("apex with CUDA extensions is not installed")
    names = [n for n, _ in _model().named_parameters()]
    bert_like = tuple(n.endswith("bias") or n.startswith("1.") for n in names)  # biases and the norm layer
    for wd, exempt in ((0.01, ()), (0.01, bert_like), (0.0, ())):  # wd 0: use_nvlamb keeps every ratio
        cfg = OptimConfig(name="lamb", lr=0.01, weight_decay=wd, max_grad_norm=1.0, eps=1e-6)
        a, b = FlatParams(_model().cuda()), FlatParams(_model().cuda())
        ours, apex = LAMB(a, cfg, decay_exempt=exempt), ApexLAMB(b, cfg, decay_exempt=exempt)
        assert len(apex._apex.param_groups) == (2 if exempt else 1)
        for step in range(10):
            g = torch.randn(a.size, generator=torch.Generator().manual_seed(step)).cuda()
            a.grads.copy_(g)
            b.grads.copy_(g)
            ours.step(torch.tensor(0.01, device="cuda"))
            apex.step(torch.tensor(0.01, device="cuda"))
        torch.testing.assert_close(a.params, b.params, atol=1e-5, rtol=1e-4)


def test_channels_last_parameters_keep_their_layout_in_the_flat_buffer() -> None:
    def conv() -> nn.Module:
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))

    model = conv().to(memory_format=torch.channels_last)
    flat = FlatParams(model)
    weight = model[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert weight.data_ptr() == flat.params.data_ptr()
    x = torch.randn(2, 3, 10, 10)
    model(x.contiguous(memory_format=torch.channels_last)).square().mean().backward()
    flat.check_grads()
    ref = conv()
    ref(x).square().mean().backward()
    for p, r, off in zip(model.parameters(), ref.parameters(), flat.offsets):
        assert p.grad.data_ptr() == flat.grads.data_ptr() + off * 4  # accumulated in the flat buffer
        torch.testing.assert_close(p.grad, r.grad, atol=1e-6, rtol=1e-5)


def test_unflatten_is_the_inverse_of_flatten_in_each_parameters_layout() -> None:
    """``unflatten`` of a buffer laid out like ``params`` gives one view per parameter with its shape and
    strides (channels-last included): of ``params`` itself the parameters, of ``flatten(ts)`` the ``ts``."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Linear(8, 5)).to(memory_format=torch.channels_last)
    flat = FlatParams(model)
    views = flat.unflatten(flat.params)
    for v, p in zip(views, model.parameters()):
        assert v.shape == p.shape and v.stride() == p.stride() and v.data_ptr() == p.data_ptr()
    tensors = [torch.randn(p.shape) for p in model.parameters()]
    back = flat.unflatten(flat.flatten(tensors))
    assert len(back) == len(tensors) and all(torch.equal(b, t) for b, t in zip(back, tensors))


def test_channels_last_3d_conv_weights() -> None:
    from hpcbench.common.precision import module_to_channels_last

    model = module_to_channels_last(nn.Sequential(nn.Conv3d(4, 8, 3), nn.Conv2d(8, 8, 1), nn.Linear(8, 2)))
    flat = FlatParams(model)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert model[1].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(p.data_ptr() == flat.params.data_ptr() + o * 4 for p, o in zip(model.parameters(), flat.offsets))


def test_keras_momentum_form_keeps_the_rate_inside_the_velocity() -> None:
    """optim.momentum_form = "keras" (CosmoFlow's reference optimizer, Keras SGD): v = m v - lr g, w += v, written
    out here over steps whose rate changes (where it differs from torch's form); torch's form stays the default."""
    import torch
    from torch import nn

    from hpcbench.common.flat import FlatParams
    from hpcbench.common.optim import build_optimizer
    from hpcbench.common.runconfig import OptimConfig

    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    start = [p.detach().clone() for p in model.parameters()]
    flat = FlatParams(model)
    opt = build_optimizer(flat, OptimConfig(name="sgd", momentum=0.9, momentum_form="keras"))
    grads = [[torch.randn_like(p) for p in start] for _ in range(4)]
    rates = [0.1, 0.2, 0.05, 0.05]
    for g, lr in zip(grads, rates):
        for p, gi in zip(model.parameters(), g):
            p.grad.copy_(gi)  # the grads are views of the flat buffer
        opt.step(torch.tensor(lr))
    w, v = [s.clone() for s in start], [torch.zeros_like(s) for s in start]
    for g, lr in zip(grads, rates):
        for k in range(len(w)):
            v[k] = 0.9 * v[k] - lr * g[k]
            w[k] = w[k] + v[k]
    for p, e in zip(model.parameters(), w):
        torch.testing.assert_close(p.detach(), e, atol=1e-6, rtol=1e-6)


def test_keras_momentum_form_nesterov_and_skipped_steps() -> None:
    """Keras' Nesterov SGD (v = m v - lr g; w += m v - lr g) step by step, and a step skipped under fp16 loss
    scaling (skip = 1) changes neither the weights nor the velocity; skip = 0 steps as usual."""
    import torch
    from torch import nn

    from hpcbench.common.flat import FlatParams
    from hpcbench.common.optim import build_optimizer
    from hpcbench.common.runconfig import OptimConfig

    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    start = [p.detach().clone() for p in model.parameters()]
    flat = FlatParams(model)
    opt = build_optimizer(flat, OptimConfig(name="sgd", momentum=0.9, nesterov=True, momentum_form="keras"))
    grads = [[torch.randn_like(p) for p in start] for _ in range(3)]
    rates, skips = [0.1, 0.3, 0.2], [0.0, 1.0, 0.0]
    for g, lr, sk in zip(grads, rates, skips):
        for p, gi in zip(model.parameters(), g):
            p.grad.copy_(gi)
        opt.step(torch.tensor(lr), torch.tensor(sk))
    w, v = [s.clone() for s in start], [torch.zeros_like(s) for s in start]
    for g, lr, sk in zip(grads, rates, skips):
        if sk:
            continue
        for k in range(len(w)):
            v[k] = 0.9 * v[k] - lr * g[k]
            w[k] = w[k] + 0.9 * v[k] - lr * g[k]
    for p, e in zip(model.parameters(), w):
        torch.testing.assert_close(p.detach(), e, atol=1e-6, rtol=1e-6)
