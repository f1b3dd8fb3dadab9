"""Length buckets and the TensorRT optimization profiles they become.

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

The KV cache's window_step graph (export --kv-cache) has a third dynamic axis, the window: the columns a cached pass
runs, a denoising block. Its engine has one profile per (length bucket, window length) pair (`WindowLayout`): window
lengths w_1 < ... < w_m are planned like buckets, profile (i, j) serving windows (w_{j-1}, w_j] at the sequence lengths
of bucket i, and a pair no call can reach (its narrowest window wider than the response columns of bucket i's calls)
is left out. Without --window-lengths: 32 (LLaDA's block length) and the last bucket (one block over the whole
response, what generation runs without --block-length), so every window up to the longest response has a profile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.spec.graphs import INPUT_IDS, Axis, GraphIO

DEFAULT_MIN_BUCKET = 16
DEFAULT_BLOCK_WINDOW = 32  # LLaDA's block length: the window a cached pass usually runs

Histogram = Mapping[int, float] | Sequence[int]
ProfileDim = Axis | int  # an input axis: Axis.BATCH, Axis.SEQ (prompt + response), or a fixed size


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
    try:
        buckets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(f"--buckets '{text}' is not a comma-separated list of integers, e.g. 32,64,128") from exc
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
    try:
        windows = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(f"--window-lengths '{text}' is not a comma-separated list of integers, e.g. 32 or "
                          "16,32") from exc
    if not windows or any(w < 1 for w in windows) or windows != sorted(set(windows)):
        raise ConfigError(f"--window-lengths '{text}' must be positive, distinct and ascending, e.g. 32 or 16,32")
    return windows


def _check_lengths(max_gen_length: int, min_bucket: int) -> None:
    if max_gen_length < 1:
        raise ConfigError(f"max_gen_length must be at least 1 (got {max_gen_length})")
    if min_bucket < 1:
        raise ConfigError(f"min_bucket must be at least 1 (got {min_bucket})")


@dataclass(frozen=True)
class ShapeRange:
    """One input's (min, opt, max) shapes in one optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One optimization profile: the response lengths (lo, bucket] it serves and each input's shape range; a
    window_step engine's profile also the windows [window_lo, window] it serves (both 0 for the other graphs)."""

    index: int
    bucket: int
    lo: int  # the previous bucket (0 for the first): this profile serves kept lengths lo+1 .. bucket
    shapes: dict[str, ShapeRange]
    window: int = 0  # the widest window (window_step only)
    window_lo: int = 0  # the narrowest window (window_step only)


@dataclass(frozen=True)
class ProfileLayout:
    """What an engine's profiles cover: buckets (response lengths), batch 1..max_batch, prompt widths."""

    buckets: tuple[int, ...]
    max_batch: int
    max_prompt: int
    min_prompt: int = 1

    def validate(self, max_seq_len: int | None = None) -> None:
        """ConfigError naming the bad setting; max_seq_len is the model's position limit, when known."""
        check_buckets(self.buckets)
        if self.max_batch < 1:
            raise ConfigError(f"--max-batch must be at least 1 (got {self.max_batch})")
        if self.min_prompt < 1:
            raise ConfigError(f"--min-prompt must be at least 1 (got {self.min_prompt})")
        if self.min_prompt > self.max_prompt:
            raise ConfigError(
                f"prompt width range [{self.min_prompt}, {self.max_prompt}] is empty; --max-prompt must be >= "
                f"{max(1, self.min_prompt)}"
            )
        if max_seq_len is not None and self.max_prompt + self.buckets[-1] > max_seq_len:
            raise ConfigError(
                f"--max-prompt {self.max_prompt} + the largest bucket {self.buckets[-1]} = "
                f"{self.max_prompt + self.buckets[-1]} exceeds the model's {max_seq_len} positions; "
                f"lower --max-prompt to {max_seq_len - self.buckets[-1]} or use smaller buckets"
            )

    def check_batch(self, batch: int | None) -> None:
        """ConfigError for a batch the profiles do not cover (None: not known, not checked)."""
        if batch is not None and not 1 <= batch <= self.max_batch:
            raise ConfigError(
                f"batch {batch} is outside this engine's 1..{self.max_batch}; split the batch or rebuild with "
                f"--max-batch {batch}"
            )

    @property
    def profile_count(self) -> int:
        return len(self.buckets)

    def largest_axes(self) -> dict[Axis, int]:
        """The batch and sequence length of the largest call any profile takes (the last profile's maximum)."""
        return {Axis.BATCH: self.max_batch, Axis.SEQ: self.max_prompt + self.buckets[-1]}

    def seq_range(self, index: int) -> tuple[int, int]:
        """(min, max) sequence length of profile `index`: min_prompt + previous bucket + 1, max_prompt + bucket."""
        lo = self.buckets[index - 1] if index > 0 else 0
        return self.min_prompt + lo + 1, self.max_prompt + self.buckets[index]


@dataclass(frozen=True)
class WindowLayout:
    """The window_step engine's profiles: one per (length bucket, window length) pair a call can reach.

    Pair (i, j) serves sequence lengths as profile i of `layout` does and windows (windows[j-1], windows[j]], capped
    at the most response columns a call of bucket i has (max_prompt + bucket_i - min_prompt: a window lies inside
    the response); a pair whose narrowest window is past that cap is left out. Its shortest sequence is also at least
    min_prompt + its narrowest window, so the profile's min shapes are a call that can happen. Profiles are numbered
    bucket-major.
    """

    layout: ProfileLayout
    windows: tuple[int, ...]

    def validate(self, max_seq_len: int | None = None) -> None:
        """ConfigError naming the bad setting (the layout's, or window lengths that no call can use)."""
        self.layout.validate(max_seq_len)
        w, last = list(self.windows), self.layout.buckets[-1]
        if not w or any(v < 1 for v in w) or w != sorted(set(w)):
            raise ConfigError(f"window lengths {w} must be positive, distinct and ascending, e.g. --window-lengths 32")
        if w[-1] > last:
            raise ConfigError(
                f"window length {w[-1]} exceeds the last bucket {last}: a window is a denoising block inside the "
                f"response, at most the longest response; use --window-lengths up to {last}"
            )

    def window_cap(self, bucket_index: int) -> int:
        """The most response columns a call of bucket `bucket_index` has: its longest sequence less the narrowest
        prompt."""
        return self.layout.max_prompt + self.layout.buckets[bucket_index] - self.layout.min_prompt

    def window_range(self, bucket_index: int, window_index: int) -> tuple[int, int]:
        """(narrowest, widest) window of pair (bucket_index, window_index); empty (lo > hi) when none is reachable."""
        lo = self.windows[window_index - 1] + 1 if window_index > 0 else 1
        return lo, min(self.windows[window_index], self.window_cap(bucket_index))

    def seq_range(self, bucket_index: int, window_index: int) -> tuple[int, int]:
        """(min, max) sequence length of pair (bucket_index, window_index): bucket i's, at least min_prompt + the
        narrowest window."""
        lo, hi = self.layout.seq_range(bucket_index)
        return max(lo, self.layout.min_prompt + self.window_range(bucket_index, window_index)[0]), hi

    def pairs(self) -> list[tuple[int, int]]:
        """(bucket index, window index) of every profile, in profile order."""
        return [(i, j) for i in range(len(self.layout.buckets)) for j in range(len(self.windows))
                if self.window_range(i, j)[0] <= self.window_range(i, j)[1]]

    @property
    def profile_count(self) -> int:
        return len(self.pairs())

    def largest_axes(self) -> dict[Axis, int]:
        """The batch, sequence length and window of the largest call any profile takes."""
        return {**self.layout.largest_axes(), Axis.WINDOW: self.windows[-1]}

    def choose(self, seq_len: int, window: int, *, batch: int | None = None) -> int:
        """The profile for a cached pass of `window` columns over a sequence of seq_len: the length bucket's (as
        `choose_profile_for_seq`), and in it the smallest window length >= window. ConfigError where none covers it."""
        bucket = choose_profile_for_seq(seq_len, self.layout, batch=batch)
        if window < 1:
            raise ConfigError(f"a window must have at least one column (got {window})")
        widest = self.windows[-1]
        if window > widest:
            raise ConfigError(
                f"window {window} is wider than this engine's widest window {widest}; run with a --block-length of "
                f"at most {widest}, or rebuild with --window-lengths covering {window} (at most the last bucket)"
            )
        if window > seq_len - self.layout.min_prompt:  # then also past the window cap of the bucket
            raise ConfigError(
                f"window {window} is wider than the {seq_len - self.layout.min_prompt} response columns a sequence of "
                f"{seq_len} has with prompts of at least {self.layout.min_prompt} (--min-prompt of the build); "
                "pad the prompts to that width or rebuild with a smaller --min-prompt"
            )
        j = next(j for j, w in enumerate(self.windows) if window <= w)
        return self.pairs().index((bucket, j))


def input_axes(
    inputs: Mapping[str, Sequence[int | str]], anchor: str = INPUT_IDS.name, window_anchor: str | None = None
) -> dict[str, tuple[ProfileDim, ...]]:
    """Each graph input's axes as Axis.BATCH, Axis.SEQ (Axis.WINDOW) or a fixed size, from the shapes an export
    manifest records.

    The anchor input ([batch, seq] by spec.graphs) names the two symbols, the window anchor ([batch, window], the
    window_step graph's window_ids) the third; every other input's symbolic axis must be one of them, so an input
    with an unknown dynamic axis (the image table's) is refused rather than guessed at.
    """
    if anchor not in inputs or len(inputs[anchor]) != 2 or not all(isinstance(d, str) for d in inputs[anchor]):
        raise ArtifactError(f"the graph's '{anchor}' input must have shape [batch, seq] with symbolic dims; re-export")
    batch_sym, seq_sym = inputs[anchor]
    roles: dict[int | str, ProfileDim] = {batch_sym: Axis.BATCH, seq_sym: Axis.SEQ}
    if window_anchor is not None:
        window = list(inputs.get(window_anchor, ()))
        if (len(window) != 2 or window[0] != batch_sym or not isinstance(window[1], str)
                or window[1] in (batch_sym, seq_sym)):
            raise ArtifactError(f"the graph's '{window_anchor}' input must have shape [batch, window] with a window "
                                f"dim of its own (got {window}); re-export")
        roles[window[1]] = Axis.WINDOW
    axes: dict[str, tuple[ProfileDim, ...]] = {}
    for name, shape in inputs.items():
        dims: list[ProfileDim] = []
        for d in shape:
            if isinstance(d, int) and not isinstance(d, bool) and d > 0:
                dims.append(d)
            elif isinstance(d, str) and d in roles:
                dims.append(roles[d])
            else:
                raise ArtifactError(
                    f"input '{name}' has axis {d!r}, which is neither fixed nor one of the planned axes "
                    f"{sorted(str(k) for k in roles)}; engines cannot plan profiles for it"
                )
        axes[name] = tuple(dims)
    return axes


def profile_shapes(layout: ProfileLayout, inputs: Mapping[str, Sequence[ProfileDim]]) -> list[Profile]:
    """One profile per bucket, with every input's (min, opt, max) shape (axes from `input_axes`).

    Batch axes: min 1, opt = max = max_batch. Sequence axes: min = min_prompt + previous bucket + 1,
    opt = max = max_prompt + bucket. Fixed axes keep their size.
    """
    layout.validate()
    if not inputs:
        raise ConfigError("the graph has no inputs to build profiles for")
    if any(Axis.WINDOW in axes for axes in inputs.values()):
        raise ConfigError("a graph with a window axis (window_step) is planned by window_profile_shapes")
    profiles = []
    for index, bucket in enumerate(layout.buckets):
        low, high = _seq_bounds(layout, index)
        lo = layout.buckets[index - 1] if index > 0 else 0
        profiles.append(Profile(index=index, bucket=bucket, lo=lo, shapes=_ranges(inputs, low, high)))
    return profiles


def window_profile_shapes(windows: WindowLayout, inputs: Mapping[str, Sequence[ProfileDim]]) -> list[Profile]:
    """The window_step engine's profiles, one per `WindowLayout.pairs` entry: batch and sequence axes as
    `profile_shapes` gives bucket i (the sequence's min raised to `WindowLayout.seq_range`'s), window axes min = the
    pair's narrowest window, opt = max = its widest."""
    windows.validate()
    if not inputs:
        raise ConfigError("the graph has no inputs to build profiles for")
    layout = windows.layout
    profiles = []
    for index, (i, j) in enumerate(windows.pairs()):
        low, high = _seq_bounds(layout, i)
        w_lo, w_hi = windows.window_range(i, j)
        low[Axis.SEQ] = windows.seq_range(i, j)[0]
        low[Axis.WINDOW], high[Axis.WINDOW] = w_lo, w_hi
        lo = layout.buckets[i - 1] if i > 0 else 0
        profiles.append(Profile(index=index, bucket=layout.buckets[i], lo=lo, shapes=_ranges(inputs, low, high),
                                window=w_hi, window_lo=w_lo))
    return profiles


def _seq_bounds(layout: ProfileLayout, index: int) -> tuple[dict[Axis, int], dict[Axis, int]]:
    """The batch and sequence axes' (min, max) in profile `index` of the layout."""
    seq_lo, seq_hi = layout.seq_range(index)
    return {Axis.BATCH: 1, Axis.SEQ: seq_lo}, {Axis.BATCH: layout.max_batch, Axis.SEQ: seq_hi}


def _ranges(inputs: Mapping[str, Sequence[ProfileDim]], low: Mapping[Axis, int], high: Mapping[Axis, int]
            ) -> dict[str, ShapeRange]:
    """Every input's ShapeRange: its planned axes from low / high (opt = max: the padded shape calls run), fixed
    dims as they are."""
    shapes = {}
    for name, axes in inputs.items():
        mins = tuple(low[a] if isinstance(a, Axis) else a for a in axes)
        maxs = tuple(high[a] if isinstance(a, Axis) else a for a in axes)
        shapes[name] = ShapeRange(min=mins, opt=maxs, max=maxs)
    return shapes


def choose_profile(
    kept_len: int, layout: ProfileLayout, *, prompt_len: int | None = None, batch: int | None = None
) -> int:
    """The profile for a call with `kept_len` response positions: the smallest bucket >= kept_len.

    Also checks the prompt width and batch against the build-time ranges, so an out-of-range call is a clear
    ConfigError here instead of a TensorRT shape error deep in execution.
    """
    index = bucket_index(kept_len, layout.buckets)
    if prompt_len is not None and not layout.min_prompt <= prompt_len <= layout.max_prompt:
        raise ConfigError(
            f"prompt width {prompt_len} is outside this engine's [{layout.min_prompt}, {layout.max_prompt}]; "
            f"shorten the prompts or rebuild with --max-prompt {prompt_len}"
        )
    layout.check_batch(batch)
    return index


def choose_profile_for_seq(seq_len: int, layout: ProfileLayout, *, batch: int | None = None) -> int:
    """The profile for a call of total length seq_len (prompt + response) when the prompt width is not known.

    The smallest bucket with max_prompt + bucket >= seq_len. Its range always contains seq_len: the previous
    profile's max, max_prompt + previous bucket, is < seq_len, so seq_len >= min_prompt + previous bucket + 1.
    """
    if seq_len < layout.min_prompt + 1:
        raise ConfigError(
            f"sequence length {seq_len} is shorter than this engine's smallest prompt ({layout.min_prompt}) plus "
            f"one response position"
        )
    for index, bucket in enumerate(layout.buckets):
        if seq_len <= layout.max_prompt + bucket:
            break
    else:
        raise ConfigError(
            f"sequence length {seq_len} exceeds this engine's largest profile (max prompt {layout.max_prompt} + "
            f"bucket {layout.buckets[-1]} = {layout.max_prompt + layout.buckets[-1]}); shorten the prompt or "
            f"--gen-length, or rebuild with a larger --max-prompt or last bucket"
        )
    layout.check_batch(batch)
    return index


def buffer_shapes(graph: GraphIO, layout: ProfileLayout | WindowLayout, engine_shapes: Mapping[str, Sequence[int]]
                  ) -> dict[str, tuple[int, ...]]:
    """The shape of the one device buffer each engine tensor needs: its largest over every profile.

    `engine_shapes` are the engine's own tensor shapes (-1 where dynamic). The declaration (spec.graphs) says which
    axes are the batch and the sequence (and the window, for a WindowLayout), which take their largest values over
    the layout; every other dim is the engine's fixed size. ArtifactError where the engine and the declaration
    disagree.
    """
    largest = layout.largest_axes()
    planned = "batch, sequence and window" if Axis.WINDOW in largest else "batch and sequence"
    shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in engine_shapes.items():
        try:
            declared = graph.tensor(name).shape
        except KeyError as exc:
            raise ArtifactError(f"the {graph.name} engine has a tensor '{name}' that its graph does not declare; "
                                "rebuild the engine from a current export") from exc
        if len(dims) != len(declared):
            raise ArtifactError(f"the {graph.name} engine's {name} has rank {len(dims)}, {len(declared)} declared")
        shape = []
        for index, (want, have) in enumerate(zip(declared, dims, strict=True)):
            if isinstance(want, Axis) and want in largest:
                shape.append(largest[want])
            elif isinstance(want, Axis) or have < 0 or (isinstance(want, int) and have != want):
                raise ArtifactError(f"the {graph.name} engine's {name} has dim {index} = {have}, declared {want}; "
                                    f"engines are planned for the {planned} axes only")
            else:
                shape.append(have)
        shapes[name] = tuple(shape)
    return shapes
