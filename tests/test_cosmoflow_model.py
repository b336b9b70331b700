"""The reference model: parameter count, memory formats, bf16, and the spec's maths."""
from __future__ import annotations

import pytest
import torch

from hpcbench.workloads.cosmoflow.config import CosmoFlowConfig, CosmoModelConfig
from hpcbench.workloads.cosmoflow.model import CosmoFlowNet, conv_flops_per_sample, count_parameters
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload


def test_reference_parameter_count() -> None:
    assert count_parameters(CosmoFlowNet(CosmoModelConfig(), 128)) == 8_907_556


def test_full_preset_is_the_reference_model() -> None:
    cfg = CosmoFlowWorkload.load_config("full")
    assert cfg.data.size == 128 and cfg.train.target == 0.124 and cfg.train.division == "closed"
    assert count_parameters(CosmoFlowWorkload(cfg).build_model()) == 8_907_556


def _small() -> tuple[CosmoFlowNet, torch.Tensor]:
    torch.manual_seed(0)
    cfg = CosmoModelConfig(conv_layers=2, conv_channels=4, fc_sizes=(16, 8), dropout=0.0)
    return CosmoFlowNet(cfg, 8).eval(), torch.rand(3, 4, 8, 8, 8)


def test_channels_last_matches_ncdhw() -> None:
    model, x = _small()
    ref = model(x)
    out = model.to(memory_format=torch.channels_last_3d)(x.contiguous(memory_format=torch.channels_last_3d))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert ref.shape == (3, 4) and ref.abs().max() <= 1.2


def test_flatten_uses_reference_dhwc_order() -> None:
    model, x = _small()
    feats = model.features(x)
    manual = torch.tanh(model.head(feats.permute(0, 2, 3, 4, 1).reshape(3, -1))) * 1.2
    torch.testing.assert_close(model(x), manual)


def test_bf16_autocast_close_to_fp32() -> None:
    model, x = _small()
    ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)


def test_flops_count_of_reference() -> None:
    # first conv: 128^3 voxels * 32 out * 4 in * 27 taps * 2
    assert conv_flops_per_sample(CosmoModelConfig(), 128) > 2.0 * 128**3 * 32 * 4 * 27


def test_loss_metric_and_hyperparameters() -> None:
    cfg = CosmoFlowWorkload.load_config("full")
    wl = CosmoFlowWorkload(cfg)
    y = torch.tensor([[0.0, 0.5, -0.5, 1.0]])
    out = torch.tensor([[0.1, 0.5, -0.7, 0.6]])
    # loss() is the sum and loss_count() the number of terms; the harness divides (the MSE)
    assert (wl.loss(out, (None, y)) / wl.loss_count((None, y))).item() == pytest.approx((0.01 + 0.04 + 0.16) / 4)
    sums = {k: float(v) for k, v in wl.eval_sums(out, (None, y)).items()}
    assert wl.metric(sums) == pytest.approx(0.7 / 4)
    hp = wl.hyperparameters()
    for key in ("opt_name", "opt_base_learning_rate", "opt_learning_rate_warmup_epochs",
                "opt_learning_rate_warmup_factor", "opt_learning_rate_decay_boundary_epochs",
                "opt_learning_rate_decay_factor", "dropout", "opt_weight_decay"):
        assert key in hp
    assert hp["opt_name"] == "sgd" and wl.target().describe() == "eval_error <= 0.124"


def test_loss_is_a_float32_sum_with_a_device_count() -> None:
    wl = CosmoFlowWorkload(CosmoFlowWorkload.load_config("mini"))
    gen = torch.Generator().manual_seed(1)
    y = torch.rand(3, 4, generator=gen) * 2 - 1
    out = (torch.rand(3, 4, generator=gen) * 2 - 1).bfloat16()
    loss = wl.loss(out, (None, y))
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ((out.float() - y) ** 2).sum())
    count = wl.loss_count((None, y))
    assert count.dtype == torch.float32 and count.shape == () and count.device == y.device and float(count) == 12


def test_config_rejects_indivisible_size() -> None:
    from hpcbench.common.errors import ConfigError

    with pytest.raises(ConfigError, match="data.size"):
        CosmoFlowWorkload.load_config("full", ["data.size=100"])
    assert isinstance(CosmoFlowWorkload.load_config("mini"), CosmoFlowConfig)
