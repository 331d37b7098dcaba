"""Post-processing: turn a batch of model output into one JSON response per request.

``classify``: softmax and top-5 per request. ``detect``: per image, best class and score per
candidate box, a score threshold, class-aware NMS and the top 100 detections. Both end in
``json.dumps`` of the response, because serialising is part of what a server pays.

Detection output is recognised as a tensor ``(batch, boxes, 4 + classes)`` (x1, y1, x2, y2,
then per-class scores: the layout YOLO-style heads emit once transposed) or a dict with
``boxes`` ``(batch, boxes, 4)`` and ``scores`` ``(batch, boxes[, classes])``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from soakd.workload.nms import batched_nms

KINDS = ("auto", "none", "classify", "detect")
TOP_K = 5
SCORE_THRESHOLD = 0.25
IOU_THRESHOLD = 0.45
MAX_DETECTIONS = 100


class PostprocessError(ValueError):
    """The model's output does not fit the configured post-processing."""


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise PostprocessError(f"expected a tensor output, got {type(output).__name__}")


def looks_like_detections(output: Any) -> bool:
    if isinstance(output, dict):
        return "boxes" in output and "scores" in output
    return isinstance(output, torch.Tensor) and output.dim() == 3 and output.shape[-1] >= 5


def classify(output: Any, n: int) -> list[bytes]:
    logits = _first_tensor(output).detach().float().cpu().reshape(n, -1)
    probs = torch.softmax(logits, dim=1)
    top = probs.topk(min(TOP_K, probs.shape[1]), dim=1)
    ids, scores = top.indices.tolist(), top.values.tolist()
    return [
        json.dumps({"classes": i, "scores": [round(s, 5) for s in sc]}).encode()
        for i, sc in zip(ids, scores, strict=True)
    ]


def _split_detections(output: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """-> boxes (B, N, 4), class scores (B, N, C)."""
    if isinstance(output, dict):
        boxes, scores = output["boxes"], output["scores"]
        if scores.dim() == 2:
            scores = scores.unsqueeze(-1)
    else:
        out = _first_tensor(output)
        if out.dim() != 3 or out.shape[-1] < 5:
            shape = tuple(out.shape)
            raise PostprocessError(f"detect: expected output (batch, boxes, 4 + classes), got {shape}")
        boxes, scores = out[..., :4], out[..., 4:]
    return boxes.detach().float().cpu(), scores.detach().float().cpu()


def detect(output: Any, n: int) -> list[bytes]:
    boxes, scores = _split_detections(output)
    best, classes = scores.max(dim=-1)
    responses = []
    for i in range(n):
        mask = best[i] > SCORE_THRESHOLD
        b, s, c = boxes[i][mask], best[i][mask], classes[i][mask]
        keep = batched_nms(b, s, c, IOU_THRESHOLD)[:MAX_DETECTIONS]
        dets = [
            {"box": [round(v, 2) for v in box], "score": round(score, 4), "class": cls}
            for box, score, cls in zip(b[keep].tolist(), s[keep].tolist(), c[keep].tolist(), strict=True)
        ]
        responses.append(json.dumps({"detections": dets}).encode())
    return responses


def auto(output: Any, n: int) -> list[bytes]:
    return detect(output, n) if looks_like_detections(output) else classify(output, n)


def postprocessor(kind: str) -> Callable[[Any, int], list[bytes]]:
    """The post-processing function for ``input.postprocess`` (not ``none``)."""
    return {"auto": auto, "classify": classify, "detect": detect}[kind]
