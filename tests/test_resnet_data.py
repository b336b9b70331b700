"""ResNet data: the ImageNet folder layout on a tree built with plain Pillow (RGB, grayscale, CMYK,
PNG), named errors (corrupt, truncated, empty class, missing split, class mismatch), the synthetic
generator, and the Pillow and DALI loaders (same shapes/normalization/labels, eval paths agree,
decoded cache on = off for evaluation)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import damage_jpeg_entropy_data

from hpcbench.common.data.dali import DaliLoader, dali_available
from hpcbench.common.data.loader import Loader
from hpcbench.common.data.sampler import EpochSampler
from hpcbench.common.errors import ConfigError, DataError
from hpcbench.workloads.mlperf_training.resnet.dataset import Cropped, Decoded, Encoded, ImageNetData
from hpcbench.workloads.mlperf_training.resnet.synth import write_dataset
from hpcbench.workloads.mlperf_training.resnet.transforms import MEAN, RATIO, SCALE, STD, crop_box

CPU = torch.device("cpu")
needs_dali = pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed")
WNIDS = ("n01440764", "n01443537", "n02102040")


def _noise(seed: int, h: int, w: int) -> np.ndarray:
    """Smooth random pixels (JPEG keeps them close) so decoded values can be compared."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BILINEAR))


def _hand_tree(root: Path) -> None:
    """The published layout written with Pillow alone: 3 classes per split, one RGB, one grayscale,
    one CMYK JPEG and (in train) one PNG named .JPEG, as ImageNet holds."""
    for split, per in (("train", 3), ("val", 2)):
        for k, wnid in enumerate(WNIDS):
            d = root / split / wnid
            d.mkdir(parents=True)
            for i in range(per):
                img = Image.fromarray(_noise(k * 10 + i, 40 + 4 * i, 56 - 3 * k))
                mode = ("RGB", "L", "CMYK")[(k + i) % 3]
                img.convert(mode).save(d / f"{wnid}_{i}.JPEG", format="JPEG", quality=95)
    Image.fromarray(_noise(99, 48, 48)).save(root / "train" / WNIDS[1] / f"{WNIDS[1]}_png.JPEG", format="PNG")


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    write_dataset(root, classes=4, train_per_class=12, val_per_class=6, size=48, seed=3, progress=False)
    return root


def _spec(**kw: object) -> ImageNetData:
    return ImageNetData(32, 37, **kw)  # type: ignore[arg-type]


def _loader(spec: ImageNetData, root: Path, train: bool, dali: bool = False, cache: str = "none",
            threads: int = 2, batch: int = 8, multiplier: int = 1) -> Loader:
    src = spec.open(root, spec.train_split if train else spec.eval_split)
    sampler = EpochSampler(len(src), batch, 0, 1, seed=5, train=train)
    if dali:
        return DaliLoader(spec, src, sampler, CPU, threads=threads, prefetch=2, cache=cache, batch_multiplier=multiplier)
    return Loader(spec, src, sampler, CPU, threads=threads, prefetch=2, cache=cache)


def _epoch(loader: Loader, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    loader.set_epoch(epoch)
    xs, ys = zip(*list(loader))
    return torch.cat(xs), torch.cat(ys)


# the layout ---------------------------------------------------------------------------------------
def test_reader_on_a_tree_built_with_pillow(tmp_path: Path) -> None:
    _hand_tree(tmp_path)
    spec = _spec()
    train, val = spec.open(tmp_path, "train"), spec.open(tmp_path, "val")
    assert len(train) == 10 and len(val) == 6
    assert train.images.wnids == WNIDS  # class index = sorted wnid order
    assert train.images.labels.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]  # the PNG sorts after _2
    for i, path in enumerate(train.files):
        sample = train[i]
        assert isinstance(sample, Decoded) and sample.label.tolist() == [train.images.labels[i]]
        want = np.asarray(Image.open(path).convert("RGB"))  # the reference's conversion
        assert sample.pixels.shape == want.shape and sample.pixels.dtype == np.uint8
        assert np.array_equal(sample.pixels, want)
    gray = train[1].pixels  # class 0 image 1 is grayscale: three equal channels
    assert np.array_equal(gray[..., 0], gray[..., 2])
    crop = val[0]
    assert isinstance(crop, Cropped) and crop.pixels.shape == (32, 32, 3)
    enc = _spec(encoded_for_dali=True).open(tmp_path, "train")[0]
    assert isinstance(enc, Encoded) and enc.pixels.tobytes() == train.files[0].read_bytes()


def _one_class_tree(root: Path) -> Path:
    for split in ("train", "val"):
        (root / split / WNIDS[0]).mkdir(parents=True)
        Image.fromarray(_noise(1, 160, 160)).save(root / split / WNIDS[0] / "a.JPEG", format="JPEG")
    return root / "train" / WNIDS[0] / "a.JPEG"


@pytest.mark.parametrize("encoded", [False, True])
def test_corrupt_and_truncated_files_are_named(tmp_path: Path, encoded: bool) -> None:
    good = _one_class_tree(tmp_path)
    data = good.read_bytes()
    bad = good.with_name("b.JPEG")
    spec = _spec(encoded_for_dali=encoded)
    bad.write_bytes(data[: len(data) * 3 // 4])  # truncated inside the image data
    with pytest.raises(DataError, match=r"b\.JPEG.*truncated"):
        spec.open(tmp_path, "train")[1]
    bad.write_bytes(b"\x00not an image at all" * 20)  # not a JPEG
    with pytest.raises(DataError, match=r"b\.JPEG.*not a readable JPEG"):
        spec.open(tmp_path, "train")[1]
    bad.write_bytes(data)
    Image.fromarray(_noise(2, 20, 20)).save(bad, format="GIF")  # another format under the name
    with pytest.raises(DataError, match=r"b\.JPEG.*GIF image; expected JPEG"):
        spec.open(tmp_path, "train")[1]


@pytest.mark.parametrize("save", [
    {}, {"progressive": True}, {"optimize": True}, {"quality": 100, "subsampling": 0}, {"subsampling": 1},
    {"exif": b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x00"}, {"restart_marker_blocks": 1},
    {"mode": "L"}, {"mode": "CMYK"}])
def test_strict_decode_accepts_what_encoders_write_and_gives_pillows_pixels(tmp_path: Path, save: dict) -> None:
    """Baseline, progressive (several scans, DHT between them), optimized, 4:4:4, 4:2:2, an APP1
    segment, restart markers after every MCU, grayscale and CMYK JPEGs written by libjpeg (odd sizes,
    partial MCUs) pass the strict check, and the decode is the reference's Image.open().convert("RGB")
    pixel for pixel (libjpeg-turbo for YCbCr and grayscale, Pillow's conversion for CMYK)."""
    from hpcbench.workloads.mlperf_training.resnet.imagenet import check_encoded, decode

    kw = dict(save)
    img = Image.fromarray(_noise(3, 97, 131)).convert(kw.pop("mode", "RGB"))
    path = tmp_path / "x.JPEG"
    img.save(path, format="JPEG", **kw)
    data = path.read_bytes()
    if "restart_marker_blocks" in save:
        assert any(bytes([0xFF, m]) in data for m in range(0xD0, 0xD8))
    assert check_encoded(path).tobytes() == data  # no error
    assert np.array_equal(decode(path), np.asarray(Image.open(path).convert("RGB")))


def _damaged(good: Path, at: float, patch: bytes) -> bytes:
    """The file with ``patch`` written over its entropy-coded data at fraction ``at`` of it."""
    data = bytearray(good.read_bytes())
    sos = data.find(b"\xff\xda")
    pos = sos + 20 + int((len(data) - sos - 40) * at)
    data[pos:pos + len(patch)] = patch
    return bytes(data)


@pytest.mark.parametrize("encoded", [False, True])
def test_damaged_entropy_coded_data_is_named_under_both_loaders(tmp_path: Path, encoded: bool) -> None:
    """A marker byte pair no JPEG holds inside the image data, and a segment length past the file:
    libjpeg only warns ("Unsupported marker type", "Premature end") and DALI and Pillow decode a
    partly grey image; both loaders refuse the file by name."""
    good = _one_class_tree(tmp_path)
    bad = good.with_name("b.JPEG")
    bad.write_bytes(_damaged(good, 0.5, b"\xff\x99"))
    with pytest.raises(DataError, match=r"b\.JPEG.*(corrupt|does not decode)"):
        _spec(encoded_for_dali=encoded).open(tmp_path, "train")[1]
    data = bytearray(good.read_bytes())  # a segment length that runs past the file
    app = data.find(b"\xff\xdb")
    data[app + 2:app + 4] = (len(data)).to_bytes(2, "big") if len(data) < 65536 else b"\xff\xff"
    bad.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"b\.JPEG.*(corrupt|does not decode|not a readable)"):
        _spec(encoded_for_dali=encoded).open(tmp_path, "train")[1]


@pytest.mark.parametrize("kind", ["train", "val", "encoded", "bounded"])
def test_damaged_huffman_data_with_intact_markers_is_named(tmp_path: Path, kind: str) -> None:
    """Bytes inside the Huffman-coded data replaced, no 0xFF among them (the marker structure intact):
    Pillow decodes the file without an error (the hold-out case trained on it) and libjpeg-turbo's
    strict decode names it, for training and evaluation decodes, the bounded (draft) decode and the
    encoded bytes handed to DALI."""
    from PIL import Image as PILImage

    good = _one_class_tree(tmp_path)
    split = "val" if kind == "val" else "train"
    bad = tmp_path / split / WNIDS[0] / "b.JPEG"
    bad.write_bytes(good.read_bytes())
    damage_jpeg_entropy_data(bad)
    assert bad.read_bytes().count(b"\xff") == good.read_bytes().count(b"\xff")  # the markers as they were
    PILImage.open(bad).convert("RGB")  # Pillow: no error (libjpeg's warning is swallowed)
    spec = _spec(encoded_for_dali=kind == "encoded", decode_short_side=64 if kind == "bounded" else 0)
    with pytest.raises(DataError, match=r"b\.JPEG: the JPEG data does not decode cleanly \(libjpeg-turbo: "
                                        r"Corrupt JPEG data.*corrupt or truncated"):
        spec.open(tmp_path, split)[1]


def test_encoded_files_are_decoded_strictly_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DALI path decodes a file's data (at 1/8 scale) the first time this process reads it; a
    later epoch's read checks the header and end-of-image marker only."""
    from hpcbench.workloads.mlperf_training.resnet import imagenet

    _one_class_tree(tmp_path)
    calls: list[Path] = []
    real = imagenet.strict_decode
    monkeypatch.setattr(imagenet, "strict_decode", lambda data, path, check_only=False: (
        calls.append(path), real(data, path, check_only))[1])
    src = _spec(encoded_for_dali=True).open(tmp_path, "train")
    src[0], src[0]
    assert calls == [src.files[0]]


def test_layout_errors_name_the_folder(tmp_path: Path) -> None:
    _one_class_tree(tmp_path)
    spec = _spec()
    with pytest.raises(DataError, match=r"no_such/train: no such folder"):
        spec.open(tmp_path / "no_such", "train")
    (tmp_path / "train" / WNIDS[1]).mkdir()
    with pytest.raises(DataError, match=rf"train/{WNIDS[1]}: empty class folder"):
        spec.open(tmp_path, "train")
    Image.fromarray(_noise(1, 40, 40)).save(tmp_path / "train" / WNIDS[1] / "x.JPEG", format="JPEG")
    with pytest.raises(DataError, match=rf"val: its classes differ.*missing \['{WNIDS[1]}'\]"):
        spec.open(tmp_path, "val")
    (tmp_path / "val" / "cats").mkdir()
    with pytest.raises(DataError, match=r"WordNet ids.*cats"):
        spec.open(tmp_path, "val")


# the generator ------------------------------------------------------------------------------------
def test_generator_is_deterministic_and_leaves_only_complete_files(tmp_path: Path, synth_root: Path) -> None:
    write_dataset(tmp_path / "a", classes=4, train_per_class=12, val_per_class=6, size=48, seed=3, progress=False)
    write_dataset(tmp_path / "b", classes=4, train_per_class=2, val_per_class=1, size=48, seed=4, progress=False)
    files = sorted(p.relative_to(synth_root) for p in synth_root.rglob("*") if p.is_file())
    assert len(files) == 4 * 18 and all(p.suffix == ".JPEG" and not p.name.startswith(".") for p in files)
    assert all((tmp_path / "a" / p).read_bytes() == (synth_root / p).read_bytes() for p in files)
    same = files[0]
    assert (tmp_path / "b" / same).read_bytes() != (synth_root / same).read_bytes()
    sizes = {Image.open(synth_root / p).size for p in files}
    assert len(sizes) > 10  # variable image sizes
    modes = {Image.open(synth_root / p).mode for p in files}
    assert modes == {"RGB", "L"}  # image 11 of a class is grayscale (CMYK from image 41 on)


def test_crop_box_follows_the_reference_ranges() -> None:
    # the reference TF2 imagenet_preprocessing.py: area_range=[0.05, 1.0]; NVIDIA's closed ResNet (training_results
    # v4.0 run_and_time.sh): --min-random-area 0.05 --max-random-area 1.0, DALI's aspect ratio 3/4..4/3
    assert SCALE == (0.05, 1.0) and RATIO == (3.0 / 4.0, 4.0 / 3.0)
    rng = np.random.default_rng(0)
    areas = []
    for _ in range(500):
        left, top, right, bottom = crop_box(120, 80, rng)
        w, h = right - left, bottom - top
        assert 0 <= left < right <= 120 and 0 <= top < bottom <= 80
        assert 0.05 * 9600 * 0.9 <= w * h <= 9600
        areas.append(w * h / 9600)
    assert min(areas) < 0.075  # below torchvision's 0.08: the reference's range is used
    assert crop_box(400, 10, rng)[2] - crop_box(400, 10, rng)[0] <= 14  # the fallback clamps the ratio


# the loaders --------------------------------------------------------------------------------------
def _check_batch(x: torch.Tensor, y: torch.Tensor, n: int, classes: int) -> None:
    assert x.shape == (n, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (n,) and y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < classes
    lo = (0 - np.array(MEAN)) / np.array(STD)
    hi = (1 - np.array(MEAN)) / np.array(STD)
    for c in range(3):  # normalized with the ImageNet mean/std: inside the mapped [0, 255] range
        assert lo[c] - 1e-4 <= float(x[:, c].min()) and float(x[:, c].max()) <= hi[c] + 1e-4


@pytest.mark.parametrize("dali", [False, pytest.param(True, marks=needs_dali)])
def test_loaders_give_the_same_shapes_normalization_and_labels(synth_root: Path, dali: bool) -> None:
    spec = _spec(encoded_for_dali=dali)
    x, y = _epoch(_loader(spec, synth_root, train=True, dali=dali))
    _check_batch(x, y, 48, 4)
    assert sorted(y.tolist()) == sorted(np.repeat(np.arange(4), 12).tolist())  # every sample once
    xe, ye = _epoch(_loader(spec, synth_root, train=False, dali=dali))
    _check_batch(xe, ye, 24, 4)
    assert ye.tolist() == np.repeat(np.arange(4), 6).tolist()  # evaluation in file order


@pytest.mark.parametrize("dali", [False, pytest.param(True, marks=needs_dali)])
def test_channels_last_batches(synth_root: Path, dali: bool) -> None:
    spec = _spec(encoded_for_dali=dali, channels_last=True)
    x, _ = next(iter(_loader(spec, synth_root, train=False, dali=dali)))
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


@pytest.mark.parametrize("encoded", [False, True])
def test_model_batch_is_model_input_also_for_encoded_samples(synth_root: Path, encoded: bool) -> None:
    """``train.channels_last = "auto"`` times the model on ``model_batch``: with the DALI loader the
    training samples are JPEG bytes (before: collate refused them, a traceback before run_start); the
    batch is the decoded, augmented crop in the form DALI hands the model."""
    spec = _spec(encoded_for_dali=encoded)
    x, y = spec.model_batch(spec.open(synth_root, "train"), 4)
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (4,)


@needs_dali
def test_pillow_and_dali_evaluation_agree(synth_root: Path) -> None:
    """Same files, same resize + centre crop: only the resamplers' rounding differs (a mean of
    under one grey level), and the labels are identical."""
    xp, yp = _epoch(_loader(_spec(), synth_root, train=False))
    xd, yd = _epoch(_loader(_spec(encoded_for_dali=True), synth_root, train=False, dali=True))
    assert torch.equal(yp, yd)
    levels = (xp - xd).abs() * torch.tensor(STD).view(1, 3, 1, 1) * 255  # grey levels
    assert float(levels.mean()) < 1.0 and float(levels.quantile(0.99)) < 8.0


@needs_dali
def test_dali_input_batch_multiplier_gives_the_same_batches(synth_root: Path) -> None:
    """Super-batches of 3 batches (the last one partial) cut back: the same evaluation batches, in
    the same sizes and order, and training batches of the sampler's sizes with every sample once."""
    spec = _spec(encoded_for_dali=True)
    one = list(_loader(spec, synth_root, train=False, dali=True, batch=5))
    three_loader = _loader(spec, synth_root, train=False, dali=True, batch=5, multiplier=3)
    three = list(three_loader)
    assert len(three) == len(one) == len(three_loader) == 5  # 24 samples: 5+5+5 | 5+4
    for (x1, y1), (x3, y3) in zip(one, three):
        assert torch.equal(y1, y3) and torch.allclose(x1, x3)
    train = _loader(spec, synth_root, train=True, dali=True, batch=8, multiplier=4)
    got = list(train)
    assert [len(y) for _, y in got] == [8] * 6 and sorted(torch.cat([y for _, y in got]).tolist()) == \
        sorted(np.repeat(np.arange(4), 12).tolist())
    with pytest.raises(ConfigError, match="dali_batch_multiplier"):
        _loader(spec, synth_root, train=True, dali=True, multiplier=0)


def test_training_augmentation_is_seeded_per_sample_not_per_thread(synth_root: Path) -> None:
    a = _epoch(_loader(_spec(seed=7), synth_root, train=True, threads=0))
    b = _epoch(_loader(_spec(seed=7), synth_root, train=True, threads=2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    loader = _loader(_spec(seed=7), synth_root, train=True)
    e0, e1 = _epoch(loader, 0), _epoch(loader, 0)  # the same order, new draws: different crops
    assert torch.equal(e0[1], e1[1]) and not torch.equal(e0[0], e1[0])


@pytest.mark.parametrize("dali", [False, pytest.param(True, marks=needs_dali)])
def test_decoded_cache_equals_no_cache_for_evaluation(synth_root: Path, dali: bool) -> None:
    plain = _epoch(_loader(_spec(), synth_root, train=False))
    cached = _loader(_spec(), synth_root, train=False, dali=dali, cache="host")
    for epoch in range(2):  # the first fills the cache, the second reads only from it
        x, y = _epoch(cached, epoch)
        assert torch.equal(y, plain[1]) and torch.allclose(x, plain[0], atol=1e-6)


@pytest.mark.parametrize("dali", [False, pytest.param(True, marks=needs_dali)])
def test_decoded_cache_skips_decoding_after_the_first_epoch(synth_root: Path, dali: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(decode_short_side=40)
    loader = _loader(spec, synth_root, train=True, dali=dali, cache="host")
    calls: list[int] = []
    source = loader.source.source  # the SampleCache wraps the decoding source
    real = type(source).__getitem__
    monkeypatch.setattr(type(source), "__getitem__", lambda self, i: calls.append(i) or real(self, i))
    x0, y0 = _epoch(loader, 0)
    first = len(calls)
    x1, y1 = _epoch(loader, 1)
    assert first == 48 - 1 and len(calls) == first  # one sample was read when the cache was sized
    _check_batch(x1, y1, 48, 4)
    assert sorted(y1.tolist()) == sorted(y0.tolist()) and not torch.equal(x0, x1)  # new crops each epoch
    assert all(min(s.pixels.shape[:2]) <= 40 for s in loader.source.samples.values())  # bounded decode


def test_device_cache_of_augmented_batches_is_refused(synth_root: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.cache.*randomly augmented"):
        _loader(_spec(), synth_root, train=True, cache="device")


# image-size bombs ---------------------------------------------------------------------------------
def _jpeg_with_size(data: bytes, w: int, h: int) -> bytes:
    """The JPEG with its frame header (SOFn) claiming ``w`` x ``h`` (the data left as it was)."""
    import struct

    b, pos = bytearray(data), 2
    while pos < len(b):
        marker, length = b[pos + 1], struct.unpack(">H", b[pos + 2:pos + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            b[pos + 5:pos + 9] = struct.pack(">HH", h, w)
            return bytes(b)
        pos += 2 + length
    raise AssertionError("no SOF marker")


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG of a few dozen bytes whose IHDR claims ``w`` x ``h`` RGB pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b""))


def _no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any decode of a bomb's data (libjpeg-turbo through simplejpeg, or Pillow) fails the test
    instead of allocating gigabytes."""
    import simplejpeg
    from PIL import ImageFile

    def refuse(*args: object, **kw: object) -> None:
        raise AssertionError("the image data was decoded; the size must be refused from the header")

    monkeypatch.setattr(simplejpeg, "decode_jpeg", refuse)
    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)


@pytest.mark.parametrize("kind", ["train", "val", "encoded", "bounded"])
@pytest.mark.parametrize("fmt", ["jpeg", "cmyk_jpeg", "png"])
def test_image_size_bombs_are_refused_from_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      kind: str, fmt: str) -> None:
    """A file of a few KB whose header claims 60000 x 60000 (JPEG: libjpeg-turbo would allocate ~10.8 GB
    before finding the data short) or 100000 x 100000 (PNG: Pillow's DecompressionBombError) is a
    DataError naming the file and its pixel count, refused from the header before any decode, under
    the training, evaluation, bounded and DALI (encoded) readers."""
    good = _one_class_tree(tmp_path)
    split = "val" if kind == "val" else "train"
    bad = tmp_path / split / WNIDS[0] / "b.JPEG"
    if fmt == "png":
        bad.write_bytes(_png_header_only(100_000, 100_000))
        pixels = "10000000000"
    else:
        src = tmp_path / "src.JPEG"
        Image.fromarray(_noise(4, 64, 64)).convert("CMYK" if fmt == "cmyk_jpeg" else "RGB").save(src, format="JPEG")
        bad.write_bytes(_jpeg_with_size(src.read_bytes(), 60_000, 60_000))
        pixels = "3600000000"
    assert bad.stat().st_size < 10_000
    spec = _spec(encoded_for_dali=kind == "encoded", decode_short_side=64 if kind == "bounded" else 0)
    src = spec.open(tmp_path, split)
    _no_decoding(monkeypatch)
    with pytest.raises(DataError, match=rf"b\.JPEG: .*{pixels} pixels.*limit of 178956970 pixels"):
        src[1]


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
def test_image_size_limit_is_pillows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """The limit is the reference reader's: Pillow refuses an image above 2 x Image.MAX_IMAGE_PIXELS
    (and only warns up to it), read when the file is read."""
    import warnings

    from PIL import Image as PILImage

    from hpcbench.workloads.mlperf_training.resnet.imagenet import check_encoded, decode

    path = tmp_path / "x.JPEG"
    Image.fromarray(_noise(5, 40, 50)).save(path, format="PNG" if fmt == "png" else "JPEG")  # 2000 pixels
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 1000)  # Pillow's error above 2000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
        assert decode(path).shape == (40, 50, 3)
        check_encoded(path)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 999)
    for read in (decode, check_encoded):
        with pytest.raises(DataError, match=r"x\.JPEG: .*2000 pixels.*limit of 1998 pixels"):
            read(path)
