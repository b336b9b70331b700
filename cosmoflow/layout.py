"""The CosmoFlow file layout (what ``hpcbench pack``/``stage`` need): sample files, splits, published sizes."""
from __future__ import annotations

from hpcbench.common.data.layout import FileLayout, KnownSplit

# 128^3 x 4 int16 = 16 MiB raw per sample; the source document reports ~85% fewer bytes after
# merge + compression on the real data.
_SAMPLE_BYTES = 128 ** 3 * 4 * 2 + 64

LAYOUT = FileLayout(
    "cosmoflow", ("*.tfrecord", "*.tfrecord.gz", "*.tfrecords", "*.tfrecords.gz"), ("train", "validation"),
    known={"train": KnownSplit(524_288, _SAMPLE_BYTES, 0.15),
           "validation": KnownSplit(65_536, _SAMPLE_BYTES, 0.15)},
    describe="TFRecord files",
)
