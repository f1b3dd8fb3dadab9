"""Boundary detectors on synthetic step-zero profiles: steps are found, noise and trends are not cut."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.core.sparsity import STAT_NAMES
from seer_deploy.seer.config import SeerConfig, Trend
from seer_deploy.seer.detect import detect, detect_eos, detect_sparsity, fuse, split_scores
from seer_deploy.seer.response_profile import ResponseProfile

EOS, DIGIT = 11, 3
ROWS = tuple((3, s) for s in STAT_NAMES)


def profile(sparsity: np.ndarray, boundary: int | None = None, eos_hi: float = 0.99) -> ResponseProfile:
    """A profile whose step-zero prediction is digits before `boundary` and EOS from it on (no EOS if None)."""
    G = sparsity.shape[1]
    tail = np.arange(G) >= (boundary if boundary is not None else G)
    return ResponseProfile(
        token_ids=np.where(tail, EOS, DIGIT).astype(np.int64),
        eos_prob=np.where(tail, eos_hi, 0.001).astype(np.float32),
        sparsity=sparsity.astype(np.float32),
        sparsity_rows=ROWS,
    )


def stepped(G: int, k: int, height: float, noise: float, seed: int, trend: float = 0.0) -> np.ndarray:
    """Four rows: a step of `height` at k (two rows up, two down), optional linear drift, Gaussian noise."""
    rng = np.random.default_rng(seed)
    pos = np.arange(G)
    step = (pos >= k).astype(float) * height
    signs = np.array([1.0, 1.0, -1.0, -1.0])[:, None]
    return 0.5 + signs * step + trend * pos / G + rng.normal(0.0, noise, (4, G))


@pytest.mark.parametrize("G, k", [(64, 1), (64, 7), (64, 40), (256, 17), (256, 200), (32, 30)])
def test_a_clean_step_is_found_at_its_position(G: int, k: int) -> None:
    b = detect_sparsity(profile(stepped(G, k, 0.2, 0.0, 0)), SeerConfig(detector="sparsity"))
    assert b.position == k


@pytest.mark.parametrize("score", ["t", "snr"])
@pytest.mark.parametrize("trend_term", [True, False])
def test_a_noisy_step_is_found_near_its_position(score: str, trend_term: bool) -> None:
    # A 1.5-sigma step per row, four rows pooled; the two scores live on different scales, so do their floors.
    floor = 3.0 if score == "t" else 1.0
    cfg = SeerConfig(detector="sparsity", score=score, trend_term=trend_term, floor=floor)  # type: ignore[arg-type]
    hits = [detect_sparsity(profile(stepped(128, 50, 0.15, 0.1, seed)), cfg).position for seed in range(20)]
    assert all(h is not None and abs(h - 50) <= 3 for h in hits)


def test_flat_and_pure_noise_profiles_give_no_truncation() -> None:
    cfg = SeerConfig(detector="sparsity")
    assert detect_sparsity(profile(np.full((4, 128), 0.3)), cfg).position is None
    cuts = [detect_sparsity(profile(stepped(128, 0, 0.0, 0.05, seed)), cfg).position for seed in range(200)]
    assert cuts.count(None) == len(cuts)


def test_a_trend_without_a_step_gives_no_truncation() -> None:
    cfg = SeerConfig(detector="sparsity")
    for seed in range(50):
        trended = stepped(128, 0, 0.0, 0.02, seed, trend=0.4)
        assert detect_sparsity(profile(trended), cfg).position is None
    # Without the drift term the same trend passes for a step: the drift term is what stops it.
    plain = SeerConfig(detector="sparsity", trend_term=False)
    assert detect_sparsity(profile(stepped(128, 0, 0.0, 0.02, 0, trend=0.4)), plain).position is not None


def test_a_calibrated_trend_is_removed_before_scoring() -> None:
    G = 96
    pos = np.arange(G)
    curve = 0.3 * np.sqrt(pos / G)  # a bent drift, which a linear term cannot absorb
    mean = tuple(tuple(float(0.5 + curve[p]) for p in pos) for _ in range(4))
    trend = Trend(gen_length=G, mean=mean, scale=(0.02,) * 4)
    cfg = SeerConfig(detector="sparsity", rows=ROWS, weights=(1.0,) * 4, trends=(trend,), trend_term=False)
    rng = np.random.default_rng(1)
    flat = 0.5 + curve + rng.normal(0, 0.02, (4, G))
    assert detect_sparsity(profile(flat), cfg).position is None
    assert detect_sparsity(profile(flat), cfg.with_(trends=())).position is not None  # the bend alone passes for a step
    with_step = flat + (pos >= 30) * 0.05
    assert detect_sparsity(profile(with_step), cfg).position == 30
    # Calibrated weights make the test one-sided: a step the wrong way is not a boundary.
    assert detect_sparsity(profile(flat - (pos >= 30) * 0.05), cfg).position is None


def test_split_scores_match_the_plain_snr_definition() -> None:
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.normal(0, 1, 20), rng.normal(2, 1, 30)])
    scores = split_scores(y, score="snr", trend_term=False)
    for k in (5, 20, 33):
        left, right = y[:k], y[k:]
        pooled = np.sqrt((((left - left.mean()) ** 2).sum() + ((right - right.mean()) ** 2).sum()) / (len(y) - 2))
        assert scores[k] == pytest.approx((right.mean() - left.mean()) / pooled, rel=1e-4)
    assert scores[0] == -np.inf and scores[len(y)] == -np.inf


def test_eos_detector_finds_the_first_lasting_eos() -> None:
    cfg = SeerConfig(detector="eos")
    assert detect_eos(profile(np.zeros((4, 64)), boundary=9), EOS, cfg).position == 9
    assert detect_eos(profile(np.zeros((4, 64)), boundary=None), EOS, cfg).position is None
    assert detect_eos(profile(np.zeros((4, 64)), boundary=0), EOS, cfg).position == 1  # answers are never empty
    # A stray digit deep in the tail moves the boundary past it, unless the tolerance allows it.
    p = profile(np.zeros((4, 64)), boundary=9)
    p.token_ids[40] = DIGIT
    p.eos_prob[40] = 0.1
    assert detect_eos(p, EOS, cfg).position == 41
    assert detect_eos(p, EOS, cfg.with_(eos_tolerance=1)).position == 9
    # An early EOS that does not last is not the boundary.
    q = profile(np.zeros((4, 64)), boundary=20)
    q.token_ids[5], q.eos_prob[5] = EOS, 0.9
    assert detect_eos(q, EOS, cfg).position == 20


def test_eos_detector_respects_its_floor() -> None:
    weak = profile(np.zeros((4, 64)), boundary=12, eos_hi=0.4)  # argmax EOS, but not sure
    assert detect_eos(weak, EOS, SeerConfig(eos_floor=0.5)).position is None
    assert detect_eos(weak, EOS, SeerConfig(eos_floor=0.3)).position == 12


def test_fused_cuts_where_eos_is_confident_never_before_either_boundary() -> None:
    cfg = SeerConfig(detector="fused")
    p = profile(stepped(128, 60, 0.2, 0.01, 0), boundary=40)
    e, s, f = detect_eos(p, EOS, cfg), detect_sparsity(p, cfg), detect(p, cfg, EOS)
    assert (e.position, s.position, f.position) == (40, 60, 60)
    q = profile(stepped(128, 60, 0.0, 0.01, 0), boundary=40)  # no sparsity step: only EOS is confident
    assert detect(q, cfg, EOS).position == 40
    assert fuse(detect_eos(profile(np.zeros((4, 64))), EOS, cfg), detect_sparsity(q, cfg)).position is None
    # No confident EOS boundary: no cut, even where the sparsity step alone is clear.
    r = profile(stepped(128, 60, 0.2, 0.01, 0), boundary=None)
    assert detect_sparsity(r, cfg).position == 60 and detect(r, cfg, EOS).position is None


@settings(max_examples=150, deadline=None)
@given(
    G=st.integers(1, 80),
    seed=st.integers(0, 2**16),
    boundary=st.one_of(st.none(), st.integers(0, 80)),
    detector=st.sampled_from(["sparsity", "eos", "fused"]),
    scale=st.sampled_from([0.0, 1e-9, 0.05, 10.0]),
)
def test_detectors_never_leave_the_response(G: int, seed: int, boundary: int | None, detector: str, scale: float) -> None:
    rng = np.random.default_rng(seed)
    sparsity = rng.normal(0.5, 1.0, (4, G)) * scale + rng.integers(0, 2, (4, G)) * scale
    p = profile(sparsity, boundary=None if boundary is None else min(boundary, G))
    b = detect(p, SeerConfig(detector=detector, floor=0.0), EOS)  # type: ignore[arg-type]
    assert b.position is None or 1 <= b.position <= G
    assert b.candidate is None or 1 <= b.candidate <= G


def _identity_runner(full: np.ndarray, wrong_until: dict[int, int]):
    """A fake Seer run: row i's tokens differ from full length's while the margin is below wrong_until[i]."""

    def run(seer: SeerConfig) -> tuple[np.ndarray, np.ndarray]:
        tokens = full.copy()
        for row, margin in wrong_until.items():
            if seer.margin < margin:
                tokens[row, 0] += 1
        return tokens, np.full(len(full), 3 + seer.margin)

    return run


def test_identity_fit_takes_the_first_margin_reaching_the_target() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin

    full = np.zeros((10, 8), dtype=np.int64)
    true_len = np.full(10, 2)
    fit = fit_identity_margin(_identity_runner(full, {0: 2, 1: 5}), SeerConfig(), full, true_len, range(8),
                              IdentityGoal(target_identical=0.95))
    assert fit.margin == 5 and fit.rule.startswith("first margin")
    assert [t["identical"] for t in fit.tried] == [0.8, 0.8, 0.9, 0.9, 0.9, 1.0]
    assert fit.tried[-1]["mean_kept"] == 8


def test_identity_fit_takes_the_knee_when_the_target_is_out_of_reach() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin

    full = np.zeros((10, 8), dtype=np.int64)
    fit = fit_identity_margin(_identity_runner(full, {0: 1, 1: 3, 2: 99}), SeerConfig(), full, np.full(10, 2),
                              range(6), IdentityGoal(target_identical=0.95, slack=0.1))
    assert [t["identical"] for t in fit.tried] == [0.7, 0.8, 0.8, 0.9, 0.9, 0.9]
    assert fit.margin == 1 and "not reached" in fit.rule  # 0.8 is within 0.1 of the best, 0.9


def test_identity_fit_tries_tail_contexts_at_the_knee_margin_when_margins_fall_short() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin

    full = np.zeros((10, 16), dtype=np.int64)
    margin_runner = _identity_runner(full, {0: 1, 1: 99, 2: 99})  # rows 1 and 2 need the tail, not a margin

    def run(seer: SeerConfig) -> tuple[np.ndarray, np.ndarray]:
        tokens, kept = margin_runner(seer)
        slots = seer.context_slots(int(kept[0]), full.shape[1])
        tokens[1:3, 0] = full[1:3, 0] + (slots < 8)  # both are right once 8 cut slots stay in view
        return tokens, kept

    fit = fit_identity_margin(run, SeerConfig(), full, np.full(10, 2), range(4),
                              IdentityGoal(tail_contexts=(4, 8, "all"), target_identical=0.95, slack=0.0))
    assert (fit.margin, fit.tail_context) == (1, 8) and "tail context" in fit.rule
    assert [(t["margin"], t["tail_context"], t["identical"]) for t in fit.tried] == [
        (0, 0, 0.7), (1, 0, 0.8), (2, 0, 0.8), (3, 0, 0.8), (1, 4, 0.8), (1, 8, 1.0)]
    assert fit.tried[-1]["mean_width"] == 4 + 8  # kept 3 + margin 1, plus the 8 context slots
    assert fit.to_dict()["tail_context"] == 8


def test_identity_fit_keeps_tail_context_zero_when_a_margin_suffices() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin

    full = np.zeros((10, 8), dtype=np.int64)
    fit = fit_identity_margin(_identity_runner(full, {0: 2}), SeerConfig(), full, np.full(10, 2), range(4),
                              IdentityGoal(tail_contexts=(8, "all"), target_identical=1.0))
    assert (fit.margin, fit.tail_context) == (2, 0)
    assert all(t["tail_context"] == 0 for t in fit.tried)


def test_identity_fit_rejects_a_bad_tail_context() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin
    from seer_deploy.core.errors import ConfigError

    full = np.zeros((2, 8), dtype=np.int64)
    with pytest.raises(ConfigError, match="tail_context"):
        fit_identity_margin(_identity_runner(full, {}), SeerConfig(), full, np.full(2, 2), range(2),
                            IdentityGoal(tail_contexts=(-1,)))


def _context_runner(full: np.ndarray, needs: dict[int, int]):
    """A fake Seer run, identical to full length except row i while fewer than needs[i] cut slots stay in view."""

    def run(seer: SeerConfig) -> tuple[np.ndarray, np.ndarray]:
        tokens, kept = full.copy(), np.full(len(full), 3 + seer.margin)
        slots = seer.context_slots(int(kept[0]), full.shape[1])
        for row, need in needs.items():
            tokens[row, 0] += slots < need
        return tokens, kept

    return run


def test_identity_fit_tries_contexts_cheapest_first_and_falls_back_to_the_best() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin

    full = np.zeros((10, 16), dtype=np.int64)
    # Rows 0-1 need 4 slots in view, row 2 never matches: 0.9 is the best any run reaches.
    fit = fit_identity_margin(_context_runner(full, {0: 4, 1: 4, 2: 99}), SeerConfig(), full, np.full(10, 2),
                              range(2), IdentityGoal(tail_contexts=("all", 8, 0, 4, 8), target_identical=1.0, slack=0.0))
    assert [(t["margin"], t["tail_context"]) for t in fit.tried] == [(0, 0), (1, 0), (0, 4), (0, 8), (0, "all")]
    assert (fit.margin, fit.tail_context, fit.identical) == (0, 4, 0.9)  # the first run at the best rate
    assert fit.rule.startswith("target not reached")


def test_identity_fit_slack_is_inclusive_and_must_not_be_negative() -> None:
    from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin
    from seer_deploy.core.errors import ConfigError

    full = np.zeros((10, 8), dtype=np.int64)
    runner = _identity_runner(full, {0: 1, 1: 2, 2: 99})  # 0.7 at margin 0, 0.8 at 1, 0.9 from 2 on
    fit = fit_identity_margin(runner, SeerConfig(), full, np.full(10, 2), range(4),
                              IdentityGoal(target_identical=1.0, slack=0.2))
    assert fit.margin == 0  # 0.7 lies exactly 0.2 below the best, 0.9: within the slack
    with pytest.raises(ConfigError, match="slack"):
        fit_identity_margin(runner, SeerConfig(), full, np.full(10, 2), range(4), IdentityGoal(slack=-0.1))
