"""3D U-Net training patches against the reference's loader (mlcommons/training ``image_segmentation/pytorch``,
``data_loading/pytorch_loader.py``): ``RandBalancedCrop(patch, 0.4)`` then ``RandFlip``, ``Cast``,
``RandomBrightnessAugmentation(0.3, 0.1)``, ``GaussianNoise(0, 0.1, 0.1)``.

``reference_sample`` below re-writes that code (4-D ``(1, D, H, W)`` arrays, ``scipy.ndimage`` on the 4-D mask
as the reference calls it) with its ``random``/``np.random`` calls routed to one numpy Generator in the same
order; ours must give bit-identical patches from the same draws. The distribution tests check the
probabilities and magnitudes themselves. docs/closed.md lists what each test proves.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.ndimage

from hpcbench.workloads.mlperf_training.unet3d.dataset import KiTSData
from hpcbench.workloads.mlperf_training.unet3d.format import write_case
from hpcbench.workloads.mlperf_training.unet3d.patches import Draws, crop_corner, intensity, largest_components
from hpcbench.workloads.mlperf_training.unet3d.synth import ShapeRange, make_case


class RefRandom:
    """``random.random``/``random.randrange``/``np.random.*`` of the reference, on one Generator; counts branches."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.taken = rng, {"foreground": 0, "brightness": 0, "noise": 0}

    def random(self) -> float:
        return float(self.rng.random())

    def randrange(self, n: int) -> int:
        return int(self.rng.integers(n))

    def choice(self, a: np.ndarray) -> int:
        return int(a[int(self.rng.integers(len(a)))])


def reference_sample(image: np.ndarray, label: np.ndarray, patch: tuple[int, int, int], oversampling: float,
                     r: RefRandom) -> tuple[np.ndarray, np.ndarray]:
    def randrange(m: int) -> int:
        return 0 if m == 0 else r.randrange(m)

    def rand_crop() -> list[int]:
        return [randrange(s - p) for s, p in zip(image.shape[1:], patch)]

    def adjust(sl: tuple[slice, ...], idx: int) -> int:
        diff = patch[idx - 1] - (sl[idx].stop - sl[idx].start)
        sign = -1 if diff < 0 else 1
        diff = abs(diff)
        ladj = randrange(diff)
        hadj = diff - ladj
        low = max(0, sl[idx].start - sign * ladj)
        high = min(label.shape[idx], sl[idx].stop + sign * hadj)
        diff = patch[idx - 1] - (high - low)
        if diff > 0 and low == 0:
            high += diff
        elif diff > 0:
            low -= diff
        return low

    if r.random() < oversampling:
        r.taken["foreground"] += 1
        cl = r.choice(np.unique(label[label > 0]))
        slices = [x for x in scipy.ndimage.find_objects(scipy.ndimage.label(label == cl)[0]) if x is not None]
        volumes = [np.prod([s.stop - s.start for s in sl]) for sl in slices]
        slices = [slices[i] for i in np.argsort(volumes)[-2:]]
        chosen = slices[randrange(len(slices))]
        corner = [adjust(chosen, 1), adjust(chosen, 2), adjust(chosen, 3)]
    else:
        corner = rand_crop()
    box = (slice(None), *(slice(c, c + p) for c, p in zip(corner, patch)))
    img, lab = image[box], label[box]
    for axis in (1, 2, 3):  # RandFlip
        if r.random() < 1 / 3:
            img, lab = np.flip(img, axis=axis).copy(), np.flip(lab, axis=axis).copy()
    img, lab = img.astype(np.float32), lab.astype(np.uint8)  # Cast
    if r.random() < 0.1:  # RandomBrightnessAugmentation(factor=0.3, prob=0.1)
        r.taken["brightness"] += 1
        factor = np.array([r.rng.uniform(1.0 - 0.3, 1.0 + 0.3)])  # np.random.uniform(..., size=1)
        img = (img * (1 + factor)).astype(img.dtype)
    if r.random() < 0.1:  # GaussianNoise(mean=0.0, std=0.1, prob=0.1)
        r.taken["noise"] += 1
        scale = r.rng.uniform(0.0, 0.1)
        img = img + r.rng.normal(0.0, scale, img.shape).astype(img.dtype)
    return img, lab


def test_training_patches_equal_the_reference_pipeline_draw_for_draw(tmp_path: Path) -> None:
    shapes = ShapeRange((20, 20, 20), (28, 26, 24))
    for case in (1, 2, 3):
        write_case(tmp_path, case, *make_case(0, case, shapes))
    patch, seed = (16, 16, 16), 7
    src = KiTSData(patch, 0.4, True, seed).open(tmp_path, "train")
    src.stream = 1
    taken = {"foreground": 0, "brightness": 0, "noise": 0}
    for i in range(len(src)):
        image, label = np.load(src.pairs[i].image), np.load(src.pairs[i].label)
        for n in range(40):
            ours = src[i]
            r = RefRandom(np.random.default_rng([seed, 1, i, n]))  # the stream TrainCases draws this read from
            ref = reference_sample(image, label, patch, 0.4, r)
            assert ours[0].dtype == np.float32 and ours[1].dtype == np.uint8
            assert np.array_equal(ours[0], ref[0]) and np.array_equal(ours[1], ref[1]), (i, n)
            for k, v in r.taken.items():
                taken[k] += v
    assert min(taken.values()) > 0, taken  # every branch was compared (foreground, brightness, noise)


def test_foreground_crop_holds_one_of_the_two_largest_components() -> None:
    label = np.zeros((64, 64, 64), np.uint8)
    label[2:12, 2:12, 2:12] = 1  # 1000 voxels
    label[40:48, 40:48, 40:48] = 1  # 512
    label[20:22, 50:52, 5:7] = 1  # 8: never the crop's target
    boxes = largest_components(label, 1)
    assert sorted((b[0].start, b[0].stop) for b in boxes) == [(2, 12), (40, 48)]
    draws, hits = Draws(np.random.default_rng(3)), {2: 0, 40: 0}
    for _ in range(400):
        c = crop_corner(label.shape, (16, 16, 16), draws, 1.0, lambda: label)
        held = [b for b in boxes if all(lo <= s.start and s.stop <= lo + 16 for lo, s in zip(c, b))]
        assert len(held) >= 1, c  # a box shorter than the patch lies wholly inside it
        hits[held[0][0].start] += 1
    assert min(hits.values()) > 150  # either of the two, evenly (random.randrange(2))


def test_a_component_larger_than_the_patch_is_cut_inside_its_box() -> None:
    label = np.zeros((48, 48, 48), np.uint8)
    label[4:40, 10:20, 0:48] = 2  # 36 x 10 x 48 against a 16^3 patch
    draws = Draws(np.random.default_rng(0))
    for _ in range(200):
        c = crop_corner(label.shape, (16, 16, 16), draws, 1.0, lambda: label)
        assert 4 <= c[0] <= 40 - 16 and c[1] <= 10 and c[1] + 16 >= 20 and 0 <= c[2] <= 48 - 16


def test_brightness_and_noise_probabilities_and_magnitudes() -> None:
    base = np.full((1, 6, 6, 6), 0.5, np.float32)
    draws = Draws(np.random.default_rng(11))
    n, bright, noisy, factors, stds = 6000, 0, 0, [], []
    for _ in range(n):
        out = intensity(base, draws)
        mean = float(out.mean())
        spread = float(out.std())
        scaled = not np.isclose(np.median(out), 0.5, atol=0.05)
        if scaled:
            bright += 1
        if spread > 1e-6:  # a constant image keeps a zero spread up to float rounding
            noisy += 1
            stds.append(spread)
        elif scaled:  # brightness alone: the exact factor
            factors.append(float(out.flat[0]) / 0.5)
        assert out.dtype == np.float32 and np.isfinite(mean)
    # p = 0.1 each: 600 expected, binomial sd ~23
    assert abs(bright - 0.1 * n) < 100 and abs(noisy - 0.1 * n) < 100
    assert 1.7 - 1e-3 <= min(factors) and max(factors) <= 2.3 + 1e-3  # x (1 + U(0.7, 1.3)), the reference's
    assert max(stds) < 0.12 and min(stds) < 0.02  # N(0, U(0, 0.1))
    unchanged = Draws(np.random.default_rng(11))
    first = [intensity(base, unchanged) for _ in range(50)]
    assert sum(np.array_equal(x, base) for x in first) > 30  # ~81% of patches are left as they are


def test_a_case_without_foreground_falls_back_to_the_random_crop() -> None:
    """docs/closed.md, foreground crop: with oversampling 1 and an all-background case, the corner is the random
    crop's (the same draws after the oversampling one), inside the case; the labels are read for it."""
    shape, patch = (20, 24, 28), (8, 8, 8)
    read = []

    def background() -> np.ndarray:
        read.append(1)
        return np.zeros(shape, dtype=np.uint8)

    for seed in range(20):
        got = crop_corner(shape, patch, Draws(np.random.default_rng(seed)), 1.0, background)
        ref = Draws(np.random.default_rng(seed))
        ref.random()  # the oversampling draw
        assert got == tuple(ref.randrange(s - p) for s, p in zip(shape, patch))
        assert all(0 <= c <= s - p for c, s, p in zip(got, shape, patch))
    assert len(read) == 20
