"""A response's step-zero profile as plain numpy arrays, so every backend feeds the same detectors.

Backends return `Step0Output` over the whole (left-padded) sequence; the detectors see only the response part:
positions 0..gen_length-1 after the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seer_deploy.core.backend import Step0Output
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.sparsity import SparsityRow


@dataclass(frozen=True)
class ResponseProfile:
    """Step zero's view of one response: prediction per position and the MLP statistics (sparsity rows)."""

    token_ids: np.ndarray  # int64 [G]: step-zero argmax (or sample) per response position
    eos_prob: np.ndarray  # float32 [G]: step-zero softmax probability of EOS
    sparsity: np.ndarray  # float32 [K, G]: one row per entry of `sparsity_rows`
    sparsity_rows: tuple[SparsityRow, ...]
    confidence: np.ndarray | None = None  # float32 [G]: log-probability of token_ids

    @property
    def gen_length(self) -> int:
        return int(self.token_ids.shape[0])

    def select(self, wanted: tuple[SparsityRow, ...]) -> np.ndarray:
        """The sparsity rows in `wanted` order [len(wanted), G]; a missing row is an error that names the fix."""
        index = {row: i for i, row in enumerate(self.sparsity_rows)}
        missing = [row for row in wanted if row not in index]
        if missing:
            raise ArtifactError(
                f"the seer config pools sparsity rows {missing}, but step zero reports only {list(self.sparsity_rows)}; "
                "re-export (or rerun) with this --seer-config so step zero computes them"
            )
        return self.sparsity[[index[row] for row in wanted]]



def profiles_from_step0(out: Step0Output, sparsity_rows: list[SparsityRow], prompt_width: int,
                        gen_length: int) -> list[ResponseProfile]:
    """Split a batched step-zero output (left-padded prompts of `prompt_width`) into per-response profiles."""
    S = out.token_ids.shape[1]
    if prompt_width + gen_length != S:
        raise ConfigError(
            f"step zero ran {S} positions, but prompt width {prompt_width} + gen_length {gen_length} = "
            f"{prompt_width + gen_length}; pass the widths the step ran with"
        )
    if out.sparsity.shape[1] != len(sparsity_rows):
        raise ArtifactError(
            f"step zero returned {out.sparsity.shape[1]} sparsity rows but {len(sparsity_rows)} row labels; "
            "the backend's sparsity_rows does not match its graph"
        )
    lo = prompt_width
    return [
        ResponseProfile(
            token_ids=np.asarray(out.token_ids[b, lo:], dtype=np.int64),
            eos_prob=np.asarray(out.eos_prob[b, lo:], dtype=np.float32),
            sparsity=np.asarray(out.sparsity[b, :, lo:], dtype=np.float32),
            sparsity_rows=tuple(sparsity_rows),
            confidence=np.asarray(out.confidence[b, lo:], dtype=np.float32),
        )
        for b in range(out.token_ids.shape[0])
    ]
