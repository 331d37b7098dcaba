"""Prompts for ``--api openai``: synthetic text of drawn token lengths, or prompt files.

Synthetic: ``input.shapes = "seq:..."`` draws each prompt's length in tokens (the same specs as
:mod:`soakd.workload.seqlen`). The text is a prefix of one pre-made run of common English words,
so a draw costs a string slice. With ``target.tokenizer`` (a local tokenizer dir, read with the
``tokenizers`` or ``transformers`` package) the prefix ends exactly after the N-th token of that
tokenizer; without it a token is taken as :data:`WORDS_PER_TOKEN` words (OpenAI's rule of thumb
for English), so lengths are approximate and the server's ``usage`` says what they were.

Samples: ``--samples DIR`` holds ``.txt`` files (each file one prompt) and ``.jsonl`` files
(each line ``{"messages": [...]}`` for chat, or ``{"prompt": "..."}``; either may carry its own
``max_tokens``), read once at start and cycled in name order.

``target.output_tokens`` (N or a length spec) sets each request's ``max_tokens``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any

import numpy as np

from soakd.config import Config, parse_output_tokens
from soakd.errors import ConfigError
from soakd.specs import SeqLenSpec, parse_seq_spec
from soakd.workload.bodies import MAX_TOTAL_BYTES
from soakd.workload.samples import walk_samples
from soakd.workload.seqlen import draw_lengths

log = logging.getLogger("soakd")

WORDS_PER_TOKEN = 0.75  # without a tokenizer: 100 tokens ~ 75 English words
PROMPT_EXTENSIONS = frozenset({".txt", ".jsonl"})
DRAWS = 4096  # lengths drawn at a time (one numpy call)
_COMMON = (
    "the of and to in is was that for it with as his on be at by had are but from or have an they "
    "which one you were her all she there would their we him been has when who will more no if out "
    "so said what up its about into than them can only other new some could time these two may then "
    "do first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life being"
)
WORDS = tuple(_COMMON.split())


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input: ``text`` (a completion prompt, or the one user message) or chat
    ``messages``; ``input_tokens`` is what the prompt holds as far as soakd knows (exact with a
    tokenizer, else estimated), counted when the server sends no ``usage``."""

    text: str | None
    messages: list[dict[str, Any]] | None
    input_tokens: int
    max_tokens: int | None


class _Tokenizer:
    """A local tokenizer: ``tokenizers`` reads ``tokenizer.json``; else ``transformers`` loads the dir."""

    def __init__(self, path: str) -> None:
        self.path = path
        file = Path(path) / "tokenizer.json"
        try:
            import tokenizers  # optional: only --tokenizer needs it (not a soakd dependency)

            if file.is_file():
                self._fast: Any = tokenizers.Tokenizer.from_file(str(file))
                self._hf: Any = None
                return
        except ImportError:
            pass
        try:
            import transformers  # optional: only --tokenizer needs it (not a soakd dependency)
        except ImportError:
            raise ConfigError(
                f"target.tokenizer: {path}: reading a tokenizer needs the tokenizers or transformers "
                "package (pip install tokenizers), neither is importable"
            ) from None
        try:
            self._fast = None
            self._hf = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # the library's errors differ per file; all mean "no tokenizer here"
            raise ConfigError(f"target.tokenizer: {path}: cannot load a tokenizer ({exc})") from None

    def ends(self, text: str) -> list[int]:
        """Where each token of ``text`` ends (character offsets), special tokens left out."""
        if self._fast is not None:
            return [end for _, end in self._fast.encode(text, add_special_tokens=False).offsets]
        enc = self._hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return [end for _, end in enc["offset_mapping"]]

    def count(self, text: str) -> int:
        return len(self.ends(text))


class PromptSource:
    """The engine's ``RequestSource`` for ``--api openai``: ``next()`` -> (None, :class:`Prompt`)."""

    preprocess = None  # prompts go out as JSON, built by the target
    bad_log = None

    def __init__(self, cfg: Config) -> None:
        tg, inp = cfg.target, cfg.input
        self._rng = np.random.default_rng(cfg.load.seed)
        self._out: SeqLenSpec | None = parse_output_tokens(tg.output_tokens) if tg.output_tokens else None
        self._out_draws: list[int] = []
        self._tok = _Tokenizer(tg.tokenizer) if tg.tokenizer else None
        self.exact = self._tok is not None
        self._samples: list[Prompt] = []
        self._lengths: list[int] = []
        self.spec: SeqLenSpec | None = None
        if inp.samples is not None:
            self._samples = self._read_samples(inp.samples, chat_ok=tg.openai_endpoint == "chat")
            self._next_sample = cycle(self._samples).__next__
            self.bodies = self._samples[:3]  # warm-up cycles through these
            self.describe = f"{len(self._samples)} prompts from {inp.samples}"
            return
        self.spec = parse_seq_spec(inp.shapes)
        self._text, self._ends = self._premade(self.spec.high)
        self.bodies = [self._synthetic(n) for n in sorted({self.spec.low, self.spec.high})]
        how = f"exact, tokenizer {self._tok.path}" if self._tok is not None else "approximate"
        self.describe = f"synthetic prompts {inp.shapes} ({how})"

    # ------------------------------------------------------------------ synthetic

    def _premade(self, max_tokens: int) -> tuple[str, list[int]]:
        """Text of at least ``max_tokens`` tokens and where each token ends in it."""
        words = np.array(WORDS)
        n_words = int(max_tokens * WORDS_PER_TOKEN) + 16
        while True:
            text = " ".join(words[self._rng.integers(0, len(words), size=n_words)].tolist())
            if self._tok is None:  # a "token" is WORDS_PER_TOKEN words: ends of word runs
                word_ends = np.cumsum([len(w) + 1 for w in text.split(" ")]) - 1
                idx = np.maximum(1, np.rint(np.arange(1, max_tokens + 1) * WORDS_PER_TOKEN)).astype(int) - 1
                return text, word_ends[idx].tolist()
            ends = self._tok.ends(text)
            if len(ends) >= max_tokens:
                ends = ends[:max_tokens]
                self._check_exact(text, ends)
                return text, ends
            n_words *= 2

    def _check_exact(self, text: str, ends: list[int]) -> None:
        assert self._tok is not None
        for n in sorted({1, len(ends) // 2 or 1, len(ends)}):
            got = self._tok.count(text[: ends[n - 1]])
            if got != n:  # a tokenizer that merges across the cut: lengths are then near, not exact
                log.warning(
                    "target.tokenizer: %s: a %d-token prefix re-encodes to %d tokens; prompt lengths are approximate",
                    self._tok.path,
                    n,
                    got,
                )
                self.exact = False
                return

    def _synthetic(self, n: int) -> Prompt:
        return Prompt(self._text[: self._ends[n - 1]], None, n, self._max_tokens())

    # ------------------------------------------------------------------ samples

    def _read_samples(self, root: str, *, chat_ok: bool) -> list[Prompt]:
        out: list[Prompt] = []
        total = 0
        for path in walk_samples(root, PROMPT_EXTENSIONS):
            suffix = Path(path).suffix.lower()
            try:
                data = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"input.samples: {path}: cannot read ({exc})") from None
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                raise ConfigError(f"input.samples: {root}: the prompts pass {MAX_TOTAL_BYTES >> 20} MiB")
            if suffix == ".txt":
                if data.strip():
                    out.append(Prompt(data, None, self._count(data), None))
                continue
            for lineno, line in enumerate(data.splitlines(), 1):
                if line.strip():
                    out.append(self._jsonl_prompt(line, f"{path}:{lineno}", chat_ok))
        if not out:
            raise ConfigError(f"input.samples: {root}: no .txt or .jsonl prompts to send")
        return out

    def _jsonl_prompt(self, line: str, where: str, chat_ok: bool) -> Prompt:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"input.samples: {where}: not JSON ({exc.msg})") from None
        limit = obj.get("max_tokens") if isinstance(obj, dict) else None
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"input.samples: {where}: max_tokens must be an integer >= 1, got {limit!r}")
        if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            return Prompt(obj["prompt"], None, self._count(obj["prompt"]), limit)
        messages = obj.get("messages") if isinstance(obj, dict) else None
        if not (
            isinstance(messages, list)
            and messages
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
        ):
            raise ConfigError(
                f'input.samples: {where}: expected {{"messages": [{{"role": ..., "content": "..."}}]}} '
                'or {"prompt": "..."}'
            )
        if not chat_ok:
            raise ConfigError(
                f'input.samples: {where}: chat messages need target.openai_endpoint = "chat" (this run posts '
                "to /completions)"
            )
        return Prompt(None, messages, sum(self._count(m["content"]) for m in messages), limit)

    def _count(self, text: str) -> int:
        if self._tok is not None:
            return self._tok.count(text)
        return max(1, round(len(text.split()) / WORDS_PER_TOKEN))

    # ------------------------------------------------------------------ RequestSource

    def _max_tokens(self) -> int | None:
        if self._out is None:
            return None
        if not self._out_draws:
            self._out_draws = draw_lengths(self._out, self._rng, DRAWS).tolist()
        return int(self._out_draws.pop())

    def next(self) -> tuple[Any, Prompt]:
        if self._samples:
            p = self._next_sample()
            limit = self._max_tokens()
            return None, p if p.max_tokens is not None or limit is None else Prompt(
                p.text, p.messages, p.input_tokens, limit
            )
        if not self._lengths:
            assert self.spec is not None
            self._lengths = draw_lengths(self.spec, self._rng, DRAWS).tolist()
        return None, self._synthetic(int(self._lengths.pop()))

    def pooled(self) -> list[Any]:
        return []  # synthetic prompts are made per request

    def warmup_inputs(self) -> list[tuple[Any, Any]]:
        """The few prompts a network target's warm-up requests cycle through."""
        return [(None, p) for p in self.bodies]
