"""``builtin:detector``: a tiny single-stage detector whose raw output needs NMS.

Two strided convolutions to a grid of cells (one per 16x16 pixels), and per cell a box and
per-class scores, the way YOLO-style heads emit them. Output: ``(batch, cells, 4 + classes)``,
boxes as x1, y1, x2, y2 in input pixels, scores in [0, 1]. Boxes are up to four cells wide,
so neighbours overlap and NMS has real work: a 320x320 image gives 400 candidates.
"""

from __future__ import annotations

import torch
from torch import nn

from soakd.models.seeded import seed_weights


class Detector(nn.Module):
    def __init__(self, num_classes: int = 10, stride: int = 16) -> None:
        super().__init__()
        if stride % 4:
            raise ValueError("stride must be a multiple of 4")
        self.stride = stride
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=4, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=stride // 4, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 4 + num_classes, kernel_size=1),
        )
        seed_weights(self)  # the same weights every run: a stable fingerprint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)  # (B, 4 + C, gh, gw)
        gh, gw = y.shape[-2:]
        s = float(self.stride)
        gy, gx = torch.meshgrid(
            torch.arange(gh, device=x.device, dtype=y.dtype),
            torch.arange(gw, device=x.device, dtype=y.dtype),
            indexing="ij",
        )
        anchors = torch.stack([gx.flatten(), gy.flatten()], dim=-1).add(0.5).mul(s)  # (cells, 2) centres
        y = y.flatten(2).transpose(1, 2)  # (B, cells, 4 + C)
        centres = anchors + torch.tanh(y[..., :2]) * s
        half = torch.sigmoid(y[..., 2:4]) * (2 * s)
        boxes = torch.cat([centres - half, centres + half], dim=-1)
        return torch.cat([boxes, torch.sigmoid(y[..., 4:])], dim=-1)
