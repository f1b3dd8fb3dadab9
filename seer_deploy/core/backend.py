"""The one small interface every backend implements: run step zero, run a step, on a `StepInput`.

Backends (torch eager = the reference, ONNX Runtime, TensorRT) return compact per-position outputs: the chosen token
and its log-probability (the commit score, see `models.networks.confidence`), so a step moves B x S numbers to the host
rather than B x S x V logits. Step zero also returns the EOS probability and Seer's sparsity statistics.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from seer_deploy.core.decoding import Scoring
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import SparsityRow

# The block-wise KV cache, float32 [n_layers, 2, B, n_kv_heads, S, head_dim]: a numpy array, or a device tensor (a
# torch tensor on the engine's GPU) that never crosses to the host. The runtime only allocates it, reads rows and
# writes rows (`kv_zeros`, and `[:, :, rows]` indexing, which numpy arrays and torch tensors share).
KVCache = Any


def is_device_array(value: object) -> bool:
    """Whether a KV cache is a device tensor (torch) rather than a numpy array."""
    return not isinstance(value, np.ndarray) and hasattr(value, "new_zeros")


def kv_zeros(like: KVCache, shape: tuple[int, ...]) -> KVCache:
    """Zeros of `shape` of the same kind as `like`: on its device for a device tensor, a float32 array otherwise."""
    return like.new_zeros(shape) if is_device_array(like) else np.zeros(shape, dtype=np.float32)


class StepInput(NamedTuple):
    """One forward pass: the sequence, which of it is real, and how to pick tokens."""

    input_ids: np.ndarray  # int64 [B, S]: left-padded prompts, then response slots
    attention_mask: np.ndarray | None = None  # int64 [B, S], 1 = real token; None = every position is real
    temperature: float | np.ndarray = 0.0  # 0: argmax; > 0: a sample; an exported step graph takes one per row [B]
    seed: int | None = None  # the sample's randomness at temperature > 0
    prompt_width: int = 0  # columns [0, prompt_width) hold the prompts: what classifier-free guidance masks
    guidance: float = 0.0  # classifier-free guidance scale; only backends with `supports_guidance` run it
    # int64 [B, C]: the columns whose tokens the pass must compute (the masks it may commit; a row with fewer repeats
    # one of its columns), or None for every column. An exported step graph computes these only: at the others it
    # returns the input id with confidence -inf. The torch backend computes every column whatever this says.
    candidates: np.ndarray | None = None
    # The Dream family's sampler: what the pass scores its candidates by (returned as `score` beside the token);
    # None: LLaDA's rules, whose score is the confidence (no `score` returned).
    scoring: Scoring | None = None
    # float32 [B, S] in (0, 1]: the sampling uniforms themselves, instead of drawing them from `seed` (rows that share
    # a pass each with their own, as alone: continuous batching). Backends without per-row sampling refuse them.
    uniform: np.ndarray | None = None

    def checked(self, max_seq_len: int) -> StepInput:
        """The input as every engine wants it (int64, C-contiguous, a mask array), or ConfigError naming what is
        wrong with it."""
        ids = np.asarray(self.input_ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ConfigError(f"input_ids must be a 2-D integer array [batch, seq], got {ids.dtype} {ids.shape}")
        if ids.size == 0:
            raise ConfigError(f"input_ids is empty ({ids.shape}); give at least one row with one token")
        if ids.shape[1] > max_seq_len:
            raise ConfigError(
                f"the sequence has {ids.shape[1]} positions (prompt + response), more than the model's max_seq_len "
                f"{max_seq_len}; shorten the prompt or gen_length (or re-export with a larger --max-seq-len)"
            )
        if self.attention_mask is None:
            mask = np.ones(ids.shape, dtype=np.int64)
        else:
            mask = np.asarray(self.attention_mask)
            if mask.shape != ids.shape:
                raise ConfigError(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}; they must match")
        temperature = np.asarray(self.temperature, dtype=np.float64)
        if temperature.ndim > 1 or (temperature.ndim == 1 and temperature.shape[0] != ids.shape[0]):
            raise ConfigError(f"temperature must be one number or one per row ({ids.shape[0]}), got {temperature.shape}")
        if not bool(np.all(temperature >= 0)):  # NaN fails too
            raise ConfigError(f"temperature must be a number >= 0, got {self.temperature}")
        if not self.guidance >= 0:
            raise ConfigError(f"the guidance scale must be a number >= 0, got {self.guidance}")
        if not 0 <= self.prompt_width <= ids.shape[1]:
            raise ConfigError(f"prompt_width {self.prompt_width} lies outside the sequence [0, {ids.shape[1]}]")
        candidates = None
        if self.candidates is not None:
            candidates = np.asarray(self.candidates)
            if (candidates.ndim != 2 or candidates.shape[0] != ids.shape[0] or candidates.shape[1] == 0
                    or not np.issubdtype(candidates.dtype, np.integer)):
                raise ConfigError(f"candidates must be integer columns [batch {ids.shape[0]}, at least 1], got "
                                  f"{candidates.dtype} {candidates.shape}")
            if candidates.min() < 0 or candidates.max() >= ids.shape[1]:
                raise ConfigError(f"candidates must be columns in [0, {ids.shape[1]}), got {candidates.min()} to "
                                  f"{candidates.max()}")
            candidates = np.ascontiguousarray(candidates, dtype=np.int64)
        return self._replace(
            input_ids=np.ascontiguousarray(ids, dtype=np.int64), attention_mask=np.ascontiguousarray(mask, np.int64),
            candidates=candidates, uniform=_uniform(self.uniform, ids.shape),
        )


class StepOutput(NamedTuple):
    token_ids: np.ndarray  # int64 [B, S]: x0, the argmax (or sample) per position
    confidence: np.ndarray  # float32 [B, S]: log softmax probability of x0 (temperature-free logits)
    score: np.ndarray | None = None  # float32 [B, S]: StepInput.scoring's score per candidate (-inf elsewhere)


class Step0Output(NamedTuple):
    token_ids: np.ndarray  # int64 [B, S]
    confidence: np.ndarray  # float32 [B, S]
    eos_prob: np.ndarray  # float32 [B, S]: softmax probability of EOS
    sparsity: np.ndarray  # float32 [B, K, S]: rows described by `Backend.sparsity_rows`
    score: np.ndarray | None = None  # as StepOutput.score
    kv: KVCache | None = None  # every layer's keys and values, when the pass was a prefill (the prompt cache)


class WindowInput(NamedTuple):
    """A cached pass (block-wise KV cache): only a window of the sequence runs, against a refresh's keys/values."""

    window_ids: np.ndarray  # int64 [B, W]: the tokens of columns [window_start[b], window_start[b] + W)
    attention_mask: np.ndarray  # int64 [B, S]: the whole sequence's, 1 = real
    window_start: np.ndarray  # int64 [B]
    kv: KVCache  # float32 [n_layers, 2, B, n_kv_heads, S, head_dim]: `RefreshOutput.kv` of these rows
    temperature: float | np.ndarray = 0.0
    seed: int | None = None
    prompt_width: int = 0  # where the responses start: what a prefix-DLM model's prompt queries see up to
    uniform: np.ndarray | None = None  # float32 [B, W]: as StepInput.uniform, over the window's columns
    position_shift: np.ndarray | None = None  # int64 [B], M-RoPE models with pictures (`position_shift` below)

    def checked(self) -> WindowInput:
        """The input as engines want it, or ConfigError naming what does not fit."""
        ids, mask = np.asarray(self.window_ids), np.asarray(self.attention_mask)
        start = np.asarray(self.window_start)
        kv: KVCache = self.kv if is_device_array(self.kv) else np.asarray(self.kv)
        if ids.ndim != 2 or mask.ndim != 2 or ids.shape[0] != mask.shape[0] or ids.shape[1] > mask.shape[1]:
            raise ConfigError(f"window_ids {ids.shape} must be [batch, W] with W <= the sequence of attention_mask "
                              f"{mask.shape}")
        if start.shape != (ids.shape[0],) or bool(np.any(start < 0)) or bool(np.any(start + ids.shape[1] > mask.shape[1])):
            raise ConfigError(f"window_start {start.tolist()} must give one column per row with the window "
                              f"({ids.shape[1]} wide) inside the sequence ({mask.shape[1]})")
        if kv.ndim != 6 or kv.shape[1] != 2 or kv.shape[2] != ids.shape[0] or kv.shape[4] != mask.shape[1]:
            raise ConfigError(f"kv {kv.shape} must be [layers, 2, batch {ids.shape[0]}, kv_heads, seq {mask.shape[1]}, "
                              "head_dim], what a refresh of the same rows returned")
        if not 0 <= self.prompt_width <= mask.shape[1]:
            raise ConfigError(f"prompt_width {self.prompt_width} lies outside the sequence [0, {mask.shape[1]}]")
        return self._replace(
            window_ids=np.ascontiguousarray(ids, np.int64), attention_mask=np.ascontiguousarray(mask, np.int64),
            window_start=np.ascontiguousarray(start, np.int64), kv=checked_kv(kv),
            uniform=_uniform(self.uniform, ids.shape), position_shift=_shift(self.position_shift, ids.shape[0]),
        )


def checked_kv(kv: KVCache) -> KVCache:
    """A cache as engines want it: a contiguous float32 device tensor, or a C-contiguous float32 array."""
    if is_device_array(kv):
        if str(kv.dtype) != "torch.float32":
            raise ConfigError(f"kv on the device must be float32, got {kv.dtype}")
        return kv.contiguous()
    return np.ascontiguousarray(kv, np.float32)


class PromptInput(NamedTuple):
    """A pass against the prompt cache: the last prompt token and the responses run, against the keys and values of
    the columns before them (step zero's, cut there), positions continuing from the cache."""

    run_ids: np.ndarray  # int64 [B, R]: the columns [C, C + R) of the rows, C = prompt_kv's columns
    attention_mask: np.ndarray  # int64 [B, C + R]: the rows' whole mask, 1 = real
    prompt_kv: KVCache  # float32 [n_layers, 2, B, n_kv_heads, C, head_dim]
    temperature: float | np.ndarray = 0.0
    seed: int | None = None
    candidates: np.ndarray | None = None  # int64 [B, K]: run columns whose tokens to compute (None: every one)
    prompt_width: int = 0  # where the responses start (at least C + 1): prefix-DLM models' prompt queries
    scoring: Scoring | None = None  # as StepInput.scoring
    position_shift: np.ndarray | None = None  # as WindowInput.position_shift

    def checked(self) -> PromptInput:
        """The input as engines want it, or ConfigError naming what does not fit."""
        ids, mask = np.asarray(self.run_ids), np.asarray(self.attention_mask)
        kv: KVCache = self.prompt_kv if is_device_array(self.prompt_kv) else np.asarray(self.prompt_kv)
        if ids.ndim != 2 or mask.ndim != 2 or ids.shape[0] != mask.shape[0] or ids.shape[1] == 0:
            raise ConfigError(f"run_ids {ids.shape} must be [batch, R >= 1] beside attention_mask {mask.shape}")
        cached = mask.shape[1] - ids.shape[1]
        if kv.ndim != 6 or kv.shape[1] != 2 or kv.shape[2] != ids.shape[0] or kv.shape[4] != cached:
            raise ConfigError(f"prompt_kv {tuple(kv.shape)} must be [layers, 2, batch {ids.shape[0]}, kv_heads, "
                              f"{cached} cached columns, head_dim]: the mask's columns before the run")
        if not cached < self.prompt_width <= mask.shape[1]:
            raise ConfigError(f"prompt_width {self.prompt_width} must lie in ({cached}, {mask.shape[1]}]: the run "
                              "holds the last prompt token")
        candidates = np.arange(ids.shape[1])[None, :].repeat(ids.shape[0], 0) if self.candidates is None else \
            np.asarray(self.candidates)
        if (candidates.ndim != 2 or candidates.shape[0] != ids.shape[0] or candidates.size == 0
                or candidates.min() < 0 or candidates.max() >= ids.shape[1]):
            raise ConfigError(f"candidates {candidates.shape} must be run columns in [0, {ids.shape[1]}), one row per "
                              "batch row")
        return self._replace(run_ids=np.ascontiguousarray(ids, np.int64),
                             attention_mask=np.ascontiguousarray(mask, np.int64), prompt_kv=checked_kv(kv),
                             candidates=np.ascontiguousarray(candidates, np.int64),
                             position_shift=_shift(self.position_shift, ids.shape[0]))


def _shift(shift: np.ndarray | None, batch: int) -> np.ndarray:
    """A cached pass's position shift as graphs take it: int64 [batch] (None: zeros, a row without pictures)."""
    if shift is None:
        return np.zeros(batch, np.int64)
    s = np.asarray(shift)
    if s.shape != (batch,) or not np.issubdtype(s.dtype, np.integer):
        raise ConfigError(f"position_shift must be one integer per row ({batch}), got {s.dtype} {s.shape}")
    return np.ascontiguousarray(s, np.int64)


def _uniform(uniform: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """Explicit sampling uniforms as a graph takes them, or ConfigError for the wrong shape or range."""
    if uniform is None:
        return None
    u = np.ascontiguousarray(uniform, dtype=np.float32)
    if u.shape != shape or not bool(np.all((u > 0) & (u <= 1))):
        raise ConfigError(f"uniform must be float32 {shape} in (0, 1], got {u.dtype} {u.shape}")
    return u


class RefreshOutput(NamedTuple):
    token_ids: np.ndarray  # int64 [B, S]
    confidence: np.ndarray  # float32 [B, S]
    kv: KVCache  # float32 [n_layers, 2, B, n_kv_heads, S, head_dim]: every layer's keys and values
    score: np.ndarray | None = None  # as StepOutput.score


PassOutput = StepOutput | Step0Output | RefreshOutput  # what a pass returns: each has token_ids, confidence, score


class Backend(Protocol):
    """What the runtime loop needs from an engine."""

    name: str
    max_seq_len: int
    sparsity_rows: list[SparsityRow]  # (layer, statistic name) of each of the K sparsity rows

    def step0(self, inputs: StepInput) -> Step0Output: ...

    def step(self, inputs: StepInput) -> StepOutput: ...


class ImageBackend(Backend, Protocol):
    """A backend of a multimodal target: it turns pictures into embeddings and feeds the step graphs the table of
    the batch's embeddings, which the prompts' image ids index."""

    def encode_images(self, pixel_values: np.ndarray) -> np.ndarray: ...

    def set_image_table(self, table: np.ndarray | list[np.ndarray]) -> None: ...


class PatchBackend(Backend, Protocol):
    """A backend of a Dimple target: its Qwen2.5-VL tower takes every picture of a batch in one call, as the host
    prepared them (models.pictures.qwen_layout.tower_inputs), and returns one embedding per image token."""

    def encode_patches(self, tower_inputs: dict[str, np.ndarray]) -> np.ndarray: ...

    def set_image_table(self, table: np.ndarray | list[np.ndarray], layout: np.ndarray | None = None) -> None:
        """`layout`: each table row's place in its picture (models.pictures.mrope), which the positions follow."""


class CacheBackend(Backend, Protocol):
    """A backend that runs the block-wise KV cache: a step that also returns the keys and values (`refresh`) and a
    step over a window of the sequence against them (`window_step`)."""

    def refresh(self, inputs: StepInput) -> RefreshOutput: ...

    def window_step(self, inputs: WindowInput) -> StepOutput: ...


class PromptCacheBackend(Backend, Protocol):
    """A backend that runs the prompt cache: step zero that also returns the keys and values (`prefill`) and a pass
    over the last prompt token and the response against those of the columns before them (`prompt_step`)."""

    def prefill(self, inputs: StepInput) -> Step0Output: ...

    def prompt_step(self, inputs: PromptInput) -> StepOutput: ...


def position_shift(backend: Backend, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray | None:
    """int64 [B]: what a cached pass over these rows' text after their pictures adds to the 1-D positions, on a
    backend whose model takes M-RoPE positions (Dimple: models.pictures.mrope.text_position_shift); None elsewhere
    (the positions are the 1-D ones)."""
    shift = getattr(backend, "position_shift", None)
    return None if shift is None else shift(input_ids, attention_mask)


def supports_prompt_cache(backend: Backend) -> bool:
    """Whether a backend runs the prompt cache (an export made with its graph, or torch)."""
    return bool(getattr(backend, "supports_prompt_cache", False))


def window_lead(backend: Backend) -> int:
    """Columns a block-wise cache window runs before the block: 1 for a model that reads a token from the column
    before it (shifted logits: Dream, Dimple, LaViDa-Dream), 0 else."""
    return int(getattr(backend, "window_lead", 0))


def supports_cache(backend: Backend) -> bool:
    """Whether a backend runs the block-wise KV cache (an export made with the cache graphs, or torch)."""
    return bool(getattr(backend, "supports_cache", False))


def supports_guidance(backend: Backend) -> bool:
    """Whether a backend runs classifier-free guidance (it needs the full logits, which exported graphs never
    return)."""
    return bool(getattr(backend, "supports_guidance", False))


def samples_per_row(backend: Backend) -> bool:
    """Whether a backend samples each row of a pass at its own temperature from uniforms the caller gives
    (`StepInput.uniform`: the exported graphs); the torch backend draws one Gumbel noise per pass at one temperature."""
    return bool(getattr(backend, "samples_per_row", False))
