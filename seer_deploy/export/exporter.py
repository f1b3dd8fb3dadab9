"""`export_checkpoint`: checkpoint directory -> export directory (step0.onnx, step.onnx, weights.bin, manifest.json).

Everything is written into a temporary directory next to the destination and renamed into place only after the
ONNX checker and the ONNX Runtime vs torch comparison passed, so a failed or interrupted export leaves nothing at the
destination. A destination that holds another model's export is refused unless forced; one that holds something
other than an export is always refused (replacing it would delete the user's files).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import onnx_ir as ir
import torch

import seer_deploy
from seer_deploy.core.atomic import install_dir, temp_dir_beside
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import file_sha256
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.export.graphs import Step0Graph, StepGraph
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.trace import BATCH, SEQ, io_specs, trace_graph
from seer_deploy.export.validate import check_graph_files, compare_with_torch, make_probes, torch_references
from seer_deploy.export.weights import SharedWeightFile
from seer_deploy.models.checkpoint import DEMO_NAMES, checkpoint_fingerprint, load_checkpoint, resolve_checkpoint
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.spec import sampling
from seer_deploy.spec.export_manifest import (
    MANIFEST_FILE,
    ExportManifest,
    GraphSpec,
    ModelSpec,
    SeerSpec,
    WeightsSpec,
)

STAGES: tuple[str, ...] = (
    "loading checkpoint",
    "torch reference",
    "tracing step0",
    "tracing step",
    "checking graphs",
    "validating with ONNX Runtime",
    "installing",
)
MAX_TRACE_BATCH = 4096  # the batch dim is dynamic; this only bounds torch.export's symbolic range
Progress = Callable[[str], None]  # called with the name of each stage as it starts


@dataclass(frozen=True)
class ExportResult:
    out: Path
    manifest: ExportManifest
    max_diff: dict[str, float]  # measured ORT vs torch differences per output (empty with verify=False)
    seconds: float


def check_destination(out: Path, fingerprint: str, force: bool) -> None:
    """Refuse to replace anything but an empty directory or an export of the same model (or any export if forced)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ArtifactError(f"--out {out} is a file; give a directory path for the export")
    if not any(out.iterdir()):
        return
    if not (out / MANIFEST_FILE).is_file():
        raise ArtifactError(
            f"--out {out} is a non-empty directory that is not a seer-deploy export; refusing to replace it. "
            "Choose a new or empty directory"
        )
    try:
        existing: ExportManifest | None = ExportManifest.load(out)
    except ArtifactError:
        existing = None
    if force:
        return
    if existing is None:
        raise ArtifactError(f"--out {out} holds an export with an unreadable manifest; pass --force to replace it")
    if existing.model.fingerprint != fingerprint:
        raise ArtifactError(
            f"--out {out} holds the export of another model ({existing.model.source}, fingerprint "
            f"{existing.model.fingerprint[:12]}); pass --force to replace it, or choose another --out"
        )



def export_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript

    return {
        "seer_deploy": seer_deploy.__version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxscript": onnxscript.__version__,
        "onnx_ir": ir.__version__,
    }


def _trace_both(
    model: MaskPredictor, spec: StatsSpec, options: ExportOptions, max_seq_len: int, tmp: Path, progress: Progress
) -> tuple[dict[str, GraphSpec], SharedWeightFile]:
    cfg = model.cfg
    S = min(8, max_seq_len)
    ids = torch.randint(0, cfg.vocab_size, (2, S), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, S, dtype=torch.long)
    bs, b = {0: BATCH, 1: SEQ}, {0: BATCH}
    jobs = (
        ("step0", Step0Graph(model, spec), (ids, mask), ("input_ids", "attention_mask"),
         ("token_ids", "confidence", "eos_prob", "sparsity"), {"input_ids": bs, "attention_mask": bs}),
        ("step", StepGraph(model), (ids, mask, torch.zeros(2), torch.ones(2, S)),
         ("input_ids", "attention_mask", sampling.TEMPERATURE_INPUT, sampling.UNIFORM_INPUT), ("token_ids", "confidence"),
         {"input_ids": bs, "attention_mask": bs, sampling.TEMPERATURE_INPUT: b, sampling.UNIFORM_INPUT: bs}),
    )
    graphs: dict[str, GraphSpec] = {}
    store = SharedWeightFile(tmp)
    with store:
        for name, module, args, inputs, outputs, dyn in jobs:
            progress(f"tracing {name}")
            onnx_model = trace_graph(module, args, inputs, outputs, dyn, options.opset, MAX_TRACE_BATCH, max_seq_len)
            store.externalize(onnx_model, options.inline_limit_bytes)
            path = tmp / f"{name}.onnx"
            ir.save(onnx_model, path)
            graphs[name] = GraphSpec(
                path.name, file_sha256(path), io_specs(onnx_model.graph.inputs), io_specs(onnx_model.graph.outputs)
            )
            del onnx_model
    return graphs, store


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Export both graphs of `checkpoint` ('demo' or a local directory) into `out`; see the module docstring."""
    from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions

    options = options or ExportOptions()
    options.validate()
    report: Progress = progress or (lambda stage: None)
    start = time.perf_counter()
    dest = Path(out).expanduser().absolute()
    report("loading checkpoint")
    ckpt_path = resolve_checkpoint(checkpoint)
    fingerprint = checkpoint_fingerprint(ckpt_path)
    check_destination(dest, fingerprint, options.force)
    ckpt = load_checkpoint(ckpt_path, dtype=torch.float32)
    cfg = ckpt.config
    max_seq_len = options.max_seq_len or cfg.max_seq_len
    if max_seq_len > cfg.max_seq_len:
        raise ConfigError(
            f"--max-seq-len {max_seq_len} exceeds the model's {cfg.max_seq_len} positions; use at most {cfg.max_seq_len}"
        )
    if max_seq_len < 2:
        raise ConfigError(f"--max-seq-len {max_seq_len} is too short; give at least 2 positions")
    spec = options.seer.spec(cfg.n_layers)
    model = ckpt.model

    report("torch reference")
    refs = torch_references(model, spec, make_probes(cfg, max_seq_len)) if options.verify else []
    if options.dtype == "fp16":
        model = model.to(torch.float16)

    tmp = temp_dir_beside(dest, "export")
    try:
        graphs, store = _trace_both(model, spec, options, max_seq_len, tmp, report)
        manifest = ExportManifest(
            model=ModelSpec(
                source=str(checkpoint) if str(checkpoint) in DEMO_NAMES else str(ckpt_path.absolute()),
                layout=ckpt.layout,
                fingerprint=fingerprint,
                config=cfg.to_dict(),
            ),
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
            extra={"tensors_in_weights_file": store.tensors_written, "tensors_shared": store.tensors_shared},
        )
        manifest.save(tmp)

        report("checking graphs")
        check_graph_files([tmp / g.file for g in graphs.values()])
        max_diff: dict[str, float] = {}
        if options.verify:
            report("validating with ONNX Runtime")
            backend = OrtBackend(tmp, OrtSessionOptions(providers=("CPUExecutionProvider",)))
            max_diff = compare_with_torch(backend, refs, cfg, options.dtype)
            del backend
            manifest = replace(manifest, extra={**manifest.extra, "validation_max_diff": max_diff})
            manifest.save(tmp)

        report("installing")
        check_destination(dest, fingerprint, options.force)  # again: another process may have written there meanwhile
        install_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(dest, manifest, max_diff, time.perf_counter() - start)
