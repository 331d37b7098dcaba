"""Seeded weights for builtin models: the same weights on every run, so a builtin's fingerprint
(a hash of its state_dict) is stable and two demo runs compare like for like.

The draws come from a ``torch.Generator`` local to the builder, never the global RNG, so what a
user (or a test) seeded before the model was built does not change the model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

BUILTIN_SEED = 0


@torch.no_grad()
def seed_weights(module: nn.Module, seed: int = BUILTIN_SEED) -> nn.Module:
    """Re-draw every conv and linear layer the way PyTorch's default init does (Kaiming-uniform
    weights, uniform bias in +-1/sqrt(fan_in)), in module order, from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=gen)
            if layer.bias is not None:
                fan_in = layer.weight[0].numel()
                bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
                layer.bias.uniform_(-bound, bound, generator=gen)
    return module
