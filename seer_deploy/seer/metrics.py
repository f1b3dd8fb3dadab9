"""How good is a cut? True answer lengths, position-matched separation, safe / exact rates and kept share."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def true_lengths(tokens: np.ndarray, stop_ids: set[int]) -> np.ndarray:
    """First stop-token position of each full-length response [N, G] (G when the answer fills every slot)."""
    stops = np.isin(tokens, list(stop_ids))
    G = tokens.shape[1]
    return np.where(stops.any(axis=1), stops.argmax(axis=1), G).astype(np.int64)


def identical_share(tokens: np.ndarray, full: np.ndarray, true_len: np.ndarray) -> float:
    """Share of rows with the same tokens as full length up to and including the full-length answer's first EOS."""
    upto = np.minimum(true_len + 1, full.shape[1])
    return float(np.mean([np.array_equal(tokens[i, : upto[i]], full[i, : upto[i]]) for i in range(len(full))]))


def padding_mask(true_len: np.ndarray, gen_length: int) -> np.ndarray:
    """bool [N, G]: True at the EOS padding (positions at or after the true end)."""
    return np.arange(gen_length)[None, :] >= np.asarray(true_len)[:, None]


def position_matched_auc(values: np.ndarray, true_len: np.ndarray) -> float:
    """P(padding value > answer value) for pairs at the same position, pooled over positions (0.5 = no signal).

    Comparing at the same position removes what a positional drift alone would give away.
    """
    values = np.asarray(values, dtype=np.float64)
    G = values.shape[1]
    pad = padding_mask(true_len, G)
    wins = pairs = 0.0
    for p in range(G):
        a, b = values[~pad[:, p], p], values[pad[:, p], p]
        if a.size == 0 or b.size == 0:
            continue
        both = np.concatenate([a, b])
        ranks = average_ranks(both)
        u = ranks[a.size :].sum() - b.size * (b.size + 1) / 2  # Mann-Whitney U of the padding side
        wins += u
        pairs += a.size * b.size
    return wins / pairs if pairs else 0.5


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(1, x.size + 1)
    uniq, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    if uniq.size < x.size:
        sums = np.bincount(inverse, weights=ranks)
        ranks = (sums / counts)[inverse]
    return ranks


def mixed_auc(values: np.ndarray, pad: np.ndarray) -> float:
    """P(padding value > answer value) over all positions mixed: what a positional drift alone can give away."""
    v, p = np.asarray(values, dtype=np.float64).reshape(-1), np.asarray(pad, dtype=bool).reshape(-1)
    n1, n0 = int(p.sum()), int((~p).sum())
    if n1 == 0 or n0 == 0:
        return 0.5
    return float((average_ranks(v)[p].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


@dataclass(frozen=True)
class CutMetrics:
    """Cuts of one detector over a prompt set."""

    n: int
    safe: float  # share kept at or past the true end (kept >= true length)
    exact: float  # share whose detected boundary is the true end exactly
    truncated: float  # share actually cut (kept < gen_length)
    mean_overshoot: float  # mean of kept - true length over the safe ones
    mean_kept: float
    kept_fraction: float  # mean kept / gen_length
    mean_true: float

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def cut_metrics(boundary: np.ndarray, kept: np.ndarray, true_len: np.ndarray, gen_length: int) -> CutMetrics:
    """boundary [N] (-1 = none), kept [N], true_len [N]."""
    boundary, kept, true_len = (np.asarray(a, dtype=np.int64) for a in (boundary, kept, true_len))
    safe = kept >= true_len
    return CutMetrics(
        n=int(kept.size),
        safe=float(safe.mean()),
        exact=float((boundary == true_len).mean()),
        truncated=float((kept < gen_length).mean()),
        mean_overshoot=float((kept - true_len)[safe].mean()) if safe.any() else 0.0,
        mean_kept=float(kept.mean()),
        kept_fraction=float(kept.mean() / gen_length),
        mean_true=float(true_len.mean()),
    )
