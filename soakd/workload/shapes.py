"""Synthetic requests: one or a weighted mix of input shapes, from a pool of pre-made tensors.

Tensors are made once (``pool`` per shape) and cycled, so drawing a request costs a few
hundred nanoseconds and the load generator never competes with the model for the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from soakd.specs import Shape, parse_shape_mix

if TYPE_CHECKING:
    import torch

__all__ = ["Shape", "ShapeSource", "parse_shape_mix"]


class ShapeSource:
    """Draws each request's shape by weight and hands out a pooled tensor of that shape."""

    # Pre-made tensors: no preprocess stage (RequestSource).
    preprocess = None
    bad_log = None

    def __init__(
        self,
        spec: str,
        *,
        pool: int = 8,
        dtype: torch.dtype | None = None,  # None: float32
        seed: int = 0,
        encode: Callable[[Shape, torch.Tensor], Any] | None = None,
    ) -> None:
        """``encode`` (a network target's): each pooled tensor is kept only as the payload it
        makes (JSON bytes, a gRPC message), made once here."""
        import torch  # here, not at the top: the modules that name this class run without a model

        self.mix = parse_shape_mix(spec)
        self.shapes = [s for s, _ in self.mix]
        gen = torch.Generator().manual_seed(seed)
        made = (lambda s, t: t) if encode is None else encode
        self._pools: list[list[Any]] = [
            [made(s, torch.randn(s, generator=gen).to(dtype or torch.float32)) for _ in range(pool)]
            for s in self.shapes
        ]
        self._weights = np.array([w for _, w in self.mix])
        self._rng = np.random.default_rng(seed)
        self._draws: list[int] = []
        self._turn = 0

    def next(self) -> tuple[Shape, Any]:
        if len(self._pools) == 1:  # one shape: nothing to draw (and no 32 KB list of draws to make)
            k = 0
        else:
            if not self._draws:
                self._draws = self._rng.choice(len(self.shapes), size=4096, p=self._weights).tolist()
            k = self._draws.pop()
        self._turn += 1
        pool = self._pools[k]
        return self.shapes[k], pool[self._turn % len(pool)]

    def pooled(self) -> list[Any]:
        return [item for pool in self._pools for item in pool]

    def warmup_inputs(self) -> list[tuple[Shape, Any]]:
        return [(s, p[0]) for s, p in zip(self.shapes, self._pools, strict=True)]
