"""`seer-deploy bench [TARGET]`: the torch reference, ONNX Runtime at full length, with Seer and with an oracle,
and torch with Seer, on held-out demo prompts (demo-vl pictures for a multimodal TARGET), plus a cost-scaling
workload; writes bench.json, bench.md and bench.png into --out.

The defaults (8 prompts, 3 timed passes, gen lengths 64/128/256, batches 1 and 8) finish in under 10 minutes on
2 CPU cores.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import generation_options, seer_options, target_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.checks import ascii_ints
from seer_deploy.core.errors import ConfigError

if TYPE_CHECKING:
    from seer_deploy.bench.harness import BenchSettings
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.runtime.targets import TargetOptions
    from seer_deploy.seer.options import SeerOptions


def parse_ints(text: str, option: str, unique: bool = True) -> tuple[int, ...]:
    """'64,128,256' -> (64, 128, 256), in the order given (duplicates dropped when `unique`)."""
    parsed = ascii_ints(text)
    if parsed is None:
        raise ConfigError(f"{option} '{text}' is not a comma-separated list of integers in digits 0-9 (e.g. 64,128,256)")
    values = tuple(dict.fromkeys(parsed)) if unique else tuple(parsed)
    if not values:
        raise ConfigError(f"{option} is empty; give at least one value, e.g. 64,128,256")
    return values


def canonical_command(settings: BenchSettings, out: Path) -> str:
    """The command line that reproduces `settings`, every option spelled out (what BENCHMARKS.md records)."""
    joined = lambda values: ",".join(str(v) for v in values)
    parts = ["seer-deploy", "bench", settings.target, "--gen-lengths", joined(settings.gen_lengths),
             "--batch-sizes", joined(settings.batch_sizes), "--prompts", str(settings.prompts),
             "--repeats", str(settings.repeats), "--threads", str(settings.engine.threads), "--out", str(out)]
    sc = settings.scaling
    if sc is None:
        parts.append("--no-scaling")
    else:
        parts += ["--scaling-lengths", joined(sc.lengths),
                  "--scaling-shape", joined((sc.d_model, sc.n_layers, sc.mlp_hidden, sc.vocab_size))]
    if not settings.tensorrt:
        parts.append("--no-tensorrt")
    if settings.tail_context is not None:
        parts += ["--tail-context", str(settings.tail_context)]
    parts += ["--fast-block-length", str(settings.fast_block_length), "--threshold", f"{settings.threshold:g}",
              "--first-canvas", str(settings.first_canvas)]
    engine = settings.engine
    parts += ["--device", engine.device] if engine.device is not None else []
    parts += ["--io-binding"] * engine.io_binding + ["--cuda-graph"] * engine.cuda_graph
    parts += ["--quantize", ",".join(settings.quantize) or "none"]
    if settings.rules:
        parts += ["--rules", ",".join(settings.rules)]
    return " ".join(shlex.quote(p) for p in parts)


@click.command("bench", short_help=summary("bench"))
@click.argument("target", default="demo")
@click.option("--gen-lengths", default=None,
              help="Response lengths to measure.  [default: 64,128,256; 16,32,64 for a multimodal TARGET]")
@click.option("--batch-sizes", default="1,8", show_default=True, help="Batch sizes to measure.")
@click.option("--prompts", type=int, default=8, show_default=True, help="Held-out demo prompts per setting.")
@click.option("--repeats", type=int, default=3, show_default=True,
              help="Timed passes per row and setting after one warm-up batch; medians are reported.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Where bench.json, bench.md and bench.png go.")
@click.option("--scaling/--no-scaling", default=True, show_default=True,
              help="Also time one step against sequence length on a large random LLaDA-shaped model.")
@click.option("--scaling-lengths", default="32,64,128,256,512,1024", show_default=True,
              help="Sequence lengths of the cost-scaling workload.")
@click.option("--scaling-shape", default="1024,8,2816,16384", show_default=True,
              help="The cost-scaling model: d_model,layers,mlp_hidden,vocab (heads: d_model / 64).")
@click.option("--tensorrt/--no-tensorrt", default=True, show_default=True,
              help="Add TensorRT rows when a CUDA GPU and TensorRT are present.")
@seer_options("tail_context", "first_canvas", tail_context={
    "help": "Also measure ort-seer-tail: Seer with this tail_context (cut slots kept in view as committed EOS; 'all': "
            "the whole tail) [default: no such row]."}, first_canvas={
    "default": 32, "show_default": True,
    "help": "ort-seer-progressive: step zero's first canvas in response slots (progressive step zero)."})
@click.option("--fast-block-length", type=int, default=32, show_default=True,
              help="Block length of the fast rows (ort-parallel, ort-fastdllm, ort-seer-fast), Fast-dLLM's 32 "
                   "(one block of gen_length where it does not divide it).")
@generation_options("threshold", threshold={"help": "The fast rows' parallel decoding threshold (Fast-dLLM's default "
                                                    "0.9)."})
@target_options("threads", "device", "io_binding", "cuda_graph", threads={
    "default": 0, "show_default": True, "help": "torch and ONNX Runtime intra-op threads (0 = the libraries' defaults)."
}, device={"help": "torch's device (reference and torch rows) and ONNX Runtime's CUDA provider GPU [default: torch "
                   "cpu, ONNX Runtime CUDA if installed]."},
    io_binding={"help": "ONNX Runtime rows through IO binding (see generate --help)."},
    cuda_graph={"help": "ONNX Runtime rows with CUDA graphs per call shape (CUDA only)."})
@click.option("--quantize", "quantize", default="int8,int4", show_default=True, metavar="int8,int4|none",
              help="Also export the target quantized (weight-only, `export --quantize`) and measure ort-seer and "
                   "ort-seer-fast on each: the ort-int8-seer ... rows; none: no such rows.")
@click.option("--rules", default="none", show_default=True, metavar="dream,lavida-dream,dimple,dimple-confident|none",
              help="Also measure these Dream-family decoding rules on ONNX Runtime at full length and with Seer "
                   "(ort-<rule>, ort-<rule>-seer rows; their answers compared with the rule's own full length).")
def command(target: str, gen_lengths: str | None, batch_sizes: str, prompts: int, repeats: int, out: Path,
            scaling: bool, scaling_lengths: str, scaling_shape: str, tensorrt: bool, seer: SeerOptions,
            fast_block_length: int, generation: GenerationConfig, target_options: TargetOptions,
            quantize: str, rules: str) -> None:
    """Benchmark TARGET (a checkpoint directory, 'demo' (the default) or 'demo-vl'): reference, ONNX Runtime full /
    Seer / oracle, the peers' recipes (Fast-dLLM's parallel decoding and dual KV cache) with and without Seer, torch
    with Seer, and step time against length on a large random model.

    A multimodal TARGET ('demo-vl' or a LLaDA-V-layout checkpoint) is measured on held-out demo-vl pictures."""
    from seer_deploy.bench.harness import BenchSettings, prepare_bench, run_bench
    from seer_deploy.bench.plot import write_plot
    from seer_deploy.bench.report import headline, render_markdown
    from seer_deploy.bench.results import JSON_FILE, MARKDOWN_FILE, PLOT_FILE, write_json
    from seer_deploy.bench.scaling import ScalingSettings
    from seer_deploy.core.atomic import write_atomic

    scaling_settings = None
    if scaling:
        shape = parse_ints(scaling_shape, "--scaling-shape", unique=False)
        if len(shape) != 4:
            raise ConfigError(f"--scaling-shape '{scaling_shape}' needs four numbers: d_model,layers,mlp_hidden,vocab")
        d_model, layers, mlp, vocab = shape
        scaling_settings = ScalingSettings(d_model=d_model, n_layers=layers, n_heads=max(1, d_model // 64),
                                           mlp_hidden=mlp, vocab_size=vocab,
                                           lengths=parse_ints(scaling_lengths, "--scaling-lengths"))
    if gen_lengths is None:
        from seer_deploy.models.checkpoints.multimodal_files import is_multimodal_checkpoint

        gen_lengths = "16,32,64" if is_multimodal_checkpoint(target) else "64,128,256"
    assert seer.first_canvas is not None  # this verb's default: 32
    settings = BenchSettings(target=target, gen_lengths=parse_ints(gen_lengths, "--gen-lengths"),
                             batch_sizes=parse_ints(batch_sizes, "--batch-sizes"), prompts=prompts, repeats=repeats,
                             engine=target_options, scaling=scaling_settings, tensorrt=tensorrt,
                             tail_context=seer.tail_context, fast_block_length=fast_block_length,
                             threshold=generation.threshold, first_canvas=seer.first_canvas,
                             quantize=() if quantize == "none" else tuple(dict.fromkeys(quantize.split(","))),
                             rules=() if rules == "none" else tuple(dict.fromkeys(rules.split(","))))
    settings.validate()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for bench.json, bench.md and bench.png")
    invoked = canonical_command(settings, out)
    say = lambda message: click.echo(message, err=True)
    with tempfile.TemporaryDirectory(prefix="seer-deploy-bench-") as tmp:
        prepared = prepare_bench(settings, Path(tmp), say)
        for note in prepared.notes:
            say(f"note: {note}")
        for skip in prepared.skipped:
            say(f"skipping {skip['row']}: {skip['why']}")
        with click.progressbar(length=prepared.units, label="benchmarking", file=sys.stderr, show_pos=True,
                               item_show_func=lambda item: item) as bar:
            result = run_bench(prepared, invoked, progress=lambda label: bar.update(1, label))
    data = result.to_dict()
    write_json(data, out / JSON_FILE)
    write_atomic(out / MARKDOWN_FILE, lambda path: path.write_text(render_markdown(data, PLOT_FILE)))
    write_plot(data, out / PLOT_FILE)
    click.echo(headline(data))
    click.echo(f"wrote {out / JSON_FILE}, {out / MARKDOWN_FILE} and {out / PLOT_FILE}")
