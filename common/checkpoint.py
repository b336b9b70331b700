"""Checkpoints of a training run, written atomically and resumed exactly.

Layout, per instance: ``<checkpoint_dir>/instance_<k>/epoch_<NNNN>/`` holding ``model.pt`` (the
flat fp32 parameters, written by instance rank 0) and ``rank_<r>.pt`` per rank (its optimizer state
- only its shard for DistributedLAMB -, its module buffers such as BatchNorm statistics, its RNG
states and the loss-scaler state), plus ``latest`` naming the newest complete checkpoint; the newest ``KEEP`` are kept.

Every file is written to a temporary name, fsynced and renamed; the directory is assembled as
``epoch_<NNNN>.tmp`` and renamed only when every rank's file is in place, and ``latest`` moves last.
A crash at any point leaves the previous checkpoint as the latest. Checkpoints are taken at epoch
boundaries, so the data position is "start of the next epoch": the loaders' per-epoch shuffling
(``set_epoch``) then replays the same order, and a resumed run continues the same loss curve.
"""
from __future__ import annotations

import io
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .atomic import atomic_write, atomic_write_text
from .errors import ConfigError, DataError
from .step import tree_map

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

FORMAT = 2  # 2: parameters saved packed (without the flat buffer's alignment gaps)
KEEP = 2  # complete checkpoints kept per instance (older ones are removed after a save)


def instance_dir(root: str | Path, instance: int) -> Path:
    return Path(root) / f"instance_{instance}"


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def _save(path: Path, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_write(path) as fh:
        fh.write(buf.getvalue())


def _load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise DataError(f"checkpoint file {path} is missing") from None
    except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt files
        raise DataError(f"checkpoint file {path} cannot be read: {exc}") from None


def save(root: Path, epoch: int, tr: "Trainer") -> Path:
    """Write the checkpoint after ``epoch`` (collective over the instance)."""
    comm, rank = tr.env.instance_comm, tr.rank
    final = root / f"epoch_{epoch:04d}"
    tmp = root / f"epoch_{epoch:04d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.Barrier()
    if rank == 0:
        _save(tmp / "model.pt", {"format": FORMAT, "epoch": epoch, "world": tr.world, "numel": tr.flat.numel,
                                 "names": tr.flat.names, "params": tr.flat.pack(tr.flat.params).cpu()})
    _save(tmp / f"rank_{rank}.pt", {
        "optimizer": tree_map(lambda t: t.cpu(), tr.optimizer.state_dict()),
        "buffers": {k: v.cpu() for k, v in tr.model.named_buffers()},
        "precision": {k: v.cpu() for k, v in tr.precision.state_dict().items()},
        "rng": _rng_state(),
    })
    comm.Barrier()
    if rank == 0:
        missing = [f"rank_{r}.pt" for r in range(tr.world) if not (tmp / f"rank_{r}.pt").exists()]
        if missing:
            raise DataError(f"checkpoint {tmp} is incomplete: {', '.join(missing)} not written")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        atomic_write_text(root / "latest", final.name + "\n")
        for old in sorted(root.glob("epoch_[0-9][0-9][0-9][0-9]"))[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    comm.Barrier()
    return final


def load_latest(root: Path, tr: "Trainer") -> int | None:
    """Restore the newest complete checkpoint under ``root``; its epoch, or None if there is none."""
    marker = root / "latest"
    if not marker.exists():
        return None
    path = root / marker.read_text().strip()
    model = _load(path / "model.pt")
    if model.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {path} has format {model.get('format')}, this version reads format {FORMAT} "
                          "(parameters saved packed since 2); remove it or change train.checkpoint_dir")
    if model["numel"] != tr.flat.numel or model["names"] != tr.flat.names:
        raise ConfigError(f"checkpoint {path} was written for a different model; remove it or change "
                          "train.checkpoint_dir")
    if model["world"] != tr.world:
        raise ConfigError(f"checkpoint {path} holds per-rank state for {model['world']} ranks, this instance "
                          f"has {tr.world}; resume with the same number of ranks")
    tr.flat.unpack(model["params"].to(tr.flat.device), tr.flat.params)
    state = _load(path / f"rank_{tr.rank}.pt")
    tr.optimizer.load_state_dict(tree_map(lambda t: t.to(tr.device), state["optimizer"]))
    buffers = dict(tr.model.named_buffers())
    for k, v in state["buffers"].items():
        buffers[k].copy_(v)
    tr.precision.load_state_dict({k: v.to(tr.device) for k, v in state["precision"].items()})
    _set_rng_state(state["rng"])
    return int(model["epoch"])
