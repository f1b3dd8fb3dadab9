"""Truncation plans: kept length, proportional step budgets, block semantics, work accounting, config files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.checkpoints.checkpoint import resolve_checkpoint
from seer_deploy.runtime.targets import checkpoint_seer
from seer_deploy.seer.config import SeerConfig, Trend
from seer_deploy.seer.plan import block_plan, kept_length, make_plan


def test_kept_length_adds_the_margin_rounds_to_buckets_and_caps() -> None:
    assert kept_length(10, 3, 64) == 13
    assert kept_length(62, 8, 64) == 64
    assert kept_length(None, 3, 64) == 64
    assert kept_length(10, 3, 64, (8, 16, 32)) == 16
    assert kept_length(40, 3, 64, (8, 16, 32)) == 64  # no bucket fits: full length
    assert kept_length(10, 3, 12, (16, 32)) == 12  # never above gen_length
    with pytest.raises(ConfigError, match="outside the response"):
        kept_length(0, 3, 64)


def test_single_block_keeps_the_tokens_per_step() -> None:
    for G, steps, kept in [(256, 256, 20), (256, 128, 21), (64, 32, 64), (64, 16, 3)]:
        blocks = block_plan(G, steps, None, kept)
        assert len(blocks) == 1 and (blocks[0].start, blocks[0].end) == (0, kept)
        assert blocks[0].steps == max(1, math.ceil(steps * kept / G))


def test_blocks_past_the_cut_are_dropped_and_a_partial_block_is_shortened() -> None:
    blocks = block_plan(128, 64, 32, 70)  # 4 blocks of 32 with 16 steps each; the cut falls in the third block
    assert [(b.start, b.end, b.steps) for b in blocks] == [(0, 32, 16), (32, 64, 16), (64, 70, 3)]
    assert sum(b.steps for b in blocks) == math.ceil(64 * 70 / 128)
    assert [(b.start, b.end, b.steps) for b in block_plan(128, 64, 32, 64)] == [(0, 32, 16), (32, 64, 16)]


@given(G=st.sampled_from([8, 16, 64, 96]), div=st.sampled_from([1, 2, 4]), per=st.integers(1, 8), kept=st.integers(1, 96))
def test_full_length_plan_is_the_full_loop(G: int, div: int, per: int, kept: int) -> None:
    block = G // div
    steps = per * div
    full = block_plan(G, steps, block, G)
    assert sum(b.steps for b in full) == steps and len(full) == div
    kept = min(kept, G)
    plan = block_plan(G, steps, block, kept)
    assert plan[-1].end == kept and all(b.steps >= 1 for b in plan)
    assert sum(b.steps for b in plan) == math.ceil(steps * kept / G)


def test_a_lone_step_zero_gets_one_more_step_when_masks_remain() -> None:
    still = np.zeros(256, dtype=bool)
    assert make_plan(256, 64, None, 3, still_masked=still).steps == 1  # step zero decided all three slots
    still[1] = True
    assert make_plan(256, 64, None, 3, still_masked=still).steps == 2


def test_work_accounting_counts_step_zero_at_full_length() -> None:
    plan = make_plan(64, 64, None, 16)
    assert plan.steps == 16 and plan.truncated
    assert plan.tokens_processed(10) == (10 + 64) + 15 * (10 + 16)
    assert plan.full_tokens_processed(10) == 64 * (10 + 64)
    assert plan.tokens_processed(10, passes_per_step=2) == 2 * plan.tokens_processed(10)


def test_tail_context_widens_the_later_steps_but_keeps_the_cut_steps() -> None:
    """tail_context: the first cut slots stay in view as committed EOS; the step budget is still the cut's."""
    cut = make_plan(64, 64, None, 16)
    plan = make_plan(64, 64, None, 16, context=SeerConfig(tail_context=8).context_slots(16, 64))
    assert (plan.kept, plan.context, plan.width, plan.steps) == (16, 8, 24, cut.steps)
    assert plan.tokens_processed(10) == (10 + 64) + 15 * (10 + 24)
    assert SeerConfig(tail_context="all").context_slots(16, 64) == 48
    assert SeerConfig(tail_context=100).context_slots(60, 64) == 4 and SeerConfig().context_slots(16, 64) == 0
    with pytest.raises(ConfigError, match="does not fit"):
        make_plan(64, 64, None, 60, context=8)


def test_config_round_trips_through_an_atomic_json_file(tmp_path: Path) -> None:
    trend = Trend(gen_length=4, mean=((0.1, 0.2, 0.3, 0.4),), scale=(0.5,))
    cfg = SeerConfig(
        detector="fused", margin=3, stats_layers=(3,), rows=((3, "frac_h_abs"),), weights=(1.5,), trends=(trend,),
        buckets=(16, 32), tail_context="all", calibration={"safe": 0.997},
    )
    path = cfg.save(tmp_path / "seer.json")
    assert [p.name for p in tmp_path.iterdir()] == ["seer.json"]  # no temp file left behind
    raw = json.loads(path.read_text())
    assert raw["stats_layers"] == [3] and raw["abs_threshold"] == 0.05 and raw["rel_threshold"] == 0.05
    assert raw["tail_context"] == "all"
    loaded = SeerConfig.load(path)
    assert loaded == cfg and loaded.calibration == {"safe": 0.997}
    # A checkpoint's calibrated config is its seer.json, found in one place (the demos' shipped ones too).
    assert checkpoint_seer(tmp_path) == cfg
    (tmp_path / "seer.json").unlink()
    assert checkpoint_seer(tmp_path) is None
    assert checkpoint_seer("demo") == SeerConfig.load(resolve_checkpoint("demo") / "seer.json")


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"detector": "magic"}, "detector 'magic' is unknown"),
        ({"margin": -1}, "margin is -1; it must be a whole number"),
        ({"rows": [[3, "frac_bogus"]]}, "unknown statistic"),
        ({"stats_layers": [2], "rows": [[3, "frac_h_abs"]]}, "not in stats_layers"),
        ({"buckets": [32, 16]}, "strictly ascending"),
        ({"tail_context": -2}, "tail_context -2 is not a count"),
        ({"tail_context": "most"}, "tail_context 'most' is not a count"),
        ({"surprise": 1}, "unknown keys"),
        ({"version": 99}, "version 99"),
    ],
)
def test_bad_configs_name_the_problem(tmp_path: Path, raw: dict, message: str) -> None:
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message):
        SeerConfig.load(tmp_path / "bad.json")


def test_stats_layers_must_exist_in_the_model() -> None:
    assert SeerConfig().stats_spec(4).layers == (3,)  # () = the last layer
    assert SeerConfig(stats_layers=(-1, 0)).stats_spec(4).layers == (3, 0)  # negatives count from the end
    with pytest.raises(ConfigError, match="a 2-layer model lacks"):
        SeerConfig(stats_layers=(3,)).stats_spec(2)
    with pytest.raises(ConfigError, match="read layers outside stats_layers"):
        SeerConfig(stats_layers=(-1,), rows=((0, "frac_h_rel"),)).stats_spec(4)  # -1 is layer 3 here
