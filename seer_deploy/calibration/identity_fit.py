"""Fit the margin, then the tail context, end to end: the cheapest Seer config whose answers equal full length's on
a target share of prompts (`calibrate --target-identical`).

A safe cut (kept >= the true answer length, `detector_fit`) does not guarantee the same answer: with few EOS slots
left after it, a model trained on long padding sometimes answers differently. Every candidate here is a Seer run
compared token for token with the full-length answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seer_deploy.calibration.collect import stop_ids
from seer_deploy.calibration.detector_fit import CalibrationOptions, split_indices
from seer_deploy.calibration.sources import AnswerSource
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.seer.config import SeerConfig, TailContext
from seer_deploy.seer.metrics import identical_share, true_lengths


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


@dataclass(frozen=True)
class IdentityGoal:
    """What an end-to-end fit aims at (`calibrate --target-identical`): the share of answers equal to full length's,
    the margins tried (up to `margin_span` past the safe-rate one), the tail contexts tried when no margin reaches
    it, and how close to the best rate a cheaper run may stay (`slack`)."""

    target_identical: float = 0.995
    tail_contexts: tuple[TailContext, ...] = ()
    margin_span: int = 16
    slack: float = 0.01

    def check(self) -> None:
        check_target_identical(self.target_identical)
        if self.margin_span < 0:
            raise ConfigError(f"margin span {self.margin_span} must be >= 0")
        if self.slack < 0:
            raise ConfigError(f"identity slack {self.slack} must be >= 0")


@dataclass(frozen=True)
class SeerRuns:
    """How a fit answers its prompts under a Seer config: `source`'s answers (`calibration.sources`) to `prompts` with
    `config`, `batch_size` at a time."""

    source: AnswerSource
    prompts: Sequence[list[int]]
    config: GenerationConfig
    batch_size: int = 64

    def on(self, indices: np.ndarray) -> Callable[[SeerConfig], tuple[np.ndarray, np.ndarray]]:
        """A runner over the prompts at `indices`: Seer config -> (tokens, kept)."""
        subset = [self.prompts[i] for i in indices]
        return lambda seer: self.source.answers(subset, self.config, seer=seer, batch_size=self.batch_size)


def fit_identity_margin(
    run_seer: Callable[[SeerConfig], tuple[np.ndarray, np.ndarray]],
    seer: SeerConfig,
    full_tokens: np.ndarray,
    true_len: np.ndarray,
    margins: Sequence[int],
    goal: IdentityGoal = IdentityGoal(),
    log: Callable[[str], None] = lambda _: None,
) -> IdentityFit:
    """The cheapest margin, then tail context, whose answers equal full length's on a target share of prompts.

    A safe cut (kept >= true length) is not enough: with few EOS slots left after the answer, a model trained on long
    padding sometimes answers differently. `run_seer(config)` generates with Seer and returns (tokens, kept).
    Margins are tried first, at `seer.tail_context`, in order, and the first reaching the target wins. If none
    does, the margin is the knee (the smallest within `goal.slack` of the best rate: past it more margin buys little
    identity for many more slots) and `goal.tail_contexts` are tried at that margin, cheapest first (fewest slots, 'all'
    last: each keeps more of the cut tail in view as committed EOS, see SeerConfig.tail_context); the first reaching
    the target wins. If still none does, the first run tried within `slack` of the best rate seen.
    """
    if not margins:
        raise ConfigError("give at least one margin to try")
    goal.check()
    target_identical, slack = goal.target_identical, goal.slack
    # Each tail context becomes a config now, so SeerConfig rejects a bad one before any run.
    with_contexts = sorted((seer.with_(tail_context=c) for c in dict.fromkeys(goal.tail_contexts)),
                           key=lambda c: slots_order(c.tail_context))
    gen_length = full_tokens.shape[1]
    tried: list[dict[str, Any]] = []

    def attempt(config: SeerConfig) -> bool:
        tokens, kept = run_seer(config)
        identical = identical_share(tokens, full_tokens, true_len)
        width = [k + config.context_slots(int(k), gen_length) for k in kept]
        tried.append({"margin": config.margin, "tail_context": config.tail_context, "identical": round(identical, 4),
                      "mean_kept": round(float(np.mean(kept)), 2), "mean_width": round(float(np.mean(width)), 2)})
        log(f"  identity margin {config.margin}, tail context {config.tail_context}: identical {identical:.3f}, "
            f"mean kept {float(np.mean(kept)):.1f}, with context {float(np.mean(width)):.1f}")
        return identical >= target_identical

    def fit(run: dict[str, Any], rule: str) -> IdentityFit:
        return IdentityFit(int(run["margin"]), run["tail_context"], rule, target_identical, tried)

    for margin in margins:
        if attempt(seer.with_(margin=margin)):
            return fit(tried[-1], "first margin reaching the target")

    def near_best() -> tuple[float, dict[str, Any]]:  # the best rate, and the first run within slack of it
        best = max(t["identical"] for t in tried)
        return best, next(t for t in tried if t["identical"] >= best - slack - 1e-9)

    best, knee = near_best()
    for config in with_contexts:
        if config.tail_context != seer.tail_context and attempt(config.with_(margin=int(knee["margin"]))):
            return fit(tried[-1], f"no margin reached the target; margin {knee['margin']} (the knee, within {slack} "
                                  f"of the best rate {best}), then the first tail context reaching it")
    best, chosen = near_best()
    return fit(chosen, f"target not reached; the first run within {slack} of the best rate {best}")


def slots_order(tail_context: TailContext) -> tuple[bool, int]:
    """Sort key of tail contexts, cheapest first: fewest cut slots in view, 'all' last."""
    return (tail_context == "all", 0 if tail_context == "all" else int(tail_context))


def identity_margins(seer: SeerConfig, gen_length: int, span: int = 16, stride: int = 2) -> range:
    """The margins an end-to-end fit tries: from the safe-rate calibration's up to `span` more, in steps of `stride`."""
    return range(seer.margin, min(seer.margin + span, gen_length) + 1, stride)


def check_target_identical(target: float) -> None:
    """ConfigError unless `target` is a share of answers an end-to-end fit can aim at."""
    if not 0.5 <= target <= 1.0:
        raise ConfigError(f"target identical share {target} must lie in [0.5, 1]")


def fit_identity_on_split(runs: SeerRuns, seer: SeerConfig, full_tokens: np.ndarray, options: CalibrationOptions,
                          goal: IdentityGoal, log: Callable[[str], None] = lambda _: None) -> tuple[IdentityFit, float]:
    """`fit_identity_margin` on the calibration split of the prompts (the split `fit_detectors` uses), then the share
    of the validation split's answers that equal full length's under the fitted margin and tail context."""
    goal.check()
    true_len = true_lengths(full_tokens, stop_ids(runs.source.cfg))
    cal, val = split_indices(len(runs.prompts), options.holdout, options.seed)
    margins = identity_margins(seer, runs.config.gen_length, goal.margin_span)
    fit = fit_identity_margin(runs.on(cal), seer, full_tokens[cal], true_len[cal], margins, goal, log)
    tokens, _ = runs.on(val)(seer.with_(margin=fit.margin, tail_context=fit.tail_context))
    return fit, identical_share(tokens, full_tokens[val], true_len[val])
