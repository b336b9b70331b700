"""DeepCAM maths: class-weighted cross-entropy and the reference IoU score.

IoU (as the MLPerf reference computes it): for each sample and class, TP / (TP + FP + FN); a class
absent from both prediction and label counts as a perfect match; the per-sample score is the mean
over the classes and the reported score the mean over samples.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def class_weights(frequencies: Sequence[float], power: float = -0.125) -> torch.Tensor:
    """Loss weight per class: frequency ** power (the reference uses -0.125)."""
    f = torch.tensor(list(frequencies), dtype=torch.float32)
    if torch.any(f <= 0):
        raise ValueError(f"class frequencies must be > 0, got {list(frequencies)}")
    return f.pow(power)


def weighted_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Sum over pixels of the class-weighted per-pixel cross-entropy (``weights`` on the logits' device)."""
    return F.cross_entropy(logits.float(), labels, weight=weights, reduction="sum")


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-pixel weighted CE averaged over all pixels (not over the weights), like the reference."""
    return weighted_cross_entropy_sum(logits, labels, weights) / labels.numel()


def iou_per_sample(pred: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N,) mean-over-classes IoU of each sample; ``pred`` and ``labels`` are (N, H, W) class ids."""
    n = labels.shape[0]
    p = pred.reshape(n, -1)
    g = labels.reshape(n, -1)
    # joint histogram per sample: confusion[i, true, predicted]
    idx = g.long() * num_classes + p.long() + (torch.arange(n, device=g.device) * num_classes**2)[:, None]
    conf = torch.bincount(idx.reshape(-1), minlength=n * num_classes**2).reshape(n, num_classes, num_classes)
    tp = conf.diagonal(dim1=1, dim2=2).double()
    union = conf.sum(1).double() + conf.sum(2).double() - tp  # predicted + true - both
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.ones_like(tp))
    return iou.mean(1)
