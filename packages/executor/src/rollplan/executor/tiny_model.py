"""A tiny Llama model built locally (no hub access), for CPU engines in tests, examples and benchmarks.

``build_tiny_model(dir, seed)`` writes a Hugging Face model folder: ``LlamaForCausalLM`` (2 layers, hidden
128, 2 heads, 1 KV head, vocab 1024, intermediate 256, float32) with random weights drawn from ``seed``, and
a ByteLevel BPE tokenizer trained on generated text. The tokenizer depends only on ``tokenizer_seed`` (fixed
by default), so models built with different weight seeds share it: that is what makes a weight sync between
them meaningful (same vocabulary, different weights).

Contract: the same (seed, tokenizer_seed) gives byte-identical weights and the same tokenizer on every call.
Building takes a few seconds (importing transformers dominates) and writes ~1.2 MB.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

VOCAB_SIZE = 1024
MAX_POSITIONS = 512
SPECIAL_TOKENS = ("<|begin|>", "<|end|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|pad|>")

# A small chat template: "<|user|>text<|end|><|assistant|>..." (generation prompt opens the assistant turn).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_WORDS = [
    "the",
    "agent",
    "calls",
    "a",
    "tool",
    "and",
    "reads",
    "the",
    "result",
    "then",
    "it",
    "plans",
    "the",
    "next",
    "step",
    "search",
    "open",
    "file",
    "run",
    "test",
    "python",
    "error",
    "value",
    "list",
    "count",
    "sum",
    "answer",
    "question",
    "because",
    "therefore",
    "result",
    "observation",
    "action",
    "think",
    "compute",
    "weather",
    "city",
    "temperature",
    "price",
    "order",
    "item",
    "user",
    "assistant",
    "query",
    "table",
    "row",
    "column",
    "json",
    "key",
]


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    """Generated text for the tokenizer: words, numbers and punctuation, reproducible from ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.75:
                parts.append(rng.choice(_WORDS))
            elif r < 0.9:
                parts.append(str(rng.randint(0, 9999)))
            else:
                parts.append(rng.choice(("(", ")", ":", ",", ".", "=", "{", "}", '"', "'")))
        out.append(" ".join(parts))
    return out


def build_tokenizer(tokenizer_seed: int = 0):
    """The ByteLevel BPE tokenizer (a ``PreTrainedTokenizerFast``) trained on ``_corpus(tokenizer_seed)``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(tokenizer_seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(directory: str | os.PathLike[str], seed: int = 0, *, tokenizer_seed: int = 0) -> Path:
    """Write the tiny model (weights from ``seed``) and its tokenizer to ``directory``; return its path.

    The folder loads with ``HF_HUB_OFFLINE=1`` in vLLM and transformers. Weights are float32 safetensors.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(tokenizer_seed)
    # The BPE trainer gives the special tokens the first ids, in order.
    special = {
        name: SPECIAL_TOKENS.index(tok)
        for name, tok in (("bos", "<|begin|>"), ("eos", "<|end|>"), ("pad", "<|pad|>"))
    }
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=special["bos"],
        eos_token_id=special["eos"],
        pad_token_id=special["pad"],
        tie_word_embeddings=False,
        dtype="float32",
    )
    # Seeded on a private generator so callers' global RNG state is untouched.
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                # Larger than HF's default init (0.02) so greedy outputs vary with the context (a test needs
                # different weights to give different tokens).
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.2)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def main() -> None:  # pragma: no cover - manual use: python -m rollplan.executor.tiny_model DIR [SEED]
    import sys

    print(build_tiny_model(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))


if __name__ == "__main__":  # pragma: no cover
    main()
