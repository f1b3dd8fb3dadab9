"""Multimodal export: vision.onnx (pixels -> image embeddings) and an image-aware step.onnx (and window_step.onnx).

The step graph takes one extra input, the image table float32 [image_tokens, D] (contracts.graphs.IMAGE_TABLE): the
embeddings of every image of the batch, one row per image token. Prompt ids at and above the LM's embedding rows
(`image_id_base`) select a row of it in-graph (seer_deploy.export.graphs); every other id is embedded as usual. So the
runtime loop, Seer's truncation and regrouped batches work on plain ids, and the graphs' other inputs and outputs are
those of a text-only export. The vision graph outputs float32 whatever the export dtype, so the table's type never
depends on it.

A prefix-DLM model (LaViDa with prefix-DLM attention: ModelConfig.prefix_dlm) gets the prefix variant of the step
graph, which takes `prompt_width` [B] after the image table (contracts.graphs.step_graph(prefix_dlm=True)).

The export directory and manifest are the text export's (written by seer_deploy.export.exporter.ExportRun) with
the vision graph and the image settings under `extra["multimodal"]`; the weights of all its graphs share one
weights.bin.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seer_deploy.contracts.graphs import (
    IMAGE_TABLE,
    INPUT_IDS,
    PIXEL_VALUES,
    PROMPT_STEP,
    STEP,
    VISION,
    Size,
    step_graph,
)
from seer_deploy.contracts.manifest_sections import GraphRecord
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.engines.ort import OrtSessionOptions
from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
from seer_deploy.export.examples import cache_sizes, prompt_examples, step_examples
from seer_deploy.export.exporter import STAGES as TEXT_STAGES
from seer_deploy.export.exporter import (
    ExportResult,
    ExportRun,
    GraphPlan,
    Loaded,
    Progress,
    checkpoint_config,
)
from seer_deploy.export.graphs import VisionGraph, cache_modules, step_module
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.quantized_reference import dequantized_model, quantized_parameters
from seer_deploy.export.validate import (
    ExportValidationError,
    Probe,
    compare_with_torch,
    make_probes,
    torch_references,
    with_cast_references,
)
from seer_deploy.export.validate_quantized import compare_quantized
from seer_deploy.export.validation_twin import probe_logits
from seer_deploy.models.checkpoints.checkpoint import read_config
from seer_deploy.models.checkpoints.multimodal import (
    DEMO_VL_NAME,
    checkpoint_directory,
    load_multimodal,
    vision_config_from_dict,
)
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.networks.vision import VisionConfig

# The text export's stages with the vision tower traced first; its weights are written with the step graph.
STAGES: tuple[str, ...] = (*TEXT_STAGES[:2], "tracing vision",
                           *(stage for stage in TEXT_STAGES[2:] if stage != "writing weights"))
VISION_ATOL = {"fp32": 1e-4, "fp16": 5e-2}  # max |diff| of the image embeddings, relative to their max |value|


def image_probes(cfg: ModelConfig, max_seq_len: int, n_table: int, seed: int = 1) -> list[Probe]:
    """The text export's probes with a run of image ids in each prompt (rows point at different table rows)."""
    probes = []
    rng = np.random.default_rng(seed)
    for p in make_probes(cfg, max_seq_len, seed):
        ids = p.input_ids.copy()
        for b in range(ids.shape[0]):
            real = np.flatnonzero(p.attention_mask[b])
            span = real[: max(1, len(real) // 3)]
            ids[b, span] = cfg.n_embed_rows + rng.integers(0, n_table, len(span))
        probes.append(Probe(ids, p.attention_mask, p.temperature, p.seed, p.prompt_width))
    return probes


def prepare_multimodal(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                       options: ExportOptions | None = None) -> ExportRun:
    """Check an export of a LLaDA-V-layout checkpoint (or 'demo-vl') into `out` before any work (ExportRun.check,
    and room for one image and a response); `.start()` runs it."""
    options = options or ExportOptions()
    options.validate()  # flags first: before the checkpoint is read
    path = checkpoint_directory(checkpoint)
    tokens = vision_config_from_dict(read_config(path), path).tokens_per_image
    source = DEMO_VL_NAME if str(checkpoint) == DEMO_VL_NAME else str(path.absolute())
    why = f"it cannot hold one image ({tokens} tokens) and a response; raise it"
    return ExportRun.check(path, source, checkpoint_config(path), out, options, _load_multimodal, (tokens + 1, why))


def export_multimodal(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                      options: ExportOptions | None = None, progress: Progress | None = None) -> ExportResult:
    """Export a LLaDA-V-layout checkpoint (or 'demo-vl'): vision.onnx, step.onnx, weights.bin, manifest.

    As the text exporter: written into a temporary directory, checked (declared interfaces, ONNX checker, ONNX Runtime
    vs torch on image-bearing probes and on pixels) and renamed into place only when everything passed.
    """
    return prepare_multimodal(checkpoint, out, options).start(progress)


def _load_multimodal(run: ExportRun, report: Progress) -> Loaded:
    """The language model and the vision tower, the torch references on pixels and image-bearing probes (with
    verify), and the vision and step graphs to trace."""
    loaded = load_multimodal(run.checkpoint, dtype=torch.float32)
    cfg, vcfg, stats, max_seq_len = loaded.config, loaded.vision_config, run.stats, run.max_seq_len
    lm, vision = loaded.lm.model, loaded.vision
    dtype = run.options.dtype

    report("torch reference")
    size = vcfg.image.image_size
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32))
    with torch.no_grad():
        ref_embeds = vision(pixels).float()
    table = ref_embeds.reshape(-1, cfg.d_model)
    probes = image_probes(cfg, max_seq_len, table.shape[0])
    refs = torch_references(ImageConditionedModel(lm, table), stats, probes) if run.options.verify else []
    lm32 = copy.deepcopy(lm) if dtype == "fp16" and run.options.quantization else lm  # the scheme's own reference
    if dtype == "fp16":
        lm, vision = lm.to(torch.float16), vision.to(torch.float16)
        if refs:  # the same model in float16: how far the dtype alone moves each output
            refs = with_cast_references(refs, ImageConditionedModel(lm, table), stats)

    def validate(staged: Path) -> dict[str, float]:
        def open_backend(directory: Path) -> MultimodalOrtBackend:
            backend = MultimodalOrtBackend(directory, OrtSessionOptions(providers=("CPUExecutionProvider",)))
            backend.set_image_table(table.numpy())
            return backend

        logits = probe_logits(staged, open_backend, refs)  # from the validation twin, closed before the export opens
        backend = open_backend(staged)
        max_diff = {VISION.name: _check_vision(backend, pixels.numpy(), ref_embeds.numpy(), dtype)}
        quant = run.options.quantization
        if quant:
            names = quantized_parameters(staged / STEP.file, lm32, quant, (cfg.vocab_size, cfg.n_embed_rows))
            quantized = dequantized_model(lm32, names, quant)
            own = torch_references(ImageConditionedModel(quantized, table), stats, probes)
            return max_diff | compare_quantized(backend, refs, quant, logits, own)
        return max_diff | compare_with_torch(backend, refs, cfg, dtype, logits)

    def manifest_section(records: dict[str, GraphRecord]) -> dict[str, Any]:
        return {
            MULTIMODAL_KEY: {
                VISION.name: records[VISION.name].to_dict(),
                "vision_config": vcfg.to_dict(),
                "image_id_base": cfg.n_embed_rows,
                "image_table_input": IMAGE_TABLE.name,
            }
        }

    kv_cache = run.options.kv_cache
    plan = GraphPlan(
        modules=(
            (VISION, VisionGraph(vision)),
            (step_graph(multimodal=True, prefix_dlm=cfg.prefix_dlm, kv_cache=kv_cache),
             step_module(lm, stats, multimodal=True, kv_cache=kv_cache)),
            *(cache_modules(lm) if kv_cache else ()),
        ),
        examples=_examples(cfg, vcfg, max_seq_len),
        graph_examples={PROMPT_STEP.name: prompt_examples(cfg, max_seq_len)},
        sizes={
            Size.STAT_ROWS: len(stats.sparsity_rows),
            Size.D_MODEL: cfg.d_model,
            Size.IMAGE_SIZE: size,
            Size.TOKENS_PER_IMAGE: vcfg.tokens_per_image,
            **cache_sizes(cfg),
        },
        validate=validate,
        manifest_extra=manifest_section,
        head_widths=(cfg.vocab_size, cfg.n_embed_rows),
    )
    return Loaded(loaded.lm.layout, plan)


def _examples(cfg: ModelConfig, vcfg: VisionConfig, max_seq_len: int) -> dict[str, torch.Tensor]:
    """The text tracing examples with image ids in the prompts (so the trace exercises the table lookup), a table
    of three rows and two blank pictures."""
    examples = step_examples(cfg, max_seq_len)
    ids = examples[INPUT_IDS.name].clone()
    ids[:, 1] = cfg.n_embed_rows + torch.tensor([0, 2])
    size = vcfg.image.image_size
    return examples | {
        INPUT_IDS.name: ids,
        IMAGE_TABLE.name: torch.zeros(3, cfg.d_model),
        PIXEL_VALUES.name: torch.zeros(2, 3, size, size),
    }


def _check_vision(backend: MultimodalOrtBackend, pixels: np.ndarray, want: np.ndarray, dtype: str) -> float:
    return vision_diff(backend.encode_images(pixels), want, dtype)


def vision_diff(got: np.ndarray, want: np.ndarray, dtype: str) -> float:
    """max |diff| of a vision graph's embeddings relative to the largest torch value; ExportValidationError above the
    dtype's tolerance."""
    if got.shape != want.shape:
        raise ExportValidationError(f"vision.onnx returned {got.shape}, torch {want.shape}")
    scale = float(np.abs(want).max(initial=1e-12))
    worst = float(np.abs(got.astype(np.float64) - want).max(initial=0.0)) / scale
    if worst > VISION_ATOL[dtype]:
        raise ExportValidationError(
            f"vision.onnx disagrees with torch: max |diff| {worst:.3g} of the largest embedding value > "
            f"{VISION_ATOL[dtype]:g} ({dtype} tolerance)", {VISION.name: worst}
        )
    return worst
