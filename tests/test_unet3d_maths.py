"""unet3d maths: sliding-window evaluation (one window equals a plain forward; the Gaussian weights
normalise; trimming and padding as the reference), the Dice score and Dice + CE loss against hand
computations, and foreground-oversampled patches."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from hpcbench.workloads.mlperf_training.unet3d.config import UNetModelConfig
from hpcbench.workloads.mlperf_training.unet3d.inference import gaussian_map, pad_amounts, sliding_window, strides_of, trim_bounds
from hpcbench.workloads.mlperf_training.unet3d.loss import dice_ce_per_sample, dice_score
from hpcbench.workloads.mlperf_training.unet3d.model import UNet3D
from hpcbench.workloads.mlperf_training.unet3d.patches import Draws, crop_corner


def test_one_window_equals_a_plain_forward() -> None:
    torch.manual_seed(0)
    model = UNet3D(UNetModelConfig(channels=(4, 8))).eval()
    x = torch.randn(1, 1, 16, 16, 16)
    y = torch.randint(0, 3, (1, 1, 16, 16, 16), dtype=torch.uint8)
    with torch.no_grad():
        out, label = sliding_window(model, x, y, (16, 16, 16), overlap=0.5)
        want = model(x)
    assert out.shape == (1, 3, 16, 16, 16) and torch.equal(label, y)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_gaussian_map_is_the_reference_kernel() -> None:
    n = 8
    g = gaussian_map(n)
    assert g.shape == (n, n, n) and float(g.max()) == 1.0
    k = np.arange(n) - (n - 1) / 2
    one = np.exp(-0.5 * (k / (0.125 * n)) ** 2)  # scipy.signal.gaussian(n, 0.125 n)
    want = np.cbrt(np.einsum("i,j,k->ijk", one, one, one))
    np.testing.assert_allclose(g.numpy(), want / want.max(), rtol=1e-6)
    assert torch.equal(g, g.flip(0)) and torch.equal(g, g.permute(2, 0, 1))


def test_weights_normalise_constant_logits_and_overlaps_blend() -> None:
    """A model that outputs a constant per class gives that constant everywhere, whatever the weights;
    a model whose output depends on the window blends windows by the Gaussian weights."""
    const = torch.tensor([0.5, -1.0, 2.0]).view(1, 3, 1, 1, 1)

    def flat(x: torch.Tensor) -> torch.Tensor:
        return const.expand(x.shape[0], 3, *x.shape[2:]).clone()

    x = torch.randn(1, 1, 24, 16, 40)
    out, _ = sliding_window(flat, x, torch.zeros_like(x, dtype=torch.uint8), (16, 16, 16), 0.5, batch=3)
    assert out.shape == (1, 3, 24, 16, 40)
    torch.testing.assert_close(out, const.expand_as(out))

    # windows output their mean input: along an axis of 2 overlapping windows, the middle gets the
    # Gaussian-weighted mean of the two windows' values
    ramp = torch.cat([torch.zeros(1, 1, 8, 8, 8), torch.ones(1, 1, 8, 8, 8)], dim=2)  # D = 16, windows of 8
    def mean_model(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(1, 2, 3, 4), keepdim=True).expand(x.shape[0], 3, *x.shape[2:]).clone()
    out, _ = sliding_window(mean_model, ramp, torch.zeros_like(ramp, dtype=torch.uint8), (8, 8, 8), 0.5)
    g = gaussian_map(8)[:, 0, 0]
    # voxel d = 5 is in windows starting at 0 (value 0, weight g[5]), 4 (value 0.5, weight g[1]); 8 does not reach it
    want = (0.0 * g[5] + 0.5 * g[1]) / (g[5] + g[1])
    assert math.isclose(float(out[0, 0, 5, 0, 0]), float(want), rel_tol=1e-5)


def test_trim_and_pad_follow_the_reference() -> None:
    strides = strides_of((128, 128, 128), 0.5)
    assert strides == [64, 64, 64]
    # remainders: 10 < 32 trimmed (5 each side), 40 >= 32 kept, 0 kept
    assert trim_bounds((138, 168, 128), strides) == [(5, 133), (0, 168), (0, 128)]
    # kept sizes padded to a multiple of the stride and at least the window
    assert pad_amounts((128, 168, 100), (128, 128, 128), strides) == [(0, 0), (12, 12), (14, 14)]
    assert pad_amounts((40, 64, 64), (128, 128, 128), strides) == [(44, 44), (32, 32), (32, 32)]


def test_sliding_window_refuses_a_case_the_trim_would_empty() -> None:
    """An axis under half a stride is trimmed to nothing by the reference's rule; an empty prediction
    against an empty label would score a perfect Dice, so the case is refused, never scored."""
    import pytest

    from hpcbench.common.errors import DataError

    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 3, *x.shape[2:])

    x = torch.randn(1, 1, 38, 40, 6)
    y = torch.ones(1, 1, 38, 40, 6, dtype=torch.uint8)  # foreground everywhere
    with pytest.raises(DataError, match=r"\(38, 40, 6\) voxels .*at least the window \(32, 32, 32\) \(data.roi\)"):
        sliding_window(model, x, y, (32, 32, 32), 0.5)
    # at or above half a stride nothing is trimmed: padded and scored as the reference does
    out, label = sliding_window(model, torch.randn(1, 1, 32, 32, 8), torch.ones(1, 1, 32, 32, 8, dtype=torch.uint8),
                                (32, 32, 32), 0.5)
    assert out.shape == (1, 3, 32, 32, 8) and label.shape == (1, 1, 32, 32, 8)


def test_dice_score_against_hand_computation() -> None:
    label = torch.zeros(1, 1, 2, 2, 2, dtype=torch.uint8)
    label[0, 0, 0, 0, :] = 1  # 2 kidney voxels
    label[0, 0, 1, 1, 1] = 2  # 1 tumour voxel
    pred = torch.zeros(1, 2, 2, 2, dtype=torch.long)
    pred[0, 0, 0, 0] = 1  # 1 of 2 kidney voxels right
    pred[0, 1, 0, 0] = 1  # plus one false kidney voxel
    pred[0, 1, 1, 1] = 2  # tumour exact
    logits = F.one_hot(pred, 3).permute(0, 4, 1, 2, 3).float() * 5
    score = dice_score(logits, label)
    # kidney: 2 * 1 / (2 + 2); tumour: 2 * 1 / (1 + 1); the 1e-6 smoothing terms as the reference
    torch.testing.assert_close(score, torch.tensor([[(2 + 1e-6) / (4 + 1e-6), (2 + 1e-6) / (2 + 1e-6)]]))
    # a class absent from both prediction and label scores 1, absent from the prediction only ~0
    empty = dice_score(torch.zeros(1, 3, 2, 2, 2).index_fill_(1, torch.tensor([0]), 1.0), torch.zeros_like(label))
    torch.testing.assert_close(empty, torch.ones(1, 2))
    assert float(dice_score(torch.zeros(1, 3, 2, 2, 2).index_fill_(1, torch.tensor([0]), 1.0), label).max()) < 1e-6


def test_dice_ce_loss_against_hand_computation() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 3, 3, 3)
    label = torch.randint(0, 3, (2, 1, 3, 3, 3), dtype=torch.uint8)
    got = dice_ce_per_sample(logits, label)
    p = torch.softmax(logits, 1)
    for i in range(2):
        ce = -torch.log(p[i].gather(0, label[i].long())).mean()
        dl = []
        for c in (1, 2):
            t = (label[i, 0] == c).float()
            dl.append(1 - (2 * (p[i, c] * t).sum() + 1e-6) / (t.sum() + p[i, c].sum() + 1e-6))
        torch.testing.assert_close(got[i], (sum(dl) / 2 + ce) / 2)
    # the batch mean is the reference's DiceCELoss: (mean over samples and classes of 1 - Dice + CE over all voxels) / 2
    onehot = F.one_hot(label[:, 0].long(), 3).permute(0, 4, 1, 2, 3).float()
    inter, total = (p * onehot).sum((2, 3, 4)), (p + onehot).sum((2, 3, 4))
    dice_term = (1 - (2 * inter[:, 1:] + 1e-6) / (total[:, 1:] + 1e-6)).mean()
    torch.testing.assert_close(got.mean(), (dice_term + F.cross_entropy(logits, label[:, 0].long())) / 2)


def test_oversampled_crop_always_holds_foreground() -> None:
    draws = Draws(np.random.default_rng(0))
    label = np.zeros((40, 36, 50), np.uint8)
    label[30:33, 2:4, 45:48] = 1
    label[5, 30, 1] = 2
    seen = set()
    for _ in range(200):
        c = crop_corner(label.shape, (16, 16, 16), draws, 1.0, lambda: label)
        assert all(0 <= a <= s - 16 for a, s in zip(c, label.shape))
        crop = label[c[0]:c[0] + 16, c[1]:c[1] + 16, c[2]:c[2] + 16]
        assert crop.any()
        seen.add(int(crop.max()))
    assert seen == {1, 2}  # both classes get drawn
    plain = [crop_corner(label.shape, (16, 16, 16), draws, 0.0, lambda: label) for _ in range(300)]
    # the reference's randrange(size - patch): 0 .. size - patch - 1 (its last position is never drawn)
    assert min(c[0] for c in plain) == 0 and max(c[0] for c in plain) == 23


def test_metric_is_the_mean_over_cases_of_kidney_and_tumour_dice() -> None:
    from hpcbench.workloads.mlperf_training.unet3d.workload import UNet3DWorkload

    wl = UNet3DWorkload(UNet3DWorkload.load_config("mini"))
    label = torch.zeros(1, 1, 2, 2, 2, dtype=torch.uint8)
    label[0, 0, 0] = 1
    label[0, 0, 1, 1, 1] = 2
    perfect = F.one_hot(label[:, 0].long(), 3).permute(0, 4, 1, 2, 3).float()
    no_tumour = perfect.clone()
    no_tumour[:, 2] = 0  # the tumour voxel predicted background: kidney 1, tumour ~0
    sums: dict[str, float] = {}
    for logits in (perfect, no_tumour):
        for k, v in wl.eval_sums((logits, label), (label.float(), label)).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    assert sums["cases"] == 2
    assert math.isclose(wl.metric(sums), (1.0 + 1.0 + 1.0 + 0.0) / 4, abs_tol=1e-6)


def test_training_patches_are_reproducible_per_rank_and_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from hpcbench.workloads.mlperf_training.unet3d.dataset import KiTSData
    from hpcbench.workloads.mlperf_training.unet3d.format import write_case
    from hpcbench.workloads.mlperf_training.unet3d.synth import ShapeRange, make_case

    for case in (1, 2):
        write_case(tmp_path, case, *make_case(0, case, ShapeRange((20, 20, 20), (24, 24, 24))))
    spec = KiTSData((8, 8, 8), 0.4, True, seed=5)

    def draws(stream: int) -> list[np.ndarray]:
        src = spec.open(tmp_path, "train")
        src.stream = stream
        return [src[0][0] for _ in range(4)]

    a, b, other = draws(0), draws(0), draws(1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # same seed, rank and read count: same patch
    assert not np.array_equal(a[0], a[1])  # the next read of the case is a new patch
    assert not all(np.array_equal(x, y) for x, y in zip(a, other))  # another rank draws others
    assert a[0].shape == (1, 8, 8, 8) and a[0].dtype == np.float32


def test_evaluation_in_batches_of_windows_gives_the_one_window_logits() -> None:
    """``data.window_batch`` windows per model call: the workload's evaluation forward gives the logits of the
    reference's one window at a time (up to float rounding: a batch may take another convolution path), the
    same argmax, and a count below 1 is refused naming the key."""
    import pytest

    from hpcbench.common.errors import ConfigError
    from hpcbench.workloads.mlperf_training.unet3d.workload import UNet3DWorkload

    torch.manual_seed(0)
    x, y = torch.randn(1, 1, 44, 40, 48), torch.zeros(1, 1, 44, 40, 48, dtype=torch.uint8)
    one = UNet3DWorkload(UNet3DWorkload.load_config("mini", ["data.window_batch=1"]))
    model = one.build_model().eval()
    outs = []
    for n in (1, 3, 4):  # 3: the 8 windows end with a partial batch
        wl = UNet3DWorkload(UNet3DWorkload.load_config("mini", [f"data.window_batch={n}"]))
        with torch.no_grad():
            outs.append(wl.forward(model, (x, y))[0])
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(out.argmax(1), outs[0].argmax(1))
    assert UNet3DWorkload.load_config("mini").data.window_batch == 4
    assert UNet3DWorkload.load_config("full").data.window_batch == 1  # the reference's
    with pytest.raises(ConfigError, match="data.window_batch"):
        UNet3DWorkload.load_config("mini", ["data.window_batch=0"])
