"""Multimodal export: vision.onnx (pixels -> image embeddings) and image-aware step0.onnx / step.onnx.

The step graphs take one extra input, `image_table` float32 [image_tokens, D]: the embeddings of every image of the
batch, one row per image token. Prompt ids at and above the LM's embedding rows (`image_id_base`) select a row of
it in-graph (seer_deploy.models.image_prompts.embed_with_images); every other id is embedded as usual. So the runtime
loop, Seer's truncation and regrouped batches work on plain ids, and the graphs' other inputs and outputs are those
of a text-only export. The vision graph folds in the SigLIP tower, the selected layer, the projector and LLaVA's
image_newline, and outputs float32 whatever the export dtype, so the table's type never depends on it.

The export directory and manifest are the text export's (seer_deploy.export.exporter) with the vision graph and the
image settings under `extra["multimodal"]`; the weights of all three graphs share one weights.bin.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx_ir as ir
import torch
from torch import Tensor, nn

from seer_deploy.core.atomic import install_dir, temp_dir_beside
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import file_sha256
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.engines.ort import OrtSessionOptions
from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
from seer_deploy.export.exporter import Progress, check_destination, export_versions
from seer_deploy.export.graphs import Step0Graph, StepGraph
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.trace import check_opset, io_specs, quiet_exporter, strip_metadata
from seer_deploy.export.validate import (
    Probe,
    check_graph_files,
    compare_with_torch,
    make_probes,
    torch_references,
)
from seer_deploy.export.weights import SharedWeightFile
from seer_deploy.models.checkpoint import checkpoint_fingerprint
from seer_deploy.models.config import ModelConfig
from seer_deploy.models.image_prompts import ImageConditionedModel, embed_with_images
from seer_deploy.models.llada import MaskPredictor, ModelOutput
from seer_deploy.models.multimodal import DEMO_VL_NAME, load_multimodal, resolve_multimodal
from seer_deploy.models.vision import VisionEncoder
from seer_deploy.spec import sampling
from seer_deploy.spec.export_manifest import ExportManifest, GraphSpec, ModelSpec, SeerSpec, WeightsSpec
from seer_deploy.spec.multimodal import EMBEDS_OUTPUT, IMAGE_TABLE_INPUT, MULTIMODAL_KEY, PIXEL_INPUT, VISION_FILE

STAGES: tuple[str, ...] = (
    "loading checkpoint",
    "torch reference",
    "tracing vision",
    "tracing step0",
    "tracing step",
    "checking graphs",
    "validating with ONNX Runtime",
    "installing",
)
MAX_TRACE_BATCH = 4096
MAX_IMAGE_TOKENS = 1 << 20  # bounds torch.export's symbolic range for the image table only
VISION_ATOL = {"fp32": 1e-4, "fp16": 5e-2}  # max |diff| of the image embeddings, relative to their max |value|


class _EmbedsModel(nn.Module):
    """Step0Graph / StepGraph call model(ids, mask, stats=...); this adapter receives embeddings in the ids' place."""

    def __init__(self, lm: MaskPredictor) -> None:
        super().__init__()
        self.lm = lm
        self.cfg = lm.cfg

    def forward(self, embeds: Tensor, attention_mask: Tensor | None = None, *, stats: StatsSpec | None = None) -> ModelOutput:
        return self.lm(None, attention_mask, inputs_embeds=embeds, stats=stats)  # type: ignore[no-any-return]


class MultimodalStep0Graph(nn.Module):
    """Step0Graph with image ids: (input_ids, attention_mask, image_table) -> token, confidence, EOS prob, sparsity."""

    def __init__(self, lm: MaskPredictor, spec: StatsSpec) -> None:
        super().__init__()
        self.head = Step0Graph(cast(MaskPredictor, _EmbedsModel(lm)), spec)  # registers the LM once, inside

    def forward(self, input_ids: Tensor, attention_mask: Tensor, image_table: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head(embeds, attention_mask)  # type: ignore[no-any-return]


class MultimodalStepGraph(nn.Module):
    """StepGraph with image ids: (input_ids, attention_mask, temperature, sample_uniform, image_table)."""

    def __init__(self, lm: MaskPredictor) -> None:
        super().__init__()
        self.head = StepGraph(cast(MaskPredictor, _EmbedsModel(lm)))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor, image_table: Tensor
    ) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head(embeds, attention_mask, temperature, sample_uniform)  # type: ignore[no-any-return]


class VisionGraph(nn.Module):
    """pixel_values [N, 3, H, W] (float32) -> image_embeds [N, tokens_per_image, D] (float32)."""

    def __init__(self, vision: VisionEncoder) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.vision(pixel_values).float()


def _trace(
    module: nn.Module,
    args: tuple[Tensor, ...],
    inputs: list[str],
    outputs: list[str],
    dynamic: dict[str, dict[int, tuple[str, int]]],
    opset: int,
) -> ir.Model:
    """Like export.trace.trace_graph, with any named dynamic dims (name, max): the image dims are not batch or seq."""
    check_opset(opset)
    dims: dict[str, torch.export.Dim] = {}
    for axes in dynamic.values():
        for name, upper in axes.values():
            dims.setdefault(name, torch.export.Dim(name, min=1, max=upper))
    shapes = {n: {axis: dims[name] for axis, (name, _) in dynamic.get(n, {}).items()} for n in inputs}
    with quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(
            module, args, dynamo=True, input_names=inputs, output_names=outputs, dynamic_shapes=shapes,
            opset_version=opset, optimize=True, verbose=False, report=False,
        )
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    model = program.model
    strip_metadata(model)
    return model



@dataclass(frozen=True)
class MultimodalExportResult:
    out: Path
    manifest: ExportManifest
    max_diff: dict[str, float]
    seconds: float


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
        probes.append(Probe(ids, p.attention_mask, p.temperature, p.seed))
    return probes


def export_multimodal(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> MultimodalExportResult:
    """Export a LLaDA-V-layout checkpoint (or 'demo-vl'): vision.onnx, step0.onnx, step.onnx, weights.bin, manifest.

    As the text exporter: written into a temporary directory, checked (ONNX checker, ONNX Runtime vs torch on
    image-bearing probes and on pixels) and renamed into place only when everything passed.
    """
    options = options or ExportOptions()
    options.validate()
    report: Progress = progress or (lambda stage: None)
    start = time.perf_counter()
    dest = Path(out).expanduser().absolute()
    report("loading checkpoint")
    path = resolve_multimodal(checkpoint)
    fingerprint = checkpoint_fingerprint(path)
    check_destination(dest, fingerprint, options.force)
    loaded = load_multimodal(path, dtype=torch.float32)
    cfg, vcfg = loaded.config, loaded.vision_config
    max_seq_len = options.max_seq_len or cfg.max_seq_len
    if not 2 <= max_seq_len <= cfg.max_seq_len:
        raise ConfigError(f"--max-seq-len {max_seq_len} must lie in [2, {cfg.max_seq_len}] (the model's positions)")
    if max_seq_len <= vcfg.tokens_per_image:
        raise ConfigError(
            f"--max-seq-len {max_seq_len} cannot hold one image ({vcfg.tokens_per_image} tokens) and a response; "
            "raise it"
        )
    spec = options.seer.spec(cfg.n_layers)
    lm, vision = loaded.lm.model, loaded.vision

    report("torch reference")
    size = vcfg.image.image_size
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32))
    with torch.no_grad():
        ref_embeds = vision(pixels).float()
    table = ref_embeds.reshape(-1, cfg.d_model)
    probes = image_probes(cfg, max_seq_len, table.shape[0])
    refs = torch_references(ImageConditionedModel(lm, table), spec, probes) if options.verify else []
    if options.dtype == "fp16":
        lm, vision = lm.to(torch.float16), vision.to(torch.float16)

    tmp = temp_dir_beside(dest, "export")
    try:
        graphs, vision_spec, store = _trace_all(lm, vision, spec, options, max_seq_len, tmp, report)
        source = DEMO_VL_NAME if str(checkpoint) == DEMO_VL_NAME else str(path.absolute())
        manifest = ExportManifest(
            model=ModelSpec(source=source, layout=loaded.lm.layout, fingerprint=fingerprint, config=cfg.to_dict()),
            special_ids={"mask": cfg.mask_id, "eos": cfg.eos_id, "pad": cfg.pad_id, "bos": cfg.bos_id, "eot": cfg.eot_id},
            dtype=options.dtype,
            opset=options.opset,
            max_seq_len=max_seq_len,
            graphs=graphs,
            seer=SeerSpec(
                stats_layers=list(spec.layers),
                stat_names=list(STAT_NAMES),
                abs_threshold=spec.abs_threshold,
                rel_threshold=spec.rel_threshold,
                sparsity_rows=[(layer, stat) for layer in spec.layers for stat in STAT_NAMES],
            ),
            sampling=sampling.manifest_entry(),
            versions=export_versions(),
            weights=WeightsSpec(store.name, store.sha256(), store.size),
            extra={
                "tensors_in_weights_file": store.tensors_written,
                "tensors_shared": store.tensors_shared,
                MULTIMODAL_KEY: {
                    "vision": vision_spec.to_dict(),
                    "vision_config": vcfg.to_dict(),
                    "image_id_base": cfg.n_embed_rows,
                    "image_table_input": IMAGE_TABLE_INPUT,
                },
            },
        )
        manifest.save(tmp)
        report("checking graphs")
        check_graph_files([tmp / g.file for g in graphs.values()] + [tmp / VISION_FILE])
        max_diff: dict[str, float] = {}
        if options.verify:
            report("validating with ONNX Runtime")
            backend = MultimodalOrtBackend(tmp, OrtSessionOptions(providers=("CPUExecutionProvider",)))
            max_diff["vision"] = _check_vision(backend, pixels.numpy(), ref_embeds.numpy(), options.dtype)
            backend.set_image_table(table.numpy())
            max_diff.update(compare_with_torch(backend, refs, cfg, options.dtype))
            del backend
            manifest = replace(manifest, extra={**manifest.extra, "validation_max_diff": max_diff})
            manifest.save(tmp)
        report("installing")
        check_destination(dest, fingerprint, options.force)
        install_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return MultimodalExportResult(dest, manifest, max_diff, time.perf_counter() - start)


def _trace_all(
    lm: MaskPredictor,
    vision: VisionEncoder,
    spec: StatsSpec,
    options: ExportOptions,
    max_seq_len: int,
    tmp: Path,
    progress: Progress,
) -> tuple[dict[str, GraphSpec], GraphSpec, SharedWeightFile]:
    cfg, vcfg = lm.cfg, vision.cfg
    S = min(8, max_seq_len)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, S), generator=gen)
    ids[:, 1] = cfg.n_embed_rows + torch.tensor([0, 2])  # the example exercises the image lookup
    mask = torch.ones(2, S, dtype=torch.long)
    table = torch.zeros(3, cfg.d_model)
    size = vcfg.image.image_size
    pixels = torch.zeros(2, 3, size, size)
    batch, seq = ("batch", MAX_TRACE_BATCH), ("seq", max_seq_len)
    bs = {0: batch, 1: seq}
    tab = {0: ("image_tokens", MAX_IMAGE_TOKENS)}
    temp, uni = sampling.TEMPERATURE_INPUT, sampling.UNIFORM_INPUT
    jobs: list[tuple[str, nn.Module, tuple[Tensor, ...], list[str], list[str], dict[str, Any]]] = [
        ("vision", VisionGraph(vision), (pixels,), [PIXEL_INPUT], [EMBEDS_OUTPUT],
         {PIXEL_INPUT: {0: ("images", MAX_TRACE_BATCH)}}),
        ("step0", MultimodalStep0Graph(lm, spec), (ids, mask, table), ["input_ids", "attention_mask", IMAGE_TABLE_INPUT],
         ["token_ids", "confidence", "eos_prob", "sparsity"], {"input_ids": bs, "attention_mask": bs, IMAGE_TABLE_INPUT: tab}),
        ("step", MultimodalStepGraph(lm), (ids, mask, torch.zeros(2), torch.ones(2, S), table),
         ["input_ids", "attention_mask", temp, uni, IMAGE_TABLE_INPUT], ["token_ids", "confidence"],
         {"input_ids": bs, "attention_mask": bs, temp: {0: batch}, uni: bs, IMAGE_TABLE_INPUT: tab}),
    ]
    specs: dict[str, GraphSpec] = {}
    store = SharedWeightFile(tmp)
    with store:
        for name, module, args, inputs, outputs, dyn in jobs:
            progress(f"tracing {name}")
            model = _trace(module, args, inputs, outputs, dyn, options.opset)
            store.externalize(model, options.inline_limit_bytes)
            file = tmp / f"{name}.onnx"
            ir.save(model, file)
            specs[name] = GraphSpec(file.name, file_sha256(file), io_specs(model.graph.inputs), io_specs(model.graph.outputs))
            del model
    vision_spec = specs.pop("vision")
    return specs, vision_spec, store


def _check_vision(backend: MultimodalOrtBackend, pixels: np.ndarray, want: np.ndarray, dtype: str) -> float:
    from seer_deploy.export.validate import ExportValidationError

    got = backend.encode_images(pixels)
    if got.shape != want.shape:
        raise ExportValidationError(f"vision.onnx returned {got.shape}, torch {want.shape}; nothing was written")
    scale = float(np.abs(want).max(initial=1e-12))
    worst = float(np.abs(got.astype(np.float64) - want).max(initial=0.0)) / scale
    if worst > VISION_ATOL[dtype]:
        raise ExportValidationError(
            f"vision.onnx disagrees with torch: max |diff| {worst:.3g} of the largest embedding value > "
            f"{VISION_ATOL[dtype]:g} ({dtype} tolerance); nothing was written"
        )
    return worst
