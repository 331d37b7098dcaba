"""The request source of ``--replay``: each trace row's payload, made to the row's size.

- ``--api openai``: a prompt of the row's input tokens (:mod:`soakd.workload.replay_prompts`),
  ``max_tokens`` its output tokens; rows sharing a Mooncake ``hash_id`` share that block's text.
- A token model in process (a ``seq:`` input): a token sequence of the row's input length,
  clipped to the spec's maximum (the rows clipped are counted).
- soakd's own log replayed into a tensor model: a tensor of the shape recorded.
- Otherwise (``--api http`` bodies, kserve-v2 tensors, a tensor model given a token trace) the
  trace sets the timing only and the payloads are the ones the run would send anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from soakd.config import Config
from soakd.config.parse import parse_shard
from soakd.specs import SeqLenSpec, is_seq_spec, parse_seq_spec
from soakd.workload.replay_prompts import PromptSizer
from soakd.workload.seqlen import PAD_KEY, TokenSlices
from soakd.workload.sources import RequestSource
from soakd.workload.traces import Row, RowCounts, Trace, TraceInfo, scan

if TYPE_CHECKING:  # torch is loaded where tensors are made: an openai trace makes none
    import torch

log = logging.getLogger("soakd")

MAX_SHAPES = 64  # distinct recorded shapes given a tensor each; past it, the run's own inputs
MAX_LENGTHS = 4096  # kserve-v2: payloads kept per sequence length; past it, each row's is encoded anew

Sizer = Callable[[Row], tuple[Any, Any]]


def open_trace(cfg: Config) -> tuple[Trace, TraceInfo]:
    """The trace ``load.replay`` names, scanned once (ConfigError, exit 2, naming file and line)."""
    ld = cfg.load
    assert ld.replay is not None
    trace = Trace(ld.replay, ld.replay_format, keep_failed=ld.replay_keep_failed, sort_window=ld.replay_sort_window)
    info = scan(trace)  # the whole trace: every shard keeps its clock (first row, span)
    trace.shard = parse_shard(ld.shard)  # then --shard I/N (a --workers worker's too) sends its rows
    log.info(
        "replaying %s: %s, %d rows over %.3fs at %gx%s (%d skipped, %d bad)",
        info.path,
        info.format,
        info.rows,
        info.span_seconds,
        ld.replay_speed,
        ", looped" if ld.replay_loop else "",
        info.skipped,
        info.bad,
    )
    return trace, info


class TokenSizer:
    """Token ids of the row's input length (soakd's log: the recorded length), slices of one
    pre-made sequence as :class:`~soakd.workload.seqlen.SeqLenSource` does."""

    def __init__(self, spec: SeqLenSpec, *, pad: bool, seed: int) -> None:
        self.spec = spec
        self.pad = pad
        self._tokens = TokenSlices(spec, seed)
        self.clipped = 0  # rows longer than the spec's maximum, sent at the maximum

    def __call__(self, row: Row) -> tuple[Any, torch.Tensor]:
        n = row.input_tokens
        if n is None and row.shape:
            n = row.shape[0]
        return self.of_length(n)

    def of_length(self, n: int | None) -> tuple[Any, torch.Tensor]:
        """The payload of a row of ``n`` input tokens (None: the spec's least)."""
        if n is None:
            n = self.spec.low
        elif n > self.spec.high:
            self.clipped += 1
            n = self.spec.high
        elif n < 1:
            n = 1
        return (PAD_KEY if self.pad else (n,)), self._tokens[n]


class LengthSizer:
    """A served tensor model (kserve-v2) whose last input dimension varies: the run's shape with
    that dimension set to the row's input length, clipped to the shape's own (``--input-shapes``
    is the maximum). Each length's payload is encoded once (at most :data:`MAX_LENGTHS` kept)."""

    def __init__(self, shape: tuple[int, ...], encode: Callable[[tuple[int, ...], torch.Tensor], Any], seed: int):
        self.shape = shape
        self.high = shape[-1]
        self._encode = encode
        import torch  # here, not at the top: see TYPE_CHECKING above

        gen = torch.Generator().manual_seed(seed)
        self._ids = torch.randint(1, 500, shape, generator=gen, dtype=torch.int64)  # token ids, or values
        self._made: dict[int, tuple[Any, Any]] = {}
        self.clipped = 0

    def __call__(self, row: Row) -> tuple[Any, Any]:
        n = row.input_tokens
        if n is None and row.shape:
            n = row.shape[-1]
        return self.of_length(n)

    def of_length(self, n: int | None) -> tuple[Any, Any]:
        """The payload of a row of ``n`` input tokens (None: the shape's own length)."""
        if n is None:
            n = self.high
        elif n > self.high:
            self.clipped += 1
            n = self.high
        n = max(1, n)
        made = self._made.get(n)
        if made is None:
            shape = (*self.shape[:-1], n)
            made = (shape, self._encode(shape, self._ids[..., :n].contiguous()))
            if len(self._made) < MAX_LENGTHS:
                self._made[n] = made
        return made


class ShapeSizer:
    """soakd's own log into a tensor model: one tensor per recorded shape (at most
    :data:`MAX_SHAPES`); rows without a shape get the run's own inputs."""

    def __init__(self, base: RequestSource, dtype: torch.dtype, seed: int) -> None:
        self.base = base
        self.dtype = dtype
        import torch  # here, not at the top: see TYPE_CHECKING above

        self._gen = torch.Generator().manual_seed(seed)
        self._made: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, row: Row) -> tuple[Any, Any]:
        shape = row.shape
        if not shape:
            return self.base.next()
        tensor = self._made.get(shape)
        if tensor is None:
            if len(self._made) >= MAX_SHAPES:
                return self.base.next()
            import torch  # loaded already, by __init__

            tensor = self._made[shape] = torch.randn(shape, generator=self._gen).to(self.dtype)
        return shape, tensor


class ReplaySource:
    """A :class:`RequestSource` whose payloads follow the trace's rows (``for_row``); what the
    run would send anyway (``base``) serves rows no sizer fits, the warm-up and the pool."""

    def __init__(
        self, trace: Trace, info: TraceInfo, *, sizer: Sizer | None, base: RequestSource | None, describe: str
    ) -> None:
        assert sizer is not None or base is not None
        self.trace, self.info = trace, info
        self._sizer = sizer
        self._base = base
        self.describe = describe

    @property
    def preprocess(self) -> Callable[[Any], tuple[Any, torch.Tensor]] | None:
        return self._base.preprocess if self._base is not None else None

    @property
    def bad_log(self) -> Callable[[Any, Exception], None] | None:
        return self._base.bad_log if self._base is not None else None

    @property
    def clipped(self) -> int:
        return self._sizer.clipped if isinstance(self._sizer, TokenSizer | LengthSizer) else 0

    @property
    def by_length(self) -> Callable[[int | None], tuple[Any, Any]] | None:
        """The payload of a row from its input tokens alone, where nothing else of the row counts
        (None: it needs the row's hash ids or shape, so the replay reads the row's text; the
        index the scan wrote holds its token counts)."""
        if self._sizer is None:
            base = self._base
            assert base is not None
            return lambda _n: base.next()  # the trace sets the timing only
        if isinstance(self._sizer, TokenSizer | LengthSizer) and self.info.format != "soakd":
            return self._sizer.of_length
        return None

    def for_row(self, row: Row) -> tuple[Any, Any]:
        if self._sizer is not None:
            return self._sizer(row)
        assert self._base is not None
        return self._base.next()

    def next(self) -> tuple[Any, Any]:
        if self._base is not None:
            return self._base.next()
        return self.for_row(Row(0.0, 16, 4, 0))

    def pooled(self) -> list[Any]:
        return self._base.pooled() if self._base is not None else []

    def warmup_inputs(self) -> list[tuple[Any, Any]]:
        """The run's own warm-up inputs, or (sized rows only) the trace's first rows."""
        if self._base is not None:
            return self._base.warmup_inputs()
        out = []
        rows = self.trace.rows(RowCounts())
        try:
            for row in rows:
                out.append(self.for_row(row))
                if len(out) == 3:
                    break
        finally:
            rows.close()  # the file, closed now rather than at collection
        return out


def local_replay(cfg: Config, base: RequestSource, spec: str | None, dtype: torch.dtype) -> ReplaySource:
    """``--replay`` into the model in this process: token lengths for a ``seq:`` input, the
    recorded shapes from soakd's own log, else the trace's timing with the run's own inputs."""
    trace, info = open_trace(cfg)
    sizer: Sizer | None = None
    if cfg.input.samples is None and spec and is_seq_spec(spec):
        seq = parse_seq_spec(spec)
        sizer = TokenSizer(seq, pad=cfg.input.pad, seed=cfg.load.seed)
        describe = f"token lengths from the trace (at most {seq.high}, the input spec's maximum)"
    elif cfg.input.samples is None and info.format == "soakd":
        sizer = ShapeSizer(base, dtype, cfg.load.seed)
        describe = "the shapes soakd's log recorded"
    else:
        describe = "the trace's timing; inputs as without it (sizes apply to token models)"
    log.info("replay sizes: %s", describe)
    return ReplaySource(trace, info, sizer=sizer, base=base, describe=describe)


def network_replay(
    cfg: Config,
    replay: tuple[Trace, TraceInfo],
    base: RequestSource | None,
    lengths: LengthSizer | None = None,
) -> ReplaySource:
    """``--replay`` to a served model: openai prompts of each row's size; kserve-v2 tensors of
    each row's length (``lengths``, where the model's last input dimension varies); otherwise
    the trace's timing, with the bodies or tensors the run would send anyway."""
    if cfg.target.api == "openai":
        sizer = PromptSizer(cfg)
        how = "exact" if sizer.exact else "approximate"
        describe = f"prompts of the trace's input tokens ({how}), max_tokens its output tokens"
        return ReplaySource(*replay, sizer=sizer, base=None, describe=describe)
    assert base is not None
    if lengths is not None:
        shape = "x".join(map(str, lengths.shape))
        describe = f"tensors of {shape} with the last dimension the row's input length (at most {lengths.high})"
    else:
        describe = f"the trace's timing; {cfg.target.api} payloads as without it"
    log.info("replay sizes: %s", describe)
    return ReplaySource(*replay, sizer=lengths, base=base, describe=describe)
