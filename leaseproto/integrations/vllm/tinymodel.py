"""A tiny random model built locally, for real-engine tests without downloads.

Greedy decoding of a random model is deterministic, so a single-instance run
of the same model is the reference for P/D outputs. Needs ``transformers``,
``tokenizers`` and ``torch`` (all come with vLLM); imports them only when called.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["WORDS", "build_tiny_model", "hf_cache_with"]

_SNAPSHOT = "0" * 40


#: The tokenizer's words (prompts built from them tokenize one token per word).
WORDS = tuple(
    [
        "the",
        "cache",
        "lease",
        "prefill",
        "decode",
        "block",
        "heartbeat",
        "request",
        "engine",
        "token",
        "read",
        "model",
        "tiny",
        "random",
        "server",
        "queue",
        "stall",
        "kill",
        "grant",
        "renew",
        "expire",
        "abort",
    ]
)


def _corpus() -> list[str]:
    words = WORDS
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(200)]


def build_tiny_model(path: str | Path, *, seed: int = 0, layers: int = 2) -> Path:
    """Write a 2-layer Qwen3 (hidden 128, 2 heads, head_dim 64, bf16) and a
    word-level tokenizer into ``path``; returns it. Idempotent per path."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(path)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        _corpus(),
        trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>", "<pad>"], vocab_size=512),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    cfg: Any = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=True,
        # the default 0.02 gives a model that repeats one token whatever the context, so a read
        # of wrong KV would go unseen; 0.2 makes greedy outputs depend on the prompt
        initializer_range=0.2,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def hf_cache_with(
    home: str | Path, models: dict[str, Path], base: str | Path | None = None
) -> Path:
    """An ``HF_HOME`` folder whose ``hub`` holds ``base`` (a hub cache, e.g. the
    peers' ``hf-offline``) plus each model dir under its hub name. Returns home."""
    home = Path(home)
    hub = home / "hub"
    if base is not None and not hub.exists():
        shutil.copytree(base, hub)
    hub.mkdir(parents=True, exist_ok=True)
    for name, src in models.items():
        repo = hub / ("models--" + name.replace("/", "--"))
        snap = repo / "snapshots" / _SNAPSHOT
        if snap.exists():
            continue
        shutil.copytree(src, snap)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(_SNAPSHOT)
    (home / "leaseproto-cache.json").write_text(json.dumps(sorted(models)))
    return home
