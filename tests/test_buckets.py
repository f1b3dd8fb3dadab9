"""Length buckets: power-of-two ladders, the histogram-optimal plan (against brute force), profiles and their choice."""

from __future__ import annotations

from itertools import combinations, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.core.errors import ConfigError
from seer_deploy.engines.buckets import (
    bucket_index,
    default_window_lengths,
    expected_padding,
    parse_buckets,
    parse_window_lengths,
    plan_buckets,
    power_of_two_buckets,
)

# ---------------------------------------------------------------- power-of-two ladders


def test_power_of_two_examples() -> None:
    assert power_of_two_buckets(48, 16) == [16, 32, 48]
    assert power_of_two_buckets(64, 16) == [16, 32, 64]
    assert power_of_two_buckets(100, 20) == [32, 64, 100]  # min_bucket rounds up to a power of two
    assert power_of_two_buckets(10, 16) == [10]  # a tiny model: one bucket, the whole length


@given(max_len=st.integers(1, 5000), min_bucket=st.integers(1, 300))
def test_power_of_two_properties(max_len: int, min_bucket: int) -> None:
    buckets = power_of_two_buckets(max_len, min_bucket)
    assert buckets[-1] == max_len
    assert buckets == sorted(set(buckets))
    for b in buckets[:-1]:
        assert b & (b - 1) == 0 and b >= min_bucket
    for a, b in pairwise(buckets[:-1]):
        assert b == 2 * a


def test_plan_without_histogram_is_the_ladder() -> None:
    assert plan_buckets(256) == power_of_two_buckets(256)


@pytest.mark.parametrize("bad", [{"max_gen_length": 0}, {"max_gen_length": 64, "min_bucket": 0},
                                 {"max_gen_length": 64, "max_buckets": 0}])
def test_plan_rejects_bad_settings(bad: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        plan_buckets(**bad)


# ---------------------------------------------------------------- the optimal plan against brute force


def brute_force_padding(weights: dict[int, int], max_len: int, max_buckets: int, floor: int,
                        allowed: list[int] | None = None) -> float:
    """Least expected padding over every bucket set (all lengths >= floor, or `allowed`) ending at max_len."""
    pool = allowed[:-1] if allowed is not None else [b for b in range(min(floor, max_len), max_len)]
    best = float("inf")
    for k in range(max_buckets):
        for subset in combinations(pool, k):
            best = min(best, expected_padding([*subset, max_len], weights))
    return best


def check_plan_shape(plan: list[int], max_len: int, max_buckets: int, min_bucket: int) -> None:
    assert plan == sorted(set(plan)) and plan[-1] == max_len and len(plan) <= max_buckets
    assert all(b >= min(min_bucket, max_len) for b in plan)


@settings(max_examples=150, deadline=None)
@given(
    max_len=st.integers(1, 12),
    data=st.data(),
    max_buckets=st.integers(1, 4),
    min_bucket=st.integers(1, 5),
)
def test_histogram_plan_matches_brute_force(max_len: int, data: st.DataObject, max_buckets: int,
                                            min_bucket: int) -> None:
    weights = data.draw(st.dictionaries(st.integers(1, max_len), st.integers(1, 20), min_size=1))
    plan = plan_buckets(max_len, histogram=weights, max_buckets=max_buckets, min_bucket=min_bucket)
    check_plan_shape(plan, max_len, max_buckets, min_bucket)
    assert expected_padding(plan, weights) == pytest.approx(
        brute_force_padding(weights, max_len, max_buckets, min_bucket), abs=1e-9
    )


@settings(max_examples=60, deadline=None)
@given(max_len=st.integers(2, 300), max_buckets=st.integers(1, 4))
def test_ladder_subset_is_best_for_uniform_lengths(max_len: int, max_buckets: int) -> None:
    ladder = power_of_two_buckets(max_len, 4)
    plan = plan_buckets(max_len, max_buckets=max_buckets, min_bucket=4)
    check_plan_shape(plan, max_len, max_buckets, 4)
    assert set(plan) <= set(ladder)
    uniform = list(range(1, max_len + 1))
    assert expected_padding(plan, uniform) == pytest.approx(
        brute_force_padding(dict.fromkeys(uniform, 1), max_len, max_buckets, 4, allowed=ladder)
    )


def test_histogram_list_and_mapping_agree() -> None:
    lengths = [3, 3, 7, 20, 20, 20, 41, 60]
    counts = {3: 2, 7: 1, 20: 3, 41: 1, 60: 1}
    assert plan_buckets(64, histogram=lengths, max_buckets=3, min_bucket=1) == plan_buckets(
        64, histogram=counts, max_buckets=3, min_bucket=1
    )


def test_ties_prefer_fewer_buckets() -> None:
    # Every request keeps 5: one bucket at 5 (plus the mandatory max) has zero padding; more buckets add nothing.
    assert plan_buckets(64, histogram=[5] * 10, max_buckets=4, min_bucket=1) == [5, 64]


def test_histogram_default_max_buckets_is_the_ladder_size() -> None:
    plan = plan_buckets(256, histogram=list(range(1, 257)), min_bucket=16)
    assert len(plan) == len(power_of_two_buckets(256, 16))


def test_histogram_plan_beats_the_ladder_on_a_peaked_distribution() -> None:
    lengths = [40] * 50 + [90] * 30 + [200] * 5
    plan = plan_buckets(256, histogram=lengths, max_buckets=4)
    assert {40, 90} <= set(plan)
    assert expected_padding(plan, lengths) < expected_padding(power_of_two_buckets(256), lengths)


@pytest.mark.parametrize("histogram", [[0, 5], [65], {10: -1.0}, {10: float("nan")}, [], {3: 0.0}])
def test_bad_histograms_are_refused(histogram: object) -> None:
    with pytest.raises(ConfigError):
        plan_buckets(64, histogram=histogram)  # type: ignore[arg-type]


def test_a_plan_over_4096_lengths_pads_no_more_than_any_eight_rungs_of_the_ladder() -> None:
    """At a realistic size (4096 candidate lengths, 20,000 kept lengths; its speed is benchmarked, not asserted): the
    plan has the plan's shape and pads fewer tokens than the ladder's top eight rungs or its bottom seven and 4096."""
    lengths = [(i * 37) % 4096 + 1 for i in range(20000)]
    plan = plan_buckets(4096, histogram=lengths, max_buckets=8)
    check_plan_shape(plan, 4096, 8, 16)

    def padded(buckets: list[int]) -> int:
        return sum(min(b for b in buckets if b >= n) - n for n in lengths)

    ladder = [16 << i for i in range(9)]  # 16 .. 4096
    assert padded(plan) <= min(padded(ladder[1:]), padded(ladder[:7] + [4096]))


def test_bucket_index_and_parse() -> None:
    assert parse_buckets("32, 64,128") == [32, 64, 128]
    assert bucket_index(33, [32, 64, 128]) == 1
    for bad in ("64,32", "32,32", "a,b", "", "0,8"):
        with pytest.raises(ConfigError):
            parse_buckets(bad)


# ---------------------------------------------------------------- window lengths


def test_default_window_lengths() -> None:
    assert default_window_lengths([16, 32, 64, 128]) == (32, 128)  # LLaDA's block, and one block of the response
    assert default_window_lengths([16, 32]) == (32,)
    assert default_window_lengths([16]) == (16,)  # never wider than the longest response
    assert parse_window_lengths("16, 32") == [16, 32]
    for bad in ("32,16", "16,16", "0", "", "a"):
        with pytest.raises(ConfigError, match="--window-lengths"):
            parse_window_lengths(bad)


