"""`seer-deploy demo`: the whole path on the bundled demo model, so a fresh install shows what the toolkit does.

Export the demo checkpoint, build an ONNX Runtime engine dir from it, answer a few prompts with Seer through that
engine, and run the same prompts at full length through the same backend for the speed comparison (best of a few
repeats after a warm-up, since the runs take fractions of a second). `--vl` runs the multimodal demo instead.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import generation_options, target_options
from seer_deploy.cli.verbs import summary
from seer_deploy.runtime.targets import find_seer_config
from seer_deploy.service import Prompt, Run, SeerOptions, Service, ServiceOptions

if TYPE_CHECKING:
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.export.options import ExportOptions
    from seer_deploy.runtime.targets import TargetOptions
    from seer_deploy.seer.config import SeerConfig

DEMO_PROMPTS = (
    "reverse 8675309",
    "sort 31415926535",
    "filter 9081726354",
    "double 4711",
    "count 12345678901234",
    "reverse 42",
    "sort 907",
    "double 123456789",
)
Say = Callable[[str], None]


@dataclass
class DemoResult:
    export_dir: Path
    engine_dir: Path
    backend: str
    answers: list[tuple[str, str, str]]  # prompt, answer, expected answer
    seer: Run
    full: Run
    seer_note: str  # which Seer config ran


def _best(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: r.seconds)


def export_options() -> ExportOptions:
    """The export's defaults: its step zero reports what the demo's shipped Seer config reads."""
    from seer_deploy.export.options import ExportOptions

    return ExportOptions()


def seer_note(seer: SeerConfig | None) -> str:
    if seer is None:
        return "no calibrated Seer config"
    return (f"calibrated {seer.detector} detector, margin {seer.margin}, tail context {seer.tail_context} (cut slots "
            f"the later steps still run as committed EOS)")


def run_demo(work_dir: Path, gen_length: int, repeats: int, threads: int, say: Say, stage: Say) -> DemoResult:
    """Export, build (ONNX Runtime), generate with Seer and at full length; see the module docstring."""
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.engines.build import BuildOptions, build_engines
    from seer_deploy.engines.ort import OrtSessionOptions
    from seer_deploy.export.exporter import prepare_export
    from seer_deploy.models.demos.demo_tasks import solve

    session = OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=threads)
    export = prepare_export("demo", work_dir / "export", export_options())  # refuses a directory that is not ours
    stage("export: demo checkpoint -> ONNX (step), checked against torch")
    stages: list[str] = []

    def export_stage(name: str, /, *, done: int = 0, total: int = 0, item: str = "") -> None:
        if not stages or stages[-1] != name:  # each stage once (the weights stage reports every tensor)
            stages.append(name)
            stage(f"export: {name}")

    exported = export.start(progress=export_stage)
    m = exported.manifest
    say(f"exported {m.model.source} ({m.model.config['n_layers']} layers, d_model {m.model.config['d_model']}, "
        f"{m.weights.bytes / 2**20:.1f} MiB of weights) to {exported.out} in {exported.seconds:.1f}s")
    stage("build: ONNX Runtime engine dir")
    built = build_engines(exported.out, exported.out / "engine", BuildOptions(backend="ort", ort_session=session),
                          progress=lambda s: stage(f"build: {s}"))
    stage(f"load: {built.out}")
    requests = [Prompt(p) for p in DEMO_PROMPTS]
    service = Service(built.out, ServiceOptions(GenerationConfig(gen_length, gen_length), batch_size=len(requests),
                                                seer=SeerOptions(on=True)), warn=stage)
    note = seer_note(find_seer_config(built.out))
    if note == seer_note(None):
        note = "built-in defaults (no calibrated config yet)"
    stage("warm-up")
    service.generate(requests[:1], full_length=True)
    seer_runs, full_runs = [], []
    for i in range(repeats):
        stage(f"generate {i + 1}/{repeats}: {len(requests)} prompts with Seer, then at full length "
              f"({service.backend.name})")
        seer_runs.append(service.generate(requests))
        full_runs.append(service.generate(requests, full_length=True))
    with_seer, full = _best(seer_runs), _best(full_runs)
    answers = []
    for prompt, answer in zip(DEMO_PROMPTS, with_seer.answers, strict=True):
        task, digits = prompt.split()
        answers.append((prompt, answer.text, solve(task, digits)))
    return DemoResult(exported.out, built.out, service.backend.name, answers, with_seer, full, note)


def run_multimodal_demo(work_dir: Path, gen_length: int, n: int, say: Say, stage: Say) -> Run:
    """`seer-deploy demo --vl`: export demo-vl (vision.onnx, step.onnx), answer n held-out pictures
    through ONNX Runtime with Seer (when calibrated), then the same pictures at full length for the comparison."""
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.export.multimodal import prepare_multimodal
    from seer_deploy.export.options import ExportOptions
    from seer_deploy.models.checkpoints.multimodal import DEMO_VL_NAME, load_multimodal
    from seer_deploy.models.demos.demo_vl_tasks import heldout_examples

    seer = find_seer_config(DEMO_VL_NAME)
    export = prepare_multimodal(DEMO_VL_NAME, work_dir / "demo-vl-onnx", ExportOptions(seer=seer))
    loaded = load_multimodal(DEMO_VL_NAME)
    n_params = loaded.lm.model.num_parameters() + loaded.vision.num_parameters()
    say(f"demo-vl checkpoint: {loaded.path} ({n_params / 1e6:.2f}M parameters, SigLIP tower + "
        f"{loaded.vision_config.projector_type} projector + LLaDA-style LM)")
    stage("export: demo-vl -> ONNX (vision, step), checked against torch")
    exported = export.start()
    say(f"exported demo-vl to {exported.out} (vision.onnx, step.onnx; checked against torch) in "
        f"{exported.seconds:.1f}s")
    cases = [(Prompt(e.prompt, (e.image(),)), e.answer) for e in heldout_examples(n)]  # pictures in memory
    requests = [request for request, _ in cases]
    service = Service(exported.out, ServiceOptions(GenerationConfig(gen_length, gen_length), batch_size=n), warn=stage)
    run = service.generate(requests)
    full = service.generate(requests, full_length=True)
    for i, ((request, expected), answer) in enumerate(zip(cases, run.answers, strict=True)):
        mark = "ok" if answer.text == expected else f"expected {expected}"
        kept = f"kept {answer.seer.kept:2d}/{gen_length}" if answer.seer is not None else ""
        say(f"  picture {i:<3d} {request.prompt:18s} -> {answer.text:40s} {kept} [{mark}]")
    same = sum(a.text == b.text for a, b in zip(run.answers, full.answers, strict=True))
    say(f"{n} pictures as one batch, gen_length {gen_length}, {run.backend}: Seer: {seer_note(run.seer)}: "
        f"{run.passes} passes, {run.tokens_processed} tokens processed, {run.seconds:.2f}s; full length: "
        f"{full.passes} passes, {full.tokens_processed} tokens, {full.seconds:.2f}s "
        f"({full.tokens_processed / run.tokens_processed:.1f}x the tokens); {same} of {n} answers the same as "
        f"full length's")
    return run


def report(result: DemoResult, gen_length: int, say: Say, kept_dir: bool) -> None:
    """The answers, each request's kept length, and Seer against full length."""
    for (prompt, answer, expected), rep in zip(result.answers, result.seer.reports, strict=True):
        mark = "ok" if answer == expected else f"expected {expected}"
        kept = f"kept {rep.kept:3d}/{gen_length}" if rep is not None else ""
        say(f"  {prompt:24s} -> {answer:20s} {kept}  [{mark}]")
    s, f = result.seer, result.full
    say(f"Seer: {result.seer_note}")
    say(f"{'':10s} {'seconds':>9s} {'passes':>7s} {'tokens processed':>17s}")
    say(f"{'full':10s} {f.seconds:9.3f} {f.passes:7d} {f.tokens_processed:17d}")
    say(f"{'seer':10s} {s.seconds:9.3f} {s.passes:7d} {s.tokens_processed:17d}")
    say(f"speedup {f.seconds / s.seconds:.2f}x in time, {f.tokens_processed / s.tokens_processed:.2f}x fewer tokens "
        f"({len(result.answers)} prompts as one batch, gen_length {gen_length}, {result.backend})")
    if kept_dir:
        say(f"engine dir: {result.engine_dir} (try: seer-deploy generate {result.engine_dir} -p 'sort 31415')")


@click.command("demo", short_help=summary("demo"))
@generation_options("gen_length")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the export and engine here [default: a temporary directory, removed afterwards].")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs of each side; the fastest counts.")
@target_options("threads", threads={"default": 0, "show_default": True,
                                    "help": "ONNX Runtime intra-op threads (0 = default)."})
@click.option("--vl", is_flag=True, help="Run the multimodal demo (demo-vl: pictures in, answers out) instead.")
def command(generation: GenerationConfig, work_dir: Path | None, repeats: int, target_options: TargetOptions,
            vl: bool) -> None:
    """Export the bundled demo model, build an ONNX Runtime engine, answer prompts with Seer and compare with full
    length."""
    from seer_deploy.core.errors import ConfigError

    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    gen_length, threads = generation.gen_length, target_options.threads or 0  # both checked by their groups
    start = time.perf_counter()

    def stage(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)

    with tempfile.TemporaryDirectory(prefix="seer-deploy-demo-") as tmp:
        root = Path(tmp) if work_dir is None else work_dir
        root.mkdir(parents=True, exist_ok=True)
        if vl:
            run_multimodal_demo(root, gen_length, 8, click.echo, stage)
            return
        result = run_demo(root, gen_length, repeats, threads, click.echo, stage)
    report(result, gen_length, click.echo, kept_dir=work_dir is not None)
