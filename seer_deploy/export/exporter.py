"""`export_checkpoint`: checkpoint directory -> export directory (step0.onnx, step.onnx, weights.bin, manifest.json),
and `ExportRun`, the path every export takes (the multimodal one too, seer_deploy.export.multimodal).

Everything is written into a temporary directory next to the destination and renamed into place only after the
ONNX checker, the check of every traced graph's inputs and outputs against its declaration (spec.graphs) and the
ONNX Runtime vs torch comparison passed, so a failed or interrupted export leaves nothing at the destination. A
destination that holds another model's export is refused unless forced; one that holds something other than an
export is always refused (replacing it would delete the user's files).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch
from torch import Tensor, nn

import seer_deploy
from seer_deploy.core.atomic import install_dir, temp_dir_beside
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import file_sha256
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.export.graphs import Step0Graph, StepGraph
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.trace import io_specs, trace_graph
from seer_deploy.export.validate import (
    check_graph_files,
    check_interface,
    compare_with_torch,
    make_probes,
    torch_references,
)
from seer_deploy.export.weights import SharedWeightFile
from seer_deploy.models.checkpoint import DEMO_NAMES, checkpoint_fingerprint, load_checkpoint, resolve_checkpoint
from seer_deploy.models.config import ModelConfig
from seer_deploy.spec import sampling
from seer_deploy.spec.export_manifest import (
    MANIFEST_FILE,
    ExportManifest,
    GraphRecord,
    ModelSpec,
    SeerSpec,
    WeightsSpec,
)
from seer_deploy.spec.graphs import (
    ATTENTION_MASK,
    INPUT_IDS,
    SAMPLE_UNIFORM,
    STEP,
    STEP0,
    STEP_GRAPH_NAMES,
    TEMPERATURE,
    Axis,
    GraphIO,
    Size,
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
MAX_TRACE_BATCH = 4096  # the batch and image dims are dynamic; these only bound torch.export's symbolic ranges
MAX_IMAGE_TOKENS = 1 << 20
Progress = Callable[[str], None]  # called with the name of each stage as it starts


@dataclass(frozen=True)
class ExportResult:
    out: Path
    manifest: ExportManifest
    max_diff: dict[str, float]  # measured ORT vs torch differences per output (empty with verify=False)
    seconds: float


@dataclass(frozen=True)
class GraphPlan:
    """What one export traces and how it is checked: all that a text and a multimodal export differ in."""

    modules: Sequence[tuple[GraphIO, nn.Module]]  # traced in this order
    examples: Mapping[str, Tensor]  # a tracing example per input name
    sizes: Mapping[Size, int]  # the declared Size dims, for this model (what the traced graphs must show)
    validate: Callable[[Path], dict[str, float]]  # the staged export dir -> max |diff| per output, or raise
    manifest_extra: Callable[[dict[str, GraphRecord]], dict[str, Any]] = field(default=lambda records: {})


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


def step_examples(cfg: ModelConfig, max_seq_len: int) -> dict[str, Tensor]:
    """Tracing examples for the step graphs' token and sampling inputs: batch 2, up to 8 positions."""
    S = min(8, max_seq_len)
    return {
        INPUT_IDS.name: torch.randint(0, cfg.vocab_size, (2, S), generator=torch.Generator().manual_seed(0)),
        ATTENTION_MASK.name: torch.ones(2, S, dtype=torch.long),
        TEMPERATURE.name: torch.zeros(2),
        SAMPLE_UNIFORM.name: torch.ones(2, S),
    }


def trace_graphs(
    plan: GraphPlan, options: ExportOptions, max_seq_len: int, tmp: Path, progress: Progress
) -> tuple[dict[str, GraphRecord], SharedWeightFile]:
    """Trace every graph of the plan into `tmp`, all weights into one shared file, each checked against its spec."""
    bounds = {Axis.BATCH: MAX_TRACE_BATCH, Axis.SEQ: max_seq_len, Axis.IMAGES: MAX_TRACE_BATCH,
              Axis.IMAGE_TOKENS: MAX_IMAGE_TOKENS}
    records: dict[str, GraphRecord] = {}
    store = SharedWeightFile(tmp)
    with store:
        for graph, module in plan.modules:
            progress(f"tracing {graph.name}")
            args = tuple(plan.examples[name] for name in graph.input_names)
            onnx_model = trace_graph(module, args, graph, options.opset, bounds)
            store.externalize(onnx_model, options.inline_limit_bytes)
            path = tmp / graph.file
            ir.save(onnx_model, path)
            records[graph.name] = GraphRecord(
                path.name, file_sha256(path), io_specs(onnx_model.graph.inputs), io_specs(onnx_model.graph.outputs)
            )
            check_interface(graph, records[graph.name], plan.sizes)
            del onnx_model
    return records, store


@dataclass(frozen=True)
class ExportRun:
    """One export under way: its settings, its destination, whom it reports to, when it started."""

    options: ExportOptions
    dest: Path
    report: Progress
    started: float

    @classmethod
    def begin(cls, out: str | os.PathLike[str], options: ExportOptions | None, progress: Progress | None) -> ExportRun:
        options = options or ExportOptions()
        options.validate()
        run = cls(options, Path(out).expanduser().absolute(), progress or (lambda stage: None), time.perf_counter())
        run.report("loading checkpoint")
        return run

    def claim(self, checkpoint_dir: Path) -> str:
        """The checkpoint's fingerprint, once the destination may take its export (check_destination)."""
        fingerprint = checkpoint_fingerprint(checkpoint_dir)
        check_destination(self.dest, fingerprint, self.options.force)
        return fingerprint

    def write(self, model: ModelSpec, stats: StatsSpec, max_seq_len: int, plan: GraphPlan) -> ExportResult:
        """Trace, write the manifest, check and validate in a temp dir beside the destination, then install it there;
        on any failure (an interrupt too) nothing is left behind and the destination keeps what it had."""
        options, report = self.options, self.report
        cfg = ModelConfig(**model.config)
        tmp = temp_dir_beside(self.dest, "export")
        try:
            records, store = trace_graphs(plan, options, max_seq_len, tmp, report)
            manifest = ExportManifest(
                model=model,
                special_ids={"mask": cfg.mask_id, "eos": cfg.eos_id, "pad": cfg.pad_id, "bos": cfg.bos_id,
                             "eot": cfg.eot_id},
                dtype=options.dtype,
                opset=options.opset,
                max_seq_len=max_seq_len,
                graphs={name: records[name] for name in STEP_GRAPH_NAMES},
                seer=SeerSpec(
                    stats_layers=list(stats.layers),
                    stat_names=list(STAT_NAMES),
                    abs_threshold=stats.abs_threshold,
                    rel_threshold=stats.rel_threshold,
                    sparsity_rows=stats.sparsity_rows,
                ),
                sampling=sampling.manifest_entry(),
                versions=export_versions(),
                weights=WeightsSpec(store.name, store.sha256(), store.size),
                extra={
                    "tensors_in_weights_file": store.tensors_written,
                    "tensors_shared": store.tensors_shared,
                    **plan.manifest_extra(records),
                },
            )
            manifest.save(tmp)

            report("checking graphs")
            check_graph_files([tmp / record.file for record in records.values()])
            max_diff: dict[str, float] = {}
            if options.verify:
                report("validating with ONNX Runtime")
                max_diff = plan.validate(tmp)
                manifest = replace(manifest, extra={**manifest.extra, "validation_max_diff": max_diff})
                manifest.save(tmp)

            report("installing")
            check_destination(self.dest, model.fingerprint, options.force)  # again: another process may have written
            install_dir(tmp, self.dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return ExportResult(self.dest, manifest, max_diff, time.perf_counter() - self.started)


def export_checkpoint(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                      options: ExportOptions | None = None, progress: Progress | None = None) -> ExportResult:
    """Export both graphs of `checkpoint` ('demo' or a local directory) into `out`; see the module docstring."""
    from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions

    run = ExportRun.begin(out, options, progress)
    ckpt_path = resolve_checkpoint(checkpoint)
    fingerprint = run.claim(ckpt_path)
    ckpt = load_checkpoint(ckpt_path, dtype=torch.float32)
    cfg = ckpt.config
    max_seq_len = run.options.max_seq_len or cfg.max_seq_len
    if max_seq_len > cfg.max_seq_len:
        raise ConfigError(
            f"--max-seq-len {max_seq_len} exceeds the model's {cfg.max_seq_len} positions; use at most {cfg.max_seq_len}"
        )
    if max_seq_len < 2:
        raise ConfigError(f"--max-seq-len {max_seq_len} is too short; give at least 2 positions")
    stats = run.options.seer.spec(cfg.n_layers)
    model = ckpt.model
    dtype = run.options.dtype

    run.report("torch reference")
    refs = torch_references(model, stats, make_probes(cfg, max_seq_len)) if run.options.verify else []
    if dtype == "fp16":
        model = model.to(torch.float16)

    def validate(staged: Path) -> dict[str, float]:
        backend = OrtBackend(staged, OrtSessionOptions(providers=("CPUExecutionProvider",)))
        return compare_with_torch(backend, refs, cfg, dtype)

    plan = GraphPlan(
        modules=((STEP0, Step0Graph(model, stats)), (STEP, StepGraph(model))),
        examples=step_examples(cfg, max_seq_len),
        sizes={Size.STAT_ROWS: len(stats.sparsity_rows)},
        validate=validate,
    )
    source = str(checkpoint) if str(checkpoint) in DEMO_NAMES else str(ckpt_path.absolute())
    return run.write(ModelSpec(source, ckpt.layout, fingerprint, cfg.to_dict()), stats, max_seq_len, plan)
