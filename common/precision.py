"""Mixed precision for the harness: autocast contexts and a sync-free dynamic loss scaler.

* ``fp32``: no autocast.
* ``bf16``: ``torch.autocast`` to bfloat16 on CPU and GPU; no loss scaling needed.
* ``fp16`` (GPU only): autocast to float16 and a dynamic loss scale kept on the device. The
  unscale/inf-check and the scale update are device ops (no ``.item()``), and a step with inf/nan
  gradients is skipped by the optimizer through its ``skip`` tensor, so the step stays graph-capturable.

Master weights stay fp32 in every mode: the model and its flat buffer are never cast.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from .errors import ConfigError


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast`` casts to on ``device_type`` ("cpu", "cuda") where it is on here, else None."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


class Precision:
    def __init__(self, mode: str, device: torch.device, world: int = 1, init_scale: float = 2.0**16,
                 growth_interval: int = 2000) -> None:
        if mode not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"config key 'train.precision': expected fp32, bf16 or fp16, got {mode!r}")
        if mode == "fp16" and device.type != "cuda":
            raise ConfigError("config key 'train.precision': fp16 needs a CUDA device; use bf16 on CPU")
        self.mode, self.device, self.world = mode, device, world
        self.growth_interval = growth_interval
        self.scale = torch.full((), init_scale, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)

    @property
    def scaled(self) -> bool:
        return self.mode == "fp16"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.mode == "fp32":
            yield
            return
        dtype = torch.bfloat16 if self.mode == "bf16" else torch.float16
        with torch.autocast(device_type=self.device.type, dtype=dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (loss.float() * self.scale if self.scaled else loss).backward()

    def unscale_(self, grads: torch.Tensor) -> torch.Tensor | None:
        """Divide the flat gradient by the scale; a 0-d ``skip`` tensor (1 = inf/nan on any rank)."""
        if not self.scaled:
            return None
        found_inf = torch.zeros((), device=self.device)
        torch._amp_foreach_non_finite_check_and_unscale_([grads], found_inf, self.scale.reciprocal())
        if self.world > 1:
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        return found_inf

    def update(self, found_inf: torch.Tensor | None) -> None:
        if found_inf is not None:
            torch._amp_update_scale_(self.scale, self.growth_tracker, found_inf, 2.0, 0.5, self.growth_interval)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"scale": self.scale.clone(), "growth_tracker": self.growth_tracker.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.scale.copy_(state["scale"])
        self.growth_tracker.copy_(state["growth_tracker"])


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """4-D/5-D floating tensors in channels-last layout; anything else unchanged."""
    if x.is_floating_point() and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if x.is_floating_point() and x.dim() == 5:
        return x.contiguous(memory_format=torch.channels_last_3d)
    return x


def module_to_channels_last(model: "torch.nn.Module") -> "torch.nn.Module":
    """2-D conv weights channels-last, 3-D conv weights channels-last-3d (``Module.to`` accepts only
    one of the two and fails on the other rank)."""
    for p in model.parameters():
        p.data = to_channels_last(p.data)
    return model
