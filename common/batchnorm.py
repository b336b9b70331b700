"""BatchNorm statistics over an instance: averaged before an evaluation, or synchronized in groups of ranks."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .errors import ConfigError


def sync_batchnorm_stats(model: nn.Module, world: int) -> None:
    """Average floating-point buffers (BatchNorm running mean/var) over the instance: one all-reduce."""
    if world <= 1:
        return
    bufs = [b for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase)
            for b in (m.running_mean, m.running_var) if b is not None]
    if not bufs:
        return
    packed = torch.cat([b.reshape(-1).float() for b in bufs])
    dist.all_reduce(packed)
    packed.div_(world)
    offset = 0
    for b in bufs:
        b.copy_(packed[offset : offset + b.numel()].view_as(b))
        offset += b.numel()


def group_batchnorm(model: nn.Module, group_size: int, world: int, device: torch.device) -> nn.Module:
    """BatchNorm layers synchronized over consecutive groups of ``group_size`` ranks of the instance
    (``train.bn_group_size``; torch SyncBatchNorm, CUDA only)."""
    if device.type != "cuda":
        raise ConfigError(f"config key 'train.bn_group_size' = {group_size} needs CUDA (torch SyncBatchNorm); "
                          "use 1 on CPU")
    if world % group_size:
        raise ConfigError(f"config key 'train.bn_group_size' = {group_size} must divide the instance's {world} ranks")
    group, _ = dist.new_subgroups(group_size)
    return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
