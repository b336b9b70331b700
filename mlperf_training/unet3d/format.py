"""The KiTS19 preprocessed on-disk format the MLPerf unet3d reference reads, and its writer.

One folder holds every case as a pair of ``.npy`` files (``np.save``, no pickle):

* ``case_XXXXX_x.npy``: float32 (1, D, H, W), the CT volume clipped and normalised;
* ``case_XXXXX_y.npy``: uint8 (1, D, H, W), labels 0 background, 1 kidney, 2 tumour.

``XXXXX`` is the five-digit case id; the cases listed in :data:`~.facts.EVAL_CASES` are the
validation split, every other case trains. Volumes differ in size per case. The reader checks the
pair (both files present), the header (dtype, C order, 4-D with one channel), that the two shapes
agree, that each file holds exactly the bytes its header promises (a truncated copy is caught before
any read) and, when the labels are read, their values. Every error is a :class:`DataError` naming
the file. The writer writes each file to a temporary sibling, reads it back through the reader's
checks, then renames it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcbench.common.atomic import atomic_write
from hpcbench.common.data.values import all_finite, first_non_finite
from hpcbench.common.errors import DataError

from .facts import EVAL_CASES

CASE_RE = re.compile(r"case_(\d{5})_([xy])\.npy")
SPLITS = ("train", "validation")


def image_name(case: int) -> str:
    return f"case_{case:05d}_x.npy"


def label_name(case: int) -> str:
    return f"case_{case:05d}_y.npy"


@dataclass(frozen=True)
class CasePair:
    case: int
    image: Path
    label: Path


def list_cases(root: Path) -> list[CasePair]:
    """Every ``case_XXXXX_{x,y}.npy`` pair of ``root`` by case id; a half pair is an error naming the missing file."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder (write a dataset with `hpcbench datagen unet3d --out DIR`)")
    found: dict[int, set[str]] = {}
    for p in root.iterdir():
        m = CASE_RE.fullmatch(p.name)
        if m and p.is_file():
            found.setdefault(int(m.group(1)), set()).add(m.group(2))
    pairs = []
    for case in sorted(found):
        if found[case] != {"x", "y"}:
            have, miss = (image_name(case), label_name(case)) if "x" in found[case] else (label_name(case), image_name(case))
            raise DataError(f"{root / miss}: missing; {have} has no partner (each case is an image _x.npy and a label "
                            f"_y.npy)")
        pairs.append(CasePair(case, root / image_name(case), root / label_name(case)))
    if not pairs:
        raise DataError(f"{root}: no case_XXXXX_x.npy / case_XXXXX_y.npy pairs (the KiTS19 preprocessed layout)")
    return pairs


def split_cases(pairs: list[CasePair], split: str, where: Path) -> list[CasePair]:
    """The cases of ``split``: validation = those in the reference's evaluation list, train = the rest."""
    if split not in SPLITS:
        raise DataError(f"{where}: unknown split {split!r}; unet3d has {', '.join(SPLITS)}")
    listed = set(EVAL_CASES)
    chosen = [p for p in pairs if (p.case in listed) == (split == "validation")]
    if not chosen:
        raise DataError(f"{where}: no {split} cases (validation = the reference's 42 evaluation case ids "
                        f"{EVAL_CASES[0]:05d}, {EVAL_CASES[1]:05d}, ...; train = every other case)")
    return chosen


def read_header(path: Path, dtype: np.dtype) -> tuple[int, ...]:
    """Shape of a ``.npy`` file after checking its header and that its size is what the header promises."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, found = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, found = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = f.tell()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc})") from None
    if found != dtype or fortran or len(shape) != 4 or shape[0] != 1:
        raise DataError(f"{path}: expected {np.dtype(dtype).name} (1, D, H, W) in C order, found {found} {shape}"
                        f"{' Fortran order' if fortran else ''}")
    if min(shape) < 1:
        raise DataError(f"{path}: empty volume {shape}")
    want = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
    size = path.stat().st_size
    if size != want:
        raise DataError(f"{path}: {size} bytes but its header {shape} {np.dtype(dtype).name} needs {want} "
                        f"({'truncated' if size < want else 'trailing bytes'})")
    return tuple(int(s) for s in shape)


def open_pair(pair: CasePair) -> tuple[np.ndarray, np.ndarray]:
    """Memory-mapped image (float32) and label (uint8) after the header checks; the label values
    are checked by :func:`check_labels` on what is read."""
    xs = read_header(pair.image, np.dtype("<f4"))
    ys = read_header(pair.label, np.dtype("u1"))
    if xs != ys:
        raise DataError(f"{pair.label}: shape {ys} differs from its image {pair.image.name} {xs}")
    return (np.load(pair.image, mmap_mode="r", allow_pickle=False),
            np.load(pair.label, mmap_mode="r", allow_pickle=False))


def check_labels(label: np.ndarray, path: Path) -> None:
    top = int(label.max()) if label.size else 0
    if top > 2:
        raise DataError(f"{path}: label value {top} found; expected 0 background, 1 kidney, 2 tumour")


def check_image(image: np.ndarray, path: Path) -> None:
    if not all_finite(image):
        idx, v = first_non_finite(image)
        raise DataError(f"{path}: non-finite intensities (NaN or inf) in the image: {v} at voxel {list(idx)}; "
                        "every intensity must be finite")


def read_case(pair: CasePair) -> tuple[np.ndarray, np.ndarray]:
    """The whole case in memory, every check done: image float32 (1, D, H, W), label uint8 (1, D, H, W)."""
    x, y = open_pair(pair)
    x, y = np.array(x), np.array(y)
    check_image(x, pair.image)
    check_labels(y, pair.label)
    return x, y


def write_array(dest: Path, arr: np.ndarray) -> None:
    """One ``.npy`` file of the format (image float32 or label uint8), written to a temporary sibling,
    read back through the reader's checks, then renamed."""
    dtype = np.dtype("u1") if arr.dtype == np.uint8 else np.dtype("<f4")
    arr = np.ascontiguousarray(arr, dtype=dtype)

    def verify(tmp: Path) -> None:
        verify_array(tmp, arr.shape, dtype)

    with atomic_write(dest, "wb", verify=verify) as fh:
        np.lib.format.write_array(fh, arr, allow_pickle=False)


def verify_array(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Read a written file back: header, size and values as the reader checks them."""
    if read_header(path, dtype) != tuple(shape):
        raise DataError(f"{path}: wrote {tuple(shape)} but read back another shape")
    back = np.load(path, mmap_mode="r", allow_pickle=False)
    if dtype.kind == "u":
        check_labels(back, path)
    else:
        check_image(back, path)


def write_case(root: Path, case: int, image: np.ndarray, label: np.ndarray) -> None:
    """Both files of one case, the label first, so that a case whose image exists is complete."""
    if image.shape != label.shape or image.ndim != 4 or image.shape[0] != 1:
        raise ValueError(f"case {case}: image {image.shape} and label {label.shape} must both be (1, D, H, W)")
    write_array(Path(root) / label_name(case), label.astype(np.uint8, copy=False))
    write_array(Path(root) / image_name(case), image.astype(np.float32, copy=False))
