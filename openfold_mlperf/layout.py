"""The OpenFold file layout (what ``hpcbench pack``/``stage`` need): the reference's processed dataset, which
every node needs whole (training samples are drawn from every chain by weight; chains, not files, are samples)."""
from __future__ import annotations

from hpcbench.common.data.layout import FileLayout

LAYOUT = FileLayout(
    "openfold", (), None,
    # the initial checkpoint travels with the data (model.init_checkpoint is relative to data.root): the
    # reference's as its README places it, or another one beside it
    replicate=("*_checkpoint.pt", "pdb_mmcif/processed/chains.csv", "pdb_mmcif/processed/obsolete.dat",
               "pdb_mmcif/processed/cameo_targets.txt", "pdb_mmcif/processed/dicts/*",
               "open_protein_set/processed/pdb_alignments/*"),
    describe="OpenFold processed files (chains.csv, dicts/, pdb_alignments/)",
)
