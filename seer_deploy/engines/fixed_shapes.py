"""Fixed call shapes: a call's batch and sequence axes rounded up, so that calls of nearby shapes share buffers and
a captured CUDA graph (ONNX Runtime's, engines.ort_binding; TensorRT's, engines.tensorrt_engine).

Padding keeps every real position's result: padding rows repeat row 0 (a real row, so no row is all masked), padding
columns are zeros, which the attention mask keeps out of every real position's attention; the outputs are cut back
to the call's rows and columns. Which axes are batch and sequence is read from the graph's declaration (contracts.graphs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from seer_deploy.contracts.graphs import Axis, GraphIO
from seer_deploy.core.errors import ConfigError

DEFAULT_SEQ_MULTIPLE = 32


@dataclass(frozen=True)
class FixedShapes:
    """Rounds a call's batch up to a power of two and its sequence up to a multiple of `seq_multiple` (at most
    `max_seq`), so that calls of nearby shapes share buffers and a captured CUDA graph."""

    seq_multiple: int = DEFAULT_SEQ_MULTIPLE
    max_seq: int | None = None
    max_batch: int | None = None

    def __post_init__(self) -> None:
        if self.seq_multiple < 1:
            raise ConfigError(f"the sequence multiple must be >= 1, got {self.seq_multiple}")

    def batch(self, n: int) -> int:
        rounded = 1 << max(n - 1, 0).bit_length()
        return rounded if self.max_batch is None else max(n, min(rounded, self.max_batch))

    def seq(self, s: int) -> int:
        rounded = -(-s // self.seq_multiple) * self.seq_multiple
        return rounded if self.max_seq is None else max(s, min(rounded, self.max_seq))


def pad_feed(graph: GraphIO, feed: Mapping[str, np.ndarray], batch: int, seq: int) -> dict[str, np.ndarray]:
    """The feed with every declared BATCH axis grown to `batch` (rows repeat row 0, so every row stays a real one),
    every SEQ axis to `seq` (zeros: the attention mask's zeros keep the new columns out of every real position's
    attention) and the CANDIDATES axis to `seq` too (repeating each row's last candidate: the same column computed
    twice), so that one shape serves every call of a sequence length."""
    padded = {}
    for tensor in graph.inputs:
        value = feed[tensor.name]
        for axis, kind in tensor.dynamic_axes().items():
            have = value.shape[axis]
            if kind is Axis.BATCH and batch > have:
                value = np.concatenate([value, np.repeat(np.take(value, [0], axis=axis), batch - have, axis)], axis)
            elif kind in (Axis.SEQ, Axis.CANDIDATES) and seq > have:
                widths = [(0, 0)] * value.ndim
                widths[axis] = (0, seq - have)
                value = np.pad(value, widths, mode="constant" if kind is Axis.SEQ else "edge")
        padded[tensor.name] = np.ascontiguousarray(value)
    return padded


def unpad_outputs(graph: GraphIO, outputs: Mapping[str, np.ndarray], batch: int, seq: int) -> dict[str, np.ndarray]:
    """The outputs of a padded call cut back to the call's own rows and columns."""
    cut = {}
    for name, value in outputs.items():
        index: list[slice] = [slice(None)] * value.ndim
        for axis, kind in graph.tensor(name).dynamic_axes().items():
            index[axis] = slice(0, batch) if kind is Axis.BATCH else slice(0, seq) if kind is Axis.SEQ else index[axis]
        cut[name] = value[tuple(index)]
    return cut
