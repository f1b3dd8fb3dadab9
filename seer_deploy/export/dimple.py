"""Dimple's export: vision.onnx (Qwen2.5-VL's tower and Dimple's projector, one graph for every picture size) and a
step graph that also takes the M-RoPE positions (contracts.graphs.QWEN_VISION, POSITION_IDS).

The vision graph takes what the host computes from the pictures' grids (models.pictures.qwen_layout: the window
order, the boundaries as segment ids, the rotary tables), so its one dynamic axis is the call's image tokens; it is
checked against torch on pictures of three sizes and aspect ratios, alone and together. The step graph is the
multimodal one (image ids select rows of the image table) with `position_ids` [3, B, S] after the table: the host
computes them from the ids and the pictures' layout (models.pictures.mrope), so Seer's cut and the hybrid batcher
run it unchanged. With --kv-cache the cache graphs (window_step, prompt_step) take `position_shift` [B]: the text
after a row's pictures they run sits at its 1-D positions plus that shift in all three M-RoPE rows. The manifest's
`multimodal` section records the tower and picture settings the runtime needs.
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
    POSITION_IDS,
    POSITION_SHIFT,
    PROMPT_STEP,
    QWEN_VISION,
    STEP,
    VISION,
    WINDOW_STEP,
    Size,
    step_graph,
)
from seer_deploy.contracts.manifest_sections import GraphRecord
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.engines.ort import OrtSessionOptions
from seer_deploy.engines.ort_multimodal import DimpleOrtBackend
from seer_deploy.export import exporter
from seer_deploy.export.examples import cache_sizes, prompt_examples
from seer_deploy.export.exporter import ExportResult, ExportRun, GraphPlan, Loaded, Progress
from seer_deploy.export.graphs import DimpleVisionGraph, cache_modules, step_module
from seer_deploy.export.multimodal import image_probes, prepare_multimodal, vision_diff
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.quantized_reference import dequantized_model, quantized_parameters
from seer_deploy.export.validate import (
    compare_with_torch,
    torch_references,
    with_cast_references,
)
from seer_deploy.export.validate_quantized import compare_quantized
from seer_deploy.export.validation_twin import probe_logits
from seer_deploy.models.checkpoints.checkpoint_files import read_config, resolve_checkpoint
from seer_deploy.models.checkpoints.dimple import dimple_pictures, load_dimple
from seer_deploy.models.checkpoints.multimodal_files import is_dimple_checkpoint
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.pictures.mrope import picture_layout
from seer_deploy.models.pictures.qwen_layout import Grid, tokens_of, tower_inputs

# The pictures the check runs (grids in patches): square, tall, wide; one call each and one call of all three.
CHECK_GRIDS: tuple[Grid, ...] = ((1, 4, 4), (1, 10, 4), (1, 6, 12))


def prepare_dimple(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                   options: ExportOptions | None = None) -> ExportRun:
    """Check an export of a Dimple checkpoint into `out` before any work (room for the smallest picture and a
    response); `.start()` runs it."""
    options = options or ExportOptions()
    options.validate()
    path = resolve_checkpoint(checkpoint)
    pictures = dimple_pictures(path, read_config(path))
    fewest = pictures.picture.fewest_tokens
    why = f"it cannot hold one picture (at least {fewest} tokens) and a response; raise it"
    return ExportRun.check(path, str(path.absolute()), exporter.checkpoint_config(path), out, options, _load_dimple,
                           (fewest + 1, why))


def prepare_with_pictures(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                          options: ExportOptions | None = None) -> ExportRun:
    """The export of any checkpoint that takes pictures: Dimple's (a Qwen2.5-VL tower) or a LLaVA-style one's
    (LLaDA-V, LaViDa: export.multimodal)."""
    return (prepare_dimple if is_dimple_checkpoint(checkpoint) else prepare_multimodal)(checkpoint, out, options)


def export_with_pictures(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                         options: ExportOptions | None = None, progress: Progress | None = None) -> ExportResult:
    return prepare_with_pictures(checkpoint, out, options).start(progress)


def _load_dimple(run: ExportRun, report: Progress) -> Loaded:
    """The language model, tower and projector; torch references on pictures and image-bearing probes (with verify);
    the vision and step graphs to trace."""
    loaded = load_dimple(run.checkpoint, dtype=torch.float32)
    cfg, stats, lm, vision, pictures = loaded.config, run.stats, loaded.lm.model, loaded.vision, loaded.pictures
    dtype, tower = run.options.dtype, vision.cfg

    report("torch reference")
    rng = np.random.default_rng(0)
    calls = [[grid] for grid in CHECK_GRIDS] + [list(CHECK_GRIDS)]
    feeds = [tower_inputs([rng.standard_normal((t * h * w, tower.patch_dim)).astype(np.float32) for t, h, w in grids],
                          grids, tower.geometry) for grids in calls]
    with torch.no_grad():
        wanted = [vision(**{k: torch.from_numpy(v) for k, v in feed.items()}).float().numpy() for feed in feeds]
    table = torch.from_numpy(wanted[-1])
    layout = picture_layout(list(CHECK_GRIDS), tower.spatial_merge_size)
    probes = image_probes(cfg, run.max_seq_len, table.shape[0])
    model = ImageConditionedModel(lm, table, layout)
    refs = torch_references(model, stats, probes) if run.options.verify else []
    lm32 = copy.deepcopy(lm) if dtype == "fp16" and run.options.quantization else lm  # the scheme's own reference
    if dtype == "fp16":
        lm, vision = lm.to(torch.float16), vision.to(torch.float16)
        if refs:
            refs = with_cast_references(refs, ImageConditionedModel(lm, table, layout), stats)

    def validate(staged: Path) -> dict[str, float]:
        def open_backend(directory: Path) -> DimpleOrtBackend:
            backend = DimpleOrtBackend(directory, OrtSessionOptions(providers=("CPUExecutionProvider",)))
            backend.set_image_table(table.numpy(), layout)
            return backend

        logits = probe_logits(staged, open_backend, refs)  # from the validation twin, closed before the export opens
        backend = open_backend(staged)
        worst = max(vision_diff(backend.encode_patches(feed), want, dtype) for feed, want in zip(feeds, wanted,
                                                                                               strict=True))
        quant = run.options.quantization
        if quant:
            names = quantized_parameters(staged / STEP.file, lm32, quant, (cfg.vocab_size, cfg.n_embed_rows))
            own = torch_references(ImageConditionedModel(dequantized_model(lm32, names, quant), table, layout), stats,
                                   probes)
            return {VISION.name: worst} | compare_quantized(backend, refs, quant, logits, own)
        return {VISION.name: worst} | compare_with_torch(backend, refs, cfg, dtype, logits)

    def manifest_section(records: dict[str, GraphRecord]) -> dict[str, Any]:
        vision_config = {"tower": tower.to_dict(), "pictures": pictures.to_dict(),
                         "tokens_per_image": pictures.picture.fewest_tokens, "image_token_index": loaded.image_token_index}
        return {MULTIMODAL_KEY: {VISION.name: records[VISION.name].to_dict(), "vision_config": vision_config,
                                 "image_id_base": cfg.n_embed_rows, "image_table_input": IMAGE_TABLE.name,
                                 "position_ids_input": POSITION_IDS.name}}

    example_grids = [(1, 4, 6), (1, 2, 4)]  # 8 image tokens: a size no other traced axis has
    examples = exporter.step_examples(cfg, run.max_seq_len)
    ids = examples[INPUT_IDS.name].clone()
    ids[:, 1] = cfg.n_embed_rows + torch.tensor([0, 2])
    feed = tower_inputs([np.zeros((t * h * w, tower.patch_dim), np.float32) for t, h, w in example_grids],
                        example_grids, tower.geometry)
    rows = sum(tokens_of(g, tower.spatial_merge_size) for g in example_grids)
    kv_cache = run.options.kv_cache
    plan = GraphPlan(
        modules=((QWEN_VISION, DimpleVisionGraph(vision)),
                 (step_graph(multimodal=True, kv_cache=kv_cache, positions=True),
                  step_module(lm, stats, multimodal=True, kv_cache=kv_cache)),
                 *(cache_modules(lm, positions=True) if kv_cache else ())),
        examples=examples | {k: torch.from_numpy(v) for k, v in feed.items()} | {
            INPUT_IDS.name: ids, IMAGE_TABLE.name: torch.zeros(rows, cfg.d_model),
            POSITION_IDS.name: torch.arange(ids.shape[1]).expand(3, 2, -1).contiguous()},
        graph_examples={  # the cached graphs' position shift: one row behind its 1-D positions, one not
            PROMPT_STEP.name: prompt_examples(cfg, run.max_seq_len) | {POSITION_SHIFT.name: torch.tensor([0, -3])},
            WINDOW_STEP.name: {POSITION_SHIFT.name: torch.tensor([-3, 0])}},
        sizes={Size.STAT_ROWS: len(stats.sparsity_rows), Size.D_MODEL: cfg.d_model,
               Size.MERGE_UNIT: tower.spatial_merge_size**2, Size.PATCH_DIM: tower.patch_dim,
               Size.VISION_HEAD_DIM: tower.head_dim, **cache_sizes(cfg)},
        validate=validate,
        manifest_extra=manifest_section,
        head_widths=(cfg.vocab_size, cfg.n_embed_rows),
    )
    return Loaded(loaded.lm.layout, plan)
