"""The loop's host logic: the C core and the numpy twin agree exactly, and both follow the reference semantics."""

from __future__ import annotations

import math
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
from seer_deploy.core.generation import GenerationConfig
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
def test_transfer_schedule_c_and_twin_agree_on_an_even_split(c_module: ModuleType, n: list[int], steps: int) -> None:
    counts = np.array(n, dtype=np.int64)
    c_sched, py_sched = c_module.transfer_schedule(counts, steps), TWIN.transfer_schedule(counts, steps)
    assert c_sched.shape == py_sched.shape == (len(n), steps)
    np.testing.assert_array_equal(c_sched, py_sched)
    for row, total in zip(py_sched.tolist(), n, strict=True):
        base, rem = divmod(total, steps)  # an even split, the remainder to the first steps
        assert row == [base + (i < rem) for i in range(steps)]


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


def _outcome(fn: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """(error type, message), or (counts, x after) when the call succeeds on a copy of a writable x."""
    if isinstance(kwargs["x"], np.ndarray) and kwargs["x"].flags.writeable:
        kwargs = kwargs | {"x": kwargs["x"].copy()}
    try:
        counts = fn(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the type and message are what is compared
        return type(exc).__name__, str(exc)
    return counts.tolist(), kwargs["x"].tolist()


def test_error_messages_match_the_twin(c_module: ModuleType) -> None:
    bad = _bad_inputs()
    bad.append(("huge mask id", bad[-1][1] | {"x0": np.zeros((2, 4), np.int64), "mask_id": 2**63}, OverflowError))
    for name, kwargs, error in bad:
        outcome = _outcome(c_module.commit_step, kwargs)
        assert outcome[0] == error.__name__ and outcome == _outcome(TWIN.commit_step, kwargs), name
    x, rows = np.zeros((1, 3), np.int64), np.zeros(1, np.int64)
    for block_lo in ([0], rows.data, rows.astype(np.int32), np.zeros(1, object)):  # only int64 ndarrays
        outcomes = [
            _outcome(core.masks_left, {"x": x, "block_lo": block_lo, "block_hi": rows, "mask_id": 9})
            for core in (c_module, TWIN)
        ]
        assert outcomes[0][0] == "TypeError" and outcomes[0] == outcomes[1], block_lo


# ---------------------------------------------------------------- commit_confident (parallel decoding)

# Log-probabilities (what the loop ranks by) near Fast-dLLM's thresholds, and a NaN with the sign bit set (bits
# 0xffc00000: its raw bits would order it below every number).
LOG_PROBS = [float(np.float32(math.log(p))) for p in (0.99, 0.95, 0.9, 0.75, 0.7, 0.5, 0.1)]
NEG_NAN = -math.nan


@dataclass
class ConfidentCase:
    x: np.ndarray
    x0: np.ndarray
    confidence: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    thresholds: np.ndarray
    mask_id: int

    def kwargs(self, **change: Any) -> dict[str, Any]:
        names = ("x", "x0", "confidence", "block_lo", "block_hi", "thresholds", "mask_id")
        values = (self.x.copy(), self.x0, self.confidence, self.lo, self.hi, self.thresholds, self.mask_id)
        return dict(zip(names, values, strict=True)) | change


@st.composite
def rank_thresholds(draw: st.DrawFn, n: int) -> np.ndarray:
    """float32 [n]: Fast-dLLM's threshold or factor rule through GenerationConfig, a cut (-inf for the first ranks,
    +inf after: the top few, which tests the order itself) or any float32 values."""
    kind = draw(st.sampled_from(["threshold", "factor", "cut", "any"]))
    if kind == "cut":
        return np.where(np.arange(n) < draw(st.integers(1, max(n, 1))), -np.inf, np.inf).astype(np.float32)
    if kind == "threshold":
        threshold = draw(st.one_of(st.sampled_from([1.0, 0.9, 0.7, 0.5]), st.floats(1e-6, 1.0)))
        return GenerationConfig(decode="threshold", threshold=threshold).rank_thresholds(n)
    if kind == "factor":
        factor = draw(st.one_of(st.sampled_from([1.0, 0.5, 2.0]), st.floats(1e-3, 10.0)))
        return GenerationConfig(decode="factor", factor=factor).rank_thresholds(n)
    palette = draw(st.lists(st.sampled_from(SPECIAL + LOG_PROBS), min_size=1, max_size=3))
    value = st.one_of(
        st.sampled_from(palette), st.sampled_from(SPECIAL + LOG_PROBS), st.floats(width=32, allow_nan=True)
    )
    return np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.float32)


@st.composite
def confident_cases(draw: st.DrawFn) -> ConfidentCase:
    """step_cases' rows and blocks; thresholds as long as the widest block or longer; confidences that tie, are NaN,
    +-0.0, +-inf, log-probabilities or exactly a threshold (the >= boundary), mostly from a small palette per case so
    that NaN pairs, signed-zero pairs and ties land in one row."""
    base = draw(step_cases())
    widest = int((base.hi - base.lo).max()) if base.x.shape[0] else 0
    thresholds = draw(rank_thresholds(widest + draw(st.integers(0, 3))))
    pool = SPECIAL + LOG_PROBS + [NEG_NAN] + [float(t) for t in thresholds[1:]]
    if draw(st.booleans()):  # a tight palette: only ties, +-0.0 and NaNs of either sign decide the order
        value = st.sampled_from(draw(st.lists(st.sampled_from([0.0, -0.0, NAN, NEG_NAN, 0.5]), min_size=2)))
    else:
        palette = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        value = st.one_of(st.sampled_from(palette), st.sampled_from(pool), st.floats(width=32, allow_nan=True))
    size = base.x.size
    confidence = np.array(draw(st.lists(value, min_size=size, max_size=size)), dtype=np.float32)
    return ConfidentCase(base.x, base.x0, confidence.reshape(base.x.shape), base.lo, base.hi, thresholds, base.mask_id)


def oracle_confident(case: ConfidentCase) -> tuple[np.ndarray, np.ndarray]:
    """The rule written out: rank a row's candidates (NaN first, then higher confidence, then the lower position;
    Python's -0.0 == 0.0) and take ranks 0..n-1 while rank r >= 1 has confidence >= thresholds[r]."""
    x = case.x.copy()
    counts = np.zeros(x.shape[0], dtype=np.int64)
    for b in range(x.shape[0]):
        conf = {
            p: float(case.confidence[b, p])
            for p in range(int(case.lo[b]), int(case.hi[b]))
            if case.x[b, p] == case.mask_id
        }
        ranked = sorted(conf, key=lambda p: (not math.isnan(conf[p]), 0.0 if math.isnan(conf[p]) else -conf[p], p))
        n = 0
        for r, p in enumerate(ranked):
            if r > 0 and not conf[p] >= float(case.thresholds[r]):  # float32 values compare exactly as doubles
                break
            n = r + 1
        for p in ranked[:n]:
            x[b, p] = case.x0[b, p]
        counts[b] = n
    return x, counts


def run_confident(core: Any, case: ConfidentCase) -> tuple[np.ndarray, np.ndarray]:
    kwargs = case.kwargs()
    counts = core.commit_confident(**kwargs)
    return kwargs["x"], counts


@settings(max_examples=300, deadline=None)
@given(case=confident_cases())
def test_commit_confident_c_twin_and_rule_agree(c_module: ModuleType, case: ConfidentCase) -> None:
    x_c, n_c = run_confident(c_module, case)
    x_py, n_py = run_confident(TWIN, case)
    x_rule, n_rule = oracle_confident(case)
    assert n_c.dtype == n_py.dtype == np.int64 and n_c.shape == (case.x.shape[0],)
    np.testing.assert_array_equal(n_c, n_py)
    np.testing.assert_array_equal(x_c, x_py)
    np.testing.assert_array_equal(n_py, n_rule)
    np.testing.assert_array_equal(x_py, x_rule)


@CORES
@settings(max_examples=100, deadline=None)
@given(case=confident_cases())
def test_commit_confident_commits_inside_the_block_and_at_least_one(core: Any, case: ConfidentCase) -> None:
    x, counts = run_confident(core, case)
    x_rule, n_rule = oracle_confident(case)
    np.testing.assert_array_equal(x, x_rule)
    np.testing.assert_array_equal(counts, n_rule)
    columns = np.arange(case.x.shape[1])
    for b in range(case.x.shape[0]):
        candidate = (case.x[b] == case.mask_id) & (columns >= case.lo[b]) & (columns < case.hi[b])
        changed = x[b] != case.x[b]  # x0 (100..200) never holds the mask id
        assert not (changed & ~candidate).any()  # outside the block and non-mask positions are untouched
        np.testing.assert_array_equal(x[b][changed], case.x0[b][changed])
        assert counts[b] == changed.sum() and (counts[b] >= 1) == candidate.any()


def _confident_row(
    conf: list[float], thresholds: list[float], x: list[int] | None = None, lo: int = 0, hi: int | None = None
) -> ConfidentCase:
    n = len(conf)
    return ConfidentCase(
        x=np.array([x if x is not None else [9] * n], dtype=np.int64),
        x0=np.arange(100, 100 + n, dtype=np.int64)[None],
        confidence=np.array([conf], dtype=np.float32),
        lo=np.array([lo], dtype=np.int64),
        hi=np.array([n if hi is None else hi], dtype=np.int64),
        thresholds=np.array(thresholds, dtype=np.float32),
        mask_id=9,
    )


@CORES
def test_confident_threshold_rule_and_rank_zero_always(core: Any) -> None:
    thresholds = GenerationConfig(decode="threshold", threshold=0.9).rank_thresholds(5).tolist()
    case = _confident_row([math.log(p) for p in (0.95, 0.5, 0.92, 0.3, 0.97)], thresholds)
    x, n = run_confident(core, case)
    assert n.tolist() == [3] and x.tolist() == [[100, 9, 102, 9, 104]]
    case = _confident_row([math.log(0.1)] * 4, thresholds[:4])  # nothing clears 0.9: rank 0 (the lowest position) alone
    x, n = run_confident(core, case)
    assert n.tolist() == [1] and x.tolist() == [[100, 9, 9, 9]]


@CORES
def test_confident_factor_rule_stops_at_the_first_failing_rank(core: Any) -> None:
    # factor 1: rank r needs probability >= 1 - 1 / (r + 2): rank 1 >= 2/3, rank 2 >= 3/4, rank 3 >= 4/5.
    thresholds = GenerationConfig(decode="factor", factor=1.0).rank_thresholds(5).tolist()
    case = _confident_row([math.log(p) for p in (0.7, 0.8, 0.6, 0.9, 0.99)], thresholds)
    x, n = run_confident(core, case)  # ranks: 0.99, 0.9, 0.8 (>= 3/4), then 0.7 < 4/5 stops (0.6 is not reached)
    assert n.tolist() == [3] and x.tolist() == [[9, 101, 9, 103, 104]]


@CORES
def test_confident_nan_ranks_first_and_fails_every_threshold(core: Any) -> None:
    case = _confident_row([0.0, NAN, NAN, 0.0], [-INF] * 4)
    x, n = run_confident(core, case)  # rank 0 is the first NaN; the second NaN at rank 1 fails even -inf
    assert n.tolist() == [1] and x.tolist() == [[9, 101, 9, 9]]
    case = _confident_row([1.0, 2.0], [0.0, NAN])  # a NaN threshold fails too
    assert run_confident(core, case)[0].tolist() == [[9, 101]]
    case = _confident_row([INF, NEG_NAN, 0.0], [-INF, -INF, 0.5])  # a NaN ranks first whatever its sign bit
    assert np.signbit(case.confidence[0, 1])
    x, n = run_confident(core, case)
    assert n.tolist() == [2] and x.tolist() == [[100, 101, 9]]


@CORES
def test_confident_signed_zeros_tie_and_equal_confidence_clears(core: Any) -> None:
    case = _confident_row([-0.0, 0.0, -0.5, -1.0], [-INF, 0.5, 0.5, 0.5])
    x, n = run_confident(core, case)  # -0.0 (0) ties +0.0 (1): the lower position is rank 0; rank 1 fails 0.5
    assert n.tolist() == [1] and x.tolist() == [[100, 9, 9, 9]]
    case = _confident_row([-0.0, 0.0, -0.5, -1.0], [-INF, -0.0, -0.5, -0.25])
    x, n = run_confident(core, case)  # 0.0 >= -0.0 and -0.5 >= -0.5 clear; -1 < -0.25 stops
    assert n.tolist() == [3] and x.tolist() == [[100, 101, 102, 9]]
    assert x.tolist() == oracle_confident(case)[0].tolist()


@CORES
def test_confident_only_masked_positions_inside_each_rows_block(core: Any) -> None:
    x = np.array([[9, 9, 4, 9, 9, 9], [9, 9, 9, 9, 9, 9]], dtype=np.int64)
    x0 = np.arange(12, dtype=np.int64).reshape(2, 6)
    conf = np.array([[0.0, -0.1, 0.0, -0.2, -0.3, 0.0], [0.0] * 6], dtype=np.float32)
    thresholds = np.array([-INF, -0.25, -0.25, -0.25], dtype=np.float32)
    n = core.commit_confident(x, x0, conf, np.array([1, 4]), np.array([5, 4]), thresholds, 9)
    # Row 0: candidates 1, 3, 4 (2 is committed, 0 and 5 are outside): ranks -0.1, -0.2, then -0.3 fails.
    assert n.tolist() == [2, 0]
    assert x.tolist() == [[9, 1, 4, 3, 9, 9], [9, 9, 9, 9, 9, 9]]


@CORES
def test_confident_empty_batch_sequence_and_blocks(core: Any) -> None:
    none = np.zeros(0, np.float32)
    for batch, seq in ((0, 5), (2, 0), (0, 0)):
        x = np.full((batch, seq), 9, np.int64)
        rows = np.zeros(batch, np.int64)
        counts = core.commit_confident(x, x, np.zeros((batch, seq), np.float32), rows, rows, none, 9)
        assert counts.shape == (batch,) and counts.dtype == np.int64 and not counts.any()
    case = _confident_row([0.5, 0.5, 0.5], [], lo=2, hi=2)  # empty blocks need no thresholds
    x, n = run_confident(core, case)
    assert n.tolist() == [0] and x.tolist() == [[9, 9, 9]]


def _confident_good() -> ConfidentCase:
    return ConfidentCase(
        x=np.full((2, 4), 9, dtype=np.int64),
        x0=np.zeros((2, 4), np.int64),
        confidence=np.zeros((2, 4), np.float32),
        lo=np.zeros(2, np.int64),
        hi=np.full(2, 4, np.int64),
        thresholds=np.zeros(4, np.float32),
        mask_id=9,
    )


def _confident_changes() -> list[tuple[str, dict[str, Any], type[Exception]]]:
    """(name, the arguments that replace good ones, the error they raise)."""
    readonly = np.full((2, 4), 9, dtype=np.int64)
    readonly.flags.writeable = False
    return [
        ("int32 x", {"x": np.full((2, 4), 9, dtype=np.int32)}, TypeError),
        ("float64 confidence", {"confidence": np.zeros((2, 4))}, TypeError),
        ("float64 thresholds", {"thresholds": np.zeros(4)}, TypeError),
        ("list thresholds", {"thresholds": [0.0] * 4}, TypeError),
        ("list block_lo", {"block_lo": [0, 0]}, TypeError),
        ("torch thresholds", {"thresholds": torch.zeros(4)}, TypeError),
        ("int64 thresholds", {"thresholds": np.zeros(4, np.int64)}, TypeError),
        ("big-endian x0", {"x0": np.zeros((2, 4), ">i8")}, TypeError),
        ("float mask id", {"mask_id": 9.0}, TypeError),
        ("huge mask id", {"mask_id": 2**63}, OverflowError),
        ("1-D x0", {"x0": np.zeros(8, np.int64)}, ValueError),
        ("2-D thresholds", {"thresholds": np.zeros((1, 4), np.float32)}, ValueError),
        ("strided x0", {"x0": np.zeros((2, 8), np.int64)[:, ::2]}, ValueError),
        ("strided thresholds", {"thresholds": np.zeros(8, np.float32)[::2]}, ValueError),
        ("read-only x", {"x": readonly}, ValueError),
        ("shape mismatch", {"confidence": np.zeros((2, 5), np.float32)}, ValueError),
        ("wrong rows", {"block_hi": np.full(3, 4, np.int64)}, ValueError),
        ("block past end", {"block_hi": np.array([4, 5], np.int64)}, ValueError),
        ("negative block", {"block_lo": np.array([0, -1], np.int64)}, ValueError),
        (
            "block reversed",
            {"block_lo": np.array([3, 0], np.int64), "block_hi": np.array([2, 4], np.int64)},
            ValueError,
        ),
        ("short thresholds", {"thresholds": np.zeros(3, np.float32)}, ValueError),
        (
            "short thresholds, one wide row",
            {"block_lo": np.array([2, 0], np.int64), "thresholds": np.zeros(3, np.float32)},
            ValueError,
        ),
    ]


CONFIDENT_CHANGES = _confident_changes()
CONFIDENT_BAD = [(name, _confident_good().kwargs(**change), err) for name, change, err in CONFIDENT_CHANGES]


@CORES
@pytest.mark.parametrize("name, kwargs, error", CONFIDENT_BAD, ids=[c[0] for c in CONFIDENT_BAD])
def test_commit_confident_rejects_bad_input(
    core: Any, name: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    before = kwargs["x"].copy()
    with pytest.raises(error):
        core.commit_confident(**kwargs)
    np.testing.assert_array_equal(kwargs["x"], before)  # nothing was written


def test_commit_confident_errors_match_the_twin(c_module: ModuleType) -> None:
    for name, kwargs, error in CONFIDENT_BAD:
        outcome = _outcome(c_module.commit_confident, kwargs)
        assert outcome[0] == error.__name__ and outcome == _outcome(TWIN.commit_confident, kwargs), name
    short = _confident_good().kwargs(thresholds=np.zeros(3, np.float32))
    message = "thresholds has 3 ranks but a block spans 4 positions; give one threshold per rank of the widest block"
    assert _outcome(c_module.commit_confident, short) == ("ValueError", message)


@settings(max_examples=200, deadline=None)
@given(picks=st.lists(st.sampled_from(range(len(CONFIDENT_CHANGES))), min_size=2, max_size=4, unique=True))
def test_commit_confident_checks_in_the_twins_order(c_module: ModuleType, picks: list[int]) -> None:
    """Several bad arguments at once: both cores report the same one first."""
    change: dict[str, Any] = {}
    for i in picks:
        change |= CONFIDENT_CHANGES[i][1]
    kwargs = _confident_good().kwargs(**change)
    assert _outcome(c_module.commit_confident, kwargs) == _outcome(TWIN.commit_confident, kwargs)


# ---------------------------------------------------------------- which core is active


def test_pure_python_env_forces_the_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loopcore.PURE_PYTHON_ENV, "1")
    assert active_core() is TWIN and core_name() == "python"
    monkeypatch.delenv(loopcore.PURE_PYTHON_ENV)
    assert core_name() == ("python" if c_core() is None else "c")


def test_active_core_is_the_c_module_when_built(c_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loopcore.PURE_PYTHON_ENV, raising=False)
    assert active_core() is c_module and core_name(c_module) == "c"
