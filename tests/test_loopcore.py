"""The loop's host logic: the C core and the numpy twin agree exactly, and both follow the reference semantics."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import transfer_schedule
from seer_deploy.runtime import loopcore
from seer_deploy.runtime.loopcore import active_core, c_core, core_name, python_core
from seer_deploy.runtime.reference import select_transfer

TWIN = python_core()
NAN, INF = float("nan"), float("inf")
# Values that make ties, signed zeros, NaN and infinities common.
SPECIAL = [0.0, -0.0, 0.25, 0.5, 0.5, 1.0, NAN, INF, -INF, 1e-30, -2.0, 3.0e38]


@pytest.fixture(scope="module")
def c_module() -> ModuleType:
    core = c_core()
    if core is None:
        if os.environ.get("SEER_DEPLOY_STRICT_BUILD") == "1":
            pytest.fail("SEER_DEPLOY_STRICT_BUILD=1 but the C extension seer_deploy.runtime._loopcore did not import")
        pytest.skip("the C extension seer_deploy.runtime._loopcore is not built (no C compiler at install time)")
    return core


@dataclass
class StepCase:
    x: np.ndarray
    x0: np.ndarray
    confidence: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    k: np.ndarray
    mask_id: int

    def args(self) -> tuple[Any, ...]:
        return self.x0, self.confidence, self.lo, self.hi, self.k, self.mask_id


@st.composite
def step_cases(draw: st.DrawFn) -> StepCase:
    """Batches of rows that are all masked, none masked or mixed, with tied / NaN / infinite confidences."""
    batch = draw(st.integers(0, 4))
    seq = draw(st.integers(0, 24))
    mask_id = draw(st.sampled_from([0, 3, -1, 2**40]))
    others = [v for v in (0, 1, 2, 3, 7) if v != mask_id]
    x = np.empty((batch, seq), dtype=np.int64)
    for b in range(batch):
        mode = draw(st.sampled_from(["all", "none", "mixed"]))
        if mode == "all":
            x[b] = mask_id
        elif mode == "none":
            x[b] = draw(st.lists(st.sampled_from(others), min_size=seq, max_size=seq))
        else:
            x[b] = draw(st.lists(st.sampled_from([mask_id, mask_id] + others), min_size=seq, max_size=seq))
    x0 = np.array(draw(st.lists(st.integers(100, 200), min_size=batch * seq, max_size=batch * seq)), dtype=np.int64)
    value = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32, allow_nan=True))
    conf = np.array(draw(st.lists(value, min_size=batch * seq, max_size=batch * seq)), dtype=np.float32)
    bounds = [sorted(draw(st.lists(st.integers(0, seq), min_size=2, max_size=2))) for _ in range(batch)]
    k = draw(st.lists(st.integers(0, seq + 3), min_size=batch, max_size=batch))
    return StepCase(
        x=x,
        x0=x0.reshape(batch, seq),
        confidence=conf.reshape(batch, seq),
        lo=np.array([lo for lo, _ in bounds], dtype=np.int64).reshape(batch),
        hi=np.array([hi for _, hi in bounds], dtype=np.int64).reshape(batch),
        k=np.array(k, dtype=np.int64).reshape(batch),
        mask_id=mask_id,
    )


def oracle_commit(case: StepCase) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the candidates' confidences in position order, ranked by reference.select_transfer."""
    x = case.x.copy()
    counts = np.zeros(x.shape[0], dtype=np.int64)
    for b in range(x.shape[0]):
        positions = [p for p in range(int(case.lo[b]), int(case.hi[b])) if x[b, p] == case.mask_id]
        if not positions:
            continue
        conf = torch.from_numpy(case.confidence[b, positions].copy())[None]
        chosen = select_transfer(conf, torch.tensor([int(case.k[b])]))[0].tolist()
        for p, take in zip(positions, chosen, strict=True):
            if take:
                x[b, p] = case.x0[b, p]
        counts[b] = sum(chosen)
    return x, counts


def run_commit(core: Any, case: StepCase) -> tuple[np.ndarray, np.ndarray]:
    x = case.x.copy()
    counts = core.commit_step(x, *case.args())
    return x, counts


# ---------------------------------------------------------------- C core == twin (property tests)


@settings(max_examples=1000, deadline=None)
@given(case=step_cases())
def test_commit_step_c_and_twin_agree(c_module: ModuleType, case: StepCase) -> None:
    x_c, n_c = run_commit(c_module, case)
    x_py, n_py = run_commit(TWIN, case)
    assert n_c.dtype == n_py.dtype == np.int64
    np.testing.assert_array_equal(n_c, n_py)
    np.testing.assert_array_equal(x_c, x_py)


@settings(max_examples=300, deadline=None)
@given(n=st.lists(st.integers(0, 10_000), max_size=6), steps=st.integers(1, 80))
def test_transfer_schedule_c_twin_and_reference_agree(c_module: ModuleType, n: list[int], steps: int) -> None:
    counts = np.array(n, dtype=np.int64)
    c_sched, py_sched = c_module.transfer_schedule(counts, steps), TWIN.transfer_schedule(counts, steps)
    assert c_sched.shape == py_sched.shape == (len(n), steps)
    np.testing.assert_array_equal(c_sched, py_sched)
    for row, total in zip(py_sched.tolist(), n, strict=True):
        assert row == transfer_schedule(total, steps)


@settings(max_examples=300, deadline=None)
@given(case=step_cases())
def test_masks_left_c_and_twin_agree(c_module: ModuleType, case: StepCase) -> None:
    expected = [int((case.x[b, case.lo[b] : case.hi[b]] == case.mask_id).sum()) for b in range(case.x.shape[0])]
    for core in (c_module, TWIN):
        assert core.masks_left(case.x, case.lo, case.hi, case.mask_id).tolist() == expected


@settings(max_examples=300, deadline=None)
@given(length=st.integers(-2, 70), buckets=st.lists(st.integers(-1, 64), max_size=6))
def test_choose_bucket_c_and_twin_agree(c_module: ModuleType, length: int, buckets: list[int]) -> None:
    outcomes = []
    for core in (c_module, TWIN):
        try:
            outcomes.append(core.choose_bucket(length, buckets))
        except ConfigError as exc:
            outcomes.append(("ConfigError", str(exc)))
    assert outcomes[0] == outcomes[1]
    if isinstance(outcomes[1], int):
        fits = [b for b in buckets if b >= length]
        assert buckets[outcomes[1]] == min(fits) and buckets.index(min(fits)) == outcomes[1]


# ---------------------------------------------------------------- both cores against the reference semantics


@settings(max_examples=300, deadline=None)
@given(case=step_cases())
def test_twin_commit_matches_select_transfer(case: StepCase) -> None:
    x_py, n_py = run_commit(TWIN, case)
    x_ref, n_ref = oracle_commit(case)
    np.testing.assert_array_equal(n_py, n_ref)
    np.testing.assert_array_equal(x_py, x_ref)


def _cores() -> list[Any]:
    core = c_core()
    return [TWIN] if core is None else [TWIN, core]


CORES = pytest.mark.parametrize("core", _cores(), ids=lambda c: core_name(c))


def _row(x: list[int], conf: list[float], lo: int, hi: int, k: int, mask_id: int = 9) -> StepCase:
    n = len(x)
    return StepCase(
        x=np.array([x], dtype=np.int64),
        x0=np.arange(100, 100 + n, dtype=np.int64)[None],
        confidence=np.array([conf], dtype=np.float32),
        lo=np.array([lo], dtype=np.int64),
        hi=np.array([hi], dtype=np.int64),
        k=np.array([k], dtype=np.int64),
        mask_id=mask_id,
    )


@CORES
def test_ties_go_to_the_lower_position(core: Any) -> None:
    case = _row([9, 9, 9, 9, 9], [0.5, 0.9, 0.5, 0.5, 0.1], lo=0, hi=5, k=3)
    x, n = run_commit(core, case)
    assert n.tolist() == [3] and x.tolist() == [[100, 101, 102, 9, 9]]
    assert x.tolist() == oracle_commit(case)[0].tolist()


@CORES
def test_nan_ranks_first_and_signed_zeros_tie(core: Any) -> None:
    case = _row([9, 9, 9, 9, 9], [-0.0, 0.0, NAN, INF, NAN], lo=0, hi=5, k=3)
    x, _ = run_commit(core, case)
    assert x.tolist() == [[9, 9, 102, 103, 104]]
    case.k[0] = 4  # -0.0 at position 0 ties with +0.0 at position 1: the lower position wins
    assert run_commit(core, case)[0].tolist() == [[100, 9, 102, 103, 104]] == oracle_commit(case)[0].tolist()


@CORES
def test_only_masked_positions_inside_the_block_are_candidates(core: Any) -> None:
    # Position 2 is committed already; 0 and 5 are outside the block [1, 5) although they score higher.
    case = _row([9, 9, 4, 9, 9, 9], [1.0, 0.2, 0.9, 0.1, 0.3, 1.0], lo=1, hi=5, k=2)
    x, n = run_commit(core, case)
    assert n.tolist() == [2] and x.tolist() == [[9, 101, 4, 9, 104, 9]]


@CORES
def test_k_larger_than_candidates_commits_them_all_and_k_zero_none(core: Any) -> None:
    case = _row([9, 1, 9, 9], [0.1, 0.2, 0.3, 0.4], lo=0, hi=4, k=10)
    x, n = run_commit(core, case)
    assert n.tolist() == [3] and x.tolist() == [[100, 1, 102, 103]]
    case.k[0] = 0
    x, n = run_commit(core, case)
    assert n.tolist() == [0] and x.tolist() == case.x.tolist()


@CORES
def test_empty_block_and_empty_batch(core: Any) -> None:
    case = _row([9, 9, 9], [0.5, 0.5, 0.5], lo=2, hi=2, k=2)
    x, n = run_commit(core, case)
    assert n.tolist() == [0] and x.tolist() == [[9, 9, 9]]
    empty = np.zeros((0, 5), dtype=np.int64)
    rows = np.zeros(0, dtype=np.int64)
    counts = core.commit_step(empty, empty, np.zeros((0, 5), np.float32), rows, rows, rows, 9)
    assert counts.shape == (0,) and counts.dtype == np.int64
    assert core.transfer_schedule(rows, 4).shape == (0, 4)


@CORES
def test_rows_use_their_own_block_and_k(core: Any) -> None:
    x = np.full((2, 6), 9, dtype=np.int64)
    x0 = np.arange(12, dtype=np.int64).reshape(2, 6)
    conf = np.tile(np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], np.float32), (2, 1))
    n = core.commit_step(x, x0, conf, np.array([0, 3]), np.array([3, 6]), np.array([1, 2]), 9)
    assert n.tolist() == [1, 2]
    assert x.tolist() == [[9, 9, 2, 9, 9, 9], [9, 9, 9, 9, 10, 11]]


# ---------------------------------------------------------------- validation: both cores raise the same errors


def _bad_inputs() -> list[tuple[str, dict[str, Any], type[Exception]]]:
    x = np.full((2, 4), 9, dtype=np.int64)
    good: dict[str, Any] = {
        "x": x,
        "x0": np.zeros((2, 4), np.int64),
        "confidence": np.zeros((2, 4), np.float32),
        "block_lo": np.zeros(2, np.int64),
        "block_hi": np.full(2, 4, np.int64),
        "k": np.ones(2, np.int64),
        "mask_id": 9,
    }
    readonly = x.copy()
    readonly.flags.writeable = False
    cases: list[tuple[str, dict[str, Any], type[Exception]]] = [
        ("int32 x", {"x": x.astype(np.int32)}, TypeError),
        ("float64 confidence", {"confidence": np.zeros((2, 4))}, TypeError),
        ("list k", {"k": [1, 1]}, TypeError),
        ("1-D x0", {"x0": np.zeros(8, np.int64)}, ValueError),
        ("strided x0", {"x0": np.zeros((2, 8), np.int64)[:, ::2]}, ValueError),
        ("read-only x", {"x": readonly}, ValueError),
        ("shape mismatch", {"confidence": np.zeros((2, 5), np.float32)}, ValueError),
        ("wrong rows", {"k": np.ones(3, np.int64)}, ValueError),
        ("block past end", {"block_hi": np.array([4, 5], np.int64)}, ValueError),
        (
            "block reversed",
            {"block_lo": np.array([3, 0], np.int64), "block_hi": np.array([2, 4], np.int64)},
            ValueError,
        ),
        ("negative k", {"k": np.array([1, -1], np.int64)}, ValueError),
        ("float mask id", {"mask_id": 9.0}, TypeError),
        ("big-endian x0", {"x0": np.zeros((2, 4), ">i8")}, TypeError),
    ]
    return [(name, good | change, err) for name, change, err in cases]


@CORES
@pytest.mark.parametrize("name, kwargs, error", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_commit_step_rejects_bad_input(core: Any, name: str, kwargs: dict[str, Any], error: type[Exception]) -> None:
    before = kwargs["x"].copy()
    with pytest.raises(error):
        core.commit_step(**kwargs)
    np.testing.assert_array_equal(kwargs["x"], before)  # nothing was written


@CORES
def test_other_functions_reject_bad_input(core: Any) -> None:
    with pytest.raises(ValueError, match="steps"):
        core.transfer_schedule(np.array([3], np.int64), 0)
    with pytest.raises(ValueError, match="n_masked"):
        core.transfer_schedule(np.array([-1], np.int64), 2)
    with pytest.raises(TypeError, match="n_masked"):
        core.transfer_schedule(np.array([[1]], np.float32), 2)
    with pytest.raises(ValueError, match="block"):
        core.masks_left(np.zeros((1, 3), np.int64), np.array([0], np.int64), np.array([4], np.int64), 9)
    with pytest.raises(ConfigError, match="largest bucket"):
        core.choose_bucket(65, [32, 64])
    with pytest.raises(ConfigError, match="no length buckets"):
        core.choose_bucket(1, [])
    with pytest.raises(TypeError):
        core.choose_bucket(1, 5)


# ---------------------------------------------------------------- which core is active


def test_pure_python_env_forces_the_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loopcore.PURE_PYTHON_ENV, "1")
    assert active_core() is TWIN and core_name() == "python"
    monkeypatch.delenv(loopcore.PURE_PYTHON_ENV)
    assert core_name() == ("python" if c_core() is None else "c")


def test_active_core_is_the_c_module_when_built(c_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loopcore.PURE_PYTHON_ENV, raising=False)
    assert active_core() is c_module and core_name(c_module) == "c"
