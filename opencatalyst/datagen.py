"""Synthetic-but-real OC20 S2EF data: ASE metal slabs with adsorbates, EMT energies and forces.

Each sample: a random fcc metal (Al, Cu, Ag, Au, Ni, Pd, Pt) slab with a random facet (111, 100,
110), one adsorbate (H, C, N, O, OH, CO) at a random site, Gaussian-rattled free atoms, EMT
energy and raw forces, sub-surface atoms fixed, OC20 tags (0 sub-surface, 1 surface, 2 adsorbate)
and a periodic radius graph. Sample ``k`` of a split depends only on (seed, split, k).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.common.data.datagen import Datagen, FileJob, generate

from . import lmdbio

METALS = ("Al", "Cu", "Ag", "Au", "Ni", "Pd", "Pt")
FACETS = ("fcc111", "fcc100", "fcc110")
ADSORBATES = ("H", "C", "N", "O", "OH", "CO")
SPLITS = {"train": 0, "validation": 1}


@dataclass(frozen=True)
class GenSpec:
    size: tuple[int, int, int] = (2, 2, 3)  # slab repeats (x, y, layers)
    rattle: float = 0.05  # Angstrom, std of the displacement of free atoms
    cutoff: float = 6.0
    max_neighbors: int = 50
    vacuum: float = 6.0
    metals: tuple[str, ...] = METALS
    adsorbates: tuple[str, ...] = ADSORBATES
    relax_steps: int = 0  # BFGS steps (EMT) before rattling; 0 keeps the unrelaxed geometry


def make_sample(spec: GenSpec, seed: int, split: str, index: int) -> dict[str, Any]:
    from ase.build import add_adsorbate, fcc100, fcc110, fcc111, molecule
    from ase.calculators.emt import EMT
    from ase.constraints import FixAtoms

    from . import graph  # imports torch: here, in the writing process, not where the options are read

    rng = np.random.default_rng([seed, SPLITS[split], index])
    metal = spec.metals[rng.integers(len(spec.metals))]
    facet = FACETS[rng.integers(len(FACETS))]
    builder = {"fcc111": fcc111, "fcc100": fcc100, "fcc110": fcc110}[facet]
    slab = builder(metal, size=spec.size, vacuum=spec.vacuum, orthogonal=facet != "fcc111")
    ase_tags = slab.get_tags()  # layer number from the top, 1 = surface
    ads_name = spec.adsorbates[rng.integers(len(spec.adsorbates))]
    ads = molecule(ads_name) if len(ads_name) > 1 else ads_name
    cell = np.array(slab.get_cell().array, dtype=np.float64)
    xy = rng.random(2) @ cell[:2, :2]
    add_adsorbate(slab, ads, height=float(rng.uniform(1.2, 2.2)), position=(float(xy[0]), float(xy[1])))
    n_ads = len(slab) - len(ase_tags)
    tags = np.concatenate([np.where(ase_tags == 1, 1, 0), np.full(n_ads, 2)]).astype(np.int64)
    fixed = (tags == 0).astype(np.int8)
    slab.set_constraint(FixAtoms(mask=fixed.astype(bool)))
    slab.calc = EMT()
    if spec.relax_steps > 0:
        from ase.optimize import BFGS

        BFGS(slab, logfile=None).run(fmax=0.01, steps=spec.relax_steps)
    pos = slab.get_positions()
    pos[fixed == 0] += rng.normal(0.0, spec.rattle, size=(int((fixed == 0).sum()), 3))
    slab.set_positions(pos, apply_constraint=False)
    energy = float(slab.get_potential_energy())
    forces = slab.get_forces(apply_constraint=False)
    edge_index, offsets = graph.radius_graph_pbc(pos, cell, spec.cutoff, spec.max_neighbors, tuple(slab.pbc))
    return {
        "pos": pos.astype(np.float32), "atomic_numbers": slab.get_atomic_numbers().astype(np.int64),
        "cell": cell.astype(np.float32)[None], "natoms": len(slab), "edge_index": edge_index,
        "cell_offsets": offsets, "y": energy, "force": forces.astype(np.float32), "fixed": fixed,
        "tags": tags, "sid": SPLITS[split] * 10_000_000 + index, "fid": 0,
    }


def write_file(spec: GenSpec, seed: int, job: FileJob, tmp: Path) -> np.ndarray:
    """Make the job's samples and write them as one LMDB file at ``tmp``; returns their sizes."""
    return lmdbio.write_shard(tmp, (make_sample(spec, seed, job.split, k) for k in job.indices))


def verify_file(tmp: Path, job: FileJob) -> None:
    lmdbio.verify_shard(tmp, len(job.indices))


def file_jobs(split: str, count: int, per_shard: int) -> list[FileJob]:
    """``data.NNNN.lmdb`` files of ``per_shard`` consecutive samples (the last may hold fewer)."""
    return [FileJob(split, lmdbio.shard_name(s), tuple(range(a, min(a + per_shard, count))))
            for s, a in enumerate(range(0, count, per_shard))]


def generate_split(out: Path, split: str, count: int, spec: GenSpec, seed: int, workers: int,
                   per_shard: int, progress: bool = True) -> None:
    """Write ``out/split/data.NNNN.lmdb`` (each with its samples' sizes) through the shared driver."""
    generate(out, file_jobs(split, count, per_shard), partial(write_file, spec, seed), verify_file, workers,
             progress=progress, desc=f"oc20 {split}")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", type=int, default=512, help="training samples")
    parser.add_argument("--val", type=int, default=128, help="validation samples")
    parser.add_argument("--size", default="2,2,3", help="slab repeats x,y,layers (default 2,2,3: ~13 atoms)")
    parser.add_argument("--rattle", type=float, default=0.05, help="displacement std of free atoms, Angstrom")
    parser.add_argument("--cutoff", type=float, default=6.0, help="graph radius, Angstrom (OC20: 6)")
    parser.add_argument("--max-neighbors", type=int, default=50, help="neighbours per atom (OC20: 50)")
    parser.add_argument("--metals", default=",".join(METALS), help="comma-separated EMT metals to draw from")
    parser.add_argument("--adsorbates", default=",".join(ADSORBATES), help="comma-separated adsorbates")
    parser.add_argument("--relax-steps", type=int, default=0, help="EMT BFGS steps before rattling (0: none)")
    parser.add_argument("--per-shard", type=int, default=128, help="samples per data.NNNN.lmdb")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> None:
    from hpcbench.common.errors import ConfigError

    try:
        size = tuple(int(v) for v in str(args.size).split(","))
    except ValueError:
        size = ()
    if len(size) != 3 or min(size) < 1:
        raise ConfigError(f"--size: expected three positive integers like 2,2,3, got {args.size!r}")
    metals = tuple(m for m in str(args.metals).split(",") if m)
    ads = tuple(a for a in str(args.adsorbates).split(",") if a)
    if not metals or set(metals) - set(METALS):
        raise ConfigError(f"--metals: expected some of {','.join(METALS)}, got {args.metals!r}")
    if not ads or set(ads) - set(ADSORBATES):
        raise ConfigError(f"--adsorbates: expected some of {','.join(ADSORBATES)}, got {args.adsorbates!r}")
    spec = GenSpec(size=size, rattle=args.rattle, cutoff=args.cutoff, max_neighbors=args.max_neighbors,  # type: ignore[arg-type]
                   metals=metals, adsorbates=ads, relax_steps=max(0, args.relax_steps))
    out = Path(args.out)
    for split, count in (("train", args.train), ("validation", args.val)):
        generate_split(out, split, count, spec, args.seed, max(1, args.workers), max(1, args.per_shard),
                       progress=not args.no_progress)


class OC20Datagen(Datagen):
    """OC20 S2EF LMDB shards (``hpcbench datagen oc20``); the processes that build the graphs import torch."""

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        add_args(parser)

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--train", "320", "--val", "64", "--size", "2,2,3", "--metals", "Cu,Pt",
                "--adsorbates", "O,H,N,C", "--relax-steps", "150", "--rattle", "0.018", "--cutoff", "4",
                "--max-neighbors", "12"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        run(args)
