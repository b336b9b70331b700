"""Checkpoints of a training run: the run's stateful parts (:mod:`hpcbench.common.parts`), written
atomically with a manifest, each rank its own shard, and resumed exactly.

Layout, per instance: ``<checkpoint_dir>/instance_<k>/epoch_<NNNN>/`` holding

* ``replicated.pt``: the parts every rank holds the same (the shared parameters, the data position),
  written by instance rank 0;
* ``rank_<r>.pt`` per rank: its own parts (optimizer state - only its shard for DistributedLAMB, its
  rows for sparse Adagrad -, model-parallel and sparse-gradient parameters, buffers, loss scaler, RNG);
* ``manifest.json``: format, epoch, ranks, the parts in each file, and every file's size and sha256,
  written last;

* ``sharded/`` for the parts whose state holds DTensors (a model that shards its own parameters with FSDP2 or
  tensor parallelism, and its optimizer; :mod:`hpcbench.common.sharded`): written collectively with
  ``torch.distributed.checkpoint`` (each rank its own shards in ``__<r>_0.distcp``, one ``.metadata``) and read
  back into the same layout;

plus ``latest`` naming the newest complete checkpoint; the newest ``KEEP`` are kept.

Every file is written to a temporary name, fsynced and renamed; the directory is assembled as
``epoch_<NNNN>.tmp``, checked against the manifest and renamed only when every rank's file is in place,
and ``latest`` moves last. A crash at any point leaves the previous checkpoint as the latest. Loading
checks the manifest (ranks, parts, sizes, checksums) before any part is touched, and names the file
and what was expected when something does not match.

The manager knows nothing of the trainer: it gets the parts by name and an MPI communicator of the
instance's ranks (or of the training ranks, with dedicated evaluation ranks).
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write, atomic_write_text
from .errors import ConfigError, DataError
from .parts import Stateful

FORMAT = 3  # 3: parts by name, one shard per rank, manifest with checksums
SHARDED = "sharded"  # the torch.distributed.checkpoint folder of the sharded parts
KEEP = 2  # complete checkpoints kept per instance (older ones are removed after a save)
MANIFEST = "manifest.json"
REPLICATED = "replicated.pt"


def recorded_settings(root: str | Path, instance: int) -> dict[str, Any]:
    """The settings the newest checkpoint of ``instance`` under ``root`` was trained with (its manifest's
    ``settings``), or {} when there is none or it records none (a damaged one is refused later, by name)."""
    folder = instance_dir(root, instance)
    try:
        latest = (folder / "latest").read_text().strip()
        settings = json.loads((folder / latest / MANIFEST).read_text()).get("settings", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def instance_dir(root: str | Path, instance: int) -> Path:
    return Path(root) / f"instance_{instance}"


def _rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def _serialize(obj: Any) -> tuple[bytes, dict[str, Any]]:  # noqa: ANN401
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return data, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write(path: Path, data: bytes) -> None:
    with atomic_write(path) as fh:
        fh.write(data)


class CheckpointManager:
    """Saves and restores named parts at epoch ends. Collective over ``comm`` (every rank calls it)."""

    def __init__(self, root: Path, comm: Any, replicated: Mapping[str, Stateful],  # noqa: ANN401
                 per_rank: Mapping[str, Stateful], sharded: Mapping[str, Stateful] | None = None,
                 settings: Mapping[str, Any] | None = None) -> None:
        self.root, self.comm = Path(root), comm
        self.rank, self.world = comm.Get_rank(), comm.Get_size()
        self.replicated, self.per_rank = dict(replicated), dict(per_rank)
        self.sharded = dict(sharded or {})
        # the run's settings resolved at start (``train.precision``/``train.channels_last`` = "auto"), kept in the
        # manifest so that a resumed run takes the same ones (:func:`recorded_settings`) and trains the same numbers
        self.settings = dict(settings or {})

    # saving -------------------------------------------------------------------------------------
    def save(self, epoch: int) -> Path:
        """Write the checkpoint after ``epoch``; returns its directory."""
        final = self.root / f"epoch_{epoch:04d}"
        tmp = self.root / f"epoch_{epoch:04d}.tmp"
        made = None
        if self.rank == 0:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            except OSError as exc:
                made = f"cannot create {tmp}: {exc}"
        made = self.comm.bcast(made, root=0)  # also the barrier before the ranks write into it
        if made:
            raise DataError(f"checkpoint after epoch {epoch} not written: {made}")
        files: dict[str, dict[str, Any]] = {}
        try:
            data, meta = _serialize({k: p.state_dict() for k, p in self.per_rank.items()})
            _write(tmp / _rank_file(self.rank), data)
            files[_rank_file(self.rank)] = meta
            if self.rank == 0:
                data, meta = _serialize({k: p.state_dict() for k, p in self.replicated.items()})
                _write(tmp / REPLICATED, data)
                files[REPLICATED] = meta
            err = None
        except OSError as exc:
            err = f"rank {self.rank}: cannot write its checkpoint file in {tmp}: {exc}"
        if self.sharded and not any(e for _, e in self.comm.allgather((None, err))):
            err = self._save_sharded(tmp, files)
        gathered = self.comm.allgather((files, err))
        errors = [e for _, e in gathered if e]
        if errors:
            raise DataError(f"checkpoint after epoch {epoch} not written: {errors[0]}; the previous one stays the latest")
        failed = None
        if self.rank == 0:
            try:
                self._publish(tmp, final, epoch, [f for f, _ in gathered])
            except (OSError, DataError) as exc:
                failed = f"checkpoint after epoch {epoch} not published: {exc}; the previous one stays the latest"
        failed = self.comm.bcast(failed, root=0)  # the other ranks never wait on a failed rank 0
        if failed:
            raise DataError(failed)
        self.comm.Barrier()
        return final

    def _save_sharded(self, tmp: Path, files: dict[str, dict[str, Any]]) -> str | None:
        """The sharded parts with torch.distributed.checkpoint (collective); this rank's files' sizes and checksums."""
        import torch.distributed.checkpoint as dcp

        try:
            dcp.save({k: p.state_dict() for k, p in self.sharded.items()}, checkpoint_id=str(tmp / SHARDED))
            self.comm.Barrier()  # every rank's shard file and the metadata are in place
            for f in _sharded_files_of(tmp / SHARDED, self.rank):
                files[f"{SHARDED}/{f.name}"] = _digest(f)
        except (OSError, RuntimeError) as exc:
            return f"rank {self.rank}: cannot write its sharded checkpoint in {tmp / SHARDED}: {exc}"
        return None

    def _publish(self, tmp: Path, final: Path, epoch: int, files: list[dict[str, Any]]) -> None:
        """Rank 0: check every rank's file, write the manifest, rename, move ``latest``, drop old ones."""
        listed: dict[str, Any] = {}
        for f in files:
            listed.update(f)
        manifest = {"format": FORMAT, "epoch": epoch, "ranks": self.world,
                    "replicated": sorted(self.replicated), "per_rank": sorted(self.per_rank), "files": listed}
        if self.sharded:
            manifest["sharded"] = sorted(self.sharded)
        if self.settings:
            manifest["settings"] = self.settings
        _verify_files(tmp, manifest)
        step = tmp / MANIFEST
        try:  # each step names its file: a full disk here says which write failed
            atomic_write_text(step, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            step = final
            tmp.rename(final)
            step = self.root / "latest"
            atomic_write_text(step, final.name + "\n")
        except OSError as exc:
            raise DataError(f"{step}: {exc.strerror or exc}") from None
        # the newest KEEP up to this one stay: never the one just published, never one of a later epoch (not
        # this run's: a fresh run into a used folder is refused, see :meth:`refuse_used`)
        older = sorted(p for p in self.root.glob("epoch_[0-9][0-9][0-9][0-9]") if int(p.name[6:]) < epoch)
        for old in older[:max(len(older) - (KEEP - 1), 0)]:
            shutil.rmtree(old, ignore_errors=True)

    def check_writable(self) -> None:
        """Before the first epoch: the folder can be made and written (not a file, not a read-only mount), so that
        a run that is to checkpoint learns it now rather than after its first epoch trained. Collective."""
        why = None
        if self.rank == 0:
            probe = self.root / ".write_probe.tmp"
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as exc:
                why = (f"train.checkpoint_dir: cannot write checkpoints to {self.root}: {exc.strerror or exc}"
                       f"{f' ({exc.filename})' if exc.filename else ''}")
        why = self.comm.bcast(why, root=0)
        if why:
            raise ConfigError(why)

    def refuse_used(self) -> None:
        """A run that does not resume must not write into a folder holding this instance's checkpoints: its
        epochs would mix with the older run's (``latest`` naming one, pruning the other). Collective."""
        found = None
        if self.rank == 0:
            held = sorted(p.name for p in self.root.glob("epoch_[0-9][0-9][0-9][0-9]"))
            if held or (self.root / "latest").exists():
                found = (f"train.checkpoint_dir: {self.root} already holds checkpoints ({', '.join(held[-3:]) or 'latest'}) "
                         "of an earlier run; set train.resume=true to continue it, or give another "
                         "train.checkpoint_dir (or remove that one) to start afresh")
        found = self.comm.bcast(found, root=0)
        if found:
            raise ConfigError(found)

    # loading ------------------------------------------------------------------------------------
    def latest(self) -> Path | None:
        marker = self.root / "latest"
        if not marker.exists():
            return None
        return self.root / marker.read_text().strip()

    def load_latest(self) -> int | None:
        """Restore the newest complete checkpoint; its epoch, or None when there is none. A checkpoint that
        does not fit this run (another model, other ranks, a damaged file) is an error on every rank."""
        path = self.latest()
        if path is None:
            return None
        state: tuple[dict[str, Any], dict[str, Any], int] | None = None
        try:
            manifest = self._manifest(path)
            replicated = _read(path, REPLICATED, manifest)
            mine = _read(path, _rank_file(self.rank), manifest)
            for f in _sharded_files_of(path / SHARDED, self.rank) if self.sharded else ():
                _check_file(path, f"{SHARDED}/{f.name}", manifest)
            state = (replicated, mine, int(manifest["epoch"]))
            err: BaseException | None = None
        except (ConfigError, DataError) as exc:
            err = exc
        errors = [e for e in self.comm.allgather(None if err is None else (type(err).__name__, str(err))) if e]
        if errors:
            kind, msg = errors[0]
            raise (ConfigError if kind == "ConfigError" else DataError)(msg)
        assert state is not None
        replicated, mine, epoch = state
        try:  # a part that does not fit (another model width, another workload) says so; this names the checkpoint
            for name, part in self.replicated.items():
                part.load_state_dict(replicated[name])
            for name, part in self.per_rank.items():
                part.load_state_dict(mine[name])
        except ConfigError as exc:
            raise ConfigError(f"checkpoint {path}: {exc}") from None
        if self.sharded:
            import torch.distributed.checkpoint as dcp

            state_sharded = {k: p.state_dict() for k, p in self.sharded.items()}
            dcp.load(state_sharded, checkpoint_id=str(path / SHARDED))  # in place, into this run's layout
            for name, part in self.sharded.items():
                part.load_state_dict(state_sharded[name])
        return epoch

    def _manifest(self, path: Path) -> dict[str, Any]:
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise DataError(f"checkpoint {path} has no {MANIFEST} (written by an older hpcbench, or not a "
                            "checkpoint); remove it or change train.checkpoint_dir") from None
        except (OSError, ValueError) as exc:
            raise DataError(f"checkpoint manifest {path / MANIFEST} cannot be read: {exc}") from None
        _check_manifest_shape(path / MANIFEST, manifest)
        if manifest.get("format") != FORMAT:
            raise ConfigError(f"checkpoint {path} has format {manifest.get('format')}, this version reads format "
                              f"{FORMAT}; remove it or change train.checkpoint_dir")
        if manifest.get("ranks") != self.world:
            raise ConfigError(f"checkpoint {path} holds per-rank state for {manifest.get('ranks')} ranks, this instance "
                              f"has {self.world}; resume with the same number of ranks")
        if manifest.get("sharded", []) != sorted(self.sharded):
            raise ConfigError(f"checkpoint {path} holds sharded parts {manifest.get('sharded', [])}, this run has "
                              f"{sorted(self.sharded)}; it was written for a different model or setup")
        for kind, have in (("replicated", self.replicated), ("per_rank", self.per_rank)):
            if manifest.get(kind) != sorted(have):
                raise ConfigError(f"checkpoint {path} holds {kind} parts {manifest.get(kind)}, this run has "
                                  f"{sorted(have)}; it was written for a different model or setup")
        return manifest


def _check_manifest_shape(path: Path, manifest: Any) -> None:  # noqa: ANN401
    """The manifest's JSON has the fields :meth:`CheckpointManager._publish` writes, each of its type; else a
    DataError naming the file and the field (not an AttributeError or KeyError from deep inside loading)."""
    if not isinstance(manifest, dict):
        raise DataError(f"checkpoint manifest {path} holds a JSON {type(manifest).__name__}, expected an object")
    for key, kind in (("format", int), ("epoch", int), ("ranks", int), ("replicated", list), ("per_rank", list),
                      ("files", dict)):
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise DataError(f"checkpoint manifest {path}: field '{key}' is {manifest.get(key)!r}, expected "
                            f"{'an integer' if kind is int else 'a JSON ' + ('array' if kind is list else 'object')}")
    for name, meta in manifest["files"].items():
        if not (isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise DataError(f"checkpoint manifest {path}: entry '{name}' of 'files' is {meta!r}, expected "
                            "{\"bytes\": <size>, \"sha256\": <hex digest>}")


def _digest(f: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return {"bytes": f.stat().st_size, "sha256": h.hexdigest()}


def _sharded_files_of(folder: Path, rank: int) -> list[Path]:
    """The torch.distributed.checkpoint files rank ``rank`` vouches for: its own ``__<rank>_*.distcp`` and, on rank 0,
    the ``.metadata``."""
    mine = sorted(folder.glob(f"__{rank}_*.distcp"))
    return mine + ([folder / ".metadata"] if rank == 0 else [])


def _check_file(path: Path, name: str, manifest: dict[str, Any]) -> None:
    """A file of a checkpoint against its manifest entry (size and sha256)."""
    meta = manifest["files"].get(name)
    if meta is None:
        raise DataError(f"checkpoint {path}: {MANIFEST} lists no {name}")
    if not (path / name).is_file():
        raise DataError(f"checkpoint file {path / name} is missing")
    got = _digest(path / name)
    if got != {"bytes": meta["bytes"], "sha256": meta["sha256"]}:
        raise DataError(f"checkpoint file {path / name} is damaged: {got['bytes']} bytes with another checksum, "
                        f"{MANIFEST} expects {meta['bytes']} bytes, sha256 {meta['sha256'][:12]}...")


def _read(path: Path, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """One file of a checkpoint, checked against its manifest entry before it is unpickled."""
    _check_file(path, name, manifest)
    data = (path / name).read_bytes()
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt files
        raise DataError(f"checkpoint file {path / name} cannot be read: {exc}") from None


def _verify_files(tmp: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is in place with its size (rank 0, before the rename)."""
    missing = [f for f, meta in manifest["files"].items()
               if not (tmp / f).is_file() or (tmp / f).stat().st_size != meta["bytes"]]
    expected = {REPLICATED, *(_rank_file(r) for r in range(manifest["ranks"]))}
    if manifest.get("sharded"):
        expected.add(f"{SHARDED}/.metadata")
    missing += sorted(expected - set(manifest["files"]))
    if missing:
        raise DataError(f"checkpoint {tmp} is incomplete: {', '.join(missing)} not written")
