"""Calibration: pick Seer's statistics, trend, floors and margin so a target share of answers is kept whole.

Step zero and full-length generation run on a prompt set; the true end of each answer is the first EOS of its
full-length output. Half the prompts (by default) choose the settings, the other half validate them, and both
results go into the config's `calibration` record. For the sparsity detector the search covers the thresholds,
which rows to pool (the best single row, the best layer, the last layer, every layer), the split score, and the
in-response drift term; the positional trend of each row and its step (its pooling weight) are fitted on the
calibration half. For every candidate the floor and the margin are the pair that meets the target safe share with
the smallest mean kept length.

A safe cut does not guarantee the same answer, so `fit_identity_margin` can then fit the margin, and if no margin is
enough the tail context, end to end against the full-length answers (`calibrate --target-identical`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seer_deploy.calibration.collect import StepZeroSet, Thresholds, batched_generation, full_generation, step_zero_set
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.core.sparsity import STAT_NAMES, SparsityRow
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.seer.config import DETECTORS, SeerConfig, TailContext, Trend, check_tail_context
from seer_deploy.seer.detect import Boundary, detect_eos, detect_sparsity, fuse
from seer_deploy.seer.metrics import cut_metrics, identical_share, padding_mask, position_matched_auc, true_lengths
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


# -- fitting the sparsity statistics ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowFit:
    """One row's positional trend, residual spread and position-matched step (padding minus answer)."""

    trend: np.ndarray  # [G]
    scale: float
    step: float


def fit_row(values: np.ndarray, true_len: np.ndarray) -> RowFit:
    """Fit x[n, p] = trend[p] + step * padding[n, p] + noise by least squares (the step compared at equal p)."""
    x = np.asarray(values, dtype=np.float64)
    pad = padding_mask(true_len, x.shape[1]).astype(np.float64)
    xc, pc = x - x.mean(axis=0), pad - pad.mean(axis=0)
    denom = float((pc * pc).sum())
    step = float((xc * pc).sum() / denom) if denom > 0 else 0.0
    trend = (x - step * pad).mean(axis=0)
    resid = x - trend - step * pad
    return RowFit(trend=trend, scale=max(float(resid.std()), 1e-9), step=step)


def pooling_weights(values: np.ndarray, true_len: np.ndarray, fits: list[RowFit], shrink: float = 0.1) -> np.ndarray:
    """Discriminant weights for z-scored rows: inverse residual correlation times the standardized steps."""
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
    """Position-matched AUC of every row at every threshold pair: thresholds -> [R]."""
    return {
        t: np.array([position_matched_auc(values[:, r], true_len) for r in range(len(data.rows))])
        for t, values in data.sparsity.items()
    }


def row_sets(rows: tuple[SparsityRow, ...], aucs: np.ndarray, n_layers: int) -> dict[str, tuple[SparsityRow, ...]]:
    """Candidate rows to pool: the best single row, the best layer, the last layer, every layer."""
    sep = np.abs(aucs - 0.5)
    best = rows[int(np.argmax(sep))]
    layer_sep = {layer: max(sep[i] for i, r in enumerate(rows) if r[0] == layer) for layer in range(n_layers)}
    best_layer = max(layer_sep, key=lambda layer: (layer_sep[layer], layer))
    return {
        "best-row": (best,),
        "best-layer": tuple(r for r in rows if r[0] == best_layer),
        "last-layer": tuple(r for r in rows if r[0] == n_layers - 1),
        "all-layers": rows,
    }


def sparsity_config(data: StepZeroSet, true_len: np.ndarray, thresholds: Thresholds, rows: tuple[SparsityRow, ...],
                    base: SeerConfig) -> SeerConfig:
    """A sparsity config pooling `rows` at `thresholds`, with trend and weights fitted on (data, true_len)."""
    index = [data.rows.index(r) for r in rows]
    values = data.sparsity[thresholds][:, index]
    fits = [fit_row(values[:, i], true_len) for i in range(len(rows))]
    weights = pooling_weights(values, true_len, fits)
    trend = Trend(
        gen_length=data.gen_length,
        mean=tuple(tuple(float(v) for v in f.trend) for f in fits),
        scale=tuple(f.scale for f in fits),
    )
    return base.with_(
        stats_layers=tuple(sorted({r[0] for r in rows})),
        abs_threshold=thresholds[0],
        rel_threshold=thresholds[1],
        rows=rows,
        weights=tuple(float(w) for w in weights),
        trends=(trend,),
    )


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
    floor, and kept = candidate + margin. Ties go to the higher floor (fewer cuts).
    """
    n = candidate.size
    allowed = int(np.floor(n * (1 - target) + 1e-9))
    has = candidate >= 1
    if floors is None:
        conf = np.unique(confidence[has])
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


# -- the whole calibration ----------------------------------------------------------------------------------------
def split_indices(n: int, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split into calibration and validation indices (both sorted, both non-empty)."""
    if n < 4:
        raise ConfigError(f"calibration needs at least 4 prompts (got {n}); give more with --prompts")
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(n - 2, max(2, round(n * holdout)))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def calibrate(
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
        for name, rows in row_sets(data.rows, aucs[thresholds], n_layers).items():
            fitted = sparsity_config(dcal, tcal, thresholds, rows, base)
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
            f"abs {t[0]} / rel {t[1]}": {f"{layer}/{stat}": round(float(a[i]), 4) for i, (layer, stat) in enumerate(data.rows)}
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


@dataclass(frozen=True)
class IdentityFit:
    """The margin and tail context fitted end to end, and every run on the way
    ({margin, tail_context, identical, mean_kept, mean_width} each; width = kept + tail-context slots)."""

    margin: int
    tail_context: TailContext
    rule: str
    target_identical: float
    tried: list[dict[str, Any]]

    @property
    def identical(self) -> float:
        """The identical share of the chosen run."""
        return next(float(t["identical"]) for t in self.tried
                    if (t["margin"], t["tail_context"]) == (self.margin, self.tail_context))

    def to_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "tail_context": self.tail_context, "rule": self.rule,
                "target_identical": self.target_identical, "tried": self.tried}


def fit_identity_margin(
    run_seer: Callable[[SeerConfig], tuple[np.ndarray, np.ndarray]],
    seer: SeerConfig,
    full_tokens: np.ndarray,
    true_len: np.ndarray,
    margins: Sequence[int],
    *,
    tail_contexts: Sequence[TailContext] = (),
    target_identical: float = 0.995,
    slack: float = 0.01,
    log: Callable[[str], None] = lambda _: None,
) -> IdentityFit:
    """The cheapest margin, then tail context, whose answers equal full length's on a target share of prompts.

    A safe cut (kept >= true length) is not enough: with few EOS slots left after the answer, a model trained on long
    padding sometimes answers differently. `run_seer(config)` generates with Seer and returns (tokens, kept).
    Margins are tried first, at `seer.tail_context`, in order, and the first reaching the target wins. If none
    does, the margin is the knee (the smallest within `slack` of the best rate: past it more margin buys little
    identity for many more slots) and `tail_contexts` are tried at that margin, cheapest first (fewest slots, 'all'
    last: each keeps more of the cut tail in view as committed EOS, see SeerConfig.tail_context); the first reaching
    the target wins. If still none does, the first run tried within `slack` of the best rate seen.
    """
    if not margins:
        raise ConfigError("give at least one margin to try")
    if slack < 0:
        raise ConfigError(f"identity slack {slack} must be >= 0")
    for context in tail_contexts:
        check_tail_context(context)
    contexts = sorted(set(tail_contexts), key=lambda c: (c == "all", 0 if c == "all" else int(c)))
    gen_length = full_tokens.shape[1]
    tried: list[dict[str, Any]] = []

    def attempt(margin: int, context: TailContext) -> bool:
        config = seer.with_(margin=margin, tail_context=context)
        tokens, kept = run_seer(config)
        identical = identical_share(tokens, full_tokens, true_len)
        width = [k + config.context_slots(int(k), gen_length) for k in kept]
        tried.append({"margin": margin, "tail_context": context, "identical": round(identical, 4),
                      "mean_kept": round(float(np.mean(kept)), 2), "mean_width": round(float(np.mean(width)), 2)})
        log(f"  identity margin {margin}, tail context {context}: identical {identical:.3f}, "
            f"mean kept {float(np.mean(kept)):.1f}, with context {float(np.mean(width)):.1f}")
        return identical >= target_identical

    def fit(run: dict[str, Any], rule: str) -> IdentityFit:
        return IdentityFit(int(run["margin"]), run["tail_context"], rule, target_identical, tried)

    for margin in margins:
        if attempt(margin, seer.tail_context):
            return fit(tried[-1], "first margin reaching the target")

    def near_best() -> tuple[float, dict[str, Any]]:  # the best rate, and the first run within slack of it
        best = max(t["identical"] for t in tried)
        return best, next(t for t in tried if t["identical"] >= best - slack - 1e-9)

    best, knee = near_best()
    for context in contexts:
        if context != seer.tail_context and attempt(int(knee["margin"]), context):
            return fit(tried[-1], f"no margin reached the target; margin {knee['margin']} (the knee, within {slack} "
                                  f"of the best rate {best}), then the first tail context reaching it")
    best, chosen = near_best()
    return fit(chosen, f"target not reached; the first run within {slack} of the best rate {best}")


def identity_margins(seer: SeerConfig, gen_length: int, span: int = 16, stride: int = 2) -> range:
    """The margins an end-to-end fit tries: from the safe-rate calibration's up to `span` more, in steps of `stride`."""
    return range(seer.margin, min(seer.margin + span, gen_length) + 1, stride)


def check_target_identical(target: float) -> None:
    """ConfigError unless `target` is a share of answers an end-to-end fit can aim at."""
    if not 0.5 <= target <= 1.0:
        raise ConfigError(f"target identical share {target} must lie in [0.5, 1]")


def fit_identity_on_split(
    model: MaskPredictor,
    prompts: Sequence[list[int]],
    config: GenerationConfig,
    seer: SeerConfig,
    full_tokens: np.ndarray,
    options: CalibrationOptions,
    *,
    tail_contexts: Sequence[TailContext] = (),
    target_identical: float = 0.99,
    margin_span: int = 16,
    batch_size: int = 64,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[IdentityFit, float]:
    """`fit_identity_margin` on the calibration split of `prompts` (the split `calibrate` uses), then the share of
    the validation split's answers that equal full length's under the fitted margin and tail context."""
    check_target_identical(target_identical)
    if margin_span < 0:
        raise ConfigError(f"margin span {margin_span} must be >= 0")
    cfg = model.cfg
    stops = {cfg.eos_id} | ({cfg.eot_id} if cfg.eot_id is not None else set())
    true_len = true_lengths(full_tokens, stops)
    cal, val = split_indices(len(prompts), options.holdout, options.seed)

    def runner(rows: np.ndarray) -> Callable[[SeerConfig], tuple[np.ndarray, np.ndarray]]:
        subset = [prompts[i] for i in rows]
        return lambda s: batched_generation(model, subset, config, seer=s, batch_size=batch_size)

    margins = identity_margins(seer, config.gen_length, margin_span)
    fit = fit_identity_margin(runner(cal), seer, full_tokens[cal], true_len[cal], margins,
                              tail_contexts=tail_contexts, target_identical=target_identical, log=log)
    tokens, _ = runner(val)(seer.with_(margin=fit.margin, tail_context=fit.tail_context))
    return fit, identical_share(tokens, full_tokens[val], true_len[val])


def calibrate_model(
    model: MaskPredictor,
    prompts: Sequence[list[int]],
    config: GenerationConfig,
    options: CalibrationOptions = CalibrationOptions(),
    *,
    full_tokens: np.ndarray | None = None,
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationResult:
    """Run step zero and full-length generation on `prompts`, then `calibrate` (full_tokens: reuse a cached run)."""
    options.validate()
    cfg = model.cfg
    config.validate(cfg.max_seq_len, max(len(p) for p in prompts))
    if full_tokens is None:
        full_tokens = full_generation(model, prompts, config, batch_size, progress)
    if full_tokens.shape != (len(prompts), config.gen_length):
        raise ConfigError(f"cached full-length answers have shape {full_tokens.shape}, expected "
                          f"{(len(prompts), config.gen_length)}; delete the cache and rerun")
    stops = {cfg.eos_id} | ({cfg.eot_id} if cfg.eot_id is not None else set())
    true_len = true_lengths(full_tokens, stops)
    data = step_zero_set(model, prompts, config.gen_length, options.thresholds, batch_size)
    result = calibrate(data, true_len, cfg.eos_id, cfg.n_layers, options)
    result.report["steps"] = config.steps
    result.report["block_length"] = config.block
    result.report["stat_names"] = list(STAT_NAMES)
    return result
