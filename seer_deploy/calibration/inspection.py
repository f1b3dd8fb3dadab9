"""Look at one prompt the way Seer does: per-layer statistics, EOS probability, boundaries and the true end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from seer_deploy.calibration.collect import step_zero_set, stop_ids
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.core.sparsity import STAT_NAMES
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.detect import Boundary, detect_eos, detect_sparsity, fuse, pooled_signal, split_scores
from seer_deploy.seer.metrics import true_lengths
from seer_deploy.seer.plan import kept_length


@dataclass(frozen=True)
class Inspection:
    """Everything the inspection figure and its JSON show for one prompt."""

    gen_length: int
    stats: np.ndarray  # [L, F, G]: every layer's statistics at the config's thresholds
    eos_prob: np.ndarray  # [G]
    token_ids: np.ndarray  # [G] step-zero argmax
    signal: np.ndarray  # [G] pooled, detrended sparsity signal
    scores: np.ndarray  # [G + 1] split scores of the signal (-inf where not allowed)
    boundaries: dict[str, Boundary]  # detector -> boundary
    kept: dict[str, int]  # detector -> kept length
    true_end: int  # first EOS of the full-length answer
    answer: np.ndarray  # [G] full-length response ids
    margin: int
    detector: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "gen_length": self.gen_length,
            "true_end": self.true_end,
            "detector": self.detector,
            "margin": self.margin,
            "boundaries": {k: {"position": b.position, "candidate": b.candidate, "confidence": round(b.confidence, 4)}
                           for k, b in self.boundaries.items()},
            "kept": self.kept,
            "eos_prob": [round(float(v), 5) for v in self.eos_prob],
            "stats": {f"layer {layer}": {name: [round(float(v), 5) for v in self.stats[layer, f]]
                                         for f, name in enumerate(STAT_NAMES)}
                      for layer in range(self.stats.shape[0])},
            "signal": [round(float(v), 4) for v in self.signal],
            "answer_tokens": [int(v) for v in self.answer],
        }


def inspect_prompt(model: MaskPredictor, prompt: list[int], config: GenerationConfig, seer: SeerConfig) -> Inspection:
    """Step zero with every layer's statistics, the three detectors, and the full-length answer's true end."""
    cfg = model.cfg
    G = config.gen_length
    thresholds = (seer.abs_threshold, seer.rel_threshold)
    data = step_zero_set(model, [prompt], G, (thresholds,))
    profile = data.profile(0, thresholds)
    sp_cfg = seer.with_(stats_layers=seer.stats_spec(cfg.n_layers).layers)  # the layers a loop's step zero would report
    eos_b, sp_b = detect_eos(profile, cfg.eos_id, seer), detect_sparsity(profile, sp_cfg)
    found = {"eos": eos_b, "sparsity": sp_b, "fused": fuse(eos_b, sp_b)}
    signal, two_sided = pooled_signal(profile, sp_cfg)
    scores = split_scores(signal, score=seer.score, trend_term=seer.trend_term, min_tail=seer.min_tail,
                          two_sided=two_sided)
    answer = generate(model, [prompt], config).tokens[0].numpy()
    return Inspection(
        gen_length=G,
        stats=data.sparsity[thresholds][0].reshape(cfg.n_layers, len(STAT_NAMES), G),
        eos_prob=data.eos_prob[0],
        token_ids=data.token_ids[0],
        signal=signal,
        scores=scores,
        boundaries=found,
        kept={k: kept_length(b.position, seer.margin, G, seer.buckets) for k, b in found.items()},
        true_end=int(true_lengths(answer[None, :], stop_ids(cfg))[0]),
        answer=answer,
        margin=seer.margin,
        detector=seer.detector,
    )
