"""Non-maximum suppression in plain torch + numpy (torchvision is not a dependency).

Greedy NMS as torchvision.ops.nms does it: highest score first, drop every later box whose
IoU with a kept box exceeds the threshold. The IoU matrix is computed once, vectorised; the
greedy pass is a loop over rows of a boolean matrix, which for the few hundred candidates a
detector leaves after its score threshold costs well under a millisecond.
"""

from __future__ import annotations

import numpy as np
import torch


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box in ``a`` (N, 4) with every box in ``b`` (M, 4), boxes as x1, y1, x2, y2."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union, torch.zeros_like(inter))


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the kept boxes, highest score first (torchvision.ops.nms semantics)."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    order = torch.argsort(scores, descending=True, stable=True)
    overlap = (box_iou(boxes[order], boxes[order]) > iou_threshold).numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep: list[int] = []
    for i in range(len(order)):
        if removed[i]:
            continue
        keep.append(i)
        removed |= overlap[i]
    return order[torch.as_tensor(keep, dtype=torch.int64)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """NMS within each class only: boxes of different classes never suppress each other.

    Shifts each class's boxes by a multiple of the largest coordinate so classes cannot overlap,
    then runs one NMS (torchvision's coordinate trick).
    """
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    offset = classes.to(boxes.dtype) * (boxes.max() + 1)
    return nms(boxes + offset[:, None], scores, iou_threshold)
