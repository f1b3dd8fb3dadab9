"""The contract of the step graph's sampling inputs, shared by every backend that runs an export.

The step graph takes `temperature` [B] and `sample_uniform` [B, S]. Where temperature[b] == 0 the token is the argmax
(ties to the lowest id) and the uniforms are ignored; where it is > 0 the token is an exact draw from
softmax(logits / T) by inverse CDF, #{v : cumsum(softmax(logits / T))[v] < u}, which is the distribution LLaDA's
Gumbel-max `argmax(exp(l) / (-log g)^T)` samples from (equal in distribution, not in values). The confidence is always
softmax(logits)[token], the temperature-free probability LLaDA's low_confidence remasking ranks by. `random`
remasking needs nothing from the graph: the host draws those scores itself.

Backends draw the uniforms with `draw_uniform(seed, shape)` so that the same seed gives the same tokens on ONNX
Runtime and TensorRT.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seer_deploy.contracts.graphs import SAMPLE_UNIFORM, STEP, TEMPERATURE


def draw_uniform(seed: int | None, shape: tuple[int, int]) -> np.ndarray:
    """float32 uniforms in (0, 1] (u = 0 would always pick token 0): 1 - default_rng(seed).random(shape)."""
    return (np.float32(1.0) - np.random.default_rng(seed).random(shape, dtype=np.float32)).astype(np.float32)


def step_feed(
    batch: int, seq: int, temperature: float | np.ndarray, seed: int | None, uniform: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The step graph's sampling inputs for one call: per-row temperatures and (only if one is > 0) the uniforms
    given, else fresh ones from `seed`."""
    temps = np.broadcast_to(np.asarray(temperature, dtype=np.float32), (batch,)).copy()
    if uniform is not None:
        uniform = np.ascontiguousarray(uniform, dtype=np.float32)
    elif (temps > 0).any():
        uniform = draw_uniform(seed, (batch, seq))
    else:
        uniform = np.ones((batch, seq), dtype=np.float32)  # ignored by the graph
    return {TEMPERATURE.name: temps, SAMPLE_UNIFORM.name: uniform}


def manifest_entry() -> dict[str, Any]:
    """The manifest's `sampling` section: how temperature > 0 works, written out so nothing downstream guesses."""
    return {
        "method": "inverse_cdf",
        "graph": STEP.name,
        "inputs": {
            TEMPERATURE.name: "float32 [batch]; 0 = greedy argmax (ties to the lowest id), > 0 = sample",
            SAMPLE_UNIFORM.name: "float32 [batch, seq] in (0, 1]; ignored in rows whose temperature is 0",
        },
        "token": "where temperature > 0: min(#{v : cumsum(softmax(logits / temperature))[v] < u}, V - 1)",
        "confidence": "softmax(logits)[token] (temperature-free)",
        "host_uniform": "1 - numpy.random.default_rng(seed).random((batch, seq), dtype=float32)",
        "random_remasking": "host-drawn scores; the graph's confidence is not used",
        "step0": "greedy only (argmax)",
        "note": "equal in distribution to LLaDA's Gumbel-max sampling, not in values; cumsum in float32",
    }
