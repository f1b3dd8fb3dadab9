"""One declarative I/O description per exported graph (in the spirit of Optimum's OnnxConfig).

Every place that names a graph tensor reads it from here: tracing (input/output names, dynamic shapes), the
export's self-check, the ONNX Runtime and TensorRT feeds and output unpacking, TensorRT's optimization profiles and
device buffers. A traced graph that drifts from its declaration fails the export instead of passing silently.

A shape is a tuple of dims: an `Axis` (dynamic: the ONNX graph keeps it symbolic, under that name), a `Size` (fixed
when a model is exported: the ONNX graph has a number there) or an int (the same for every export).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum


class Axis(StrEnum):
    """A dynamic axis; its value is the symbolic dim name the exported graph carries."""

    BATCH = "batch"
    SEQ = "seq"  # prompt + response positions
    IMAGES = "images"
    IMAGE_TOKENS = "image_tokens"  # rows of the image table: every image token of the batch
    WINDOW = "window"  # the columns a cached pass runs (a denoising block)
    CANDIDATES = "candidates"  # the columns a step computes tokens for (the masks it may commit)
    RUN = "run"  # the columns a prompt-cache pass runs: the last prompt token and the response
    CACHED = "cached"  # the columns a prompt cache holds: the prompt's, before its last token


class Size(StrEnum):
    """A size fixed when a model is exported, named for what sets it."""

    STAT_ROWS = "stat_rows"  # K = stats layers x statistics: the sparsity rows of step zero
    D_MODEL = "d_model"
    IMAGE_SIZE = "image_size"
    TOKENS_PER_IMAGE = "tokens_per_image"
    LAYERS = "layers"
    KV_HEADS = "kv_heads"
    HEAD_DIM = "head_dim"
    MERGE_UNIT = "merge_unit"  # a Qwen2.5-VL tower's patches per image token (2 x 2)
    PATCH_DIM = "patch_dim"  # numbers per patch: 3 x temporal_patch_size x patch_size**2 (1176)
    VISION_HEAD_DIM = "vision_head_dim"  # the tower's head size (its rotary tables' width)


Dim = Axis | Size | int
RecordedShape = list[int | str]  # as an export manifest records a shape: dynamic axes by name, the rest as numbers


@dataclass(frozen=True)
class TensorIO:
    """One graph input or output. `to_host` (outputs): copied to the host after every call; the step graphs' outputs
    are compact (B x S or B x K x S numbers), the logits never leave the device."""

    name: str
    dtype: str  # ONNX element type name, as the export manifest records it ("int64", "float32")
    shape: tuple[Dim, ...]
    to_host: bool = True

    def dynamic_axes(self) -> dict[int, Axis]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, Axis)}

    def recorded_shape(self, sizes: Mapping[Size, int]) -> RecordedShape:
        """The shape as an export of a model with these sizes records it."""
        return [d.value if isinstance(d, Axis) else self._number(d, {}, sizes) for d in self.shape]

    def concrete_shape(self, axes: Mapping[Axis, int], sizes: Mapping[Size, int]) -> tuple[int, ...]:
        """The shape of one call (or of a buffer's capacity) with the dynamic axes set to `axes`."""
        return tuple(self._number(d, axes, sizes) for d in self.shape)

    def _number(self, dim: Dim, axes: Mapping[Axis, int], sizes: Mapping[Size, int]) -> int:
        if isinstance(dim, Axis):
            value = axes.get(dim)
        elif isinstance(dim, Size):
            value = sizes.get(dim)
        else:
            return dim
        if value is None:
            raise KeyError(f"{self.name}: no value given for its '{dim}' dim")
        return int(value)


@dataclass(frozen=True)
class GraphIO:
    """A graph's declared interface: its inputs and outputs, in the order the ONNX graph lists them."""

    name: str  # "step0", "step", "vision": the manifest's key and the file stem
    inputs: tuple[TensorIO, ...]
    outputs: tuple[TensorIO, ...]

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def host_outputs(self) -> list[str]:
        return [t.name for t in self.outputs if t.to_host]

    def takes(self, tensor: TensorIO) -> bool:
        return tensor in self.inputs

    def tensor(self, name: str) -> TensorIO:
        for t in (*self.inputs, *self.outputs):
            if t.name == name:
                return t
        raise KeyError(f"the {self.name} graph declares no tensor '{name}'")

    def dynamic_axes(self) -> dict[str, dict[int, Axis]]:
        """Input name -> {axis index: Axis}: what tracing makes dynamic (the outputs follow from the inputs)."""
        return {t.name: t.dynamic_axes() for t in self.inputs}

    def with_inputs(self, *extra: TensorIO) -> GraphIO:
        return replace(self, inputs=(*self.inputs, *extra))

    def interface(self, sizes: Mapping[Size, int]) -> list[tuple[str, str, str, RecordedShape]]:
        """(kind, name, dtype, shape) of every input, then every output, as an export with these sizes records them."""
        return [("input", t.name, t.dtype, t.recorded_shape(sizes)) for t in self.inputs] + [
            ("output", t.name, t.dtype, t.recorded_shape(sizes)) for t in self.outputs
        ]


_BS = (Axis.BATCH, Axis.SEQ)
INPUT_IDS = TensorIO("input_ids", "int64", _BS)  # left-padded prompts, then response slots
ATTENTION_MASK = TensorIO("attention_mask", "int64", _BS)  # 1 = a real token
TEMPERATURE = TensorIO("temperature", "float32", (Axis.BATCH,))  # contracts.sampling: 0 = greedy, > 0 = sample
SAMPLE_UNIFORM = TensorIO("sample_uniform", "float32", _BS)  # contracts.sampling: one uniform per position
# The columns whose tokens a pass computes (the masks it may commit; padding repeats a column): the LM head, the
# head's softmax and sampling run on these columns only. Other columns return their input id, confidence -inf.
CANDIDATES = TensorIO("candidates", "int64", (Axis.BATCH, Axis.CANDIDATES))
# 1 = compute Seer's step-zero sparsity statistics (step zero); 0 in every row = skip them (sparsity is zeros).
WITH_STATS = TensorIO("with_stats", "int64", (Axis.BATCH,))
# The Dream family's rules (core.decoding.ScoreRule): what each row's candidates are scored by, and the temperature
# of the softmax the score reads (1 = untempered). Rule 0 at temperature 1 is the confidence output itself.
SCORE_RULE = TensorIO("score_rule", "int64", (Axis.BATCH,))
SCORE_TEMPERATURE = TensorIO("score_temperature", "float32", (Axis.BATCH,))
IMAGE_TABLE = TensorIO("image_table", "float32", (Axis.IMAGE_TOKENS, Size.D_MODEL))  # ids >= image_id_base pick a row
PROMPT_WIDTH = TensorIO("prompt_width", "int64", (Axis.BATCH,))  # prefix-DLM graphs: where each row's response starts
PIXEL_VALUES = TensorIO("pixel_values", "float32", (Axis.IMAGES, 3, Size.IMAGE_SIZE, Size.IMAGE_SIZE))
# M-RoPE models (Dimple): each position's (temporal, height, width) rotary position, computed on the host from the
# ids and the pictures' layout (models.pictures.mrope.mrope_positions), after the image table.
POSITION_IDS = TensorIO("position_ids", "int64", (3, Axis.BATCH, Axis.SEQ))
# The cached graphs of an M-RoPE model: the columns they run are text after every picture of the row, whose three
# rotary positions are equal and run ahead of the 1-D position by a per-row shift (each picture advances the positions
# by its largest grid side, not by its tokens: models.pictures.mrope.text_position_shift); 0 for a row without pictures.
POSITION_SHIFT = TensorIO("position_shift", "int64", (Axis.BATCH,))
# A Qwen2.5-VL tower's call (Dimple): every picture of a batch, each image token's 2 x 2 patches, in window order;
# the host computes what the tower's loops would (models.pictures.qwen_layout.tower_inputs).
_TOKEN_PATCHES = (Axis.IMAGE_TOKENS, Size.MERGE_UNIT)
PIXEL_PATCHES = TensorIO("pixel_patches", "float32", (*_TOKEN_PATCHES, Size.PATCH_DIM))
ROTARY_COS = TensorIO("rotary_cos", "float32", (*_TOKEN_PATCHES, Size.VISION_HEAD_DIM))
ROTARY_SIN = TensorIO("rotary_sin", "float32", (*_TOKEN_PATCHES, Size.VISION_HEAD_DIM))
WINDOW_SEGMENTS = TensorIO("window_segments", "int64", (Axis.IMAGE_TOKENS,))  # windowed blocks attend where equal
PICTURE_SEGMENTS = TensorIO("picture_segments", "int64", (Axis.IMAGE_TOKENS,))  # full blocks attend where equal
RESTORE_ORDER = TensorIO("restore_order", "int64", (Axis.IMAGE_TOKENS,))  # window order -> picture order

TOKEN_IDS = TensorIO("token_ids", "int64", _BS)  # x0: the argmax (or a sample) per candidate, the input id elsewhere
CONFIDENCE = TensorIO("confidence", "float32", _BS)  # log softmax probability of x0 (models.networks.confidence); -inf elsewhere
EOS_PROB = TensorIO("eos_prob", "float32", _BS)  # softmax probability of EOS per candidate; 0 elsewhere
SPARSITY = TensorIO("sparsity", "float32", (Axis.BATCH, Size.STAT_ROWS, Axis.SEQ))  # manifest seer.sparsity_rows
SCORE = TensorIO("score", "float32", _BS)  # the row's score_rule per candidate (B x S, never vocabulary-sized); -inf elsewhere
IMAGE_EMBEDS = TensorIO("image_embeds", "float32", (Axis.IMAGES, Size.TOKENS_PER_IMAGE, Size.D_MODEL))
TOKEN_EMBEDS = TensorIO(IMAGE_EMBEDS.name, "float32", (Axis.IMAGE_TOKENS, Size.D_MODEL))  # one row per image token

# The block-wise KV cache: every layer's keys and values (float32 whatever the export dtype).
KV = TensorIO("kv", "float32", (Size.LAYERS, 2, Axis.BATCH, Size.KV_HEADS, Axis.SEQ, Size.HEAD_DIM))
_BW = (Axis.BATCH, Axis.WINDOW)
WINDOW_IDS = TensorIO("window_ids", "int64", _BW)
WINDOW_START = TensorIO("window_start", "int64", (Axis.BATCH,))  # column of window_ids[:, 0] in the sequence
WINDOW_UNIFORM = TensorIO(SAMPLE_UNIFORM.name, "float32", _BW)
WINDOW_TOKEN_IDS = TensorIO(TOKEN_IDS.name, "int64", _BW)
WINDOW_CONFIDENCE = TensorIO(CONFIDENCE.name, "float32", _BW)

# One graph for every full pass, so that an engine holds one copy of the weights: step zero (with_stats = 1: the
# sparsity rows and EOS probabilities Seer reads), every later step, and in a --kv-cache export the cache refresh
# (the kv output). Skipped work costs nothing: the statistics and the sampling branch sit behind conditionals, the
# LM head runs on the candidate columns only.
STEP = GraphIO("step", (INPUT_IDS, ATTENTION_MASK, TEMPERATURE, SAMPLE_UNIFORM, CANDIDATES, WITH_STATS, SCORE_RULE,
                        SCORE_TEMPERATURE),
               (TOKEN_IDS, CONFIDENCE, EOS_PROB, SPARSITY, SCORE))
VISION = GraphIO("vision", (PIXEL_VALUES,), (IMAGE_EMBEDS,))
# Dimple's vision graph: a Qwen2.5-VL tower and Dimple's projector, one dynamic axis (the call's image tokens).
QWEN_VISION = GraphIO("vision", (PIXEL_PATCHES, ROTARY_COS, ROTARY_SIN, WINDOW_SEGMENTS, PICTURE_SEGMENTS,
                                 RESTORE_ORDER), (TOKEN_EMBEDS,))
STEP_GRAPH_NAMES: tuple[str, ...] = (STEP.name,)  # what every export has, text or multimodal
# The window graph (export --kv-cache): a step over a window only (its keys and values fresh, the rest of the
# sequence's from `kv`, which the step graph returned). A window's ids are text (the response, and for a shifted model
# the column before the block; a prompt ending with a picture is refused: runtime.loop.check_prompts): no image table.
WINDOW_STEP = GraphIO(
    "window_step",
    (WINDOW_IDS, ATTENTION_MASK, WINDOW_START, KV, TEMPERATURE, WINDOW_UNIFORM),
    (WINDOW_TOKEN_IDS, WINDOW_CONFIDENCE),
)
CACHE_GRAPH_NAMES: tuple[str, ...] = (WINDOW_STEP.name,)

# The prompt cache (export --kv-cache): a pass over the last prompt token and the response only, against the keys and
# values of the columns before them (cut from step zero's kv), positions continuing from the cache. attention_mask is
# the whole row's (cached + run columns); the candidates are run columns; the decoding rule's inputs and score as the
# step graph's; prompt_width (where the responses start) is read by prefix-DLM models only.
_BR = (Axis.BATCH, Axis.RUN)
RUN_IDS = TensorIO("run_ids", "int64", _BR)
PROMPT_KV = TensorIO("prompt_kv", "float32", (Size.LAYERS, 2, Axis.BATCH, Size.KV_HEADS, Axis.CACHED, Size.HEAD_DIM))
PROMPT_STEP = GraphIO(
    "prompt_step",
    (RUN_IDS, ATTENTION_MASK, PROMPT_KV, TEMPERATURE, TensorIO(SAMPLE_UNIFORM.name, "float32", _BR), CANDIDATES,
     SCORE_RULE, SCORE_TEMPERATURE, PROMPT_WIDTH),
    (TensorIO(TOKEN_IDS.name, "int64", _BR), TensorIO(CONFIDENCE.name, "float32", _BR),
     TensorIO(SCORE.name, "float32", _BR)),
)
PROMPT_CACHE_GRAPH_NAMES: tuple[str, ...] = (PROMPT_STEP.name,)


def step_graph(multimodal: bool = False, prefix_dlm: bool = False, kv_cache: bool = False,
               positions: bool = False) -> GraphIO:
    """The step graph of an export: a multimodal one also takes the image table, then an M-RoPE model's (Dimple:
    ModelConfig.mrope_section, with `multimodal`) `position_ids`, a prefix-DLM model's (ModelConfig.prefix_dlm,
    LaViDa) `prompt_width` last; a --kv-cache export's also returns the keys and values."""
    graph = STEP.with_inputs(IMAGE_TABLE) if multimodal else STEP
    if positions:
        graph = graph.with_inputs(POSITION_IDS)
    if prefix_dlm:
        graph = graph.with_inputs(PROMPT_WIDTH)
    return replace(graph, outputs=(*graph.outputs, KV)) if kv_cache else graph


def window_graph(prefix_dlm: bool = False, positions: bool = False) -> GraphIO:
    """The window graph of a --kv-cache export; a prefix-DLM model's takes `prompt_width` last (a window that starts
    one column before its block, for shifted logits, may hold the last prompt column), an M-RoPE model's (`positions`,
    as step_graph's) `position_shift`."""
    graph = WINDOW_STEP.with_inputs(PROMPT_WIDTH) if prefix_dlm else WINDOW_STEP
    return graph.with_inputs(POSITION_SHIFT) if positions else graph


def prompt_graph(positions: bool = False) -> GraphIO:
    """The prompt-cache graph of a --kv-cache export; an M-RoPE model's (`positions`) takes `position_shift` last."""
    return PROMPT_STEP.with_inputs(POSITION_SHIFT) if positions else PROMPT_STEP


def export_graphs(multimodal: bool = False, prefix_dlm: bool = False, kv_cache: bool = False,
                  positions: bool = False) -> tuple[GraphIO, ...]:
    """The denoising graphs of an export, in the order they are traced: the step graph, then (--kv-cache) the window
    graph and the prompt-cache graph (`positions`: an M-RoPE model's, with pictures)."""
    step = step_graph(multimodal, prefix_dlm, kv_cache, positions)
    return (step, window_graph(prefix_dlm, positions), prompt_graph(positions)) if kv_cache else (step,)
