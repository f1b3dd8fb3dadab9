"""Length buckets: which kept (response) lengths an engine gets a profile for.

After step zero each request keeps `kept` response positions (Seer's boundary + margin, at most gen_length); the
later steps run on a fixed set of response lengths, the buckets, so an engine needs one optimization profile per
bucket rather than one profile tuned for the worst case.

How the prompt enters the sequence axis: the graphs see S = prompt width + response length, where prompts are
left-padded to the batch's widest prompt. An engine is built for prompt widths in [min_prompt, max_prompt]
(fixed at build time) and profile i serves response lengths (bucket[i-1], bucket[i]], so its sequence range is
[min_prompt + bucket[i-1] + 1, max_prompt + bucket[i]] with opt = max (the padded shape the runtime actually
runs: prompt width + bucket). Ranges of neighbouring profiles overlap whenever max_prompt > min_prompt, so a
sequence length alone does not name a profile: the runtime picks the profile by the kept (response) length
with `choose_profile`, and checks the prompt width and batch against the profile's ranges.

This module plans the buckets (and the KV cache's window lengths); what each becomes as an optimization profile
(shape ranges per input, which profile a call takes) is `engines.profiles`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from seer_deploy.core.checks import ascii_ints
from seer_deploy.core.errors import ConfigError

DEFAULT_MIN_BUCKET = 16
DEFAULT_BLOCK_WINDOW = 32  # LLaDA's block length: the window a cached pass usually runs

Histogram = Mapping[int, float] | Sequence[int]


def power_of_two_buckets(max_gen_length: int, min_bucket: int = DEFAULT_MIN_BUCKET) -> list[int]:
    """min_bucket rounded up to a power of two, doubling, always ending at max_gen_length."""
    _check_lengths(max_gen_length, min_bucket)
    bucket = 1 << max(0, (min_bucket - 1).bit_length())
    buckets = []
    while bucket < max_gen_length:
        buckets.append(bucket)
        bucket *= 2
    return buckets + [max_gen_length]


def plan_buckets(
    max_gen_length: int,
    *,
    histogram: Histogram | None = None,
    max_buckets: int | None = None,
    min_bucket: int = DEFAULT_MIN_BUCKET,
) -> list[int]:
    """The kept-length buckets for an engine, ascending, the last always max_gen_length.

    Without a histogram: powers of two (`power_of_two_buckets`). With one (calibration's kept lengths, as a list
    of lengths or a {length: count} mapping): the at most `max_buckets` buckets that minimise the expected padded
    tokens, found exactly by dynamic programming; `max_buckets` defaults to the size of the power-of-two ladder,
    so a calibrated plan never builds more profiles than the default. Without a histogram but with
    `max_buckets` smaller than the ladder, the ladder subset that is best for uniformly spread lengths is kept.
    No bucket is smaller than min_bucket (tiny profiles cost build time and save almost nothing).
    """
    _check_lengths(max_gen_length, min_bucket)
    ladder = power_of_two_buckets(max_gen_length, min_bucket)
    if max_buckets is not None and max_buckets < 1:
        raise ConfigError(f"max_buckets must be at least 1 (got {max_buckets})")
    if histogram is None:
        if max_buckets is None or max_buckets >= len(ladder):
            return ladder
        uniform = {length: 1.0 for length in range(1, max_gen_length + 1)}
        return optimal_buckets(uniform, ladder, max_buckets)
    weights = normalize_histogram(histogram, max_gen_length)
    floor = min(min_bucket, max_gen_length)
    candidates = sorted({max(length, floor) for length in weights} | {max_gen_length})
    return optimal_buckets(weights, candidates, max_buckets if max_buckets is not None else len(ladder))


def optimal_buckets(weights: Mapping[int, float], candidates: Sequence[int], max_buckets: int) -> list[int]:
    """The subset of `candidates` (ascending, the last one kept) of at most max_buckets entries that minimises
    `expected_padding`; every weighted length must be <= candidates[-1].

    Exact: f[k][j] = least padded cost of lengths <= c_j using k buckets whose largest is c_j, computed as
    f[k][j] = min_i f[k-1][i] + c_j * (W(c_j) - W(c_i)) with W the cumulative weight, O(max_buckets * m^2)
    vectorised over i. Ties go to fewer buckets, then to the smaller earlier boundary, so plans are reproducible.
    """
    cands = np.asarray(candidates, dtype=np.float64)
    m = len(cands)
    if m == 0 or list(candidates) != sorted(set(candidates)):
        raise ConfigError("bucket candidates must be distinct and ascending")
    if any(length > candidates[-1] for length, w in weights.items() if w > 0):
        raise ConfigError(f"a length exceeds the largest bucket candidate {candidates[-1]}")
    # served[j] = total weight of lengths in (c_{j-1}, c_j]; the constant sum(length * w) does not change the argmin.
    served = np.zeros(m)
    for length, w in weights.items():
        served[int(np.searchsorted(cands, length, side="left"))] += w
    cum = np.cumsum(served)
    k_max = min(max_buckets, m)
    cost = np.full((k_max + 1, m), np.inf)
    back = np.full((k_max + 1, m), -1, dtype=np.int64)
    cost[1] = cands * cum
    for k in range(2, k_max + 1):
        for j in range(k - 1, m):
            options = cost[k - 1, :j] + cands[j] * (cum[j] - cum[:j])
            i = int(np.argmin(options))
            cost[k, j], back[k, j] = options[i], i
    best_k = 1 + int(np.argmin(cost[1:, m - 1]))  # argmin: the first (fewest buckets) among equal costs
    chosen, j = [], m - 1
    for k in range(best_k, 0, -1):
        chosen.append(int(candidates[j]))
        j = int(back[k, j])
    return chosen[::-1]


def normalize_histogram(histogram: Histogram, max_gen_length: int) -> dict[int, float]:
    """{length: weight} from a list of lengths or a mapping, every length checked against 1..max_gen_length."""
    pairs: Iterable[tuple[int, float]]
    if isinstance(histogram, Mapping):
        pairs = ((int(k), float(v)) for k, v in histogram.items())
    else:
        pairs = ((int(length), 1.0) for length in histogram)
    weights: dict[int, float] = {}
    for length, w in pairs:
        if not 1 <= length <= max_gen_length:
            raise ConfigError(
                f"kept length {length} in the calibration histogram is outside 1..{max_gen_length}; "
                f"recalibrate with the same gen_length as the engine, or raise max_gen_length"
            )
        if not np.isfinite(w) or w < 0:
            raise ConfigError(f"histogram weight {w} for length {length} must be a finite count >= 0")
        weights[length] = weights.get(length, 0.0) + w
    if not weights or sum(weights.values()) <= 0:
        raise ConfigError("the calibration histogram is empty; calibrate on some prompts or omit the histogram")
    return weights


def expected_padding(buckets: Sequence[int], histogram: Histogram) -> float:
    """Mean padded (wasted) response positions per request when each length runs in its bucket."""
    weights = normalize_histogram(histogram, max(buckets))
    total = sum(weights.values())
    return sum(w * (buckets[bucket_index(length, buckets)] - length) for length, w in weights.items()) / total


def bucket_index(kept_len: int, buckets: Sequence[int]) -> int:
    """Index of the smallest bucket >= kept_len; ConfigError past the largest."""
    if kept_len < 1:
        raise ConfigError(f"kept length must be at least 1 (got {kept_len})")
    for i, bucket in enumerate(buckets):
        if kept_len <= bucket:
            return i
    raise ConfigError(
        f"kept length {kept_len} exceeds the largest bucket {buckets[-1]} of this engine; "
        f"lower --gen-length to at most {buckets[-1]} or rebuild the engine with a larger last bucket"
    )


def parse_buckets(text: str) -> list[int]:
    """'32,64,128' -> [32, 64, 128], checked (the --buckets option)."""
    buckets = ascii_ints(text)
    if buckets is None:
        raise ConfigError(f"--buckets '{text}' is not a comma-separated list of integers (digits 0-9), e.g. 32,64,128")
    check_buckets(buckets)
    return buckets


def check_buckets(buckets: Sequence[int]) -> None:
    if not buckets:
        raise ConfigError("at least one bucket is needed, e.g. --buckets 32,64,128")
    if any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise ConfigError(f"buckets {list(buckets)} must be positive, distinct and ascending, e.g. 32,64,128")


def default_window_lengths(buckets: Sequence[int]) -> tuple[int, ...]:
    """The window lengths of a window_step engine built without --window-lengths: 32 (LLaDA's block length) and the
    last bucket (a single block over the whole response), so every window up to the longest response is covered."""
    check_buckets(buckets)
    last = buckets[-1]
    return tuple(sorted({min(DEFAULT_BLOCK_WINDOW, last), last}))


def parse_window_lengths(text: str) -> list[int]:
    """'16,32' -> [16, 32] (the --window-lengths option; checked against the buckets by `WindowLayout.validate`)."""
    windows = ascii_ints(text)
    if windows is None:
        raise ConfigError(f"--window-lengths '{text}' is not a comma-separated list of integers (digits 0-9), e.g. 32 "
                          "or 16,32")
    if not windows or any(w < 1 for w in windows) or windows != sorted(set(windows)):
        raise ConfigError(f"--window-lengths '{text}' must be positive, distinct and ascending, e.g. 32 or 16,32")
    return windows


def _check_lengths(max_gen_length: int, min_bucket: int) -> None:
    if max_gen_length < 1:
        raise ConfigError(f"max_gen_length must be at least 1 (got {max_gen_length})")
    if min_bucket < 1:
        raise ConfigError(f"min_bucket must be at least 1 (got {min_bucket})")
