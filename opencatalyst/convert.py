"""Convert original (pickled) OC20 LMDBs to the pickle-free encoding, plus size metadata.

Reading the source requires the user's explicit ``trust_pickle`` opt-in: unpickling runs code from
the file. Each output shard is written to a temporary file, verified and renamed.
"""
from __future__ import annotations

from pathlib import Path

from common.errors import ConfigError

from . import graph, lmdbio


def convert_split(src: Path, dst: Path, trust_pickle: bool, progress: bool = True) -> int:
    """Convert every ``data.*.lmdb`` in ``src`` to ``dst`` (same shard names); returns samples."""
    from tqdm import tqdm

    if not trust_pickle:
        raise ConfigError("reading original OC20 LMDBs unpickles Python objects, which runs code from the file; "
                          "pass --trust-pickle if you trust where these files came from")
    if src.resolve() == dst.resolve():
        raise ConfigError(f"--out must differ from the source folder {src}")
    natoms: list[int] = []
    edges: list[int] = []
    trips: list[int] = []
    paths = lmdbio.shard_paths(src)
    total = sum(len(lmdbio.Shard(p, trust_pickle=True)) for p in paths)
    with tqdm(total=total, desc=f"convert {src.name}", unit="sample", disable=not progress) as bar:
        for i, path in enumerate(paths):
            shard = lmdbio.Shard(path, trust_pickle=True)

            def samples(shard: lmdbio.Shard = shard):  # noqa: ANN202
                for k in range(len(shard)):
                    s = shard[k]
                    n = int(s["natoms"])
                    natoms.append(n)
                    edges.append(int(s["edge_index"].shape[1]))
                    trips.append(graph.count_triplets(s["edge_index"], s["cell_offsets"], n))
                    bar.update(1)
                    yield s

            name = path.name if path.name.startswith("data.") else lmdbio.shard_name(i)
            lmdbio.write_shard(dst / name, samples())
    lmdbio.write_metadata(dst, natoms, edges, trips)
    return len(natoms)


def convert(src: Path, dst: Path, trust_pickle: bool, progress: bool = True) -> dict[str, int]:
    """A dataset root with split folders (train/, validation/, ...) or a single split folder."""
    if not src.is_dir():
        raise ConfigError(f"{src}: source folder does not exist")
    if list(src.glob("data.*.lmdb")):
        return {src.name: convert_split(src, dst, trust_pickle, progress)}
    splits = sorted(p for p in src.iterdir() if p.is_dir() and list(p.glob("data.*.lmdb")))
    if not splits:
        raise ConfigError(f"{src}: no data.NNNN.lmdb files in it or in its sub-folders")
    return {p.name: convert_split(p, dst / p.name, trust_pickle, progress) for p in splits}
