"""Fit Seer's detectors and margin so a target share of answers is kept whole (the safe rate).

Step zero and full-length generation run on a prompt set; the true end of each answer is the first EOS of its
full-length output. Half the prompts (by default) choose the settings, the other half validate them, and both
results go into the config's `calibration` record. For the sparsity detector the search covers the thresholds,
which sparsity rows to pool (the best single row, the best layer, the last layer, every layer), the split score, and
the in-response drift term; the positional trend of each row and its step (its pooling weight) are fitted on the
calibration half (`sparsity_fit`). For every candidate the floor and the margin are the pair that meets the target
safe share with the smallest mean kept length.

A safe cut does not guarantee the same answer: `identity_fit` can then fit the margin, and if no margin is enough the
tail context, end to end against the full-length answers (`calibrate --target-identical`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seer_deploy.calibration.collect import StepZeroSet, Thresholds, stop_ids
from seer_deploy.calibration.sources import AnswerSource
from seer_deploy.calibration.sparsity_fit import auc_table, pooling_candidates, sparsity_config
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.core.sparsity import STAT_NAMES
from seer_deploy.seer.config import DETECTORS, SeerConfig
from seer_deploy.seer.detect import Boundary, detect_eos, detect_sparsity, fuse
from seer_deploy.seer.metrics import cut_metrics, true_lengths
from seer_deploy.seer.plan import kept_length

NEVER = 1e9  # a floor no score reaches: the detector never cuts
DEFAULT_THRESHOLDS: tuple[Thresholds, ...] = ((0.01, 0.01), (0.02, 0.02), (0.05, 0.05), (0.1, 0.1))


@dataclass(frozen=True)
class CalibrationOptions:
    target_safe: float = 0.995  # share of answers that must be kept whole
    holdout: float = 0.5  # share of prompts kept apart for validation
    seed: int = 0
    detector: str = "fused"  # the detector the written config uses
    min_margin: int = 0
    thresholds: tuple[Thresholds, ...] = DEFAULT_THRESHOLDS
    eos_tolerances: tuple[int, ...] = (0, 1, 2, 4)
    buckets: tuple[int, ...] = ()

    def validate(self) -> None:
        if not 0.5 <= self.target_safe <= 1.0:
            raise ConfigError(f"target safe share {self.target_safe} must lie in [0.5, 1]")
        if not 0.0 < self.holdout < 1.0:
            raise ConfigError(f"holdout share {self.holdout} must lie strictly between 0 and 1")
        if self.detector not in DETECTORS:
            raise ConfigError(f"detector '{self.detector}' is unknown; use one of {', '.join(DETECTORS)}")
        if self.min_margin < 0:
            raise ConfigError("min_margin must be >= 0")


@dataclass
class CalibrationResult:
    config: SeerConfig
    report: dict[str, Any] = field(default_factory=dict)


# -- floors and margins -------------------------------------------------------------------------------------------
def choose_floor_margin(
    candidate: np.ndarray,
    confidence: np.ndarray,
    true_len: np.ndarray,
    gen_length: int,
    target: float,
    min_margin: int = 0,
    floors: Sequence[float] | None = None,
) -> tuple[float, int, float]:
    """(floor, margin, mean kept): the pair meeting `target` safe share with the least mean kept length.

    candidate [N]: each response's best boundary (-1 = none); a response is cut when its confidence reaches the
    floor, and kept = candidate + margin. Ties go to the higher floor (fewer cuts). Floors are never negative (a
    config refuses them; a small prompt set or an export's few statistics can score a boundary below zero).
    """
    n = candidate.size
    allowed = int(np.floor(n * (1 - target) + 1e-9))
    has = candidate >= 1
    if floors is None:
        conf = np.unique(confidence[has & (confidence >= 0)])
        picks = conf if conf.size <= 96 else np.quantile(conf, np.linspace(0, 1, 96))
        floors = [*picks.tolist(), NEVER]
    best: tuple[float, int, float] = (NEVER, min_margin, float(gen_length))
    for f in sorted(set(floors), reverse=True):
        cut = has & (confidence >= f)
        need = np.sort(np.maximum(0, true_len - candidate)[cut])
        margin = int(need[need.size - allowed - 1]) if need.size > allowed else 0
        margin = max(margin, min_margin)
        kept = np.where(cut, np.minimum(gen_length, candidate + margin), gen_length)
        mean_kept = float(kept.mean())
        if mean_kept < best[2] - 1e-9:
            best = (float(f), margin, mean_kept)
    return best


def boundaries(data: StepZeroSet, config: SeerConfig, eos_id: int, detector: str) -> list[Boundary]:
    """Each response's boundary under `config` with `detector`."""
    thresholds = (config.abs_threshold, config.rel_threshold)
    out = []
    for i in range(data.n):
        profile = data.profile(i, thresholds) if thresholds in data.sparsity else data.profile(i, next(iter(data.sparsity)))
        if detector == "eos":
            out.append(detect_eos(profile, eos_id, config))
        elif detector == "sparsity":
            out.append(detect_sparsity(profile, config))
        else:
            out.append(fuse(detect_eos(profile, eos_id, config), detect_sparsity(profile, config)))
    return out


def candidates(found: list[Boundary]) -> tuple[np.ndarray, np.ndarray]:
    """Each boundary's best position (-1 = none) and confidence, as arrays."""
    cand = np.array([-1 if b.candidate is None else b.candidate for b in found])
    conf = np.array([b.confidence for b in found])
    return cand, conf


def evaluate(data: StepZeroSet, true_len: np.ndarray, config: SeerConfig, eos_id: int, detector: str) -> dict[str, float]:
    """Cut metrics of `detector` under `config` (floors and margin applied) on a prompt set."""
    found = boundaries(data, config, eos_id, detector)
    pos = np.array([-1 if b.position is None else b.position for b in found])
    kept = np.array([kept_length(b.position, config.margin, data.gen_length, config.buckets) for b in found])
    return cut_metrics(pos, kept, true_len, data.gen_length).to_dict()


# -- the whole safe-rate fit ----------------------------------------------------------------------------------------
def split_indices(n: int, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split into calibration and validation indices (both sorted, both non-empty)."""
    if n < 4:
        raise ConfigError(f"calibration needs at least 4 prompts (got {n}); give more with --prompts")
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(n - 2, max(2, round(n * holdout)))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def fit_detectors(
    data: StepZeroSet,
    true_len: np.ndarray,
    eos_id: int,
    n_layers: int,
    options: CalibrationOptions = CalibrationOptions(),
) -> CalibrationResult:
    """Choose every Seer setting on the calibration split and validate it on the held-out split."""
    options.validate()
    G = data.gen_length
    cal, val = split_indices(data.n, options.holdout, options.seed)
    dcal, dval, tcal, tval = data.subset(cal), data.subset(val), true_len[cal], true_len[val]
    target, mm = options.target_safe, options.min_margin
    base = SeerConfig(buckets=options.buckets)

    # EOS: tolerance, floor and margin.
    eos_best: tuple[float, SeerConfig] | None = None
    for tol in options.eos_tolerances:
        cfg = base.with_(detector="eos", eos_tolerance=tol, eos_floor=0.0)
        cand, conf = candidates(boundaries(dcal, cfg, eos_id, "eos"))
        floor, margin, mean_kept = choose_floor_margin(cand, conf, tcal, G, target, mm)
        if eos_best is None or mean_kept < eos_best[0] - 1e-9:
            eos_best = (mean_kept, cfg.with_(eos_floor=floor if floor < NEVER else 1.01, margin=margin))
    assert eos_best is not None
    eos_cfg = eos_best[1]

    # Sparsity: thresholds, rows, score and drift term; trend and weights fitted on the calibration split.
    aucs = auc_table(dcal, tcal)
    sp_best: tuple[float, SeerConfig, str] | None = None
    for thresholds in data.sparsity:
        for name, pooled in pooling_candidates(data.sparsity_rows, aucs[thresholds], n_layers).items():
            fitted = sparsity_config(dcal, tcal, thresholds, pooled, base)
            for score in ("t", "snr"):
                for trend_term in (False, True):
                    cfg = fitted.with_(detector="sparsity", score=score, trend_term=trend_term, floor=0.0)
                    cand, conf = candidates(boundaries(dcal, cfg, eos_id, "sparsity"))
                    floor, margin, mean_kept = choose_floor_margin(cand, conf, tcal, G, target, mm)
                    if sp_best is None or mean_kept < sp_best[0] - 1e-9:
                        label = f"{name} @ abs {thresholds[0]} / rel {thresholds[1]}, score {score}, drift {trend_term}"
                        sp_best = (mean_kept, cfg.with_(floor=floor, margin=margin), label)
    assert sp_best is not None
    sp_cfg = sp_best[1]

    # Fused: the chosen components with their floors; only the margin is chosen again.
    fused_cfg = sp_cfg.with_(
        detector="fused", eos_tolerance=eos_cfg.eos_tolerance, eos_floor=eos_cfg.eos_floor, margin=0
    )
    cand, _ = candidates(boundaries(dcal, fused_cfg, eos_id, "fused"))
    _, margin, _ = choose_floor_margin(cand, np.zeros(cand.size), tcal, G, target, mm, floors=[0.0])
    fused_cfg = fused_cfg.with_(margin=margin)

    by_name = {"eos": eos_cfg, "sparsity": sp_cfg, "fused": fused_cfg}
    report: dict[str, Any] = {
        "gen_length": G,
        "target_safe": target,
        "n_calibration": int(cal.size),
        "n_validation": int(val.size),
        "mean_true_length": round(float(true_len.mean()), 3),
        "sparsity_choice": sp_best[2],
        "detectors": {
            name: {
                "margin": cfg.margin,
                "floor": cfg.eos_floor if name == "eos" else cfg.floor,
                "calibration": evaluate(dcal, tcal, cfg, eos_id, name),
                "validation": evaluate(dval, tval, cfg, eos_id, name),
            }
            for name, cfg in by_name.items()
        },
        "auc": {
            f"abs {t[0]} / rel {t[1]}": {f"{layer}/{stat}": round(float(a[i]), 4) for i, (layer, stat) in enumerate(data.sparsity_rows)}
            for t, a in aucs.items()
        },
    }
    # Every detector's settings travel in the file, so switching detector only needs that detector's margin.
    chosen = sp_cfg.with_(
        detector=options.detector,
        margin=by_name[options.detector].margin,
        eos_tolerance=eos_cfg.eos_tolerance,
        eos_floor=eos_cfg.eos_floor,
        calibration=report,
    )
    return CalibrationResult(config=chosen, report=report)


def calibrate_model(
    source: AnswerSource,
    prompts: Sequence[list[int]],
    config: GenerationConfig,
    options: CalibrationOptions = CalibrationOptions(),
    *,
    full_tokens: np.ndarray | None = None,
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationResult:
    """Run step zero and full-length generation on `prompts` with `source` (a checkpoint's torch model, or an
    export's backend: `calibration.sources`), then `fit_detectors` (full_tokens: reuse a cached run). A torch model
    may be an ImageConditionedModel whose prompts hold image ids (`prompt_set`)."""
    options.validate()
    cfg = source.cfg
    config.check_fits(cfg.max_seq_len, max(len(p) for p in prompts))
    if full_tokens is None:
        full_tokens = source.answers(prompts, config, batch_size=batch_size, progress=progress)[0]
    if full_tokens.shape != (len(prompts), config.gen_length):
        raise ConfigError(f"cached full-length answers have shape {full_tokens.shape}, expected "
                          f"{(len(prompts), config.gen_length)}; delete the cache and rerun")
    true_len = true_lengths(full_tokens, stop_ids(cfg))
    data = source.step_zero(prompts, config.gen_length, options.thresholds, batch_size)
    result = fit_detectors(data, true_len, cfg.eos_id, cfg.n_layers, options)
    result.report["steps"] = config.steps
    result.report["block_length"] = config.block
    result.report["stat_names"] = list(STAT_NAMES)
    result.report["statistics"] = source.statistics(options.thresholds)
    return result
