"""The loop core's functions for the Dream family's sampler: the C core and the numpy twin agree exactly (generated
cases, edge values, the same errors), and follow the authors' expressions (Dimple's fallback written out in torch
here, from yu-rp/Dimple training-code/models/generation_utils.py)."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.core.decoding import timesteps
from seer_deploy.runtime.loopcore import c_core, python_core

TWIN = python_core()
CORES = [pytest.param(TWIN, id="numpy")] + ([pytest.param(c_core(), id="c")] if c_core() is not None else [])


@pytest.fixture(scope="module")
def c_module() -> ModuleType:
    """The C core; a missing build skips (fails under SEER_DEPLOY_STRICT_BUILD=1, CI's build)."""
    built = c_core()
    if built is not None:
        return built
    assert os.environ.get("SEER_DEPLOY_STRICT_BUILD") != "1", "the strict build's C extension did not import"
    pytest.skip("the C extension seer_deploy.runtime._loopcore is not built")


def dimple_fallback(n: int, total: int, i: int, steps: int, eps: float) -> int:
    """Dimple's `dim` fallback count, as its loop computes it (torch, float32)."""
    ts = torch.linspace(1, eps, steps + 1)
    num_cur_mask, num_total_mask = torch.tensor(n), torch.tensor(total)
    ratio = num_cur_mask / num_total_mask
    start = max(int((ts < ratio).nonzero(as_tuple=True)[0].min()), i + 1)
    number = n
    for s_idx in range(start, steps + 1):
        s = ts[s_idx]
        number = int(num_cur_mask * (1 - s / ratio)) if s > ts[-1] else n
        if number >= 1:
            break
    return number


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.sampled_from([1e-3, 0.02, 0.4]), st.data())
def test_reanchored_transfer_is_dimples_count_in_c_and_twin(steps: int, eps: float, data: st.DataObject) -> None:
    total = data.draw(st.integers(1, 700))
    n = data.draw(st.integers(1, total))
    i = data.draw(st.integers(0, steps - 1))
    ts = np.ascontiguousarray(timesteps(steps, eps)[None, :])
    args = (np.array([n]), np.array([total]), np.array([i]), ts, np.array([steps]))
    got = [int(core.reanchored_transfer(*args)[0]) for core in (TWIN, c_core() or TWIN)]
    if n / total > eps:  # below the last timestep Dimple raises; the loop commits every mask there
        assert got == [dimple_fallback(n, total, i, steps, eps)] * 2
    else:
        assert got == [n, n]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.floats(0, 1, width=32)), min_size=0, max_size=6))
def test_timestep_transfer_c_and_twin_agree(c_module: ModuleType, rows: list[tuple[int, float]]) -> None:
    n = np.array([r[0] for r in rows], np.int64)
    ratio = np.array([r[1] for r in rows], np.float32)
    expected = TWIN.timestep_transfer(n, ratio)
    np.testing.assert_array_equal(c_module.timestep_transfer(n, ratio), expected)
    assert (expected <= n).all() and (expected >= 0).all()


VALUES = [0.0, -0.0, 0.5, 0.9, float("nan"), float("inf"), -float("inf"), -2.0]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(0, 10), st.data())
def test_commit_above_c_and_twin_agree(c_module: ModuleType, batch: int, seq: int, data: st.DataObject) -> None:
    x = np.array(data.draw(st.lists(st.sampled_from([0, 1, 2]), min_size=batch * seq, max_size=batch * seq)),
                 np.int64).reshape(batch, seq)
    x0 = np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) + 10
    score = np.array(data.draw(st.lists(st.sampled_from(VALUES), min_size=batch * seq, max_size=batch * seq)),
                     np.float32).reshape(batch, seq)
    threshold = np.array(data.draw(st.lists(st.sampled_from(VALUES), min_size=batch, max_size=batch)), np.float32)
    lo = np.array(data.draw(st.lists(st.integers(0, seq), min_size=batch, max_size=batch)), np.int64)
    hi = np.array([data.draw(st.integers(int(v), seq)) for v in lo], np.int64)
    xa, xb = x.copy(), x.copy()
    counts = TWIN.commit_above(xa, x0, score, lo, hi, threshold, 1)
    np.testing.assert_array_equal(c_module.commit_above(xb, x0, score, lo, hi, threshold, 1), counts)
    np.testing.assert_array_equal(xa, xb)
    inside = (np.arange(seq)[None, :] >= lo[:, None]) & (np.arange(seq)[None, :] < hi[:, None])
    expected = (x == 1) & inside & (score > threshold[:, None])
    np.testing.assert_array_equal(xa, np.where(expected, x0, x))  # NaN never passes; strictly above
    np.testing.assert_array_equal(counts, expected.sum(axis=1))


BAD: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("timestep_transfer", {"n_masked": np.array([3]), "ratio": np.array([1.5], np.float32)}, ValueError),
    ("timestep_transfer", {"n_masked": np.array([3]), "ratio": np.array([0.5])}, TypeError),
    ("timestep_transfer", {"n_masked": np.array([3, 4]), "ratio": np.array([0.5], np.float32)}, ValueError),
    ("reanchored_transfer", {"n_current": np.array([3]), "n_total": np.array([2]), "step": np.array([0]),
                             "timesteps": np.ones((1, 3), np.float32), "steps": np.array([2])}, ValueError),
    ("reanchored_transfer", {"n_current": np.array([1]), "n_total": np.array([2]), "step": np.array([2]),
                             "timesteps": np.ones((1, 3), np.float32), "steps": np.array([2])}, ValueError),
    ("commit_above", {"x": np.zeros((1, 3), np.int64), "x0": np.zeros((1, 3), np.int64),
                      "score": np.zeros((1, 3), np.float32), "block_lo": np.array([2]), "block_hi": np.array([1]),
                      "threshold": np.zeros(1, np.float32), "mask_id": 0}, ValueError),
    ("commit_above", {"x": np.zeros((1, 3), np.int64), "x0": np.zeros((1, 3), np.int64),
                      "score": np.zeros((1, 2), np.float32), "block_lo": np.array([0]), "block_hi": np.array([1]),
                      "threshold": np.zeros(1, np.float32), "mask_id": 0}, ValueError),
]


@pytest.mark.parametrize("name, kwargs, error", BAD)
def test_bad_input_gives_the_twins_error(c_module: ModuleType, name: str, kwargs: dict[str, Any],
                                         error: type[Exception]) -> None:
    messages = []
    for core in (TWIN, c_module):
        with pytest.raises(error) as raised:
            getattr(core, name)(**kwargs)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
