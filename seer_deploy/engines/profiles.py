"""TensorRT optimization profiles: the shape range of every input of a graph, per length bucket.

Profile i of a graph with a sequence axis serves the responses of bucket i (`engines.buckets`): its sequence range is
[min_prompt + bucket[i-1] + 1, max_prompt + bucket[i]], its batch 1..max_batch. A graph is planned from the axes its
export records (`recorded_axes`: every symbolic dim is a `contracts.graphs.Axis` by name), so any graph an export lists
gets its profiles without this module knowing its name (`plan_profiles`):
- a window axis (the KV cache's window_step): one profile per (length bucket, window length) pair (`WindowLayout`),
  pair (i, j) serving windows (w_{j-1}, w_j] at bucket i's sequence lengths; a pair no call can reach is left out.
  Without --window-lengths: 32 (LLaDA's block length) and the last bucket.
- a sequence axis: one profile per bucket (the prompt cache's prompt_step too: its run and cached axes follow the
  bucket, `ProfileLayout.axis_bounds`).
- neither (the vision graph: pixels of pictures): one profile.
The image axes of a multimodal export (`ImageAxes`) are the same in every profile: the image table's rows, 1 up to
the largest number of image tokens a batch can hold, and the pictures (views) per vision call, 1 up to the most one
call takes. opt = max everywhere: the padded shape calls run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from seer_deploy.contracts.graphs import Axis, GraphIO
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines.buckets import bucket_index, check_buckets

ProfileDim = Axis | int  # an input axis: a planned Axis (batch, seq, window, image axes), or a fixed size


@dataclass(frozen=True)
class ShapeRange:
    """One input's (min, opt, max) shapes in one optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class Profile:
    """One optimization profile: the response lengths (lo, bucket] it serves and each input's shape range; a
    window_step engine's profile also the windows [window_lo, window] it serves (both 0 for the other graphs; bucket
    0 for a graph without a sequence axis)."""

    index: int
    bucket: int
    lo: int  # the previous bucket (0 for the first): this profile serves kept lengths lo+1 .. bucket
    shapes: dict[str, ShapeRange]
    window: int = 0  # the widest window (window_step only)
    window_lo: int = 0  # the narrowest window (window_step only)

    def to_dict(self) -> dict[str, object]:
        """As engine.json records it."""
        where: dict[str, object] = {"bucket": self.bucket} if self.bucket else {}
        if self.window:
            where["windows"] = [self.window_lo, self.window]
        return where | {"shapes": {name: r.to_dict() for name, r in self.shapes.items()}}


@dataclass(frozen=True)
class ImageAxes:
    """The largest image axes a multimodal engine takes: image-table rows (every image token of a batch) and pictures
    per vision call (every picture of a batch in one call; LaViDa's anyres: one picture's base view and crops)."""

    image_tokens: int
    images: int

    def validate(self) -> None:
        if self.image_tokens < 1 or self.images < 1:
            raise ConfigError(f"image axes {self.image_tokens} image tokens / {self.images} pictures per call must "
                              "be at least 1; raise --max-pictures")

    def largest(self) -> dict[Axis, int]:
        return {Axis.IMAGE_TOKENS: self.image_tokens, Axis.IMAGES: self.images}


@dataclass(frozen=True)
class ProfileLayout:
    """What an engine's profiles cover: buckets (response lengths), batch 1..max_batch, prompt widths."""

    buckets: tuple[int, ...]
    max_batch: int
    max_prompt: int
    min_prompt: int = 1
    images: ImageAxes | None = None  # a multimodal export's image axes; None for text

    def validate(self, max_seq_len: int | None = None) -> None:
        """ConfigError naming the bad setting; max_seq_len is the model's position limit, when known."""
        check_buckets(self.buckets)
        if self.images is not None:
            self.images.validate()
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
        """The batch and sequence length (and image axes) of the largest call any profile takes."""
        image = self.images.largest() if self.images is not None else {}
        longest = self.max_prompt + self.buckets[-1]
        return {Axis.BATCH: self.max_batch, Axis.SEQ: longest, Axis.CANDIDATES: longest,
                Axis.RUN: self.buckets[-1] + 1, Axis.CACHED: max(1, self.max_prompt - 1), **image}

    def axis_bounds(self, index: int) -> tuple[dict[Axis, int], dict[Axis, int]]:
        """Every planned axis' (min, max) in profile `index`: batch 1..max_batch, the bucket's sequence range, the
        candidate columns 1..its longest sequence (a pass computes some or all of its columns), the image axes from 1
        to their largest (pictures do not depend on the response), prompt_step's run (the last prompt token and the
        bucket's responses) and cached columns (the prompts less that token, at least 1)."""
        seq_lo, seq_hi = self.seq_range(index)
        previous = self.buckets[index - 1] if index > 0 else 0
        low = {Axis.BATCH: 1, Axis.SEQ: seq_lo, Axis.CANDIDATES: 1, Axis.RUN: previous + 2,
               Axis.CACHED: max(1, self.min_prompt - 1)}
        high = {Axis.BATCH: self.max_batch, Axis.SEQ: seq_hi, Axis.CANDIDATES: seq_hi,
                Axis.RUN: self.buckets[index] + 1, Axis.CACHED: max(1, self.max_prompt - 1)}
        if self.images is not None:
            for axis, largest in self.images.largest().items():
                low[axis], high[axis] = 1, largest
        return low, high

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


def recorded_axes(inputs: Mapping[str, Sequence[int | str]]) -> dict[str, tuple[ProfileDim, ...]]:
    """Each graph input's axes from the shapes an export manifest records: a symbolic dim is the `Axis` of that name
    (contracts.graphs records dynamic axes by their Axis value), a positive number a fixed size; anything else is refused
    rather than guessed at."""
    known = {axis.value: axis for axis in Axis}
    axes: dict[str, tuple[ProfileDim, ...]] = {}
    for name, shape in inputs.items():
        dims: list[ProfileDim] = []
        for d in shape:
            if isinstance(d, int) and not isinstance(d, bool) and d > 0:
                dims.append(d)
            elif isinstance(d, str) and d in known:
                dims.append(known[d])
            else:
                raise ArtifactError(
                    f"input '{name}' has axis {d!r}, which is neither fixed nor one of the planned axes "
                    f"{sorted(known)}; engines cannot plan profiles for it: re-export with this seer-deploy"
                )
        axes[name] = tuple(dims)
    return axes


def plan_profiles(graph: str, inputs: Mapping[str, Sequence[int | str]], layout: ProfileLayout,
                  windows: WindowLayout | None = None) -> list[Profile]:
    """The optimization profiles of one graph, from its recorded inputs (see the module's docstring)."""
    axes = recorded_axes(inputs)
    used = {a for dims in axes.values() for a in dims if isinstance(a, Axis)}
    if used & {Axis.IMAGES, Axis.IMAGE_TOKENS} and layout.images is None:
        raise ConfigError(f"the {graph} graph has image axes, but the profile layout plans none; a multimodal "
                          "export's build plans them from its vision config (--max-pictures)")
    if Axis.WINDOW in used:
        if windows is None:
            raise ConfigError(f"the {graph} graph needs window lengths to plan its profiles")
        return window_profile_shapes(windows, axes)
    if Axis.SEQ in used:
        return profile_shapes(layout, axes)
    low, high = layout.axis_bounds(0)
    return [Profile(index=0, bucket=0, lo=0, shapes=_ranges(axes, low, high))]


def profile_shapes(layout: ProfileLayout, inputs: Mapping[str, Sequence[ProfileDim]]) -> list[Profile]:
    """One profile per bucket, with every input's (min, opt, max) shape (axes from `input_axes`).

    Batch axes: min 1, opt = max = max_batch. Sequence axes: min = min_prompt + previous bucket + 1,
    opt = max = max_prompt + bucket. Image axes: 1 .. their largest (`ImageAxes`). Fixed axes keep their size.
    """
    layout.validate()
    if not inputs:
        raise ConfigError("the graph has no inputs to build profiles for")
    if any(Axis.WINDOW in axes for axes in inputs.values()):
        raise ConfigError("a graph with a window axis (window_step) is planned by window_profile_shapes")
    profiles = []
    for index, bucket in enumerate(layout.buckets):
        low, high = layout.axis_bounds(index)
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
        low, high = layout.axis_bounds(i)
        w_lo, w_hi = windows.window_range(i, j)
        low[Axis.SEQ] = windows.seq_range(i, j)[0]
        low[Axis.WINDOW], high[Axis.WINDOW] = w_lo, w_hi
        lo = layout.buckets[i - 1] if i > 0 else 0
        profiles.append(Profile(index=index, bucket=layout.buckets[i], lo=lo, shapes=_ranges(inputs, low, high),
                                window=w_hi, window_lo=w_lo))
    return profiles


def choose_prompt_cache_profile(cached: int, run: int, layout: ProfileLayout, *, batch: int | None = None) -> int:
    """The prompt_step profile for a pass of `run` columns against `cached` ones: the bucket of its responses
    (run - 1), with the prompt width checked against the build's range."""
    if cached < 1:
        raise ConfigError("a prompt of one token leaves nothing to cache; run it without --prompt-cache")
    return choose_profile(run - 1, layout, prompt_len=cached + 1, batch=batch)


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

    `engine_shapes` are the engine's own tensor shapes (-1 where dynamic). The declaration (contracts.graphs) says which
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
