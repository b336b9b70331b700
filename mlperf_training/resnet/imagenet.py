"""The ImageNet (ILSVRC-2012) folder layout the reference reads, and the validating JPEG reader.

``<root>/train/<wnid>/*.JPEG`` and ``<root>/val/<wnid>/*.JPEG`` (the validation images sorted into
class folders, as the MLPerf reference and torchvision's ImageFolder expect). A class index is the
position of its wnid (``n01440764``...) in sorted order, so train and val must hold the same wnids.

Decoding follows the reference, Pillow's ``Image.open(path).convert("RGB")``, which turns grayscale
and CMYK JPEGs (ImageNet has both, and one PNG named ``.JPEG``) into 3-channel RGB. YCbCr and grayscale
JPEGs are decoded by libjpeg-turbo through simplejpeg (the same library and settings as Pillow's, so
the same pixels) in strict mode: a file whose data libjpeg calls corrupt is a :class:`DataError`
naming it, where Pillow and DALI only warn. A file that does not decode, or is cut short, is a
DataError naming it. An image larger than Pillow refuses (``Image.MAX_IMAGE_PIXELS``: Pillow warns
above it and raises above twice it, 178,956,970 pixels by default) is a DataError naming the file and
its pixel count, read from the header before any decode: a few-KB file claiming 60000 x 60000 would
have libjpeg-turbo allocate ~10.8 GB (:func:`check_size`). Pillow and simplejpeg are imported when
first used.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hpcbench.common.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image as PILImage

WNID = re.compile(r"n\d{8}")
EXTENSIONS = (".jpeg", ".jpg", ".png")  # names are matched case-insensitively (ImageNet: .JPEG)
SPLITS = ("train", "val")
FORMATS = ("JPEG", "PNG")  # what the real files are (ImageNet holds one PNG named .JPEG)
JPEG_SOI, JPEG_EOI = b"\xff\xd8", b"\xff\xd9"


@dataclass(frozen=True)
class ImageList:
    """The image files of one split in a fixed order (class folders sorted, files sorted) and their
    class indices (positions in the sorted wnid list of the *train* split)."""

    root: Path
    split: str
    wnids: tuple[str, ...]
    files: tuple[Path, ...]
    labels: np.ndarray  # int64, one per file

    def __len__(self) -> int:
        return len(self.files)


def class_folders(folder: Path) -> list[str]:
    """Sorted wnid folder names of a split; anything else in it is refused by name."""
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; an ImageNet dataset has split folders "
                        f"{', '.join(SPLITS)} with one <wnid> folder per class (write one with "
                        "`hpcbench datagen resnet --out DIR`)")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    bad = [n for n in names if not WNID.fullmatch(n)]
    if bad:
        raise DataError(f"{folder}: class folders must be WordNet ids like n01440764, found {bad[:3]}")
    if not names:
        raise DataError(f"{folder}: no class folders (expected <wnid>/*.JPEG, e.g. n01440764/)")
    return names


def list_split(root: str | Path, split: str, wnids: tuple[str, ...] | None = None) -> ImageList:
    """The files of ``root/split``. ``wnids``: the class list to index by (the train split's); the
    split must hold exactly those classes. An empty class folder is refused by name."""
    folder = Path(root) / split
    found = tuple(class_folders(folder))
    classes = wnids if wnids is not None else found
    if wnids is not None and found != wnids:
        missing, extra = sorted(set(wnids) - set(found)), sorted(set(found) - set(wnids))
        raise DataError(f"{folder}: its classes differ from the train split's ({len(wnids)} classes): "
                        f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                        f"extra {extra[:3]}{'...' if len(extra) > 3 else ''}")
    files: list[Path] = []
    labels: list[int] = []
    for k, wnid in enumerate(classes):
        images = sorted(p for p in (folder / wnid).iterdir()
                        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in EXTENSIONS)
        if not images:
            raise DataError(f"{folder / wnid}: empty class folder (no *.JPEG images)")
        files += images
        labels += [k] * len(images)
    return ImageList(Path(root), split, classes, tuple(files), np.asarray(labels, dtype=np.int64))


def pixel_limit() -> int | None:
    """The most pixels an image may have: Pillow's error threshold, 2 x ``Image.MAX_IMAGE_PIXELS``
    (read now, as Pillow does; None when it is switched off)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return None if limit is None else 2 * limit


def check_size(path: Path, w: int, h: int) -> None:
    """Refuse an image above Pillow's limit (:func:`pixel_limit`) by name, before its data is decoded."""
    limit = pixel_limit()
    pixels = max(1, w) * max(1, h)  # as Pillow counts
    if limit is not None and pixels > limit:
        raise DataError(f"{path}: image size {w}x{h} ({pixels} pixels) exceeds the limit of {limit} pixels "
                        "(2 x Pillow's Image.MAX_IMAGE_PIXELS, the reference reader's); the header is "
                        "corrupt or the file is a decompression bomb")


def open_image(path: Path, data: bytes | None = None) -> "PILImage.Image":
    """The image opened (header parsed, not decoded); a file that is not an image, or one above
    Pillow's size limit, is refused."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data) if data is not None else path)
    except Image.DecompressionBombError as exc:  # Pillow's own check of the header's size
        said = str(exc).split(", could be")[0]  # "Image size (N pixels) exceeds limit of L pixels"
        raise DataError(f"{path}: {said} (2 x Pillow's Image.MAX_IMAGE_PIXELS, the reference reader's); "
                        "the header is corrupt or the file is a decompression bomb") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{path}: not a readable JPEG image ({exc})") from None
    if img.format not in FORMATS:
        raise DataError(f"{path}: a {img.format} image; expected JPEG")
    check_size(path, *img.size)  # also when Pillow's check did not run (its limit changed since)
    return img


def to_rgb(img: "PILImage.Image", path: Path) -> "PILImage.Image":
    """Decode now and convert as the reference does (grayscale, CMYK, palette -> RGB); a truncated or
    corrupt file fails here with its name."""
    try:
        img.load()
        return img if img.mode == "RGB" else img.convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"{path}: the JPEG data does not decode ({exc}); the file is corrupt or truncated") from None


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None


def jpeg_header(data: bytes, path: Path) -> tuple[int, int, str] | None:
    """(width, height, colour space) of a JPEG (libjpeg-turbo's header parse); None when the bytes
    are not a JPEG (no start-of-image marker: a PNG, or another format :func:`open_image` names). A
    size above Pillow's limit is refused here, before any decode (:func:`check_size`)."""
    import simplejpeg

    if not data.startswith(JPEG_SOI):
        return None
    try:
        w, h, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise DataError(f"{path}: not a readable JPEG image ({exc})") from None
    if w < 1 or h < 1:
        raise DataError(f"{path}: image size {w}x{h}; expected a positive size")
    check_size(path, w, h)
    return w, h, colorspace


def strict_decode(data: bytes, path: Path, check_only: bool = False) -> np.ndarray:
    """The JPEG decoded by libjpeg-turbo with every *recoverable* error treated as an error: damaged
    entropy-coded data ("Corrupt JPEG data: bad Huffman code", "N extraneous bytes before marker",
    "Unsupported marker type", "Premature end of data segment") is a DataError naming the file, where
    Pillow and DALI's decoders only warn and train on a partly grey image. ``check_only``: decode at
    1/8 scale (all of the entropy-coded data is still decoded, the inverse DCT is skipped; about 2/3 of
    a full decode's time). Damage after which the Huffman code resynchronises decodes without any
    warning and is, to every decoder, a valid image; only a checksum taken before the damage sees it (the
    staging manifest's crc32c, for damage after packing)."""
    import simplejpeg

    try:
        if check_only:
            return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, min_height=1, min_width=1)
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    except ValueError as exc:
        raise DataError(f"{path}: the JPEG data does not decode cleanly (libjpeg-turbo: {exc}); the file "
                        "is corrupt or truncated") from None


#: JPEG colour spaces whose RGB decode by libjpeg-turbo is Pillow's ``convert("RGB")`` pixel for pixel
#: (same library, same integer IDCT and upsampling); CMYK and YCCK take Pillow's own conversion.
_SAME_AS_PILLOW = frozenset(["YCbCr", "Gray"])


def decode(path: Path) -> np.ndarray:
    """The whole image as uint8 RGB (H, W, 3), as the reference's ``Image.open(path).convert("RGB")``
    gives it, with the strict JPEG check of :func:`strict_decode`."""
    data = read_bytes(path)
    return decode_read(path, data, jpeg_header(data, path))


def decode_read(path: Path, data: bytes, header: tuple[int, int, str] | None) -> np.ndarray:
    """:func:`decode` of the file's bytes already read and their :func:`jpeg_header`."""
    if header is not None and header[2] in _SAME_AS_PILLOW:
        return strict_decode(data, path)
    return np.asarray(to_rgb(open_checked(path, data, header), path))


def open_checked(path: Path, data: bytes, header: tuple[int, int, str] | None) -> "PILImage.Image":
    """The file opened by Pillow (not decoded yet: a draft scale may still be set) after a strict
    check of a JPEG's data (:func:`strict_decode` at 1/8 scale)."""
    if header is not None:
        strict_decode(data, path, check_only=True)
    return open_image(path, data)


def check_encoded(path: Path, strict: bool = True) -> np.ndarray:
    """The file's bytes for a decoder elsewhere (DALI), checked: a header that parses, a positive
    size, for a JPEG the end-of-image marker (a truncated file lacks it) and, with ``strict``, its
    data decoded by :func:`strict_decode` at 1/8 scale (the caller checks each file once and passes
    False for a file it has checked before). Returns the bytes as a uint8 array."""
    data = read_bytes(path)
    header = jpeg_header(data, path)
    if header is None:
        img = open_image(path, data)  # a PNG, or another format named there
        w, h = img.size
        if w < 1 or h < 1:
            raise DataError(f"{path}: image size {w}x{h}; expected a positive size")
    elif JPEG_EOI not in data[-64:]:
        raise DataError(f"{path}: the JPEG has no end-of-image marker; the file is truncated")
    elif strict:
        strict_decode(data, path, check_only=True)
    return np.frombuffer(data, dtype=np.uint8)
