"""DeepCAM maths: IoU as the MLPerf reference defines it, class weights and the weighted loss."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hpcbench.workloads.deepcam.config import REFERENCE_FREQUENCIES
from hpcbench.workloads.deepcam.metric import class_weights, iou_per_sample, weighted_cross_entropy


def reference_iou(pred: torch.Tensor, gt: torch.Tensor, k: int) -> float:
    """Written from the reference's definition: per sample and class TP/(TP+FP+FN), a class absent
    from both prediction and label scoring 1; mean over classes, then over the batch."""
    scores = []
    for p, g in zip(pred, gt):
        per_class = []
        for c in range(k):
            tp = int(((p == c) & (g == c)).sum())
            fp = int(((p == c) & (g != c)).sum())
            fn = int(((p != c) & (g == c)).sum())
            per_class.append(1.0 if tp + fp + fn == 0 else tp / (tp + fp + fn))
        scores.append(sum(per_class) / k)
    return sum(scores) / len(scores)


def test_iou_matches_reference_definition_on_random_maps() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        gt = torch.randint(0, 3, (4, 9, 13), generator=gen)
        gt[1] = 0  # a sample with only background: classes 1 and 2 absent
        pred = torch.where(torch.rand(gt.shape, generator=gen) < 0.7, gt, torch.randint(0, 3, gt.shape, generator=gen))
        pred[1] = 0  # ... and predicted absent too
        got = iou_per_sample(pred, gt, 3).mean().item()
        assert math.isclose(got, reference_iou(pred, gt, 3), rel_tol=1e-12)


def test_iou_edge_cases() -> None:
    gt = torch.zeros(1, 4, 4, dtype=torch.long)
    assert iou_per_sample(gt.clone(), gt, 3).item() == 1.0  # all background, predicted so
    gt[0, 0, 0] = 2
    # all-background prediction misses the river: bg 15/16, cyclone absent (1), river 0
    assert math.isclose(iou_per_sample(torch.zeros_like(gt), gt, 3).item(), (15 / 16 + 1 + 0) / 3)


def test_class_weights_follow_reference_power() -> None:
    w = class_weights(REFERENCE_FREQUENCIES, -0.125)
    expected = [f ** -0.125 for f in REFERENCE_FREQUENCIES]
    assert torch.allclose(w, torch.tensor(expected))
    assert w[1] > w[2] > w[0]  # the rarest class weighs most


def test_weighted_cross_entropy_is_mean_over_pixels() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, 7, generator=gen)
    labels = torch.randint(0, 3, (2, 5, 7), generator=gen)
    w = torch.tensor([1.0, 2.5, 1.7])
    logp = F.log_softmax(logits, 1)
    manual = -(w[labels] * logp.gather(1, labels[:, None])[:, 0]).mean()
    assert torch.allclose(weighted_cross_entropy(logits, labels, w), manual)


def test_workload_loss_is_a_pixel_sum_with_a_device_count() -> None:
    from hpcbench.workloads.deepcam.workload import DeepCAMWorkload

    wl = DeepCAMWorkload(DeepCAMWorkload.load_config("mini"))
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 5, 7, generator=gen)
    labels = torch.randint(0, 3, (2, 5, 7), generator=gen)
    batch = (torch.zeros(2, 16, 5, 7), labels)
    count = wl.loss_count(batch)
    assert count.dtype == torch.float32 and count.device == labels.device and float(count) == labels.numel()
    mean = weighted_cross_entropy(logits, labels, wl.weights)
    assert torch.allclose(wl.loss(logits, batch) / count, mean)
    # the class weights reach a device once, not every step
    assert wl.class_weights_on(logits.device) is wl.class_weights_on(logits.device)
