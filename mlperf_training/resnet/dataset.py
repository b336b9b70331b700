"""The ResNet-50 dataset spec: ImageNet folders (``train/<wnid>/*.JPEG``, ``val/<wnid>/*.JPEG``).

Samples, per split and loader (:class:`ImageSource`):

* Pillow loader, training: the whole image decoded to uint8 RGB (:class:`Decoded`; its shorter side
  bounded to ``data.decode_short_side`` when set, with libjpeg's reduced-scale decode). The random
  augmentation runs per batch in ``read_batch`` (reader threads), so ``data.cache = "host"`` keeps
  the *decoded, un-augmented* images and a cached epoch skips only the JPEG decode: every epoch still
  draws new crops and flips.
* Pillow loader, evaluation: the final centred crop (:class:`Cropped`, deterministic), so the
  cache keeps collated uint8 batches and a cached evaluation equals an uncached one exactly.
* DALI loader without a cache: the checked JPEG bytes (:class:`Encoded`); DALI decodes them
  (``fn.decoders.image_random_crop`` decodes only the crop window; "mixed" = nvJPEG on a GPU).
  With ``data.cache = "host"`` DALI is fed the decoded samples above instead (the first epoch
  decodes with Pillow in the reader threads), and its graph starts at the crop.

Batches are ``(uint8 NHWC, int64 labels)`` on the host; :meth:`ImageNetData.transform` normalizes
with the ImageNet mean/std into float32 NCHW (a channels-last view when ``channels_last``), on the
device when there is one, so uint8 crosses the bus. Light to import (``hpcbench pack``/``stage``
load :data:`LAYOUT`): Pillow, torch and DALI are imported when used.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from hpcbench.common.data.layout import FileLayout, KnownSplit
from hpcbench.common.data.spec import DatasetSpec

from .imagenet import (ImageList, check_encoded, class_folders, decode, decode_read, jpeg_header, list_split,
                       open_checked, read_bytes, to_rgb)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .dali_graph import ImageNetDali

IMAGE_PATTERNS = ("*.JPEG", "*.jpeg", "*.jpg", "*.JPG", "*.png", "*.PNG")
LAYOUT = FileLayout(
    "resnet", IMAGE_PATTERNS, ("train", "val"), describe="ImageNet images (<split>/<wnid>/*.JPEG)",
    # ILSVRC-2012: 1,281,167 train / 50,000 val JPEGs of ~110 KiB; JPEG does not compress further
    known={"train": KnownSplit(1_281_167, 110_000, 1.0), "val": KnownSplit(50_000, 128_000, 1.0)})

Batch = tuple["torch.Tensor", "torch.Tensor"]


class Decoded(NamedTuple):
    """A whole training image, decoded (uint8 H x W x 3), and its class."""

    pixels: np.ndarray
    label: np.ndarray  # int64, shape (1,)


class Cropped(NamedTuple):
    """An evaluation image after resize and centre crop (uint8 size x size x 3), and its class."""

    pixels: np.ndarray
    label: np.ndarray


class Encoded(NamedTuple):
    """The checked bytes of a JPEG for DALI to decode, and its class."""

    pixels: np.ndarray  # uint8, the file's bytes
    label: np.ndarray


class ImageSource:
    """One split's images; item ``i`` is a validated sample of the kind ``kind`` (module doc)."""

    def __init__(self, images: ImageList, kind: str, size: int, resize: int, short_side: int) -> None:
        self.images, self.kind = images, kind
        self.size, self.resize, self.short_side = size, resize, short_side
        # encoded samples: the files whose data this process has decoded strictly once (check_encoded)
        self._checked = np.zeros(len(images), dtype=bool)

    @property
    def files(self) -> tuple[Path, ...]:
        return self.images.files

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Decoded | Cropped | Encoded:
        from PIL import Image

        from .transforms import bound_shorter_side, draft, eval_crop

        path, label = self.images.files[i], self.images.labels[i:i + 1]
        if self.kind == "encoded":
            encoded = Encoded(check_encoded(path, strict=not self._checked[i]), label)
            self._checked[i] = True
            return encoded
        if self.kind == "eval":
            return Cropped(eval_crop(Image.fromarray(decode(path)), self.size, self.resize), label)
        data = read_bytes(path)
        header = jpeg_header(data, path)
        if self.short_side <= 0 or (header is not None and min(header[:2]) <= self.short_side):
            return Decoded(decode_read(path, data, header), label)  # full resolution
        img = open_checked(path, data, header)
        draft(img, self.short_side)
        return Decoded(np.asarray(bound_shorter_side(to_rgb(img, path), self.short_side)), label)

    def costs(self) -> np.ndarray:
        return np.ones(len(self))


class ImageNetData(DatasetSpec):
    layout = LAYOUT
    partition = "contiguous"
    train_split = "train"
    eval_split = "val"

    def __init__(self, image_size: int, eval_resize: int, decode_short_side: int = 0, seed: int = 1,
                 encoded_for_dali: bool = False, channels_last: bool = False) -> None:
        self.image_size, self.eval_resize, self.decode_short_side = image_size, eval_resize, decode_short_side
        self.seed = seed
        self.encoded_for_dali = encoded_for_dali  # DALI without a cache: DALI decodes the JPEGs
        self.channels_last = channels_last  # set by the harness when train.channels_last is "auto"
        self._draws: dict[int, int] = {}  # augmentations drawn so far per training sample
        from hpcbench.common.data.buffers import HostBuffers  # torch: imported when a spec is built

        self._outputs = HostBuffers()  # the float32 batches ``transform`` writes on the host (reused)
        self._lock = threading.Lock()

    def open(self, root: Path, split: str) -> ImageSource:
        wnids = None if split == self.train_split else tuple(class_folders(Path(root) / self.train_split))
        images = list_split(root, split, wnids)
        kind = "encoded" if self.encoded_for_dali else ("train" if split == self.train_split else "eval")
        return ImageSource(images, kind, self.image_size, self.eval_resize, self.decode_short_side)

    def batch_cacheable(self, train: bool) -> bool:
        """Training batches are randomly augmented: the cache keeps the decoded samples instead."""
        return not train

    def collate(self, samples: Sequence[Any], pin: bool = False) -> Batch:
        """uint8 (B, S, S, 3) and int64 (B,) from fixed-size samples (evaluation crops, augmented crops)."""
        import torch

        first = samples[0].pixels
        x = torch.empty((len(samples), *first.shape), dtype=torch.uint8, pin_memory=pin)
        xn = x.numpy()
        for j, s in enumerate(samples):
            if s.pixels.shape != first.shape:
                raise ValueError(f"collate: sample {j} is {s.pixels.shape}, the first {first.shape}; only "
                                 "fixed-size samples (crops) are collated")
            xn[j] = s.pixels
        y = torch.from_numpy(np.concatenate([s.label for s in samples]))
        return x, y

    def rng(self, index: int) -> np.random.Generator:
        """The generator of training sample ``index``'s next augmentation: seeded from (seed, index,
        how many times it was drawn on this rank), so threads and batch order do not change it."""
        with self._lock:
            k = self._draws.get(index, 0)
            self._draws[index] = k + 1
        return np.random.default_rng([self.seed, index, k])

    def read_batch(self, source: Any, indices: Sequence[int], pin: bool = False) -> Batch:
        """Evaluation: the collated crops. Training: each decoded image (from the cache when on)
        randomly cropped, resized and flipped (:func:`~.transforms.train_crop`), then collated."""
        from .transforms import train_crop

        samples = [source[int(i)] for i in indices]
        if samples and isinstance(samples[0], Decoded):
            samples = [Cropped(train_crop(s.pixels, self.image_size, self.rng(int(i))), s.label)
                       for i, s in zip(indices, samples)]
        return self.collate(samples, pin=pin)

    def model_batch(self, source: Any, n: int) -> Batch:
        """Encoded samples (DALI decodes them) are not model input: read the same images decoded
        and augmented as the Pillow loader does, which gives the shapes and layout DALI produces."""
        if isinstance(source, ImageSource) and source.kind == "encoded":
            source = ImageSource(source.images, "train", source.size, source.resize, source.short_side)
        return self.transform(self.read_batch(source, range(n)))

    def transform(self, batch: Batch) -> Batch:
        from .transforms import normalize

        import torch

        x, y = batch
        n, h, w, c = x.shape
        out = self._outputs.output((n, h, w, c) if self.channels_last else (n, c, h, w), torch.float32, x.device)
        return normalize(x, self.channels_last, out), y

    def dali_for(self, train: bool) -> "ImageNetDali":
        from .dali_graph import ImageNetDali

        return ImageNetDali(train, self.encoded_for_dali, self.image_size, self.eval_resize, self.channels_last)

    def dali(self) -> "ImageNetDali":
        return self.dali_for(True)
