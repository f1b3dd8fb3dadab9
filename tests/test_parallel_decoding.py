"""Parallel decoding (Fast-dLLM's threshold and factor rules): the settings, the rule in the torch reference against
the loop core, and whole generations of the runtime loop against the reference loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.runtime import loopcore
from seer_deploy.runtime.loop import LoopOptions, run_generation
from seer_deploy.runtime.loopcore import c_core, python_core
from seer_deploy.runtime.reference import generate, select_confident
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CORES = [python_core()] + ([c_core()] if c_core() is not None else [])


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"decode": "greedy"}, "--decode"),
        ({"decode": "threshold", "threshold": 0.0}, "--threshold"),
        ({"decode": "threshold", "threshold": 1.5}, "--threshold"),
        ({"decode": "threshold", "threshold": math.nan}, "--threshold"),
        ({"decode": "factor", "factor": 0.0}, "--factor"),
        ({"decode": "factor", "factor": -1.0}, "--factor"),
        ({"decode": "factor", "factor": math.inf}, "--factor"),
        ({"decode": "threshold", "remasking": "random"}, "--remasking"),
    ],
)
def test_bad_decoding_settings_name_their_flag(changes: dict, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        GenerationConfig(16, 16, **changes).validate()


def test_rank_thresholds_are_the_rules_in_log_probability() -> None:
    threshold = GenerationConfig(decode="threshold", threshold=0.8).rank_thresholds(5)
    assert threshold.dtype == np.float32 and threshold[0] == -np.inf
    assert np.allclose(np.exp(threshold[1:]), 0.8)
    factor = GenerationConfig(decode="factor", factor=1.5).rank_thresholds(6)
    # n tokens (rank n - 1) need p_n >= 1 - factor / (n + 1): n = 2 -> 0.5, n = 3 -> 0.625 ...
    assert np.allclose(np.exp(factor[1:]), [1 - 1.5 / (n + 1) for n in range(2, 7)])
    assert factor[0] == -np.inf and np.all(np.diff(factor[1:]) > 0)
    with pytest.raises(ConfigError, match="fixed decoding"):
        GenerationConfig().rank_thresholds(3)


_floats = st.one_of(
    st.floats(-8.0, 0.0, width=32),
    st.sampled_from([0.0, -0.0, -np.inf, np.nan, math.log(0.9), -1e-8]),
)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 4),
    seq=st.integers(1, 12),
    rule=st.sampled_from(["threshold", "factor"]),
    level=st.floats(0.05, 1.0),
)
def test_reference_rule_equals_the_loop_core(data: st.DataObject, batch: int, seq: int, rule: str, level: float) -> None:
    """torch's select_confident commits exactly what commit_confident commits (C core and numpy twin)."""
    confidence = np.array(data.draw(st.lists(_floats, min_size=batch * seq, max_size=batch * seq)),
                          dtype=np.float32).reshape(batch, seq)
    masked = np.array(data.draw(st.lists(st.booleans(), min_size=batch * seq, max_size=batch * seq))).reshape(batch, seq)
    lo = np.array([data.draw(st.integers(0, seq)) for _ in range(batch)], dtype=np.int64)
    hi = np.array([data.draw(st.integers(int(a), seq)) for a in lo], dtype=np.int64)
    config = GenerationConfig(decode=rule, threshold=level, factor=level * 3)  # type: ignore[arg-type]
    thresholds = config.rank_thresholds(seq)
    mask_id = 99
    x = np.where(masked, mask_id, 7).astype(np.int64)
    x0 = np.arange(batch * seq, dtype=np.int64).reshape(batch, seq)
    positions = np.arange(seq)
    candidate = masked & (positions >= lo[:, None]) & (positions < hi[:, None])
    chosen = select_confident(torch.from_numpy(confidence), torch.from_numpy(candidate), torch.from_numpy(thresholds))
    want = np.where(chosen.numpy(), x0, x)
    for core in CORES:
        got = x.copy()
        counts = core.commit_confident(got, x0, confidence, lo, hi, thresholds, mask_id)
        assert np.array_equal(got, want), core.CORE_NAME
        assert np.array_equal(counts, chosen.numpy().sum(1))
        assert np.all(counts[candidate.any(1)] >= 1)


def _prompts() -> list[list[int]]:
    return [[10, 3, 5, 2, 17], [10, 8, 17], [10, 1, 2, 3, 4, 5, 6, 17]]


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.CORE_NAME)
@pytest.mark.parametrize(
    "config",
    [
        GenerationConfig(24, 24, block_length=8, decode="threshold", threshold=0.2),
        GenerationConfig(24, 24, block_length=8, decode="factor", factor=2.0),
        GenerationConfig(24, 24, decode="threshold", threshold=0.5),
    ],
    ids=["threshold-blocks", "factor-blocks", "threshold-one-block"],
)
@pytest.mark.parametrize("seer", [None, SeerConfig(detector="eos", eos_floor=0.0)], ids=["full", "seer"])
def test_runtime_loop_equals_the_reference(core: object, config: GenerationConfig, seer: SeerConfig | None) -> None:
    model = tiny_model(3)
    cfg = model.cfg
    prompts = _prompts()
    ref = generate(model, prompts, config, seer=seer)
    out = run_generation(TorchBackend(model), prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id), seer=seer, options=LoopOptions(core=core))  # type: ignore[arg-type]
    assert np.array_equal(out.tokens, ref.tokens.numpy())
    assert len(out.row_passes) == len(prompts) and all(s >= 1 for s in out.row_passes)
    if seer is not None:
        assert out.seer is not None and ref.seer is not None
        assert [r.passes for r in out.seer] == [r.passes for r in ref.seer] == out.row_passes


def test_steps_follow_the_models_confidence() -> None:
    """A threshold every candidate clears finishes each block in one pass; the fixed schedule needs all its steps."""
    model = tiny_model(4)
    cfg = model.cfg
    backend = TorchBackend(model)
    easy = GenerationConfig(24, 24, block_length=8, decode="threshold", threshold=1e-30)
    out = run_generation(backend, _prompts(), easy, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id))
    assert out.passes == 3 and out.row_passes == [3, 3, 3]
    fixed = run_generation(backend, _prompts(), GenerationConfig(24, 24, block_length=8), ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id))
    assert fixed.passes == 24
    strict = GenerationConfig(24, 24, block_length=8, decode="threshold", threshold=1.0)
    one_each = run_generation(backend, _prompts(), strict, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id))
    # About one token a pass (a pass whose proposals are all the mask token itself ends its block early).
    assert 3 < one_each.passes <= 24 and max(one_each.row_passes) > 12


def test_loopcore_reports_the_commit_confident_function() -> None:
    assert callable(loopcore.commit_confident)
