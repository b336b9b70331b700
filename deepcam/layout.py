"""The DeepCAM file layout (what ``hpcbench pack``/``stage`` need): sample files, splits, replicated stats.h5, published sizes."""
from __future__ import annotations

from hpcbench.common.data.layout import FileLayout, KnownSplit

# 768 x 1152 x 16 float32 + int labels, about 56 MiB per HDF5 file.
_SAMPLE_BYTES = 768 * 1152 * 16 * 4 + 768 * 1152 * 4

LAYOUT = FileLayout(
    "deepcam", ("data-*.h5",), ("train", "validation"), replicate=("stats.h5",),
    known={"train": KnownSplit(121_266, _SAMPLE_BYTES, 0.6),
           "validation": KnownSplit(15_158, _SAMPLE_BYTES, 0.6)},
    describe="data-*.h5 files",
)
