"""`seer-deploy eval TARGET --tasks ... --modes ...`: lm-evaluation-harness (or lmms-eval) tasks on TARGET in every
mode, side by side with full length on the same documents (seer_deploy.evaluation); one table on stdout, --json FILE
writes the JSON and a markdown table beside it (FILE with .md).
"""

from __future__ import annotations

import inspect
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import generation_options, seed_option, seer_options, target_options, template_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.errors import ConfigError
from seer_deploy.evaluation.tasks import HARNESSES  # light: no harness, no torch until a run

if TYPE_CHECKING:
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.evaluation.run import EvalSettings
    from seer_deploy.runtime.targets import TargetOptions, TemplateChoice
    from seer_deploy.seer.options import SeerOptions


def split_names(text: str, option: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ConfigError(f"{option} is empty; give comma-separated names, e.g. {option} demo")
    return names


@click.command("eval", short_help=summary("eval"))
@click.argument("target")
@click.option("--tasks", required=True, help="The harness's tasks, comma-separated: the bundled 'demo' and 'demo_vl' "
              "(lmms-eval: 'demo_vl'), the harness's own (their data local: see --include-path), or task YAML files.")
@click.option("--harness", type=click.Choice(list(HARNESSES)), default="lm-eval", show_default=True,
              help="Who loads and scores the tasks: lm-evaluation-harness (text; pictures by doc_to_image) or "
                   "lmms-eval (DocVQA, ChartQA, MathVista, ...: pictures through the service).")
@click.option("--modes", default="full,seer,seer-fast", show_default=True,
              help="Modes to compare, comma-separated, or 'all' (full always runs: the baseline): full, seer, "
                   "seer-fast, fast, threshold, seer-tail, seer-progressive (their flags above).")
@click.option("--limit", type=int, default=None, help="The first N documents of each task (a quick look).")
@click.option("--num-fewshot", type=int, default=None, help="Few-shot examples [default: each task's own].")
@click.option("--include-path", "include_paths", multiple=True, type=click.Path(path_type=Path),
              help="A directory of your own task YAMLs (e.g. gsm8k or docvqa_val on your local files); repeatable.")
@generation_options("gen_length", "steps", "block_length", "temperature", "remasking", "cfg_scale", "threshold",
                    threshold={"help": "The threshold modes' --decode threshold value (Fast-dLLM's 0.9)."})
@seed_option()
@click.option("--fast-block-length", type=int, default=32, show_default=True,
              help="The threshold modes' block length (Fast-dLLM's 32; one block where it does not divide "
                   "--gen-length).")
@seer_options("config", "tail_context", "first_canvas",
              config={"help": "Seer config from `seer-deploy calibrate` [default: the target's own, else the built-in "
                              "defaults]."},
              tail_context={"default": "all", "show_default": True, "help": "seer-tail's --tail-context."},
              first_canvas={"default": 32, "show_default": True, "help": "seer-progressive's --first-canvas."})
@target_options()
@click.option("--batch-size", type=int, default=8, show_default=True, help="Documents run together.")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="The paired bootstrap interval's confidence.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the table and every document's answer and score as JSON to FILE, and as markdown "
                   "beside it (FILE with .md).")
@template_options()
def command(target: str, tasks: str, harness: str, modes: str, limit: int | None, num_fewshot: int | None,
            include_paths: tuple[Path, ...], generation: GenerationConfig, seed: int, fast_block_length: int,
            seer: SeerOptions, target_options: TargetOptions, batch_size: int, confidence: float,
            json_file: Path | None, template: TemplateChoice | None) -> None:
    """Score TARGET on lm-evaluation-harness (or, with --harness lmms-eval, lmms-eval) generation tasks once per mode
    on the same documents: per task and mode the task's metric, its paired difference from full length, the
    answers identical to full length's, and the cost (tokens processed, passes, seconds, Seer's kept length).

    Log-likelihood (multiple-choice) tasks are refused: the graphs return token ids and confidences, not
    log-probabilities. Nothing is downloaded: tasks read local data."""
    from seer_deploy.evaluation.modes import ModeSettings, parse_modes
    from seer_deploy.evaluation.report import MEANING, compare, render_markdown, render_text, to_json
    from seer_deploy.evaluation.run import EvalSettings, run_eval
    from seer_deploy.service import SeerOptions, ServiceOptions

    if fast_block_length < 1:
        raise ConfigError(f"--fast-block-length must be >= 1, got {fast_block_length}")
    assert seer.tail_context is not None and seer.first_canvas is not None  # this verb's defaults: "all", 32
    if seer.first_canvas < 0:
        raise ConfigError(f"--first-canvas must be >= 0, got {seer.first_canvas}")
    settings = EvalSettings(
        target=target, tasks=split_names(tasks, "--tasks"), modes=parse_modes(modes), harness=harness,
        service=ServiceOptions(generation=generation, target=target_options, seer=SeerOptions(config=seer.config),
                               template=template, batch_size=batch_size, seed=seed),
        mode_settings=ModeSettings(threshold=generation.threshold, fast_block_length=fast_block_length,
                                   tail_context=seer.tail_context, first_canvas=seer.first_canvas),
        limit=limit, num_fewshot=num_fewshot, include_paths=include_paths, confidence=confidence)
    settings.validate()
    if json_file is not None and json_file.exists() and json_file.is_dir():
        raise ConfigError(f"--json {json_file} is a directory; give a file name, e.g. eval.json")
    invoked = canonical_command(target, settings)
    rows = compare(run_eval(settings, say=lambda message: click.echo(message, err=True)), confidence)
    click.echo(render_text(rows))
    click.echo(MEANING.format(confidence=confidence), err=True)
    if json_file is not None:
        from seer_deploy.core.atomic import write_atomic

        record = to_json(rows, invoked, {"target": target, "harness": harness, "tasks": list(settings.tasks),
                                         "limit": limit,
                                         "modes": [m.name for m in settings.modes],
                                         "gen_length": generation.gen_length,
                                         "confidence": confidence})
        markdown = json_file.with_suffix(".md")
        write_atomic(json_file, lambda path: path.write_text(json.dumps(record, indent=1) + "\n"))
        write_atomic(markdown, lambda path: path.write_text(render_markdown(rows, invoked, confidence)))
        click.echo(f"wrote {json_file} and {markdown}", err=True)


def modes_legend() -> str:
    """The help's list of modes and their flags, from the one place they are named."""
    from seer_deploy.evaluation.modes import BASELINE, MODES

    width = max(len(name) for name in MODES) + 2
    lines = [f"  {m.name.ljust(width)}{m.flags}" + (" (the baseline)" if m.name == BASELINE else "")
             for m in MODES.values()]
    return "\n\n\b\nModes (each the `generate` flags it stands for):\n" + "\n".join(lines)


command.help = inspect.cleandoc(command.help or "") + modes_legend()


def canonical_command(target: str, settings: EvalSettings) -> str:
    """The command line that reproduces the run (what the markdown records), the main options spelled out."""
    generation = settings.service.generation
    parts = ["seer-deploy", "eval", target, "--tasks", ",".join(settings.tasks)]
    parts += ["--harness", settings.harness] if settings.harness != "lm-eval" else []
    parts += ["--modes", ",".join(m.name for m in settings.modes), "--gen-length", str(generation.gen_length)]
    parts += ["--steps", str(generation.steps)] if generation.steps != generation.gen_length else []
    parts += ["--block-length", str(generation.block_length)] if generation.block_length is not None else []
    parts += ["--limit", str(settings.limit)] if settings.limit is not None else []
    parts += ["--num-fewshot", str(settings.num_fewshot)] if settings.num_fewshot is not None else []
    parts += ["--batch-size", str(settings.service.batch_size)]
    m = settings.mode_settings
    if any(mode.threshold for mode in settings.modes):
        parts += ["--threshold", f"{m.threshold:g}", "--fast-block-length", str(m.fast_block_length)]
    parts += ["--tail-context", str(m.tail_context)] if any(mode.tail for mode in settings.modes) else []
    parts += ["--first-canvas", str(m.first_canvas)] if any(mode.progressive for mode in settings.modes) else []
    threads = settings.service.target.threads
    parts += ["--threads", str(threads)] if threads is not None else []
    for path in settings.include_paths:
        parts += ["--include-path", str(path)]
    return " ".join(shlex.quote(p) for p in parts)
