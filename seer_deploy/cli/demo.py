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

from seer_deploy.cli.generate import BatchRun, run_batches

if TYPE_CHECKING:
    from seer_deploy.export.options import ExportOptions

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
    seer: BatchRun
    full: BatchRun
    seer_note: str  # which Seer config ran


def _best(runs: list[BatchRun]) -> BatchRun:
    return min(runs, key=lambda r: r.seconds)


def export_options() -> ExportOptions:
    """Every layer's statistics, at the 'near zero' thresholds of the demo's calibrated Seer config (if any), so
    the exported step zero reports what that config reads."""
    from seer_deploy.export.options import ExportOptions, SeerStats
    from seer_deploy.seer.config import SeerConfig

    seer = SeerConfig.for_checkpoint("demo")
    if seer is None:
        return ExportOptions()
    return ExportOptions(seer=SeerStats(abs_threshold=seer.abs_threshold, rel_threshold=seer.rel_threshold))


def run_demo(work_dir: Path, gen_length: int, repeats: int, threads: int, say: Say, stage: Say) -> DemoResult:
    """Export, build (ONNX Runtime), generate with Seer and at full length; see the module docstring."""
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.engines.build import BuildOptions, build_engines
    from seer_deploy.engines.ort import OrtSessionOptions
    from seer_deploy.export.exporter import export_checkpoint
    from seer_deploy.models.demo_tasks import solve
    from seer_deploy.runtime.targets import open_target
    from seer_deploy.seer.config import SeerConfig

    stage("export: demo checkpoint -> ONNX (step0, step), checked against torch")
    exported = export_checkpoint("demo", work_dir / "export", export_options(),
                                 progress=lambda s: stage(f"export: {s}"))
    m = exported.manifest
    say(f"exported {m.model.source} ({m.model.config['n_layers']} layers, d_model {m.model.config['d_model']}, "
        f"{m.weights.bytes / 2**20:.1f} MiB of weights) to {exported.out} in {exported.seconds:.1f}s")
    stage("build: ONNX Runtime engine dir")
    session = OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=threads)
    built = build_engines(exported.out, exported.out / "engine", BuildOptions(backend="ort", ort_session=session),
                          progress=lambda s: stage(f"build: {s}"))
    stage(f"load: {built.out}")
    backend, info = open_target(str(built.out))
    seer = info.seer_config()
    seer_note = "" if seer is None else (f"calibrated {seer.detector} detector, margin {seer.margin}, tail context "
                                         f"{seer.tail_context} (cut slots the later steps still run as committed EOS)")
    if seer is None:
        seer = SeerConfig()
        seer_note = f"built-in defaults ({seer.detector} detector, margin {seer.margin}; no calibrated config yet)"
    tok = info.tokenizer()
    ids = [tok.encode_prompt(p) for p in DEMO_PROMPTS]
    config = GenerationConfig(gen_length, gen_length)
    batch = len(ids)
    stage("warm-up")
    run_batches(backend, info, ids[:1], config, seer=None, batch_size=1)
    seer_runs, full_runs = [], []
    for i in range(repeats):
        stage(f"generate {i + 1}/{repeats}: {len(ids)} prompts with Seer, then at full length ({backend.name})")
        seer_runs.append(run_batches(backend, info, ids, config, seer=seer, batch_size=batch))
        full_runs.append(run_batches(backend, info, ids, config, seer=None, batch_size=batch))
    with_seer, full = _best(seer_runs), _best(full_runs)
    answers = []
    for prompt, row in zip(DEMO_PROMPTS, with_seer.tokens, strict=True):
        task, digits = prompt.split()
        answers.append((prompt, tok.decode_answer(row), solve(task, digits)))
    return DemoResult(exported.out, built.out, backend.name, answers, with_seer, full, seer_note)


def report(result: DemoResult, gen_length: int, say: Say, kept_dir: bool) -> None:
    """The answers, each request's kept length, and Seer against full length."""
    for (prompt, answer, expected), rep in zip(result.answers, result.seer.reports, strict=True):
        mark = "ok" if answer == expected else f"expected {expected}"
        kept = f"kept {rep.kept:3d}/{gen_length}" if rep is not None else ""
        say(f"  {prompt:24s} -> {answer:20s} {kept}  [{mark}]")
    s, f = result.seer, result.full
    say(f"Seer: {result.seer_note}")
    say(f"{'':10s} {'seconds':>9s} {'passes':>7s} {'tokens processed':>17s}")
    say(f"{'full':10s} {f.seconds:9.3f} {f.steps_run:7d} {f.tokens_processed:17d}")
    say(f"{'seer':10s} {s.seconds:9.3f} {s.steps_run:7d} {s.tokens_processed:17d}")
    say(f"speedup {f.seconds / s.seconds:.2f}x in time, {f.tokens_processed / s.tokens_processed:.2f}x fewer tokens "
        f"({len(result.answers)} prompts as one batch, gen_length {gen_length}, {result.backend})")
    if kept_dir:
        say(f"engine dir: {result.engine_dir} (try: seer-deploy generate {result.engine_dir} -p 'sort 31415')")


@click.command("demo")
@click.option("--gen-length", type=int, default=64, show_default=True, help="Response slots to fill.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the export and engine here [default: a temporary directory, removed afterwards].")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs of each side; the fastest counts.")
@click.option("--threads", type=int, default=0, show_default=True, help="ONNX Runtime intra-op threads (0 = default).")
@click.option("--vl", is_flag=True, help="Run the multimodal demo (demo-vl: pictures in, answers out) instead.")
def command(gen_length: int, work_dir: Path | None, repeats: int, threads: int, vl: bool) -> None:
    """Export the bundled demo model, build an ONNX Runtime engine, answer prompts with Seer and compare with full
    length."""
    from seer_deploy.core.errors import ConfigError

    if vl:
        from seer_deploy.cli.vl import run_demo_vl

        run_demo_vl(gen_length, say=click.echo, work_dir=work_dir)
        return
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    start = time.perf_counter()

    def stage(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)

    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        result = run_demo(work_dir, gen_length, repeats, threads, click.echo, stage)
    else:
        with tempfile.TemporaryDirectory(prefix="seer-deploy-demo-") as tmp:
            result = run_demo(Path(tmp), gen_length, repeats, threads, click.echo, stage)
    report(result, gen_length, click.echo, kept_dir=work_dir is not None)
