"""The pinned start: read the reference's initial checkpoint onto our model.

The MLPerf HPC openfold reference starts closed runs from ``mlperf_hpc_openfold_resumable_checkpoint.pt``
(sha256 b518be46...ffbed, pinned by closed_openfold.yaml as ``init_checkpoint_sha256sum``): a
``torch.save`` of ``{"iteration", "alphafold_state_dict", "optimizer_state_dict"}``, or a bare
``alphafold_state_dict`` (its ``train.py`` accepts both). The state-dict names are those of the
reference's ``AlphaFold`` module tree (``evoformer_stack.blocks.0.msa_att_row.mha.linear_q.weight``, ...);
our modules carry the same names, so the mapping is one to one, and every name and shape is checked
before anything is copied. The file is read with ``torch.load(weights_only=True)``: tensors, numbers,
strings and containers only, never arbitrary pickled objects.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn

#: sha256 of the reference's initial checkpoint (closed_openfold.yaml: init_checkpoint_sha256sum)
CLOSED_INIT_CHECKPOINT_SHA256 = "b518be4677048f2c0f94889c91e2da73655a73b825a8aa7f8b6f5e580d8ffbed"
_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint that cannot start this model: the message names the file and the keys at fault."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class InitialCheckpoint:
    path: Path
    sha256: str
    iteration: Optional[int]
    #: the reference's Adam state (``optimizer.state_dict()`` layout) when the file is resumable
    optimizer_state_dict: Optional[dict[str, Any]]


def _split(obj: Any, path: Path) -> tuple[Mapping[str, torch.Tensor], Optional[dict[str, Any]], Optional[int]]:
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, expected a state dict or the reference's "
                              "resumable checkpoint {iteration, alphafold_state_dict, optimizer_state_dict}")
    if "alphafold_state_dict" in obj:
        sd = obj["alphafold_state_dict"]
        opt = obj.get("optimizer_state_dict")
        it = obj.get("iteration")
        if not isinstance(sd, Mapping):
            raise CheckpointError(f"{path}: 'alphafold_state_dict' is a {type(sd).__name__}, expected a mapping "
                                  "of parameter names to tensors")
        return sd, (dict(opt) if isinstance(opt, Mapping) else None), (int(it) if it is not None else None)
    return obj, None, None


def map_reference_state_dict(ref: Mapping[str, Any], model: nn.Module, source: str) -> dict[str, torch.Tensor]:
    """Check ``ref`` (the reference's names) against ``model`` and return our state dict from it.

    Raises :class:`CheckpointError` naming the missing, unexpected, mis-shaped or non-finite entries."""
    ours = model.state_dict()
    ref = {k[len("module."):] if k.startswith("module.") else k: v for k, v in ref.items()}  # a DDP save
    missing = [k for k in ours if k not in ref]
    unexpected = [k for k in ref if k not in ours]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:5])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:5])})")
        raise CheckpointError(f"{source}: state dict does not match the AlphaFold module tree: "
                              + "; ".join(parts))
    out: dict[str, torch.Tensor] = {}
    for k, target in ours.items():
        v = ref[k]
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{source}: {k!r} is a {type(v).__name__}, expected a tensor")
        if tuple(v.shape) != tuple(target.shape):
            raise CheckpointError(f"{source}: {k!r} has shape {tuple(v.shape)}, expected {tuple(target.shape)}")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{source}: {k!r} holds non-finite values")
        out[k] = v.to(dtype=target.dtype)
    return out


def load_initial_checkpoint(path: Path, model: nn.Module, expected_sha256: Optional[str] = None
                            ) -> InitialCheckpoint:
    """Hash ``path``, refuse it if ``expected_sha256`` is given and differs (a closed run passes
    :data:`CLOSED_INIT_CHECKPOINT_SHA256`), then load its AlphaFold weights into ``model``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the initial checkpoint ({e.strerror or e})") from e
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise CheckpointError(f"{path}: sha256 {digest}, expected {expected_sha256} (the closed rules pin the "
                              "reference's initial checkpoint)")
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a corrupt or non-torch file
        raise CheckpointError(f"{path}: not a readable torch checkpoint of tensors ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from e
    sd, opt, it = _split(obj, path)
    mapped = map_reference_state_dict(sd, model, str(path))
    with torch.no_grad():
        model.load_state_dict(mapped, strict=True)
    return InitialCheckpoint(path=path, sha256=digest, iteration=it, optimizer_state_dict=opt)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], source: str) -> None:
    """Load the reference's Adam state into ``optimizer`` (built over ``model.parameters()`` in one group,
    whose order equals the reference's), checking the parameter count and every moment's shape."""
    groups = state.get("param_groups")
    per_param = state.get("state")
    if not isinstance(groups, list) or not isinstance(per_param, Mapping):
        raise CheckpointError(f"{source}: optimizer_state_dict lacks 'param_groups'/'state'")
    ours = [p for g in optimizer.param_groups for p in g["params"]]
    theirs = [i for g in groups for i in g.get("params", [])]
    if len(ours) != len(theirs):
        raise CheckpointError(f"{source}: optimizer state covers {len(theirs)} parameters, the model has {len(ours)}")
    for p, i in zip(ours, theirs):
        st = per_param.get(i, per_param.get(str(i)))
        if st is None:
            continue
        for name in ("exp_avg", "exp_avg_sq"):
            t = st.get(name)
            if isinstance(t, torch.Tensor) and tuple(t.shape) != tuple(p.shape):
                raise CheckpointError(f"{source}: optimizer state {i}.{name} has shape {tuple(t.shape)}, "
                                      f"expected {tuple(p.shape)}")
    optimizer.load_state_dict(dict(state))
