"""The ResNet training loss: cross entropy with label smoothing, as a sum over the batch's samples.

MLPerf's reference smooths the one-hot targets with ``label_smoothing = 0.1``: the target puts
``1 - eps + eps/K`` on the true class and ``eps/K`` on each other of the ``K`` classes. Per sample
that is ``(1 - eps) * (lse - x_y) + eps * (lse - mean_k x_k)`` with ``lse = logsumexp(x)``, which
needs one logsumexp, one gather and one mean over the logits (no (N, K) target or log-softmax
tensor). The harness contract: the loss is a *sum* over this rank's samples and ``loss_count`` the
number of them; the harness divides by the instance's total count, so the gradient is the global
mean whatever each rank holds.
"""
from __future__ import annotations

import torch

#: the label smoothing MLPerf's ResNet reference and submissions train with
LABEL_SMOOTHING = 0.1


def smoothed_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor,
                               smoothing: float = LABEL_SMOOTHING) -> torch.Tensor:
    """Sum over samples of the label-smoothed cross entropy of (N, K) ``logits`` against (N,) class
    indices, computed in fp32 (under bf16 autocast the logits arrive in bf16)."""
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"expected (N, K) logits and (N,) labels, got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
    x = logits.float()
    lse = torch.logsumexp(x, dim=1)
    nll = lse - x.gather(1, labels.long().unsqueeze(1)).squeeze(1)
    if smoothing == 0.0:
        return nll.sum()
    uniform = lse - x.mean(dim=1)  # cross entropy against the uniform distribution
    return ((1.0 - smoothing) * nll + smoothing * uniform).sum()


def top1_correct(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many samples' highest logit is the true class (``eval_accuracy`` = the sum over the
    evaluation set / its size), as a 0-d float tensor on the logits' device."""
    return (logits.argmax(dim=1) == labels).sum().to(torch.float32)
