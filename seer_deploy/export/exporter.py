"""`export_checkpoint`: checkpoint directory -> export directory (step.onnx, weights.bin, manifest.json), and `ExportRun`,
the path every export takes (the multimodal one too, seer_deploy.export.multimodal).

An export is checked before any work starts (`prepare_export`: options, the checkpoint's config, the length, the
statistics, the destination, and the disk and memory it needs: export.resources), then run (`ExportRun.start`). A text
export streams: the torch reference runs one layer at a time (export.streamed_reference), the graphs are traced on a
fake model and the weights file is written tensor by tensor from the checkpoint's shards (export.streamed_weights), so
the process never holds two copies of the weights (the multimodal export still loads its model: export.multimodal).
Everything is written into a temporary directory next to the destination and renamed into place only after the ONNX
checker and the check of every traced graph's inputs and outputs against its declaration (contracts.graphs) passed, so a
failed or interrupted export leaves nothing at the destination. The ONNX Runtime vs torch comparison comes last: when
it fails, the finished export is installed all the same, marked unverified in its manifest with the figures, and the
run fails (UnverifiedExport, exit 1): an hour of work on an 8B model is kept for the user to judge, never passed off as
checked. The installed directory carries this tool's ownership marker (core.atomic.claim): a destination that holds
another model's export is refused unless forced; one that holds anything seer-deploy did not write there is always
refused (replacing it would delete the user's files).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import onnx_ir as ir
import torch
from torch import Tensor, nn

import seer_deploy
from seer_deploy.contracts import sampling
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import (
    CACHE_GRAPH_NAMES,
    PROMPT_CACHE_GRAPH_NAMES,
    PROMPT_STEP,
    STEP_GRAPH_NAMES,
    Axis,
    GraphIO,
    Size,
    export_graphs,
)
from seer_deploy.contracts.manifest_sections import GraphRecord, ModelSpec, WeightsSpec
from seer_deploy.core.atomic import (
    check_replaceable,
    claim,
    install_dir,
    staging_dir,
)
from seer_deploy.core.errors import ConfigError, UnverifiedExport
from seer_deploy.core.files import file_sha256
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export.destination import ARTIFACT_KIND, destination_fingerprint
from seer_deploy.export.examples import cache_sizes, prompt_examples, step_examples
from seer_deploy.export.graphs import cache_modules, step_module
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.quantize import QUANTIZED_GRAPHS, QuantizedGraph, quantize_graph, quantized_record
from seer_deploy.export.quantized_reference import own_references
from seer_deploy.export.resources import check_resources, footprint
from seer_deploy.export.streamed_reference import streamed_references
from seer_deploy.export.trace import StreamedWeights, io_specs, trace_graph
from seer_deploy.export.validate import (
    ExportValidationError,
    check_graph_files,
    check_interface,
    compare_with_torch,
    make_probes,
)
from seer_deploy.export.validate_quantized import compare_quantized
from seer_deploy.export.validation_twin import cpu_backend, probe_logits
from seer_deploy.export.weights import SharedWeightFile
from seer_deploy.models.checkpoints.checkpoint import (
    DEMO_NAMES,
    checkpoint_fingerprint,
    checkpoint_weights,
    read_config,
    resolve_checkpoint,
)
from seer_deploy.models.checkpoints.weight_sources import shaped_model, weight_sources
from seer_deploy.models.families.config import ModelConfig, config_from_dict
from seer_deploy.models.text.tokenizer import export_tokenizer, special_ids_from_tokenizer_file
from seer_deploy.seer.config import SeerConfig

STAGES: tuple[str, ...] = (
    "loading checkpoint",
    "torch reference",
    "tracing step",
    "writing weights",
    "tracing window_step",  # --kv-cache
    "tracing prompt_step",  # --kv-cache
    "checking graphs",
    "validating with ONNX Runtime",
    "installing",
)
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}  # export.options.EXPORT_DTYPES as torch types
MAX_TRACE_BATCH = 4096  # the batch and image dims are dynamic; these only bound torch.export's symbolic ranges
MAX_IMAGE_TOKENS = 1 << 20


class Progress(Protocol):
    """Hears each stage as it starts, and while the weights file is written each tensor: `done` bytes of `total`
    written so far, `item` the tensor just written."""

    def __call__(self, stage: str, /, *, done: int = 0, total: int = 0, item: str = "") -> None: ...


def quiet(stage: str, /, *, done: int = 0, total: int = 0, item: str = "") -> None:
    """A Progress that hears nothing."""


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
    weights: StreamedWeights | None = None  # the modules are fake, their weights streamed from the checkpoint
    head_widths: tuple[int, ...] = ()  # the LM head's output widths (the vocabulary): what --keep-head keeps
    graph_examples: Mapping[str, Mapping[str, Tensor]] = field(default_factory=dict)  # per graph name, examples that
    # replace those of `examples` (the prompt-cache graph's run columns have other widths than the step graph's)


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


def trace_graphs(
    plan: GraphPlan, options: ExportOptions, max_seq_len: int, tmp: Path, progress: Progress
) -> tuple[dict[str, GraphRecord], SharedWeightFile, dict[str, QuantizedGraph]]:
    """Trace every graph of the plan into `tmp`, all weights into one shared file, each checked against its spec;
    with --quantize the language model's graphs are quantized (what each kept in full precision, by graph)."""
    bounds = {Axis.BATCH: MAX_TRACE_BATCH, Axis.SEQ: max_seq_len, Axis.IMAGES: MAX_TRACE_BATCH,
              Axis.IMAGE_TOKENS: MAX_IMAGE_TOKENS, Axis.WINDOW: max_seq_len, Axis.CANDIDATES: max_seq_len,
              Axis.RUN: max_seq_len, Axis.CACHED: max_seq_len}
    records: dict[str, GraphRecord] = {}
    quantized: dict[str, QuantizedGraph] = {}
    store = SharedWeightFile(tmp)
    with store:
        for index, (graph, module) in enumerate(plan.modules):
            progress(f"tracing {graph.name}")
            examples = {**plan.examples, **plan.graph_examples.get(graph.name, {})}
            args = tuple(examples[name] for name in graph.input_names)
            onnx_model = trace_graph(module, args, graph, options.opset, bounds, plan.weights)
            if options.quantization is not None and graph.name in QUANTIZED_GRAPHS:
                quantized[graph.name] = quantize_graph(onnx_model, options.quantization, plan.head_widths)
            if index == 0:  # the first graph writes the weights; the others share them
                total = store.pending_bytes(onnx_model, options.inline_limit_bytes)
                progress("writing weights", total=total)
                store.on_write = lambda done, item, total=total: progress("writing weights", done=done, total=total,
                                                                          item=item)
            store.externalize(onnx_model, options.inline_limit_bytes)
            store.on_write = None
            path = tmp / graph.file
            ir.save(onnx_model, path)
            records[graph.name] = GraphRecord(
                path.name, file_sha256(path), io_specs(onnx_model.graph.inputs), io_specs(onnx_model.graph.outputs)
            )
            check_interface(graph, records[graph.name], plan.sizes)
            del onnx_model
    return records, store, quantized


def checkpoint_config(path: Path) -> ModelConfig:
    """The model configuration of a checkpoint directory, as load_checkpoint reads it, without its weights."""
    return config_from_dict(read_config(path), special_ids_from_tokenizer_file(path / "tokenizer.json"))


@dataclass(frozen=True)
class Loaded:
    """What loading the checkpoint gives an export: the weight layout and the graphs to trace."""

    layout: str
    plan: GraphPlan


@dataclass(frozen=True)
class ExportRun:
    """An export whose input passed every check that needs no heavy work; `start` loads, traces, checks and
    installs it. `load` is what a text and a multimodal export differ in."""

    options: ExportOptions
    dest: Path
    checkpoint: Path
    source: str  # what the manifest records as the model's source: 'demo', or the checkpoint's absolute path
    config: ModelConfig
    max_seq_len: int
    stats: StatsSpec
    fingerprint: str | None  # known once the destination check needed it
    load: Callable[[ExportRun, Progress], Loaded]

    @classmethod
    def check(cls, checkpoint: Path, source: str, config: ModelConfig, out: str | os.PathLike[str],
              options: ExportOptions, load: Callable[[ExportRun, Progress], Loaded],
              shortest: tuple[int, str] = (2, "give at least 2 positions")) -> ExportRun:
        """Options, the length against the model's positions and `shortest` (positions, why), the statistics'
        layers, the destination's ownership: each ConfigError / ArtifactError before any work."""
        options.validate()
        if options.quantization is not None:
            options.quantization.check_widths(config)
        max_seq_len = options.max_seq_len or config.max_seq_len
        if max_seq_len > config.max_seq_len:
            raise ConfigError(f"--max-seq-len {max_seq_len} exceeds the model's {config.max_seq_len} positions; use at "
                              f"most {config.max_seq_len}")
        if max_seq_len < shortest[0]:
            raise ConfigError(f"--max-seq-len {max_seq_len} is too short: {shortest[1]}")
        seer = options.seer or SeerConfig.shipped_in(checkpoint)  # the checkpoint's own calibration by default
        stats = seer.stats_spec(config.n_layers) if seer is not None else StatsSpec.from_config(None, config.n_layers)
        dest = Path(out).expanduser().absolute()
        fingerprint = destination_fingerprint(dest, checkpoint, options.force)
        return cls(options, dest, checkpoint, source, config, max_seq_len, stats, fingerprint, load)

    def start(self, progress: Progress | None = None) -> ExportResult:
        """Load the checkpoint, then trace, check, validate and install (write); `progress` hears each stage."""
        report = progress or quiet
        started = time.perf_counter()
        report("loading checkpoint")
        fingerprint = self.fingerprint or checkpoint_fingerprint(self.checkpoint)
        loaded = self.load(self, report)
        model = ModelSpec(self.source, loaded.layout, fingerprint, self.config.to_dict())
        return self.write(model, loaded.plan, report, started)

    def write(self, model: ModelSpec, plan: GraphPlan, report: Progress, started: float) -> ExportResult:
        """Trace, write the manifest, check and validate in a temp dir beside the destination, then install it there;
        on any failure (an interrupt too) nothing is left behind and the destination keeps what it had."""
        options, stats, max_seq_len = self.options, self.stats, self.max_seq_len
        cfg = ModelConfig(**model.config)
        with staging_dir(self.dest, ARTIFACT_KIND) as tmp:
            records, store, quantized = trace_graphs(plan, options, max_seq_len, tmp, report)
            quantization = options.quantization
            manifest = ExportManifest(
                model=model,
                special_ids={"mask": cfg.mask_id, "eos": cfg.eos_id, "pad": cfg.pad_id, "bos": cfg.bos_id,
                             "eot": cfg.eot_id},
                dtype=options.dtype,
                opset=options.opset,
                max_seq_len=max_seq_len,
                graphs={name: records[name] for name in STEP_GRAPH_NAMES + CACHE_GRAPH_NAMES + PROMPT_CACHE_GRAPH_NAMES
                        if name in records},
                seer=stats,
                sampling=sampling.manifest_entry(),
                versions=export_versions(),
                weights=WeightsSpec(store.name, store.sha256(), store.size, quantization),
                extra={
                    "tensors_in_weights_file": store.tensors_written,
                    "tensors_shared": store.tensors_shared,
                    **plan.manifest_extra(records),
                    **({"quantized": quantized_record(quantized)} if quantization is not None else {}),
                    **export_tokenizer(self.checkpoint, tmp),  # tokenizer.json, chat template, special ids' sources
                },
            )
            manifest.save(tmp)

            report("checking graphs")
            check_graph_files([tmp / record.file for record in records.values()])
            max_diff: dict[str, float] = {}
            failed: ExportValidationError | None = None
            if options.verify:
                report("validating with ONNX Runtime")
                try:
                    max_diff = plan.validate(tmp)
                except ExportValidationError as exc:  # the work is kept, marked unverified, and the run fails
                    failed, max_diff = exc, exc.max_diff
                verdict = {"verified": failed is None, "max_diff": max_diff,
                           **({"problems": str(failed), "dtype_noise": failed.noise} if failed else {})}
                manifest = replace(manifest, extra={**manifest.extra, "validation": verdict})
                manifest.save(tmp)

            report("installing")
            check_replaceable(self.dest, ARTIFACT_KIND, model.fingerprint, options.force)  # again: another process
            claim(tmp, ARTIFACT_KIND, model.fingerprint)
            install_dir(tmp, self.dest)
        if failed is not None:
            raise UnverifiedExport(f"{self.dest} was written but is UNVERIFIED (manifest.json: validation.verified is "
                                   f"false): {failed}. Report it with the checkpoint's config; the graphs may still "
                                   "answer right (compare `seer-deploy generate` on the export and the checkpoint)")
        return ExportResult(self.dest, manifest, max_diff, time.perf_counter() - started)


def prepare_export(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                   options: ExportOptions | None = None) -> ExportRun:
    """Check an export of `checkpoint` ('demo' or a local directory) into `out` (ExportRun.check); `.start()` runs
    it."""
    options = options or ExportOptions()
    options.validate()  # flags first: before the checkpoint is read
    path = resolve_checkpoint(checkpoint)
    source = str(checkpoint) if str(checkpoint) in DEMO_NAMES else str(path.absolute())
    run = ExportRun.check(path, source, checkpoint_config(path), out, options, _load_text)
    if options.check_resources:
        sources = weight_sources(checkpoint_weights(path))
        need = footprint(sources, TORCH_DTYPES[options.dtype], options.verify, options.quantization)
        check_resources(need, run.dest, options.verify)
    return run


def export_checkpoint(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
                      options: ExportOptions | None = None, progress: Progress | None = None) -> ExportResult:
    """Export both graphs of `checkpoint` ('demo' or a local directory) into `out`; see the module docstring."""
    return prepare_export(checkpoint, out, options).start(progress)


def _load_text(run: ExportRun, report: Progress) -> Loaded:
    """A text checkpoint streamed: the torch references (with verify) one layer at a time, the graphs traced on a
    fake model whose weights are read from the checkpoint as the weights file is written (export.streamed_weights)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    weights = checkpoint_weights(run.checkpoint)
    sources = weight_sources(weights)
    cfg, dtype, stats = weights.config, run.options.dtype, run.stats
    torch_dtype = TORCH_DTYPES[dtype]
    refs = []
    probes = make_probes(cfg, run.max_seq_len)
    if run.options.verify:
        report("torch reference")
        # float32 is the truth; the model in the export's dtype shows how far that dtype alone moves each output
        dtypes = list(dict.fromkeys((torch.float32, torch_dtype)))
        computed = streamed_references(cfg, sources, stats, probes, dtypes)
        refs = computed[torch.float32]
        if torch_dtype != torch.float32:
            refs = [replace(ref, cast=c) for ref, c in zip(refs, computed[torch_dtype], strict=True)]

    def validate(staged: Path) -> dict[str, float]:
        logits = probe_logits(staged, cpu_backend, refs)  # the validation twin's, closed before the export opens
        if quant := run.options.quantization:
            own = own_references(staged, quant, cfg, sources, stats, probes)
            return compare_quantized(cpu_backend(staged), refs, quant, logits, own)
        return compare_with_torch(cpu_backend(staged), refs, cfg, dtype, logits)

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        model = shaped_model(cfg, torch_dtype)
    kv_cache = run.options.kv_cache
    step = export_graphs(prefix_dlm=cfg.prefix_dlm, kv_cache=kv_cache)[0]
    plan = GraphPlan(
        modules=((step, step_module(model, stats, kv_cache=kv_cache)), *(cache_modules(model) if kv_cache else ())),
        examples=step_examples(cfg, run.max_seq_len),
        graph_examples={PROMPT_STEP.name: prompt_examples(cfg, run.max_seq_len)},
        sizes={Size.STAT_ROWS: len(stats.sparsity_rows), **cache_sizes(cfg)},
        validate=validate,
        weights=StreamedWeights(fake_mode, sources, torch_dtype),
        head_widths=(cfg.vocab_size, cfg.n_embed_rows),
    )
    return Loaded(weights.layout, plan)
