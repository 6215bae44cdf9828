"""The toy model the workers serve: :class:`TinyDecoder`
(:mod:`.tiny_decoder`), a tiny deterministic transformer with seeded weights
whose output depends on every cached K/V row, so a read of freed-and-reused
blocks shows in the tokens."""

from __future__ import annotations

from .tiny_decoder import ModelConfig, TinyDecoder

__all__ = ["ModelConfig", "TinyDecoder"]
