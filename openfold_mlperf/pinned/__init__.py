"""The mini preset's pinned initial checkpoint, shipped with the package (docs/openfold.md).

A closed OpenFold run starts from the reference's pinned checkpoint, made once by a long pretraining that is not
part of the benchmark. The ``mini`` preset does the same with a checkpoint of its own small model:
``mini_pretrained_checkpoint.pt`` here was written by

    hpcbench datagen openfold --out DIR --seed 0 <MINI.datagen_args> --pretrain-steps 5000 --pretrain-until 0.77

(:mod:`openfold_mlperf.pretrain`: 1,400 steps of 2 samples, 243 s on a 2-core AMD EPYC; its weights' average
scores 0.783 avg lDDT-Ca on that dataset's 4 validation targets) and is kept with the fingerprint of the dataset
it was trained on. ``hpcbench datagen openfold --pinned-checkpoint`` writes it beside that dataset; for any other
dataset (another seed or size) the checkpoint does not fit as it is, and datagen (given ``--pretrain-steps``)
fine-tunes it on that dataset until the start gate.

The fingerprint covers what the synthetic generator draws from its seed and writes as text: ``chains.csv``
(sequences, release dates, resolutions) and every chain's A3M and HHR files. The coordinates themselves are left
out (trigonometry on floats, whose last bits may differ between maths libraries), though the MSAs depend on them
through the contacts (CB-CB < 8 A) they co-vary; the tests score the checkpoint on freshly generated data. Where
NumPy's generator or those contacts differ, the fingerprint differs and datagen fine-tunes the pinned checkpoint
for those data instead (minutes, not seconds), saying so.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from hpcbench.common.atomic import atomic_write
from hpcbench.common.errors import DataError

from ..pretrain import MINI_CHECKPOINT

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class PinnedCheckpoint:
    file: Path  # the shipped checkpoint (the reference's resumable layout)
    sha256: str  # of ``file``
    seed: int  # datagen --seed of the dataset it was trained on
    datagen_args: tuple[str, ...]  # and its other datagen arguments
    dataset_sha256: str  # that dataset's fingerprint (:func:`dataset_fingerprint`)
    steps: int  # pretraining steps of 2 samples
    score: float  # its avg lDDT-Ca on that dataset's validation targets, at the start gate's check

    def mismatch(self, root: Path) -> str | None:
        """Why the dataset under ``root`` is not the one this checkpoint was trained on, or None if it is."""
        got = dataset_fingerprint(root)
        if got == self.dataset_sha256:
            return None
        return (f"the dataset under {root} (fingerprint {got[:12]}...) is not the one the pinned checkpoint "
                f"{self.file.name} was trained on (`hpcbench datagen openfold --seed {self.seed} "
                f"{' '.join(self.datagen_args)}` into an empty folder, fingerprint {self.dataset_sha256[:12]}...)")

    def _read(self, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as e:
            raise DataError(f"{path}: cannot read the pinned checkpoint ({e.strerror})") from None

    def verify(self, path: Path | None = None) -> None:
        """Raise unless ``path`` (default: the shipped file) has the pinned sha256."""
        got = hashlib.sha256(self._read(self.file if path is None else path)).hexdigest()
        if got != self.sha256:
            raise DataError(f"{self.file}: sha256 {got}, expected the pinned {self.sha256} (a damaged install: "
                            "reinstall hpcbench, or pretrain a checkpoint from random weights with datagen "
                            "--pretrain-steps and without --pinned-checkpoint)")

    def install(self, dest: Path) -> None:
        """Copy the checkpoint to ``dest``: written to a temporary file, its sha256 checked, then renamed."""
        data = self._read(self.file)
        with atomic_write(dest, "wb", verify=self.verify) as fh:
            fh.write(data)


def dataset_fingerprint(root: Path) -> str:
    """sha256 over the synthetic dataset's seed-drawn text under ``root``: the processed ``chains.csv`` and the
    raw A3M/HHR files of every chain (path and bytes, in path order)."""
    files = [root / "pdb_mmcif/processed/chains.csv",
             *sorted((root / "open_protein_set/original/pdb").glob("*/*/*"))]
    h = hashlib.sha256()
    for f in files:
        if not f.is_file():
            raise DataError(f"{f}: missing; the synthetic dataset's fingerprint needs chains.csv and the raw "
                            "alignments (hpcbench datagen openfold writes both)")
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


#: the mini's pinned checkpoint: the embedded dataset of ``hpcbench run --workload openfold`` (seed 0)
MINI = PinnedCheckpoint(
    file=HERE / MINI_CHECKPOINT,
    sha256="78ce666b6b64b53c37469e335131f53a85faa05dde449bc2b9a1b058d4c52be0",
    seed=0,
    datagen_args=("--families", "4", "--members", "6", "--min-length", "24", "--max-length", "40",
                  "--msa-rows", "24"),
    dataset_sha256="21c3ac971070874fa0af2b38f14f190ccee34972bbccd9b2b7d8380cac1b14ae",
    steps=1400,
    score=0.783,
)
