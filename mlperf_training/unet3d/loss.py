"""Dice + cross-entropy loss and the Dice score, as the reference computes them.

The reference's ``Dice`` (image_segmentation/pytorch/model/losses.py) takes the one-hot target and
the softmax (loss) or the one-hot argmax (score) of the logits, drops the background channel
(``include_background`` false), and gives per sample and class
``(2 * intersection + 1e-6) / (target + prediction + 1e-6)`` over the voxels. The loss is
``(mean(1 - dice) + cross_entropy) / 2`` over the batch; the score of one case is its Dice per
class, and ``eval_accuracy`` is the mean over cases of the kidney and tumour Dice averaged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SMOOTH_NR = 1e-6
SMOOTH_DR = 1e-6


def one_hot(label: torch.Tensor, classes: int) -> torch.Tensor:
    """(N, 1, D, H, W) or (N, D, H, W) integer labels -> (N, classes, D, H, W) float."""
    if label.dim() == 5:
        label = label[:, 0]
    return F.one_hot(label.long(), classes).permute(0, 4, 1, 2, 3).to(torch.float32)


def dice(pred: torch.Tensor, target: torch.Tensor, include_background: bool = False) -> torch.Tensor:
    """Per sample and class Dice (N, C') of class maps (N, C, D, H, W); background dropped unless asked."""
    if not include_background:
        pred, target = pred[:, 1:], target[:, 1:]
    dims = tuple(range(2, pred.dim()))
    inter = (pred * target).sum(dims)
    return (2.0 * inter + SMOOTH_NR) / (target.sum(dims) + pred.sum(dims) + SMOOTH_DR)


def dice_ce_per_sample(logits: torch.Tensor, label: torch.Tensor, include_background: bool = False) -> torch.Tensor:
    """The reference's loss of each sample (N,): (mean over classes of 1 - soft Dice + mean voxel CE) / 2.
    Their mean over a batch of equal-sized patches is the reference's ``DiceCELoss``."""
    logits = logits.float()
    target = label[:, 0] if label.dim() == 5 else label
    ce = F.cross_entropy(logits, target.long(), reduction="none").flatten(1).mean(1)
    soft = dice(torch.softmax(logits, dim=1), one_hot(target, logits.shape[1]), include_background)
    return ((1.0 - soft).mean(1) + ce) / 2


def dice_score(logits: torch.Tensor, label: torch.Tensor, include_background: bool = False) -> torch.Tensor:
    """Per case and class Dice (N, C') of the argmax prediction: column 0 kidney, 1 tumour."""
    classes = logits.shape[1]
    pred = one_hot(logits.argmax(dim=1), classes)
    return dice(pred, one_hot(label, classes), include_background)
