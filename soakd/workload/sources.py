"""Pick the request source a config asks for: sample files, a sequence-length mix, or shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from soakd.config import Config, ConfigError
from soakd.workload.preprocess import Preprocessor
from soakd.workload.samples import SampleSource
from soakd.workload.seqlen import SeqLenSource, is_seq_spec
from soakd.workload.shapes import ShapeSource, parse_shape_mix

if TYPE_CHECKING:
    import torch


class RequestSource(Protocol):
    """What the engine draws requests from: ``next()`` -> (batch key, tensor or raw sample).

    ``preprocess`` declares the stage: None when ``next()`` hands out ready tensors, else the
    callable the preprocess pool turns each raw sample into ``(key, tensor)`` with (raising
    BadInput); ``bad_log`` then names each bad sample once per run."""

    @property
    def preprocess(self) -> Callable[[Any], tuple[Any, torch.Tensor]] | None: ...

    @property
    def bad_log(self) -> Callable[[Any, Exception], None] | None: ...

    def next(self) -> tuple[Any, Any]: ...

    def pooled(self) -> list[Any]:
        """The inputs ``next()`` hands out over and over (a pool made once), so that a target can
        make what it needs of each once; [] when each request's input is made anew."""

    def warmup_inputs(self) -> list[tuple[Any, torch.Tensor]]: ...


def image_shape(spec: str | None) -> tuple[int, int, int] | None:
    """The (C, H, W) images are resized to: the first 3-D shape of the shape spec, if any."""
    if not spec or is_seq_spec(spec):
        return None
    for shape, _ in parse_shape_mix(spec):
        if len(shape) == 3 and shape[0] in (1, 3):
            return (shape[0], shape[1], shape[2])
    return None


def build_source(cfg: Config, default_shape: str | None, dtype: torch.dtype) -> RequestSource:
    """``input.samples`` replays files; else ``input.shapes`` (or the model's default shape)."""
    spec = cfg.input.shapes or default_shape
    if cfg.input.samples is not None:
        pre = Preprocessor(
            image_shape(spec),
            dtype,
            pad=cfg.input.pad,
            max_tokens=cfg.input.max_tokens,
            max_sample_bytes=cfg.input.max_sample_bytes,
        )
        return SampleSource(cfg.input.samples, pre)
    if not spec:
        raise ConfigError(f"input.shapes: {cfg.model.spec} has no default input shape; set --input-shapes")
    if is_seq_spec(spec):
        return SeqLenSource(spec, pad=cfg.input.pad, seed=cfg.load.seed)
    return ShapeSource(spec, pool=cfg.input.pool, dtype=dtype, seed=cfg.load.seed)
