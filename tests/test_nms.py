"""NMS and post-processing against hand-computed boxes."""

from __future__ import annotations

import json

import pytest
import torch

from soakd.models.boxes import Detector
from soakd.workload.nms import batched_nms, box_iou, nms
from soakd.workload.postprocess import PostprocessError, auto, classify, detect, looks_like_detections


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


class TestIoU:
    def test_hand_computed_overlaps(self) -> None:
        """Half-overlapping 2x2 squares: intersection 2, union 6, IoU 1/3; disjoint 0; same box 1."""
        a = t([[0, 0, 2, 2]])
        b = t([[1, 0, 3, 2], [5, 5, 6, 6], [0, 0, 2, 2], [0, 0, 1, 1]])
        iou = box_iou(a, b)[0].tolist()
        assert iou == pytest.approx([1 / 3, 0.0, 1.0, 0.25])

    def test_degenerate_boxes_have_zero_iou(self) -> None:
        """A zero-area box overlaps nothing (no division by zero)."""
        assert box_iou(t([[1, 1, 1, 1]]), t([[1, 1, 1, 1]])).item() == 0.0


class TestNMS:
    def test_keeps_the_best_of_each_overlapping_cluster(self) -> None:
        """Two clusters and a loner: the top box of each survives, highest score first."""
        boxes = t([
            [0, 0, 10, 10],     # 0: cluster A, 0.9
            [1, 1, 11, 11],     # 1: IoU with 0 = 81/119 = 0.68 -> suppressed
            [20, 20, 30, 30],   # 2: cluster B, 0.8
            [21, 20, 31, 30],   # 3: IoU with 2 = 90/110 = 0.82 -> suppressed
            [50, 50, 60, 60],   # 4: alone, 0.3
        ])  # fmt: skip
        scores = torch.tensor([0.9, 0.95, 0.8, 0.7, 0.3])
        # Box 1 outscores box 0, so box 1 is the one kept in cluster A.
        assert nms(boxes, scores, 0.5).tolist() == [1, 2, 4]

    def test_threshold_is_strictly_greater(self) -> None:
        """IoU exactly at the threshold does not suppress (torchvision's rule); above it does."""
        boxes = t([[0, 0, 2, 2], [1, 0, 3, 2]])  # IoU 1/3
        scores = torch.tensor([0.9, 0.8])
        assert nms(boxes, scores, 1 / 3 + 1e-6).tolist() == [0, 1]
        assert nms(boxes, scores, 0.3).tolist() == [0]

    def test_chain_suppression_is_greedy(self) -> None:
        """A suppresses B, and C (overlapping B only) survives: suppressed boxes suppress nothing."""
        boxes = t([[0, 0, 4, 4], [2, 0, 6, 4], [4, 0, 8, 4]])  # A-B IoU 1/3, B-C 1/3, A-C 0
        scores = torch.tensor([0.9, 0.8, 0.7])
        assert nms(boxes, scores, 0.25).tolist() == [0, 2]

    def test_empty_input(self) -> None:
        assert nms(torch.zeros((0, 4)), torch.zeros(0), 0.5).tolist() == []

    def test_batched_nms_never_suppresses_across_classes(self) -> None:
        """The same box twice, two classes: both kept; same class: one kept."""
        boxes = t([[0, 0, 10, 10], [0, 0, 10, 10]])
        scores = torch.tensor([0.9, 0.8])
        assert batched_nms(boxes, scores, torch.tensor([0, 1]), 0.5).tolist() == [0, 1]
        assert batched_nms(boxes, scores, torch.tensor([2, 2]), 0.5).tolist() == [0]


class TestPostprocess:
    def test_detect_thresholds_suppresses_and_encodes(self) -> None:
        """(batch, boxes, 4 + classes): low scores dropped, overlaps suppressed, one JSON per image."""
        out = torch.tensor([[
            [0, 0, 10, 10, 0.9, 0.1],
            [1, 1, 11, 11, 0.8, 0.1],    # suppressed by the first (same class 0)
            [1, 1, 11, 11, 0.1, 0.7],    # class 1: kept
            [40, 40, 50, 50, 0.2, 0.1],  # below the 0.25 score threshold
        ]])  # fmt: skip
        (resp,) = detect(out, 1)
        dets = json.loads(resp)["detections"]
        assert [(d["class"], d["score"]) for d in dets] == [(0, pytest.approx(0.9)), (1, pytest.approx(0.7))]
        assert dets[0]["box"] == [0, 0, 10, 10]

    def test_auto_recognises_the_builtin_detector(self) -> None:
        """builtin:detector's output is detection-shaped; NMS leaves no same-class overlap above 0.45."""
        model = Detector().eval()
        with torch.inference_mode():
            out = model(torch.randn(2, 3, 128, 128))
        assert out.shape == (2, 64, 14) and looks_like_detections(out)
        for resp in auto(out, 2):
            dets = json.loads(resp)["detections"]
            assert 0 < len(dets) <= 100
            for cls in {d["class"] for d in dets}:
                boxes = t([d["box"] for d in dets if d["class"] == cls])
                iou = box_iou(boxes, boxes) - torch.eye(len(boxes))
                assert float(iou.max()) <= 0.45 + 1e-3

    def test_classify_is_softmax_top5(self) -> None:
        """Logits -> the five most likely classes with probabilities, best first."""
        logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -1.0]])
        body = json.loads(classify(logits, 1)[0])
        assert body["classes"] == [5, 4, 3, 2, 1]
        probs = torch.softmax(logits, 1)[0]
        assert body["scores"][0] == pytest.approx(float(probs[5]), abs=1e-5)

    def test_detect_on_a_classifier_output_is_an_error(self) -> None:
        with pytest.raises(PostprocessError):
            detect(torch.zeros(2, 10), 2)
