"""Token-sequence requests whose length follows a distribution, as text traffic does.

``input.shapes = "seq:lognormal(mean=128,sigma=0.5,min=8,max=512)"`` draws each request's
length from a lognormal with that mean, clipped to [min, max]; ``seq:uniform(min=8,max=512)``
and ``seq:fixed(n=128)`` are the other two. ``vocab=N`` (default 30522) bounds the token ids.

Requests are int64 token ids, slices of one pre-made sequence of the maximum length, so a
draw costs a lookup (each length's slice is made once, no copy) and any length is available. Without ``input.pad`` each
length is its own batch key; with it every sequence shares one key and the batch is padded
to its longest member, as a tokenizer's ``padding=True`` does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from soakd.specs import SEQ_PREFIX, SeqLenSpec, is_seq_spec, parse_seq_spec

__all__ = [
    "PAD_KEY",
    "PREFIX",
    "SeqLenSource",
    "SeqLenSpec",
    "TokenSlices",
    "draw_lengths",
    "is_seq_spec",
    "parse_seq_spec",
]

if TYPE_CHECKING:  # torch is imported where tensors are made: config validation parses specs without it
    import torch

PREFIX = SEQ_PREFIX
PAD_KEY = "seq"  # the one batch key of padded sequences


def draw_lengths(spec: SeqLenSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec.dist == "fixed":
        return np.full(n, spec.low, dtype=np.int64)
    if spec.dist == "uniform":
        return rng.integers(spec.low, spec.high + 1, size=n)
    sigma = spec.params["sigma"]
    mu = math.log(spec.params["mean"]) - sigma * sigma / 2  # so the mean (before clipping) is `mean`
    return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), spec.low, spec.high).astype(np.int64)


class TokenSlices(dict[int, "torch.Tensor"]):
    """One pre-made sequence of ``spec.high`` token ids and its prefixes by length, each made once
    (``slices[n]``): slicing a tensor costs about 1.5 us on the thread that makes every request
    (an open loop's arrivals thread), a dict lookup 0.03. The prefixes are views of the one
    sequence, no copies, at most ``spec.high`` of them."""

    def __init__(self, spec: SeqLenSpec, seed: int) -> None:
        super().__init__()
        import torch  # config imports this module's parser; `soakd analyze` must start without torch

        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(1, spec.vocab, (spec.high,), generator=gen, dtype=torch.int64)

    def __missing__(self, n: int) -> torch.Tensor:
        made = self[n] = self.tokens[:n]
        return made


class SeqLenSource:
    """Hands out token sequences with drawn lengths; keys are ``(length,)`` or one shared key."""

    # Pre-made tensors: no preprocess stage (RequestSource).
    preprocess = None
    bad_log = None

    def __init__(self, spec: str, *, pad: bool = False, seed: int = 0) -> None:
        self.spec = parse_seq_spec(spec)
        self.pad = pad
        self._tokens = TokenSlices(self.spec, seed)
        self._rng = np.random.default_rng(seed)
        self._lengths: list[int] = []

    def next(self) -> tuple[object, torch.Tensor]:
        if not self._lengths:
            self._lengths = draw_lengths(self.spec, self._rng, 4096).tolist()
        n = self._lengths.pop()
        return (PAD_KEY if self.pad else (n,)), self._tokens[n]

    def pooled(self) -> list[object]:
        return []  # each request: a slice of one token tensor, made per draw

    def warmup_inputs(self) -> list[tuple[object, torch.Tensor]]:
        lengths = sorted({self.spec.low, (self.spec.low + self.spec.high) // 2, self.spec.high})
        return [((n,), self._tokens[n]) for n in lengths]
