"""Parameters and gradients as views into one contiguous flat buffer per dtype-less model (fp32).

:class:`FlatParams` moves every trainable parameter of a module into one 1-D ``params`` buffer and
points each ``p.grad`` at the matching slice of one 1-D ``grads`` buffer, so that

* gradient synchronisation is a single collective on ``grads`` (all-reduce, or reduce-scatter for
  the sharded optimizer), with no bucketing and no unflatten step;
* optimizers update the whole model with a handful of vectorised ops on ``params``;
* per-tensor quantities (LAMB trust ratios) come from segment reductions over ``lengths``.

The buffers are padded with zeros to a multiple of ``pad_to`` (the number of optimizer shards), so
each rank of an instance owns an equal contiguous slice. Autograd accumulates into the existing
``p.grad`` views in place; :meth:`FlatParams.check_grads` repairs any view autograd replaced.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .errors import ConfigError


def _collective(name: str):  # noqa: ANN202 - the torch.distributed function, newest name first
    import torch.distributed as dist

    new = {"reduce_scatter": "reduce_scatter_single", "all_gather": "all_gather_single"}[name]
    old = {"reduce_scatter": "reduce_scatter_tensor", "all_gather": "all_gather_into_tensor"}[name]
    return getattr(dist, new, None) or getattr(dist, old)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor) -> None:
    """Sum ``input`` over the default group; this rank receives its slice in ``output``."""
    _collective("reduce_scatter")(output, input)


def all_gather(output: torch.Tensor, input: torch.Tensor) -> None:
    """Concatenate every rank's ``input`` into ``output`` (rank order)."""
    _collective("all_gather")(output, input)


class FlatParams:
    """One contiguous fp32 buffer for a module's trainable parameters and one for their grads."""

    def __init__(self, module: nn.Module, pad_to: int = 1) -> None:
        self.names: list[str] = []
        params: list[nn.Parameter] = []
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.names.append(name)
                params.append(p)
        if not params:
            raise ConfigError("the model has no trainable parameters")
        if any(p.dtype != torch.float32 for p in params):
            raise ConfigError("build_model() must return an fp32 model; the harness sets precision")
        device = params[0].device
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.pad_to = max(1, pad_to)
        self.padded = -(-self.numel // self.pad_to) * self.pad_to
        self.device = device
        self.params = torch.zeros(self.padded, device=device)
        self.grads = torch.zeros(self.padded, device=device)
        offset = 0
        self.offsets: list[int] = []
        for p, n in zip(params, self.numels):
            self.offsets.append(offset)
            # as_strided keeps the parameter's memory format (channels-last conv weights stay so)
            view = _view(self.params, offset, p)
            view.copy_(p.detach())
            p.data = view
            p.grad = _view(self.grads, offset, p)
            offset += n
        self._params = params
        #: per-tensor lengths, padding counted as one extra (zero) segment
        lengths = self.numels + ([self.padded - self.numel] if self.padded > self.numel else [])
        self.lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
        self.num_tensors = len(self.numels)

    def __iter__(self) -> Iterator[nn.Parameter]:
        return iter(self._params)

    def zero_grad(self) -> None:
        self.grads.zero_()

    def check_grads(self) -> None:
        """Copy any gradient autograd did not accumulate in place back into the flat buffer."""
        for p, off, n in zip(self._params, self.offsets, self.numels):
            g = p.grad
            if g is None:
                p.grad = _view(self.grads, off, p)
            elif g.data_ptr() != self.grads.data_ptr() + off * self.grads.element_size():
                view = _view(self.grads, off, p)
                view.copy_(g)
                p.grad = view

    def shard_lengths(self, rank: int, world: int) -> torch.Tensor:
        """Per-segment element counts inside this rank's slice (zeros for segments outside it)."""
        size = self.padded // world
        lo, hi = rank * size, (rank + 1) * size
        out: list[int] = []
        off = 0
        for n in self.lengths.tolist():
            out.append(max(0, min(off + n, hi) - max(off, lo)))
            off += n
        return torch.tensor(out, dtype=torch.int64, device=self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.params[o : o + n].clone() for name, o, n in zip(self.names, self.offsets, self.numels)}


def _view(buf: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    if like.is_contiguous():
        return buf[offset : offset + like.numel()].view_as(like)
    return buf[offset : offset + like.numel()].as_strided(like.shape, like.stride())


def segment_sum(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sums of consecutive segments of a 1-D tensor (empty segments give 0); no host sync."""
    return torch.segment_reduce(values, "sum", lengths=lengths, unsafe=True, initial=0.0)


def expand_segments(per_segment: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Each segment's value repeated over its elements (``total`` given, so no host sync)."""
    return torch.repeat_interleave(per_segment, lengths, output_size=total)
