"""Small models for the limit benches (issue #13), and their packagings: an eager module for a
``python:`` factory, a TorchScript file and a ``torch.export`` program with a dynamic batch."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class PatchEncoder(nn.Module):
    """The issue's model, reconstructed: 16x16 patches of a 3x224x224 image projected to 196
    tokens of width 64 (a strided conv, as in ViT), a 2-layer transformer encoder of width 64,
    mean-pooled to 10 classes."""

    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4, patch: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)  # (B, 196, width)
        return self.head(self.encoder(tokens).mean(dim=1))  # type: ignore[no-any-return]


def make_encoder() -> nn.Module:
    """``python:bench.models:make_encoder``: the eager encoder, weights seeded."""
    torch.manual_seed(0)
    return PatchEncoder().eval()


def save_torchscript(path: Path) -> Path:
    """Script and save the encoder, as a user hands soakd ``torchscript:enc.pt``."""
    scripted = torch.jit.script(make_encoder())
    scripted.save(str(path))  # type: ignore[no-untyped-call]
    return path


def save_export(path: Path, device: str = "cpu", shape: tuple[int, ...] = (3, 224, 224)) -> Path:
    """Export the encoder with a dynamic batch dimension (``export:enc.pt2``). An exported program
    keeps the device it was traced on, so it is built on the device it will run on."""
    model = make_encoder().to(device)
    example = torch.randn(2, *shape, device=device)
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(path))
    return path
