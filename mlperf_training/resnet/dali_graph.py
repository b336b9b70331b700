"""The ResNet-50 input pipeline as DALI graphs (``train.loader = "dali"``), the same transforms as the
Pillow path (:mod:`.transforms`).

Encoded input (no cache): training decodes only a random crop window
(``fn.decoders.image_random_crop``: area (0.05, 1), aspect ratio (3/4, 4/3)) and resizes it to
``size``; evaluation decodes the whole image, resizes the shorter side to ``resize`` and takes the
centred crop. The decoder runs on the CPU here and as "mixed" (nvJPEG on the GPU) on a GPU, so the
encoded bytes stay on the host until the decoder (``host_inputs``). Decoded input (``data.cache``):
training starts at ``fn.random_resized_crop`` of the cached image; evaluation samples are the final
crops already. Both end in one ``crop_mirror_normalize`` (random flip in training, ImageNet
mean/std, float32 HWC), and :meth:`to_batch` gives NCHW (a channels-last view, or contiguous).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .transforms import MEAN, RATIO, SCALE, STD

if TYPE_CHECKING:  # pragma: no cover
    import torch


class ImageNetDali:
    host_inputs = True  # the graph moves its inputs to the GPU itself (after a mixed decode)

    def __init__(self, train: bool, encoded: bool, size: int, resize: int, channels_last: bool) -> None:
        self.train, self.encoded = train, encoded
        self.size, self.resize, self.channels_last = size, resize, channels_last

    def inputs(self, samples: Sequence[Any]) -> list[list[np.ndarray]]:
        return [[s.pixels for s in samples], [s.label for s in samples]]

    def layouts(self) -> list[str]:
        return ["" if self.encoded else "HWC", ""]

    def dtypes(self) -> list[Any]:
        from nvidia.dali import types

        return [types.UINT8, types.INT64]

    def graph(self, inputs: list[Any], device: str) -> list[Any]:
        from nvidia.dali import fn, types

        images, labels = inputs
        gpu = device == "gpu"
        if self.encoded:
            decoder = "mixed" if gpu else "cpu"
            if self.train:
                images = fn.decoders.image_random_crop(images, device=decoder, output_type=types.RGB,
                                                       random_area=list(SCALE), random_aspect_ratio=list(RATIO),
                                                       num_attempts=10)
                images = fn.resize(images, size=[self.size, self.size], interp_type=types.INTERP_LINEAR,
                                   antialias=True)
            else:
                images = fn.decoders.image(images, device=decoder, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=self.resize, interp_type=types.INTERP_LINEAR,
                                   antialias=True)
        else:
            images = images.gpu() if gpu else images
            if self.train:
                images = fn.random_resized_crop(images, size=[self.size, self.size], random_area=list(SCALE),
                                                random_aspect_ratio=list(RATIO), num_attempts=10,
                                                interp_type=types.INTERP_LINEAR, antialias=True)
        crop = None if (not self.encoded and not self.train) else (self.size, self.size)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="HWC", crop=crop,
            mean=[m * 255.0 for m in MEAN], std=[s * 255.0 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5) if self.train else 0)
        return [images, labels.gpu() if gpu else labels]

    def to_batch(self, outputs: list["torch.Tensor"]) -> tuple["torch.Tensor", "torch.Tensor"]:
        x, y = outputs
        x = x.permute(0, 3, 1, 2)
        return (x if self.channels_last else x.contiguous()), y.reshape(-1)
