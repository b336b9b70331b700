"""The OC20 S2EF dataset spec: file layout (for pack/stage), validated reader, collate, costs."""
from __future__ import annotations

from common.data.layout import FileLayout, KnownSplit

MiB = 1 << 20

LAYOUT = FileLayout(
    "oc20", ("*.lmdb",), None, replicate=(),
    known={"train": KnownSplit(80, 1_200 * MiB, 0.5), "val_id": KnownSplit(1, 1_000 * MiB, 0.5)},
)
