"""NVIDIA apex's fused LAMB behind the flat-buffer optimizer interface (CUDA + apex only).

Opt-in with ``optim.apex = true``. Used when apex's CUDA extensions import on a CUDA device, for
non-sharded LAMB, fp32/bf16 (fp16 runs keep the project's LAMB, whose ``skip`` tensor implements the
loss scaler's step skipping). apex's ``FusedMixedPrecisionLamb`` keeps its learning rate and step
counter as device tensors, so the step stays sync-free and graph-capturable; the parameters are the
flat buffer's views, so one multi-tensor launch per parameter group covers the model. The trust ratio
follows the project's LAMB: apex's default ``use_nvlamb=False`` skips it for a group whose weight decay is
0, so the ``decay_exempt`` tensors (BERT's biases and LayerNorm weights) form a second group with weight
decay 0 (ratio 1, as the reference's LAMB); at ``weight_decay = 0`` with no exempt tensors
``use_nvlamb=True`` keeps the ratio on every tensor, as the project's LAMB does. Everywhere else the project's own
:class:`hpcbench.common.optim.LAMB` (the tested default) runs, and :func:`apex_lamb_available` says why.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .errors import ConfigError
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
    """All-reduce of the flat gradient, then apex's fused LAMB kernel over the parameter views
    (``decay_exempt`` tensors in a group with weight decay 0, hence trust ratio 1)."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0,
                 decay_exempt: Sequence[bool] = ()) -> None:
        super().__init__(flat, cfg, world, rank)
        from apex.optimizers import FusedMixedPrecisionLamb

        params = list(flat)
        exempt = list(decay_exempt) or [False] * len(params)
        if len(exempt) != len(params):
            raise ConfigError(f"{len(exempt)} weight-decay flags for {len(params)} parameter tensors")
        if any(exempt) and not cfg.weight_decay:
            # apex ties the ratio to a non-zero decay (or applies it everywhere): it cannot adapt only some tensors
            raise ConfigError("config key 'optim.weight_decay': apex's LAMB cannot exempt tensors from the trust "
                              "ratio at weight decay 0; use the built-in LAMB (optim.apex = false)")
        groups = [{"params": [p for p, e in zip(params, exempt) if not e]},
                  {"params": [p for p, e in zip(params, exempt) if e], "weight_decay": 0.0}]
        self._apex = FusedMixedPrecisionLamb(
            [g for g in groups if g["params"]], lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
            weight_decay=cfg.weight_decay, bias_correction=cfg.bias_correction, grad_averaging=cfg.grad_averaging,
            adam_w_mode=True,
            # 0 disables clipping here, as in the project's LAMB; apex always clips, so use a bound never hit
            max_grad_norm=cfg.max_grad_norm if cfg.max_grad_norm > 0 else 1e30,
            # False (apex's default): no ratio where a group's decay is 0 (the exempt group); at decay 0
            # overall there is no exempt group and the project's LAMB adapts every tensor: True
            use_nvlamb=not cfg.weight_decay,
        )

    def step(self, lr: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        if skip is not None:
            raise RuntimeError("ApexLAMB does not implement skipped steps; fp16 runs use the project's LAMB")
        self.sync_grads()
        for group in self._apex.param_groups:  # each group holds its own lr tensor
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
