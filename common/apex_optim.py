"""NVIDIA apex's fused LAMB behind the flat-buffer optimizer interface (CUDA + apex only).

Opt-in with ``optim.apex = true``. Used when apex's CUDA extensions import on a CUDA device, for
non-sharded LAMB, fp32/bf16 (fp16 runs keep the project's LAMB, whose ``skip`` tensor implements the
loss scaler's step skipping). apex's ``FusedMixedPrecisionLamb`` keeps its learning rate and step
counter as device tensors, so the step stays sync-free and graph-capturable; the parameters are the
flat buffer's views, so one multi-tensor launch covers the model. Everywhere else the project's own
:class:`hpcbench.common.optim.LAMB` (the tested default) runs, and :func:`apex_lamb_available` says why.
"""
from __future__ import annotations

from typing import Any

import torch

from .flat import FlatParams
from .flat_optim import FlatOptimizer
from .runconfig import OptimConfig


def apex_lamb_available(device: torch.device) -> tuple[bool, str]:
    if device.type != "cuda":
        return False, "apex LAMB needs a CUDA device"
    try:
        from apex.optimizers import FusedMixedPrecisionLamb  # noqa: F401
        import amp_C  # noqa: F401
    except ImportError as exc:
        return False, f"apex with CUDA extensions is not importable ({exc})"
    return True, "apex FusedMixedPrecisionLamb"


class ApexLAMB(FlatOptimizer):
    """All-reduce of the flat gradient, then apex's fused LAMB kernel over the parameter views."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0) -> None:
        super().__init__(flat, cfg, world, rank)
        from apex.optimizers import FusedMixedPrecisionLamb

        self._apex = FusedMixedPrecisionLamb(
            list(flat), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
            bias_correction=cfg.bias_correction, grad_averaging=cfg.grad_averaging, adam_w_mode=True,
            # 0 disables clipping here, as in the project's LAMB; apex always clips, so use a bound never hit
            max_grad_norm=cfg.max_grad_norm if cfg.max_grad_norm > 0 else 1e30,
            use_nvlamb=True,  # trust ratio on every tensor, as in the project's LAMB
        )

    def step(self, lr: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        if skip is not None:
            raise RuntimeError("ApexLAMB does not implement skipped steps; fp16 runs use the project's LAMB")
        self.sync_grads()
        group = self._apex.param_groups[0]
        group["lr"].copy_(lr.reshape(group["lr"].shape))
        self._apex.step()
        self.step_count.add_(1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step_count.clone(), "apex": self._apex.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count.copy_(state["step"])
        self._apex.load_state_dict(state["apex"])

    def state_numel(self) -> int:
        return sum(t.numel() for s in self._apex.state.values() for t in s.values() if torch.is_tensor(t))
