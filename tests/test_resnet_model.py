"""ResNet-50 v1.5: the published parameter count (meta device), the v1.5 stride placement, the
initialisation, channels-last equality, the no-weight-decay set, and the label-smoothed loss against
torch's cross entropy."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcbench.workloads.mlperf_training.resnet.loss import smoothed_cross_entropy_sum, top1_correct
from hpcbench.workloads.mlperf_training.resnet.model import (TINY, Bottleneck, ModelConfig, ResNet, no_weight_decay,
                                          no_weight_decay_names)


def _meta_resnet50() -> ResNet:
    with torch.device("meta"):
        return ResNet(ModelConfig())


def test_resnet50_has_the_published_parameter_count_and_shapes() -> None:
    model = _meta_resnet50()
    assert sum(p.numel() for p in model.parameters()) == ModelConfig().param_count() == 25_557_032
    assert TINY.param_count() == sum(p.numel() for p in ResNet(TINY).parameters())
    feats: dict[str, torch.Size] = {}
    model.layers[-1].register_forward_hook(lambda m, i, o: feats.update(last=o.shape))
    out = model(torch.empty(2, 3, 224, 224, device="meta"))
    assert tuple(out.shape) == (2, 1000) and tuple(feats["last"]) == (2, 2048, 7, 7)


def test_v1_5_puts_the_stride_on_the_3x3_convolution() -> None:
    model = _meta_resnet50()
    assert [len(s) for s in model.layers] == [3, 4, 6, 3]
    for i, stage in enumerate(model.layers):
        first = stage[0]
        assert first.conv1.stride == (1, 1) and first.conv3.stride == (1, 1)
        assert first.conv2.stride == ((2, 2) if i > 0 else (1, 1)) and first.conv2.kernel_size == (3, 3)
        assert first.shortcut is not None and first.shortcut.conv.stride == first.conv2.stride
        assert all(b.shortcut is None and b.conv2.stride == (1, 1) for b in stage[1:])


def test_initialisation_he_normal_truncated_zero_last_gamma_and_identity_blocks() -> None:
    torch.manual_seed(0)
    model = ResNet(ModelConfig(depths=(1, 1, 2), num_classes=1000, zero_init_residual=True)).requires_grad_(False)
    conv = model.layers[2][1].conv2  # 256 x 256 x 3 x 3: 590k draws
    std = math.sqrt(2.0 / (256 * 9))
    assert float(conv.weight.std()) == pytest.approx(std, rel=0.02)
    assert float(conv.weight.abs().max()) <= 2 * std / 0.87962566103423978 + 1e-6  # truncated at 2 sigma
    assert float(model.fc.weight.std()) == pytest.approx(0.01, rel=0.02) and not model.fc.bias.any()
    blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
    assert all(not b.bn3.weight.any() and bool((b.bn1.weight == 1).all()) for b in blocks)
    block = model.layers[2][1].eval()  # zero last gamma: the block starts as the identity (after ReLU)
    x = torch.randn(2, 1024, 4, 4)
    torch.testing.assert_close(block(x), torch.relu(x))
    plain = ResNet(ModelConfig(depths=(1, 1, 1, 1)))  # the default: the reference's, every gamma 1
    assert all(bool((b.bn3.weight == 1).all()) for b in plain.modules() if isinstance(b, Bottleneck))


def test_channels_last_gives_the_same_outputs_and_keeps_the_layout() -> None:
    torch.manual_seed(0)
    ref = ResNet(TINY).double().train()
    cl = ResNet(TINY).double().train().to(memory_format=torch.channels_last)
    cl.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 64, 64, dtype=torch.float64)
    seen = []
    cl.layers[-1].register_forward_hook(lambda m, i, o: seen.append(o.is_contiguous(memory_format=torch.channels_last)))
    y_ref, y_cl = ref(x), cl(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(y_cl, y_ref)
    assert seen == [True]
    y_ref.square().sum().backward()
    y_cl.square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), cl.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_no_weight_decay_is_every_batchnorm_parameter_and_bias() -> None:
    model = _meta_resnet50()
    by_name = [n for n, _ in model.named_parameters() if no_weight_decay(n)]
    assert by_name == no_weight_decay_names(model)
    assert len(by_name) == 2 * 53 + 1  # 53 BatchNorms (stem, 16 x 3 in blocks, 4 shortcuts) + fc.bias
    assert no_weight_decay("fc.bias") and not no_weight_decay("fc.weight")
    assert no_weight_decay("layers.1.0.shortcut.bn.weight") and not no_weight_decay("layers.1.0.shortcut.conv.weight")
    exempt = sum(p.numel() for n, p in model.named_parameters() if no_weight_decay(n))
    mids = (64, 128, 256, 512)
    bn_channels = 64 + sum(d * 6 * m for d, m in zip((3, 4, 6, 3), mids)) + sum(4 * m for m in mids)
    assert exempt == 2 * bn_channels + 1000 == 54_120


def test_bad_model_config_is_refused() -> None:
    with pytest.raises(ValueError, match="depths"):
        ModelConfig(depths=(3, 0, 6, 3))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_is_torch_cross_entropy_summed(smoothing: float) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 1000, generator=g, dtype=torch.float64) * 4
    labels = torch.randint(0, 1000, (37,), generator=g)
    ours = smoothed_cross_entropy_sum(logits, labels, smoothing)
    ref = F.cross_entropy(logits, labels, label_smoothing=smoothing, reduction="sum")
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=1e-5)
    # the gradient too (what training uses), and bf16 logits are computed in fp32
    a = logits.clone().float().requires_grad_()
    b = logits.clone().float().requires_grad_()
    smoothed_cross_entropy_sum(a, labels, smoothing).backward()
    F.cross_entropy(b, labels, label_smoothing=smoothing, reduction="sum").backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert smoothed_cross_entropy_sum(logits.bfloat16(), labels, smoothing).dtype == torch.float32


def test_loss_refuses_bad_shapes_and_counts_top1() -> None:
    with pytest.raises(ValueError, match="logits"):
        smoothed_cross_entropy_sum(torch.zeros(4, 10), torch.zeros(5, dtype=torch.long))
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert float(top1_correct(logits, torch.tensor([1, 0, 0]))) == 2.0


def test_tiny_resnet_learns_a_separable_toy_problem() -> None:
    """A few SGD steps on two colour classes drive the smoothed loss down: the pieces fit together."""
    torch.manual_seed(0)
    model = ResNet(ModelConfig(depths=(1, 1, 1, 1), width=8, num_classes=2))
    x = torch.randn(16, 3, 24, 24)
    y = torch.arange(16) % 2
    x[y == 1, 0] += 1.5
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = smoothed_cross_entropy_sum(model(x), y) / len(y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.6 * losses[0]
    assert isinstance(model.fc, nn.Linear)
