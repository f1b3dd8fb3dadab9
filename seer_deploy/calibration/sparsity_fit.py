"""The sparsity detector's calibrated inputs: which sparsity rows to pool, each row's positional trend and step, and
the weights that pool them into one signal.

Every fit here is least squares or a rank statistic over a StepZeroSet and the true answer lengths; the detector
settings (floors, margin) are chosen on top of them in `detector_fit`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seer_deploy.calibration.collect import StepZeroSet, Thresholds
from seer_deploy.core.sparsity import SparsityRow
from seer_deploy.seer.config import SeerConfig, Trend
from seer_deploy.seer.metrics import padding_mask, position_matched_auc


@dataclass(frozen=True)
class SparsityRowFit:
    """One sparsity row's positional trend, residual spread and position-matched step (padding minus answer)."""

    trend: np.ndarray  # [G]
    scale: float
    step: float


def fit_sparsity_row(values: np.ndarray, true_len: np.ndarray) -> SparsityRowFit:
    """Fit x[n, p] = trend[p] + step * padding[n, p] + noise by least squares (the step compared at equal p)."""
    x = np.asarray(values, dtype=np.float64)
    pad = padding_mask(true_len, x.shape[1]).astype(np.float64)
    xc, pc = x - x.mean(axis=0), pad - pad.mean(axis=0)
    denom = float((pc * pc).sum())
    step = float((xc * pc).sum() / denom) if denom > 0 else 0.0
    trend = (x - step * pad).mean(axis=0)
    resid = x - trend - step * pad
    return SparsityRowFit(trend=trend, scale=max(float(resid.std()), 1e-9), step=step)


def pooling_weights(values: np.ndarray, true_len: np.ndarray, fits: list[SparsityRowFit],
                    shrink: float = 0.1) -> np.ndarray:
    """Discriminant weights for z-scored sparsity rows: inverse residual correlation times the standardized steps."""
    delta = np.array([f.step / f.scale for f in fits])
    if len(fits) == 1:
        return np.sign(delta) * np.maximum(np.abs(delta), 1e-6)
    pad = padding_mask(true_len, values.shape[2])
    resid = np.stack(
        [(values[:, r] - f.trend - f.step * pad) / f.scale for r, f in enumerate(fits)], axis=0
    ).reshape(len(fits), -1)
    corr = np.corrcoef(resid)
    corr = (1 - shrink) * np.nan_to_num(corr) + shrink * np.eye(len(fits))
    w = np.linalg.solve(corr, delta)
    return w / np.abs(w).max()


def auc_table(data: StepZeroSet, true_len: np.ndarray) -> dict[Thresholds, np.ndarray]:
    """Position-matched AUC of every sparsity row at every threshold pair: thresholds -> [len(data.sparsity_rows)]."""
    return {
        t: np.array([position_matched_auc(values[:, r], true_len) for r in range(len(data.sparsity_rows))])
        for t, values in data.sparsity.items()
    }


def pooling_candidates(sparsity_rows: tuple[SparsityRow, ...], aucs: np.ndarray,
                       n_layers: int) -> dict[str, tuple[SparsityRow, ...]]:
    """Sparsity rows to pool, as candidates: the best single row, the best layer, the last layer, every layer
    (of the layers the rows cover: an export reports its stats layers only, and may lack the last)."""
    sep = np.abs(aucs - 0.5)
    best = sparsity_rows[int(np.argmax(sep))]
    layers = sorted({r[0] for r in sparsity_rows})
    layer_sep = {layer: max(sep[i] for i, r in enumerate(sparsity_rows) if r[0] == layer) for layer in layers}
    best_layer = max(layer_sep, key=lambda layer: (layer_sep[layer], layer))
    last = tuple(r for r in sparsity_rows if r[0] == n_layers - 1)
    return {
        "best-row": (best,),
        "best-layer": tuple(r for r in sparsity_rows if r[0] == best_layer),
        **({"last-layer": last} if last else {}),
        "all-layers": sparsity_rows,
    }


def sparsity_config(data: StepZeroSet, true_len: np.ndarray, thresholds: Thresholds, pooled: tuple[SparsityRow, ...],
                    base: SeerConfig) -> SeerConfig:
    """A sparsity config pooling the sparsity rows `pooled` at `thresholds`, with trend and weights fitted on
    (data, true_len)."""
    index = [data.sparsity_rows.index(r) for r in pooled]
    values = data.sparsity[thresholds][:, index]
    fits = [fit_sparsity_row(values[:, i], true_len) for i in range(len(pooled))]
    weights = pooling_weights(values, true_len, fits)
    trend = Trend(
        gen_length=data.gen_length,
        mean=tuple(tuple(float(v) for v in f.trend) for f in fits),
        scale=tuple(f.scale for f in fits),
    )
    return base.with_(
        stats_layers=tuple(sorted({r[0] for r in pooled})),
        abs_threshold=thresholds[0],
        rel_threshold=thresholds[1],
        rows=pooled,
        weights=tuple(float(w) for w in weights),
        trends=(trend,),
    )
