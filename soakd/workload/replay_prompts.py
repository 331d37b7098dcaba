"""Prompts of a trace row's size for ``--api openai``, with the prefix reuse the trace had.

A prompt is a run of blocks of ``load.replay_block_tokens`` tokens each. A Mooncake row names
its blocks (``hash_ids``): block h's text is made from h alone (seeded), so every row naming h
sends the same text there, and a server's prefix cache sees the reuse production had. Rows
without hash ids (Azure, BurstGPT, soakd's log, the blocks past a row's ids) get blocks of their
own, shared with no other row. The last block is cut to the row's ``input_tokens``.

With ``target.tokenizer`` each block is exactly ``block`` tokens and the prompt is cut after its
N-th token; without one a token is :data:`~soakd.workload.prompts.WORDS_PER_TOKEN` words, so
lengths are approximate (the server's ``usage`` says what they were). Block texts are kept in
a bounded LRU, so memory does not grow with the trace's distinct ids.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from itertools import count

import numpy as np

from soakd.config import Config
from soakd.workload.prompts import WORDS, WORDS_PER_TOKEN, Prompt, _Tokenizer
from soakd.workload.traces import Row

BLOCKS_KEPT = 4096  # block texts cached (a 512-token block is about 2.5 KB of text)
_SHARED, _OWN = 0, 1  # seed namespaces: a hash_id's block, a row's own block


class PromptSizer:
    """``sizer(row)`` -> (None, :class:`Prompt`) of the row's input tokens and output tokens."""

    def __init__(self, cfg: Config) -> None:
        tg = cfg.target
        self.block = cfg.load.replay_block_tokens
        self.seed = cfg.load.seed
        self._tok = _Tokenizer(tg.tokenizer) if tg.tokenizer else None
        self.exact = self._tok is not None
        self._words = np.array(WORDS)
        self._block_words = max(1, round(self.block * WORDS_PER_TOKEN))
        self._cache: OrderedDict[int, str] = OrderedDict()
        self._own = count()  # ids of blocks no other row shares

    def _text(self, space: int, ident: int) -> str:
        """One block's text: ``block`` tokens (exact with a tokenizer), seeded by its id alone."""
        rng = np.random.default_rng([self.seed, space, ident & (2**64 - 1)])
        n_words = self._block_words if self._tok is None else self.block + 8
        while True:
            text = " ".join(self._words[rng.integers(0, len(self._words), size=n_words)].tolist())
            if self._tok is None:
                return text
            ends = self._tok.ends(text)
            if len(ends) >= self.block:
                return text[: ends[self.block - 1]]
            n_words *= 2

    def _shared(self, ident: int) -> str:
        text = self._cache.get(ident)
        if text is None:
            text = self._cache[ident] = self._text(_SHARED, ident)
            if len(self._cache) > BLOCKS_KEPT:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(ident)
        return text

    def __call__(self, row: Row) -> tuple[None, Prompt]:
        n = max(1, row.input_tokens or 1)
        need = math.ceil(n / self.block)
        ids = row.hash_ids[:need] if row.hash_ids else ()
        blocks = [self._shared(h) for h in ids]
        blocks += [self._text(_OWN, next(self._own)) for _ in range(need - len(blocks))]
        text = " ".join(blocks)
        if self._tok is None:
            text = " ".join(text.split(" ")[: max(1, round(n * WORDS_PER_TOKEN))])
        else:
            ends = self._tok.ends(text)
            text = text[: ends[min(n, len(ends)) - 1]]
        out = row.output_tokens
        return None, Prompt(text, None, n, None if out is None else max(1, out))
