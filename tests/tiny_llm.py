"""Build a tiny random causal LM and its tokenizer into a directory, for `transformers serve`:
``python tests/tiny_llm.py DIR`` with the servers' venv python (soakd's own venv has no
transformers). No hub access: a WordLevel tokenizer trained on the sentences below, a 2-layer
Llama with hidden size 32. Its output is random text; soakd only measures how it streams.
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a soak test runs for a long time and watches memory",
    "language models stream tokens one after another",
    "time to first token and inter token latency are measured per request",
    "servers leak memory slowly under steady load",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} \n{% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def build(out: str) -> None:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = sorted({w for s in SENTENCES for w in s.split()} | {"user", "assistant", "system", ":"})
    extra = [f"w{i}" for i in range(200)]  # more vocabulary, so random output is not all one word
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[BOS]", "[EOS]"])
    tok.train_from_iterator([*SENTENCES, " ".join(words), " ".join(extra)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=fast.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)


if __name__ == "__main__":
    build(sys.argv[1])
