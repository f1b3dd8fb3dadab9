"""Timing one row over the prompt list: a warm-up batch (not counted), then `repeats` timed passes.

A request's latency is the wall time of the batch call that answered it (every request of a batch waits for the
whole batch). A pass's seconds are the sum of its batch calls. Outputs are greedy, so the first pass's tokens and
costs stand for all of them; the timings are reduced by medians (see `RowTiming`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from seer_deploy.bench.rows import BatchOutput, Runner
from seer_deploy.core.errors import ConfigError
from seer_deploy.service import Prompt


@dataclass
class RowTiming:
    """One row's outputs over all prompts and its timings."""

    tokens: np.ndarray  # int64 [N, gen_length]
    forward_passes: int  # over all batches of one pass
    tokens_processed: int
    kept: list[int] | None  # per request (Seer / oracle rows)
    seconds_runs: list[float]  # one per timed pass
    latencies: np.ndarray  # float64 [repeats, N]: seconds of the batch call that answered each request
    step_zero_share: float = 0.0  # of the first timed pass's seconds, the share spent in step zero
    first_step_seconds: float | None = None  # the warm-up call's time to first step (service rows)

    @property
    def seconds(self) -> float:
        """Median over the timed passes of the seconds for all prompts."""
        return float(statistics.median(self.seconds_runs))

    def latency_percentile(self, q: float) -> float:
        """The q-th percentile over requests of each request's median latency across passes."""
        per_request = np.median(self.latencies, axis=0)
        return float(np.percentile(per_request, q))


def batches(n: int, batch_size: int) -> list[list[int]]:
    """Prompt indices in consecutive batches of `batch_size` (the last may be shorter)."""
    if n < 1 or batch_size < 1:
        raise ConfigError(f"need at least one prompt and a batch size >= 1 (got {n} prompts, batch {batch_size})")
    return [list(range(lo, min(lo + batch_size, n))) for lo in range(0, n, batch_size)]


def measure_row(
    runner: Runner,
    requests: Sequence[Prompt],
    batch_size: int,
    repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> RowTiming:
    """Warm up on the first batch, then time `repeats` passes over all requests; `tick` after each of those."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    groups = batches(len(requests), batch_size)
    warm_up = runner([requests[i] for i in groups[0]], groups[0])  # first calls at a shape allocate: not timed
    tick()
    first: list[BatchOutput] = []
    latencies = np.zeros((repeats, len(requests)))
    seconds_runs = []
    for r in range(repeats):
        total = 0.0
        for idx in groups:
            start = time.perf_counter()
            out = runner([requests[i] for i in idx], idx)
            elapsed = time.perf_counter() - start
            total += elapsed
            latencies[r, idx] = elapsed
            if r == 0:
                first.append(out)
        seconds_runs.append(total)
        tick()
    kept = None if any(o.kept is None for o in first) else [k for o in first for k in o.kept or []]
    return RowTiming(
        tokens=np.concatenate([o.tokens for o in first]),
        forward_passes=sum(o.forward_passes for o in first),
        tokens_processed=sum(o.tokens_processed for o in first),
        kept=kept,
        seconds_runs=seconds_runs,
        latencies=latencies,
        step_zero_share=sum(o.step_zero_seconds for o in first) / seconds_runs[0] if seconds_runs[0] > 0 else 0.0,
        first_step_seconds=warm_up.first_step_seconds,
    )
