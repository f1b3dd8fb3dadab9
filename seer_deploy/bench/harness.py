"""`seer-deploy bench`: every row on the same held-out demo prompts, for each gen_length and batch size, plus the
cost-scaling workload; returns one `BenchResult` with every measurement.

Setup (`prepare_bench`) opens the checkpoint, finds its calibrated Seer config, exports it once into the work dir
and opens the ONNX Runtime (and, with a GPU and TensorRT, a TensorRT engine) backend; `run_bench` then measures.
Generation is greedy with steps = gen_length in one block (LLaDA's default), so every row's tokens are
deterministic and the rows differ only in how much work they do and where.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seer_deploy.bench.machine import describe_machine
from seer_deploy.bench.measure import RowTiming, measure_row
from seer_deploy.bench.results import BenchResult, RowResult
from seer_deploy.bench.rows import (
    FAST_ROWS,
    ROW_DESCRIPTIONS,
    RULES,
    Runner,
    oracle_row,
    reference_row,
    rule_of,
    service_row,
)
from seer_deploy.bench.scaling import SCALING_BACKENDS, ScalingSettings, run_scaling
from seer_deploy.bench.workloads import Workload, picture_workload, text_workload
from seer_deploy.contracts.quantization import SCHEMES, Quantization
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.demos.demo_tasks import Example
from seer_deploy.models.demos.demo_vl_tasks import PictureExample
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.targets import TargetInfo, TargetOptions, describe, find_seer_config
from seer_deploy.seer.config import SeerConfig, TailContext, parse_tail_context
from seer_deploy.seer.metrics import true_lengths
from seer_deploy.seer.options import SeerOptions
from seer_deploy.service import Prompt, Service, ServiceOptions

Progress = Callable[[str], None]  # called once per unit of work with what it was


@dataclass(frozen=True)
class BenchSettings:
    """What `seer-deploy bench` measures. Defaults finish in under 10 minutes on 2 CPU cores."""

    target: str = "demo"
    gen_lengths: tuple[int, ...] = (64, 128, 256)
    batch_sizes: tuple[int, ...] = (1, 8)
    prompts: int = 8  # held-out demo prompts per setting
    repeats: int = 3  # timed passes per row and setting (after one warm-up batch); medians are reported
    # How the measured targets open: threads (torch's and ONNX Runtime's; 0 = each library's default), device, IO
    # binding and CUDA graphs (the ONNX Runtime rows); providers and backend are each row's own.
    engine: TargetOptions = field(default_factory=lambda: TargetOptions(threads=0))
    scaling: ScalingSettings | None = field(default_factory=ScalingSettings)  # None: skip the cost-scaling workload
    tensorrt: bool = True  # add TensorRT rows when a GPU and TensorRT are present
    tail_context: TailContext | None = None  # also measure ort-seer-tail: Seer with this tail_context
    fast_block_length: int = 32  # the fast rows' denoising block (Fast-dLLM's), or gen_length when it does not divide
    threshold: float = 0.9  # the fast rows' parallel decoding threshold (Fast-dLLM's default)
    first_canvas: int = 32  # ort-seer-progressive: step zero's first canvas (response slots)
    quantize: tuple[str, ...] = ("int8", "int4")  # also export these quantizations: the ort-int8-seer ... rows
    rules: tuple[str, ...] = ()  # bench.rows.RULES to add as ort-<rule> and ort-<rule>-seer rows

    def fast_config(self, gen_length: int) -> GenerationConfig:
        """The fast rows' settings at `gen_length`: the threshold rule over blocks of fast_block_length, with the
        dual KV cache (ort-parallel drops the cache)."""
        block = self.fast_block_length if gen_length % self.fast_block_length == 0 else None
        return GenerationConfig(gen_length, gen_length, block_length=block, decode="threshold",
                                threshold=self.threshold, kv_cache=True)

    def validate(self) -> None:
        if not self.gen_lengths or any(g < 1 for g in self.gen_lengths):
            raise ConfigError(f"--gen-lengths {list(self.gen_lengths)}: give positive lengths, e.g. 64,128,256")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"--batch-sizes {list(self.batch_sizes)}: give positive batch sizes, e.g. 1,8")
        if self.prompts < 1:
            raise ConfigError(f"--prompts must be >= 1, got {self.prompts}")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1, got {self.repeats}")
        self.engine.check()
        if self.scaling is not None:
            self.scaling.validate()
        if self.tail_context is not None:
            parse_tail_context(self.tail_context)
        if self.first_canvas < 1:
            raise ConfigError(f"--first-canvas must be >= 1, got {self.first_canvas}")
        if self.fast_block_length < 1:
            raise ConfigError(f"--fast-block-length must be >= 1, got {self.fast_block_length}")
        self.fast_config(self.fast_block_length).validate()  # --threshold in (0, 1]
        unknown_rules = [r for r in self.rules if r not in RULES]
        if unknown_rules:
            raise ConfigError(f"--rules {','.join(unknown_rules)}: choose from {', '.join(RULES)}")
        unknown = [q for q in self.quantize if q not in SCHEMES]
        if unknown:
            raise ConfigError(f"--quantize {','.join(unknown)}: use int8, int4 or both (int8,int4), or none")


@dataclass
class OpenedBench:
    """Everything the measurements need, opened once: a generation service per engine."""

    settings: BenchSettings
    model: MaskPredictor  # the checkpoint's language model
    info: TargetInfo  # the checkpoint's ids and tokenizer
    tokenizer: Tokenizer
    seer: SeerConfig
    seer_source: str  # 'calibrated' or 'defaults'
    workload: Workload
    services: dict[str, Service]  # 'torch' (the checkpoint), 'ort' (its export), 'trt' (a TensorRT engine)
    export_seconds: float
    skipped: list[dict[str, str]]
    notes: list[str]
    work_dir: Path
    model_facts: dict[str, Any] = field(default_factory=dict)  # added to the result's model section
    cache: bool = True  # the export has the KV cache graphs (not for shifted-logit models: the fast rows are skipped)

    @property
    def requests(self) -> list[Prompt]:
        return self.workload.requests

    @property
    def examples(self) -> Sequence[Example | PictureExample]:
        return self.workload.examples

    def rows(self) -> list[str]:
        names = ["reference", "ort-full", "ort-parallel", "ort-fastdllm", "ort-seer", "ort-seer-fast",
                 "ort-seer-progressive", "ort-oracle",
                 *(f"ort-{q}-seer{fast}" for q in self.settings.quantize for fast in ("", "-fast")), "torch-seer"]
        if self.settings.tail_context is not None:
            names.insert(names.index("ort-oracle"), "ort-seer-tail")
        names += [f"ort-{rule}{seer}" for rule in self.settings.rules for seer in ("", "-seer")]
        if not self.cache:
            names = [name for name in names if name not in FAST_ROWS]
        return names + (["trt-full", "trt-seer"] if "trt" in self.services else [])

    @property
    def units(self) -> int:
        """Progress units of `run_bench`: per row and setting a warm-up and each timed pass; the scaling workload's
        export and each of its timed (backend, length) points."""
        s = self.settings
        units = len(s.gen_lengths) * len(s.batch_sizes) * len(self.rows()) * (1 + s.repeats)
        if s.scaling is not None:
            units += 1 + len(s.scaling.lengths) * len(SCALING_BACKENDS)
        return units


def _tensorrt_ready() -> str | None:
    """None when TensorRT rows can run, else why not."""
    from seer_deploy.engines.tensorrt_engine import tensorrt_available

    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if not tensorrt_available():
        return "the TensorRT Python bindings are not installed (pip install tensorrt)"
    return None


def prepare_bench(settings: BenchSettings, work_dir: Path, say: Progress = lambda _: None) -> OpenedBench:
    """Open the checkpoint, resolve Seer, export once into `work_dir` and open a service on each engine."""
    from seer_deploy.export.dimple import export_with_pictures
    from seer_deploy.export.exporter import export_checkpoint
    from seer_deploy.export.options import ExportOptions

    settings.validate()
    described = describe(settings.target)
    if described.kind != "checkpoint":
        raise ConfigError(
            f"TARGET '{settings.target}' is an export or engine directory; bench needs the checkpoint (for the torch "
            f"reference row and its own export): give 'demo', 'demo-vl' or a checkpoint directory"
        )
    multimodal = described.multimodal
    notes: list[str] = []
    calibrated = find_seer_config(settings.target, described)
    seer = calibrated if calibrated is not None else SeerConfig()
    if calibrated is None:
        notes.append(f"no calibrated Seer config for {settings.target}: Seer ran with the built-in defaults "
                     f"({seer.detector} detector, margin {seer.margin}); run `seer-deploy calibrate` for a safe margin")
    say(f"loading {settings.target}")
    batch = max(settings.batch_sizes)
    ort = replace(settings.engine, threads=settings.engine.threads or None)  # 0: each library's default

    def service(target: str | Path, engine: TargetOptions) -> Service:
        return Service(target, ServiceOptions(target=engine, batch_size=batch, seer=SeerOptions(config=seer)))

    torch_service = service(settings.target, replace(ort, io_binding=False, cuda_graph=False))
    info = torch_service.info
    workload = picture_workload(settings.prompts, work_dir / "pictures") if multimodal else text_workload(settings.prompts)
    longest = max(settings.gen_lengths)
    torch_service.prepare(workload.requests, GenerationConfig(longest, longest))  # room for the longest, first
    model = torch_service.backend.language_model if multimodal else torch_service.backend.model  # type: ignore[attr-defined]
    for scheme in settings.quantize:  # a block size the model's widths refuse: said before any export
        try:
            Quantization(scheme).check_widths(model.cfg)
        except ConfigError as exc:
            raise ConfigError(f"bench --quantize {scheme} quantizes in blocks of 32, which this model refuses ({exc}); "
                              "measure it without the quantized rows: --quantize none") from exc
    say(f"exporting {settings.target} to ONNX (once for this run)")
    start = time.perf_counter()
    export = export_with_pictures if multimodal else export_checkpoint
    cache = not model.cfg.shift_logits  # the block-wise cache reads no column outside its window (Dream's shift does)
    exported = export(settings.target, work_dir / "export",
                      ExportOptions(seer=seer, kv_cache=cache))  # the fast rows run the cache
    export_seconds = time.perf_counter() - start
    services = {"torch": torch_service,
                "ort": service(exported.out, ort)}
    for scheme in settings.quantize:
        say(f"exporting {settings.target} quantized to {scheme}")
        quantized = export(settings.target, work_dir / f"export-{scheme}",
                           ExportOptions(seer=seer, kv_cache=cache,
                                         quantization=Quantization(scheme)))
        services[f"ort-{scheme}"] = service(quantized.out, ort)
    skipped: list[dict[str, str]] = [] if cache else _uncached_rows(settings)
    why = _tensorrt_ready() if settings.tensorrt else "not asked for (--no-tensorrt)"
    if why is None and multimodal:
        why = "the TensorRT profiles do not cover the multimodal step graphs' image-table input (build refuses it)"
    if why is None:
        from seer_deploy.engines.build import BuildOptions, build_engines

        say("building a TensorRT engine from the export")
        engine = build_engines(exported.out, work_dir / "trt-engine",
                               BuildOptions(backend="tensorrt", max_batch=batch, max_gen_length=max(settings.gen_lengths)))
        # TensorRT has no thread setting and always runs on device buffers
        services["trt"] = service(engine.out, TargetOptions(device=settings.engine.device))
    else:
        skipped += [{"row": name, "why": why} for name in ("trt-full", "trt-seer")]
    facts: dict[str, Any] = {}
    if multimodal:
        images = info.images
        assert images is not None  # a multimodal checkpoint's info says how it takes pictures
        notes.append("multimodal workload: each row's timings include its own vision tower (torch's, or vision.onnx) "
                     "encoding the batch's pictures, as a user's request runs")
        facts = {"vision_parameters": torch_service.backend.vision.num_parameters(),  # type: ignore[attr-defined]
                 "tokens_per_image": images.tokens_per_image,
                 "image_size": images.image.image_size if images.image is not None else None}
    return OpenedBench(settings, model, info, torch_service.tokenizer, seer,
                    "calibrated" if calibrated is not None else "defaults", workload, services, export_seconds,
                    skipped, notes, work_dir, facts, cache)


def _uncached_rows(settings: BenchSettings) -> list[dict[str, str]]:
    """The fast rows (the KV cache) this run would have had, skipped for a model the cache cannot run."""
    quantized = {f"ort-{q}-seer-fast" for q in settings.quantize}
    why = "the block-wise KV cache does not run shifted-logit models (Dream, Dimple)"
    return [{"row": name, "why": why} for name in FAST_ROWS if not name.startswith("ort-int") or name in quantized]


def _runner(p: OpenedBench, row: str, config: GenerationConfig, timings: dict[str, RowTiming]) -> Runner:
    """The runner of `row` at `config`; the oracle reads its true lengths from this setting's ort-full tokens."""
    if row == "reference":
        return reference_row(p.services["torch"], config)
    if row == "torch-seer":
        return service_row(p.services["torch"], config, p.seer)
    rule = rule_of(row)
    if rule is not None:
        return service_row(p.services["ort"], replace(config, **RULES[rule]),  # type: ignore[arg-type]
                           p.seer if row.endswith("-seer") else None)
    fast = p.settings.fast_config(config.gen_length)
    quantized = re.fullmatch(r"ort-(int\d)-seer(-fast)?", row)
    if quantized:
        return service_row(p.services[f"ort-{quantized[1]}"], fast if quantized[2] else config, p.seer)
    engine = "trt" if row.startswith("trt") else "ort"
    service = p.services[engine]
    if row == "ort-parallel":
        return service_row(service, replace(fast, kv_cache=False), None)
    if row == "ort-fastdllm":
        return service_row(service, fast, None)
    if row == "ort-seer-fast":
        return service_row(service, fast, p.seer)
    if row == "ort-seer-progressive":
        return service_row(service, fast, p.seer.with_(first_canvas=min(p.settings.first_canvas, config.gen_length)))
    if row == "ort-seer-tail":
        assert p.settings.tail_context is not None  # the row exists only with --tail-context
        return service_row(service, config, p.seer.with_(tail_context=p.settings.tail_context))
    if row.endswith("-full"):
        return service_row(service, config, None)
    if row.endswith("-seer"):
        return service_row(service, config, p.seer)
    full = timings[f"{engine}-full"]
    lengths = np.maximum(1, true_lengths(full.tokens, _stops(p.info)))
    return oracle_row(service, config, [int(n) for n in lengths])


def _stops(info: TargetInfo) -> set[int]:
    return {info.eos_id} | ({info.eot_id} if info.eot_id is not None else set())


def run_bench(p: OpenedBench, command: str, progress: Progress = lambda _: None) -> BenchResult:
    """Measure every row at every (gen_length, batch size), then the cost-scaling workload."""
    s = p.settings
    started = datetime.now(UTC)
    start = time.perf_counter()
    machine = describe_machine()
    rows: list[RowResult] = []
    for G in s.gen_lengths:
        config = GenerationConfig(gen_length=G, steps=G)
        for B in s.batch_sizes:
            timings: dict[str, RowTiming] = {}
            for row in p.rows():
                label = f"gen {G}, batch {B}: {row}"
                runner = _runner(p, row, config, timings)
                timings[row] = measure_row(runner, p.requests, B, s.repeats, tick=partial(progress, label))
            rows += score_setting(p, G, B, timings)
    scaling = None
    if s.scaling is not None:
        scaling = run_scaling(s.scaling, p.work_dir, s.engine.threads or 0, progress)
    model = p.model
    cfg = model.cfg
    return BenchResult(
        command=command,
        started=started.isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - start, 1),
        machine=machine,
        settings={"target": s.target, "gen_lengths": list(s.gen_lengths), "batch_sizes": list(s.batch_sizes),
                  "prompts": s.prompts, "workload": p.workload.description, "repeats": s.repeats, "warmup_batches": 1,
                  "threads": s.engine.threads, "tail_context": s.tail_context,
                  "steps": "gen_length", "block_length": "gen_length (one block)", "temperature": 0.0,
                  "remasking": "low_confidence",
                  "fast_rows": {"rows": list(FAST_ROWS), "decode": "threshold", "threshold": s.threshold,
                                "block_length": s.fast_block_length, "first_canvas": s.first_canvas,
                                "kv_cache": "dual (all but ort-parallel)"}},
        model={"target": s.target, "parameters": model.num_parameters(), "d_model": cfg.d_model,
               "n_layers": cfg.n_layers, "mlp_hidden": cfg.mlp_hidden, "vocab_size": cfg.vocab_size,
               "max_seq_len": cfg.max_seq_len, "export_seconds": round(p.export_seconds, 2),
               "ort_providers": list(getattr(p.services["ort"].backend, "providers", [])),
               "load_s": {name: _sig(service.load_seconds) for name, service in p.services.items()}, **p.model_facts},
        seer={"source": p.seer_source, "detector": p.seer.detector, "margin": p.seer.margin,
              "tail_context": p.seer.tail_context,
              "buckets": list(p.seer.buckets), "calibration": dict(p.seer.calibration)},
        rows=rows,
        row_descriptions={name: ROW_DESCRIPTIONS[name] for name in p.rows()},
        skipped=p.skipped,
        notes=p.notes,
        scaling=scaling,
    )


def _sig(seconds: float) -> float:
    """Seconds to 6 significant digits: a fixed number of decimals would lose percents on millisecond runs."""
    return float(f"{seconds:.6g}")


def score_setting(p: OpenedBench, gen_length: int, batch_size: int, timings: dict[str, RowTiming]) -> list[RowResult]:
    """The table rows of one (gen_length, batch size): speed against the reference, accuracy, Seer vs oracle."""
    stops = _stops(p.info)
    reference = timings["reference"]
    ref_answers = [p.tokenizer.decode_answer(row.tolist()) for row in reference.tokens]
    full_lengths = np.maximum(1, true_lengths(timings["ort-full"].tokens, stops))
    results = []
    for name, t in timings.items():
        answers = [p.tokenizer.decode_answer(row.tolist()) for row in t.tokens]
        rule = rule_of(name)
        full = ref_answers if rule is None else [p.tokenizer.decode_answer(row.tolist())
                                                 for row in timings[f"ort-{rule}"].tokens]
        answer_tokens = int(true_lengths(t.tokens, stops).sum())
        engine = "trt" if name.startswith("trt") else "ort"
        oracle = timings.get(f"{engine}-oracle") if name in ("ort-seer", "ort-seer-tail", "trt-seer") else None
        results.append(RowResult(
            gen_length=gen_length,
            batch_size=batch_size,
            row=name,
            seconds=_sig(t.seconds),
            seconds_runs=[_sig(x) for x in t.seconds_runs],
            latency_p50_s=_sig(t.latency_percentile(50)),
            latency_p95_s=_sig(t.latency_percentile(95)),
            answer_tokens=answer_tokens,
            tokens_per_s=round(answer_tokens / t.seconds, 2),
            forward_passes=t.forward_passes,
            tokens_processed=t.tokens_processed,
            speedup=round(reference.seconds / t.seconds, 3),
            seer_over_oracle=round(oracle.seconds / t.seconds, 3) if oracle is not None else None,
            exact_match=round(float(np.mean([a == e.answer for a, e in zip(answers, p.examples, strict=True)])), 4),
            identical_to_full=round(float(np.mean([a == r for a, r in zip(answers, full, strict=True)])), 4),
            mean_kept=round(float(np.mean(t.kept)), 2) if t.kept is not None else None,
            safe=round(float(np.mean(np.asarray(t.kept) >= full_lengths)), 4) if t.kept is not None else None,
            tokens_per_answer_token=round(t.tokens_processed / answer_tokens, 2) if answer_tokens else None,
            step_zero_share=round(t.step_zero_share, 3) if name != "reference" else None,
            first_step_s=_sig(t.first_step_seconds) if t.first_step_seconds is not None else None,
        ))
    return results
