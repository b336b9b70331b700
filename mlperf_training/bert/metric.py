"""Masked-LM accuracy, the benchmark's ``eval_accuracy`` (target 0.720 in the closed division).

As the reference computes it: over the whole evaluation set (10,000 samples), the number of predicted
positions whose argmax over the vocabulary equals the original token, divided by the number of
predicted positions (``masked_lm_weights`` 1 in the TF reference; the non-zero slots of
``masked_lm_positions`` in the HDF5 files). Samples with more predictions weigh more: it is not a
mean of per-batch or per-sample accuracies. So the additive state is (correct, count), summed over
batches and all-reduced over ranks, and the ratio is taken once at the end.
"""
from __future__ import annotations

import torch


def mlm_accuracy_sums(mlm_logits: torch.Tensor, mlm_labels: torch.Tensor) -> torch.Tensor:
    """(correct, count) of one batch as a float64 tensor of 2 (no host sync; add these up)."""
    correct = (mlm_logits.argmax(dim=-1) == mlm_labels).sum()
    return torch.stack([correct, torch.tensor(mlm_labels.numel(), device=correct.device)]).to(torch.float64)


def eval_accuracy(sums: torch.Tensor) -> float:
    """The metric from summed (correct, count) (over batches and ranks)."""
    correct, count = (float(x) for x in sums)
    if count <= 0:
        raise ValueError("masked-LM accuracy of an evaluation with no predicted positions")
    return correct / count
