"""Boundary detectors: where does the answer end, judged from step zero alone?

Each detector returns a `Boundary`: the first position of the EOS tail in [1, gen_length] and a confidence; below
its floor there is no clear boundary and the position is None (no truncation). All work on numpy arrays of one
response's profile, so the torch, ONNX Runtime and TensorRT paths share them.

* `sparsity` (the paper's method): pool the chosen MLP-sparsity rows into one signal (each row minus its calibrated
  positional trend, over its calibrated spread, weighted by its calibrated step), then score every split k by the
  step between the two sides over the pooled spread. Optionally a linear drift is fitted together with the step, so
  a smooth trend is not mistaken for a step. The best split wins; its score is the confidence.
* `eos`: the first position predicted EOS after which EOS keeps winning (up to `eos_tolerance` strays).
* `fused`: cuts only where the EOS detector is confident, at the later of the two confident boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.sparsity import SparsityRow
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.response_profile import ResponseProfile

EOS_WINS = 0.5  # an EOS probability at or above this beats every other token


@dataclass(frozen=True)
class Boundary:
    """A detector's answer for one response."""

    detector: str
    position: int | None  # first position of the EOS tail in [1, gen_length]; None = no clear boundary
    confidence: float  # the detector's own scale (SNR score for sparsity, EOS probability for eos)
    candidate: int | None = None  # the best position even when below the floor (for inspection and calibration)


def split_scores(
    signal: np.ndarray, *, score: str = "t", trend_term: bool = True, min_tail: int = 1, two_sided: bool = False
) -> np.ndarray:
    """Score of a step at every split k (tail = positions k..G-1); index k of the result, -inf where not allowed.

    The step height c_k is the coefficient of the indicator [p >= k] in a least-squares fit of the signal on
    [1, (p), indicator]; without the drift term it is the difference of the two sides' means. score 'snr' is c_k
    over the residual spread (the paper's SNR); 't' divides by c_k's standard error instead (the likelihood ratio
    statistic, which does not favour splits that leave a handful of points on one side).
    """
    y = np.asarray(signal, dtype=np.float64)
    G = y.shape[0]
    out = np.full(G + 1, -np.inf)
    n_params = 3 if trend_term else 2
    ks = np.arange(1, G - min_tail + 1)
    if G - n_params < 1 or ks.size == 0 or not np.all(np.isfinite(y)):
        return out
    spread = float(y.std())
    y = y - y.mean()
    p = np.arange(G, dtype=np.float64) / max(G - 1, 1) - 0.5
    # Tail sums for every k via reversed cumulative sums.
    tail_n = (G - ks).astype(np.float64)
    rev_p = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])
    rev_y = np.concatenate([np.cumsum(y[::-1])[::-1], [0.0]])
    tail_p, tail_y = rev_p[ks], rev_y[ks]
    m = ks.size
    if trend_term:
        xtx = np.empty((m, 3, 3))
        xtx[:, 0, 0], xtx[:, 0, 1], xtx[:, 1, 1] = G, p.sum(), (p * p).sum()
        xtx[:, 0, 2] = xtx[:, 2, 2] = tail_n
        xtx[:, 1, 2] = tail_p
        xtx[:, 1, 0], xtx[:, 2, 0], xtx[:, 2, 1] = xtx[:, 0, 1], xtx[:, 0, 2], xtx[:, 1, 2]
        xty = np.stack([np.full(m, y.sum()), np.full(m, (p * y).sum()), tail_y], axis=1)
    else:
        xtx = np.empty((m, 2, 2))
        xtx[:, 0, 0] = G
        xtx[:, 0, 1] = xtx[:, 1, 0] = xtx[:, 1, 1] = tail_n
        xty = np.stack([np.full(m, y.sum()), tail_y], axis=1)
    inv = np.linalg.inv(xtx)
    beta = np.einsum("mij,mj->mi", inv, xty)
    rss = np.maximum((y * y).sum() - np.einsum("mi,mi->m", beta, xty), 0.0)
    sigma = np.sqrt(rss / (G - n_params)) + 1e-6 * spread + 1e-12  # a noiseless step scores high, a flat one 0
    step = beta[:, -1]
    values = step / sigma if score == "snr" else step / (sigma * np.sqrt(inv[:, -1, -1]))
    out[ks] = np.abs(values) if two_sided else values
    return out


def pooled_sparsity_rows(profile: ResponseProfile, config: SeerConfig) -> tuple[SparsityRow, ...]:
    """The sparsity rows to pool: the config's, else every statistic of its stats_layers, else of the last reported layer."""
    if config.rows:
        return config.rows
    if not profile.sparsity_rows:
        return ()
    layers = set(config.stats_layers) or {max(layer for layer, _ in profile.sparsity_rows)}
    return tuple(r for r in profile.sparsity_rows if r[0] in layers)


def pooled_signal(profile: ResponseProfile, config: SeerConfig) -> tuple[np.ndarray, bool]:
    """The pooled, detrended sparsity signal [G] and whether its step direction is unknown (two-sided test)."""
    pooled = pooled_sparsity_rows(profile, config)
    if not pooled:
        raise ArtifactError("the sparsity detector needs step zero's sparsity rows, but the backend reported none; "
                            "export with the Seer statistics or use the 'eos' detector")
    x = profile.select(pooled).astype(np.float64)
    G = x.shape[1]
    trend = config.trend_for(G)
    if trend is not None:
        mean = np.asarray(trend.mean, dtype=np.float64)
        if mean.shape[1] >= G:
            mean = mean[:, :G]
        else:  # calibrated on a shorter response: hold the last value
            mean = np.concatenate([mean, np.repeat(mean[:, -1:], G - mean.shape[1], axis=1)], axis=1)
        z = (x - mean) / np.asarray(trend.scale, dtype=np.float64)[:, None]
    else:  # uncalibrated: standardize each row within the response
        z = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-12)
    weights = np.asarray(config.weights, dtype=np.float64) if config.weights else np.ones(len(pooled))
    if not config.weights and len(pooled) > 1:
        # Unknown directions: align every row with the first before pooling so opposite steps do not cancel.
        ref = z[0] - z[0].mean()
        weights = np.where((z - z.mean(axis=1, keepdims=True)) @ ref >= 0, 1.0, -1.0)
    signal = weights @ z / np.sqrt((weights * weights).sum())
    return signal, not config.weights


def detect_sparsity(profile: ResponseProfile, config: SeerConfig) -> Boundary:
    """The paper's detector: the best-scoring split of the pooled sparsity signal, if it clears `config.floor`."""
    signal, two_sided = pooled_signal(profile, config)
    scores = split_scores(
        signal, score=config.score, trend_term=config.trend_term, min_tail=config.min_tail, two_sided=two_sided
    )
    if not np.isfinite(scores).any():
        return Boundary("sparsity", None, 0.0, None)
    k = int(np.argmax(scores))  # ties: the lower position
    confidence = float(scores[k])
    return Boundary("sparsity", k if confidence >= config.floor else None, confidence, k)


def detect_eos(profile: ResponseProfile, eos_id: int, config: SeerConfig) -> Boundary:
    """The first position where EOS wins and keeps winning (at most `eos_tolerance` strays after it)."""
    wins = (profile.token_ids == eos_id) | (profile.eos_prob >= EOS_WINS)
    G = wins.shape[0]
    strays_after = np.concatenate([np.cumsum((~wins)[::-1])[::-1], [0]])  # non-EOS count in [p, G)
    hits = np.flatnonzero(wins & (strays_after[:G] <= config.eos_tolerance))
    if hits.size == 0:
        return Boundary("eos", None, 0.0, None)
    first = int(hits[0])
    k = min(max(1, first), G)  # the answer has at least one token
    confidence = float(profile.eos_prob[first])  # how sure step zero is that the tail starts here
    return Boundary("eos", k if confidence >= config.eos_floor else None, confidence, k)


def fuse(eos: Boundary, sparsity: Boundary) -> Boundary:
    """EOS gates, sparsity extends: cut only where the EOS detector is confident, at the later of its boundary and a
    confident sparsity boundary. So the cut is never earlier than either confident boundary, and never made where
    the more reliable EOS evidence is unclear (where the sparsity detector alone might still cut)."""
    if eos.position is None:
        return Boundary("fused", None, eos.confidence, eos.candidate)
    position = max(eos.position, sparsity.position or 0)
    confidence = eos.confidence if position == eos.position else sparsity.confidence
    return Boundary("fused", position, confidence, position)


def detect(profile: ResponseProfile, config: SeerConfig, eos_id: int) -> Boundary:
    """Run the configured detector on one response's profile."""
    if profile.gen_length < 1:
        raise ConfigError("an empty response has no boundary; gen_length must be >= 1")
    if config.detector == "eos":
        return detect_eos(profile, eos_id, config)
    if config.detector == "sparsity":
        return detect_sparsity(profile, config)
    return fuse(detect_eos(profile, eos_id, config), detect_sparsity(profile, config))
