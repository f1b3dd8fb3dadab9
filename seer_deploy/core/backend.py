"""The one small interface every backend implements: run step zero, run a step, at a given length and batch.

Backends (torch eager = the reference, ONNX Runtime, TensorRT) return compact per-position outputs: the chosen token
and its log-probability (the commit score, see `models.confidence`), so a step moves B x S numbers to the host
rather than B x S x V logits. Step zero also returns the EOS probability and Seer's sparsity statistics.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np


class StepOutput(NamedTuple):
    token_ids: np.ndarray  # int64 [B, S]: x0, the argmax (or Gumbel-max sample) per position
    confidence: np.ndarray  # float32 [B, S]: log softmax probability of x0 (temperature-free logits)


class Step0Output(NamedTuple):
    token_ids: np.ndarray  # int64 [B, S]
    confidence: np.ndarray  # float32 [B, S]
    eos_prob: np.ndarray  # float32 [B, S]: softmax probability of EOS
    sparsity: np.ndarray  # float32 [B, K, S]: rows described by `Backend.sparsity_rows`


class Backend(Protocol):
    """What the runtime loop needs from an engine. input_ids / attention_mask are int64 [B, S] (mask 1 = real)."""

    name: str
    max_seq_len: int
    sparsity_rows: list[tuple[int, str]]  # (layer, statistic name) of each of the K sparsity rows

    def step0(self, input_ids: np.ndarray, attention_mask: np.ndarray | None) -> Step0Output: ...

    def step(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> StepOutput: ...
