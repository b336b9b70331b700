"""DeepLabv3+ / modified aligned Xception: reference parameter count, structure, shapes, layouts."""
from __future__ import annotations

import torch
from torch import nn

from hpcbench.workloads.deepcam.model import ASPP, DeepLabV3Plus, ModelConfig, StridedPointwise, XBlock, count_parameters

MINI = ModelConfig(width=0.0625, middle_blocks=1)


def test_full_model_has_reference_parameter_count() -> None:
    model = DeepLabV3Plus(ModelConfig())  # 16 input channels, 3 classes, 16 middle blocks
    assert count_parameters(model) == 56_454_720
    assert len(model.encoder.middle) == 16
    assert all(isinstance(b, XBlock) for b in model.encoder.middle)
    rates = [b[0].dilation[0] for b in model.aspp.branches]
    assert rates == [1, 6, 12, 18]
    assert model.aspp.project[0].in_channels == 5 * 256  # four atrous branches + image pooling


def test_depth_and_width_scale_the_same_code() -> None:
    a = count_parameters(DeepLabV3Plus(ModelConfig(middle_blocks=15)))
    per_block = 3 * (728 * 9 + 728 * 728 + 2 * 728)  # 3 separable convs + BN per middle block
    assert 56_454_720 - a == per_block
    assert count_parameters(DeepLabV3Plus(MINI)) < 200_000


def test_output_stride_16_and_full_resolution_logits() -> None:
    torch.manual_seed(0)
    model = DeepLabV3Plus(MINI).eval()
    x = torch.randn(2, 16, 64, 96)
    feats, low = model.encoder(x)
    assert feats.shape[2:] == (4, 6) and low.shape[2:] == (16, 24)
    assert model(x).shape == (2, 3, 64, 96)


def test_channels_last_matches_nchw_forward_and_backward() -> None:
    torch.manual_seed(0)
    model = DeepLabV3Plus(MINI)
    x = torch.randn(2, 16, 32, 48)
    ref = model(x)
    ref.square().mean().backward()
    g_ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    cl = model.to(memory_format=torch.channels_last)
    out = cl(x.to(memory_format=torch.channels_last))
    out.square().mean().backward()
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4)
    assert all(torch.allclose(p.grad, g, atol=1e-4, rtol=1e-3) for p, g in zip(cl.parameters(), g_ref))


def test_strided_pointwise_equals_strided_conv() -> None:
    torch.manual_seed(0)
    sp = StridedPointwise(4, 8, 2)
    conv = nn.Conv2d(4, 8, 1, 2, bias=False)
    conv.weight.data.copy_(sp.weight.data)
    x = torch.randn(2, 4, 11, 14)
    assert torch.allclose(sp(x), conv(x))


def test_aspp_image_pool_broadcasts_to_feature_size() -> None:
    aspp = ASPP(8, 4, nn.BatchNorm2d).eval()
    assert aspp(torch.randn(1, 8, 3, 5)).shape == (1, 4, 3, 5)


def test_bf16_autocast_forward_runs() -> None:
    model = DeepLabV3Plus(MINI).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(1, 16, 32, 48))
    assert out.shape == (1, 3, 32, 48) and torch.isfinite(out.float()).all()


def test_group_batchnorm_needs_cuda_on_this_box() -> None:
    import pytest

    from hpcbench.common.errors import ConfigError
    from hpcbench.common.parallel import Degrees, check_degrees

    if torch.cuda.is_available():
        pytest.skip("CUDA present: SyncBatchNorm groups are allowed")
    # group BatchNorm is the harness option train.bn_group_size, checked by the layout object
    with pytest.raises(ConfigError, match="bn_group_size"):
        check_degrees(Degrees(bn_group=2), 2, False, 1, "cpu")


def test_initialisation_is_the_references_module_by_module() -> None:
    """The reference (architecture/deeplab_xception.py) runs kaiming_normal_ in Xception and ASPP_module only: the
    decoder, the image pool, the ASPP projection and the low-level projection keep torch's default init."""
    from hpcbench.workloads.deepcam.model import Decoder, Xception, conv_bn_relu

    cfg = ModelConfig(width=0.25, middle_blocks=1)
    torch.manual_seed(123)
    model = DeepLabV3Plus(cfg)
    kaiming, default = [], []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            (kaiming if name.startswith(("encoder.", "aspp.branches.")) else default).append((name, m))
    assert {n.split(".")[0] for n, _ in default} == {"aspp", "low_proj", "decoder"}
    assert [n for n, _ in default if n.startswith("aspp")] == ["aspp.pool.conv", "aspp.project.0"]
    assert sum(isinstance(m, nn.ConvTranspose2d) for _, m in default) == 4 and len(default) == 10
    for name, m in kaiming:  # normal, std sqrt(2 / fan_in): often beyond the default's bound 1 / sqrt(fan_in)
        fan_in = nn.init._calculate_fan_in_and_fan_out(m.weight)[0]
        w = m.weight.detach()
        assert 0.8 < w.std().item() / (2.0 / fan_in) ** 0.5 < 1.2, name
        assert w.abs().max().item() > 1.5 / fan_in ** 0.5, name
    for name, m in default:  # torch's kaiming_uniform_(a=sqrt 5): uniform within +-1 / sqrt(fan_in)
        fan_in = nn.init._calculate_fan_in_and_fan_out(m.weight)[0]
        w = m.weight.detach()
        assert w.abs().max().item() <= fan_in ** -0.5, name
        assert 0.8 < w.std().item() / (3.0 * fan_in) ** -0.5 < 1.2, name
    bias = model.decoder.fuse[2].bias.detach()  # the one conv with a bias: torch's default, not zeros
    assert bias.abs().min().item() > 0 and bias.abs().max().item() <= model.decoder.fuse[2].in_channels ** -0.5
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert bool((m.weight == 1).all()) and bool((m.bias == 0).all())
    assert bool((model.aspp.pool.scale == 1).all()) and bool((model.aspp.pool.shift == 0).all())

    # exactly: the same seed and construction order give the encoder and ASPP drawn then re-initialised in their
    # constructors, and the projection and decoder as torch constructs them, with nothing re-drawn afterwards
    torch.manual_seed(123)
    parts = nn.ModuleDict({"encoder": Xception(cfg, nn.BatchNorm2d),
                           "aspp": ASPP(cfg.ch(2048), cfg.ch(256), nn.BatchNorm2d),
                           "low_proj": conv_bn_relu(cfg.ch(128), cfg.ch(48), nn.BatchNorm2d, k=1),
                           "decoder": Decoder(cfg.ch(256), cfg.ch(48), cfg.ch(256), cfg.num_classes, nn.BatchNorm2d)})
    mine, rebuilt = model.state_dict(), parts.state_dict()
    assert mine.keys() == rebuilt.keys()
    assert all(torch.equal(mine[k], rebuilt[k]) for k in mine)
