"""The stateful parts of a training run, each with ``state_dict``/``load_state_dict``.

The harness builds the parts once (model, flat parameters, optimizer with its sparse and sharded state,
precision/loss scaler, data position, RNG streams) and hands them to whoever needs them: the step, the
evaluator, the evaluation ranks and the :class:`~hpcbench.common.checkpoint.CheckpointManager`. Nothing
here reads the trainer.

Two kinds of part, for checkpoints:

* *replicated*: the same on every rank of the instance (the parameters every rank holds, the data
  position); instance rank 0 writes it once, every rank reads it;
* *per rank*: this rank's own (its optimizer state - only its shard for DistributedLAMB -, the rows of
  the model-parallel embedding tables it holds, parameters with sparse gradients, BatchNorm statistics,
  the loss scaler, its RNG streams).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from .errors import ConfigError
from .flat import FlatParams
from .step import tree_map


class Stateful(Protocol):
    """What the checkpoint manager saves and restores."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _different_model(what: str) -> ConfigError:
    return ConfigError(f"the checkpoint was written for a different model ({what}); remove it or change "
                       "train.checkpoint_dir")


def _check_names(saved: list[str], have: list[str], what: str) -> None:
    if saved != have:
        extra = sorted(set(saved) ^ set(have))[:3]
        raise _different_model(f"{what}: {len(saved)} tensors saved, {len(have)} here"
                               + (f"; differing: {', '.join(extra)}" if extra else "; same names, other order"))


def _shared_count(flat: FlatParams) -> int:
    """How many of the flat buffer's tensors every rank holds (they come first, model-parallel ones last)."""
    return sum(1 for o in flat.offsets if o < flat.shared_size) if flat.has_local else flat.num_tensors


class SharedWeights:
    """Replicated part: the parameters every rank of the instance holds, packed (no alignment gaps)."""

    def __init__(self, flat: FlatParams) -> None:
        self.flat = flat
        self.count = _shared_count(flat)

    def _views(self) -> list[torch.Tensor]:
        f = self.flat
        return [f.params[o : o + n] for o, n in zip(f.offsets[: self.count], f.numels[: self.count])]

    @torch.no_grad()
    def state_dict(self) -> dict[str, Any]:
        return {"names": self.flat.names[: self.count], "params": torch.cat(self._views()).cpu()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_names(state["names"], self.flat.names[: self.count], "shared parameters")
        views = self._views()
        packed = state["params"]
        if packed.numel() != sum(v.numel() for v in views):
            raise _different_model(f"{packed.numel()} shared parameter elements saved, {sum(v.numel() for v in views)} here")
        torch._foreach_copy_(views, list(packed.to(self.flat.device).split([v.numel() for v in views])))


class RankWeights:
    """Per-rank part: parameters only this rank holds (model-parallel tables in the flat buffer, parameters
    with sparse gradients outside it) and the module's buffers (BatchNorm statistics)."""

    def __init__(self, model: nn.Module, flat: FlatParams) -> None:
        self.model, self.flat = model, flat
        self.count = _shared_count(flat)
        names = {id(p): n for n, p in model.named_parameters()}
        self.outside = [(names[id(p)], p) for p in flat.outside]

    @torch.no_grad()
    def state_dict(self) -> dict[str, Any]:
        f, k = self.flat, self.count
        return {
            "local_names": f.names[k:],
            "local": {n: f.params[o : o + m].cpu().clone() for n, o, m in zip(f.names[k:], f.offsets[k:], f.numels[k:])},
            "outside": {n: p.detach().cpu().clone() for n, p in self.outside},
            "buffers": {n: b.detach().cpu().clone() for n, b in self.model.named_buffers()},
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        f, k = self.flat, self.count
        _check_names(state["local_names"], f.names[k:], "parameters this rank holds")
        for n, o, m in zip(f.names[k:], f.offsets[k:], f.numels[k:]):
            f.params[o : o + m].copy_(_same_shape(state["local"][n], (m,), n))
        _check_names(sorted(state["outside"]), sorted(n for n, _ in self.outside), "sparse-gradient parameters")
        for n, p in self.outside:
            p.copy_(_same_shape(state["outside"][n], tuple(p.shape), n))
        buffers = dict(self.model.named_buffers())
        _check_names(sorted(state["buffers"]), sorted(buffers), "buffers")
        for n, b in buffers.items():
            b.copy_(_same_shape(state["buffers"][n], tuple(b.shape), n))


def _same_shape(t: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    if t.numel() != torch.Size(shape).numel():
        raise _different_model(f"{name} has shape {tuple(t.shape)} in the checkpoint, {shape} here")
    return t.reshape(shape)


class RNGStreams:
    """Per-rank part: the random streams of this process (torch, CUDA, Python, NumPy)."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        import numpy as np

        state["numpy"] = np.random.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
        if "numpy" in state:
            import numpy as np

            np.random.set_state(state["numpy"])


@dataclass
class DataPosition:
    """Replicated part: where the run is. Checkpoints are taken at epoch ends, so the next epoch starts
    from its beginning (the loaders' per-epoch order comes from (seed, epoch) and replays exactly)."""

    epoch: int = 0  # epochs completed
    global_step: int = 0  # steps completed
    samples: int = 0  # the rules' samples trained on, where the workload counts them per step (else 0)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "global_step": self.global_step, "samples": self.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.global_step = int(state["epoch"]), int(state["global_step"])
        self.samples = int(state.get("samples", 0))  # checkpoints written before samples were counted


class DataState:
    """Per-rank part: the state of this rank's data objects that keep any (a training split whose random
    crops depend on how often each sample was read, a loader with a position of its own); objects
    without ``state_dict`` hold none (their order comes from (seed, epoch))."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = {k: o for k, o in objects.items() if hasattr(o, "state_dict") and hasattr(o, "load_state_dict")}

    def state_dict(self) -> dict[str, Any]:
        return {k: o.state_dict() for k, o in self.objects.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if sorted(state) != sorted(self.objects):
            raise ConfigError(f"the checkpoint holds data state of {sorted(state)}, this run has {sorted(self.objects)}; "
                              "it was written with other data settings")
        for k, o in self.objects.items():
            o.load_state_dict(state[k])


class ToDevice:
    """A per-rank part whose tensors live on ``device`` (the optimizer, the loss scaler): saved on the host."""

    def __init__(self, part: Stateful, device: torch.device) -> None:
        self.part, self.device = part, device

    def state_dict(self) -> dict[str, Any]:
        return tree_map(lambda t: t.detach().cpu(), self.part.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.part.load_state_dict(tree_map(lambda t: t.to(self.device), state))
