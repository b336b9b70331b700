"""The OC20 S2EF file layout (what ``hpcbench pack``/``stage`` need): LMDB files and published sizes."""
from __future__ import annotations

from hpcbench.common.data.layout import FileLayout, KnownSplit

MiB = 1 << 20

LAYOUT = FileLayout(
    "oc20", ("data.*.lmdb",), None, replicate=(),
    known={"train": KnownSplit(80, 1_200 * MiB, 0.5), "val_id": KnownSplit(1, 1_000 * MiB, 0.5)},
    describe="data.NNNN.lmdb files",
)
