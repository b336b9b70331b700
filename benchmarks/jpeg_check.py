"""What the strict JPEG check costs the ResNet readers, per image, against a plain Pillow decode.

Since 2026-11-28 a JPEG whose data libjpeg calls corrupt (a warning Pillow and DALI pass on) is an
error. The readers (``resnet/imagenet.py``) do it two ways, each timed here on the same files, in the
same process, interleaved for ``--rounds`` rounds (the best round of each counts), page cache warm:

* Pillow loader: YCbCr and grayscale JPEGs are decoded by libjpeg-turbo in strict mode (simplejpeg)
  instead of by Pillow: ``decode``. Baseline: ``Image.open(path).convert("RGB")``, the reference's
  decode, on the same bytes. Ratio < 1 means the strict decode is cheaper than the plain one.
* DALI loader: the bytes are handed over undecoded; the first read of a file in a process decodes its
  data at 1/8 scale to check it (``check_encoded(strict=True)``), later reads check the header and the
  end-of-image marker only (``strict=False``). Both are printed as a share of the Pillow decode (what
  the image costs a CPU decoder; DALI's own decode on a GPU is not measured here).

  python -m benchmarks.jpeg_check --work /tmp/jc            # writes 64 JPEGs of 300-600 px there when missing
  python -m benchmarks.jpeg_check --data DIR                # an ImageNet-layout folder (its train split)
"""
from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np

from benchmarks.budget import best_seconds
from benchmarks.machine import describe, header
from hpcbench.workloads.mlperf_training.resnet.imagenet import check_encoded, decode, list_split


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: written under --work)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/jpeg_check"))
    ap.add_argument("--size", type=int, default=400, help="generated images: 0.75x-1.5x this per side")
    ap.add_argument("--images", type=int, default=64, help="at most this many files are timed")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from PIL import Image

    from hpcbench.workloads.mlperf_training.resnet.synth import write_dataset

    root = args.data
    if root is None:
        root = args.work / f"imagenet-{args.size}"
        if not (root / "train").is_dir():
            write_dataset(root, classes=4, train_per_class=max(1, args.images // 4), val_per_class=1,
                          size=args.size, seed=1, progress=False)
    files = list_split(root, "train").files[:args.images]
    blobs = [p.read_bytes() for p in files]  # warm the page cache
    nbytes = sum(map(len, blobs))
    print(header(describe()))
    print(f"data {root}: {len(files)} files, {nbytes / len(files) / 1024:.1f} KiB each on average")

    def pillow() -> None:
        for p in files:
            np.asarray(Image.open(io.BytesIO(p.read_bytes())).convert("RGB"))

    def strict() -> None:
        for p in files:
            decode(p)

    def first_read() -> None:
        for p in files:
            check_encoded(p, strict=True)

    def later_read() -> None:
        for p in files:
            check_encoded(p, strict=False)

    rows = {"pillow decode (baseline)": pillow, "strict decode (Pillow loader)": strict,
            "DALI bytes, first read (1/8 check)": first_read, "DALI bytes, later reads": later_read}
    best = {name: float("inf") for name in rows}
    for _ in range(args.rounds):  # interleaved: a burst of load hits every row alike
        for name, fn in rows.items():
            best[name] = min(best[name], best_seconds(fn, 1))
    base = best["pillow decode (baseline)"]
    for name, t in best.items():
        print(f"{name:38s} {t / len(files) * 1e3:7.3f} ms/image  {t / base:5.2f}x the Pillow decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
