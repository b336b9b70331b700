"""The ImageNet (ILSVRC-2012) folder layout the reference reads, and the validating JPEG reader.

``<root>/train/<wnid>/*.JPEG`` and ``<root>/val/<wnid>/*.JPEG`` (the validation images sorted into
class folders, as the MLPerf reference and torchvision's ImageFolder expect). A class index is the
position of its wnid (``n01440764``...) in sorted order, so train and val must hold the same wnids.

Decoding follows the reference: Pillow opens the file and ``convert("RGB")`` turns grayscale and
CMYK JPEGs (ImageNet has both, and one PNG named ``.JPEG``) into 3-channel RGB. A file that does not
decode, or is cut short, is a :class:`DataError` naming it. Pillow is imported when first used.
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


def open_image(path: Path, data: bytes | None = None) -> "PILImage.Image":
    """The image opened (header parsed, not decoded); a file that is not an image is refused."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data) if data is not None else path)
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{path}: not a readable JPEG image ({exc})") from None
    if img.format not in FORMATS:
        raise DataError(f"{path}: a {img.format} image; expected JPEG")
    return img


def to_rgb(img: "PILImage.Image", path: Path) -> "PILImage.Image":
    """Decode now and convert as the reference does (grayscale, CMYK, palette -> RGB); a truncated or
    corrupt file fails here with its name."""
    try:
        img.load()
        return img if img.mode == "RGB" else img.convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"{path}: the JPEG data does not decode ({exc}); the file is corrupt or truncated") from None


def decode(path: Path) -> np.ndarray:
    """The whole image as uint8 RGB (H, W, 3)."""
    return np.asarray(to_rgb(open_image(path), path))


def check_encoded(path: Path) -> np.ndarray:
    """The file's bytes for a decoder elsewhere (DALI), checked without decoding: a JPEG or PNG
    header Pillow can parse, a positive size, and for a JPEG the end-of-image marker (a truncated
    file lacks it). Returns the bytes as a uint8 array."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    img = open_image(path, data)
    w, h = img.size
    if w < 1 or h < 1:
        raise DataError(f"{path}: image size {w}x{h}; expected a positive size")
    if img.format == "JPEG" and (not data.startswith(JPEG_SOI) or JPEG_EOI not in data[-64:]):
        raise DataError(f"{path}: the JPEG has no end-of-image marker; the file is truncated")
    if img.format == "JPEG":
        check_jpeg_markers(data, path)
    return np.frombuffer(data, dtype=np.uint8)


#: markers that may end an entropy-coded segment (ITU T.81 table B.1): SOFn, DHT, DAC, DQT, DNL, DRI,
#: DHP, EXP, APPn, COM, SOS, EOI. Inside the segment only stuffed 0xFF00, RSTn (0xD0-0xD7) and 0xFF fill
#: bytes may follow an 0xFF.
_SCAN_ENDS = frozenset([*range(0xC0, 0xD0), 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, *range(0xE0, 0xF0), 0xFE])


def check_jpeg_markers(data: bytes, path: Path) -> None:
    """The JPEG's marker structure, walked without decoding (ITU T.81 B.1): every segment's length fits
    the file, and every 0xFF inside the entropy-coded data is a stuffed byte, a restart marker or the
    marker that ends the scan. A decoder (libjpeg in DALI or Pillow) meeting any other byte there only
    warns ("Unsupported marker", "Corrupt JPEG data") and fills the rest of the image with grey; this
    refuses that file by name. Corruption that keeps the byte structure (a flipped bit in the Huffman
    data) is only seen by decoding."""
    n, pos = len(data), 2  # after SOI
    while pos < n:
        if data[pos] != 0xFF:
            raise DataError(f"{path}: corrupt JPEG: byte {pos} is 0x{data[pos]:02x} where a marker was expected")
        while pos < n and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos >= n:
            break
        marker = data[pos]
        pos += 1
        if marker == 0xD9:  # EOI
            return
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length
            continue
        if pos + 2 > n:
            break
        length = int.from_bytes(data[pos:pos + 2], "big")
        if length < 2 or pos + length > n:
            raise DataError(f"{path}: corrupt JPEG: marker 0xFF{marker:02X} at byte {pos - 2} has length "
                            f"{length}, beyond the file's {n} bytes")
        pos += length
        if marker != 0xDA:  # SOS: its entropy-coded data follows the header
            continue
        while True:
            pos = data.find(b"\xff", pos)
            if pos < 0 or pos + 1 >= n:
                raise DataError(f"{path}: the JPEG has no end-of-image marker; the file is truncated")
            nxt = data[pos + 1]
            if nxt == 0x00 or 0xD0 <= nxt <= 0xD7 or nxt == 0xFF:
                pos += 1 if nxt == 0xFF else 2
                continue
            if nxt not in _SCAN_ENDS:
                raise DataError(f"{path}: corrupt JPEG: the image data holds marker 0xFF{nxt:02X} at byte {pos}, "
                                "which no JPEG contains; the entropy-coded data is damaged")
            break
    raise DataError(f"{path}: the JPEG has no end-of-image marker; the file is truncated")
