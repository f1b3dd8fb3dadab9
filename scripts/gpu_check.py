"""The GPU check (issue 23): one command, one JSON file, under 8 minutes on one GPU.

    python scripts/gpu_check.py --out gpu_check.json                    # a GPU machine: onnxruntime-gpu, CUDA torch
    python scripts/gpu_check.py --quick --device cpu --out check.json   # the same code on a CPU, small sizes

Run it from a source tree (PYTHONPATH=.) or an install; it exports with whatever torch it finds. Sections, each
timed; a section that fails records its one-line error and the others still run:

  environment  the GPU, torch and ONNX Runtime versions, the providers
  parity       ONNX Runtime on the GPU (IO binding, CUDA graphs where ONNX Runtime captures them) against ONNX
               Runtime on the CPU, token for token, on held-out demo prompts: Seer (the shipped config), the paper's
               cut (tail_context 0), full length; torch on the GPU against torch on the CPU
  demo_pass    per forward pass of the demo on the GPU: session.run, IO binding, CUDA graphs; the host loop's share
               of each step (C core and numpy twin) next to the time inside the engine
  seer_speed   full length, Seer and the oracle (each answer's true length known) on every GPU path, same prompts:
               seconds and the ratios the issue's targets name (Seer faster than full; Seer/oracle >= 0.7)
  large_model  a random LLaDA-shaped model exported in fp16 (and the demo in fp16 against fp32), one denoising step
               at batch 1 against kept length through ONNX Runtime on the GPU, next to the weight-read bound
               (fp16 weight bytes / the device bandwidth measured by a copy)

Targets are reported (`targets` in the JSON), never asserted: the numbers are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from seer_deploy.bench.measure import batches
from seer_deploy.bench.rows import oracle_row
from seer_deploy.bench.scaling import step_inputs
from seer_deploy.core.backend import Backend, StepInput
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.metrics import true_lengths
from seer_deploy.service import Prompt, Run, SeerOptions, Service, ServiceOptions, TargetOptions

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
PURE_PYTHON_ENV = "SEER_DEPLOY_PURE_PYTHON"


@dataclass(frozen=True)
class Sizes:
    """How much the check runs: the full GPU check, or --quick (a CPU, a test)."""

    prompts: int = 200
    gen_length: int = 256
    batch: int = 8
    pass_prompts: int = 64
    torch_prompts: int = 200
    torch_batch: int = 50
    large: tuple[int, int, int, int, int] = (4096, 4, 32, 12288, 126464)  # d_model, layers, heads, mlp, vocab
    kept_lengths: tuple[int, ...] = (16, 32, 64, 128, 256)
    prompt_tokens: int = 64
    repeats: int = 10


QUICK = Sizes(prompts=4, gen_length=32, batch=2, pass_prompts=2, torch_prompts=4, torch_batch=2,
              large=(64, 2, 4, 160, 128), kept_lengths=(16, 32), prompt_tokens=8, repeats=1)


class TimedBackend:
    """A backend whose engine calls are timed: what the engine costs, apart from the host loop around it."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def _timed(self, method: str, inputs: Any) -> Any:
        start = time.perf_counter()
        out = getattr(self._backend, method)(inputs)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out

    def step0(self, inputs: StepInput) -> Any:
        return self._timed("step0", inputs)

    def step(self, inputs: StepInput) -> Any:
        return self._timed("step", inputs)

    def refresh(self, inputs: StepInput) -> Any:
        return self._timed("refresh", inputs)

    def window_step(self, inputs: Any) -> Any:
        return self._timed("window_step", inputs)


class Check:
    """The JSON being written, section by section; a failed section records its error and the run goes on."""

    def __init__(self, out: Path, budget: float) -> None:
        self.out, self.budget, self.start = out, budget, time.perf_counter()
        self.data: dict[str, Any] = {"sections": {}}

    def run(self, name: str, body: Callable[[dict[str, Any]], None]) -> None:
        """Run one section into its record: its seconds, and its error (one line) if it failed or was skipped."""
        record: dict[str, Any] = {}
        self.data["sections"][name] = record
        begun = time.perf_counter()
        print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
        if begun - self.start > self.budget:
            record.update(ok=False, error=f"skipped: the check's budget of {self.budget:.0f} s was spent")
        else:
            try:
                body(record)
                record["ok"] = True
            except Exception as exc:  # noqa: BLE001  # a diagnostic run: record the failure, run the next section
                record["ok"] = False
                record["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                record["where"] = traceback.format_exc(limit=-3).splitlines()[-4:]
        record["seconds"] = round(time.perf_counter() - begun, 2)
        self.save()

    def seconds_left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def save(self) -> None:
        self.data["total_seconds"] = round(time.perf_counter() - self.start, 2)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        tmp.replace(self.out)


def gpu_options(device: str, *, io_binding: bool = True, cuda_graph: bool = False) -> OrtSessionOptions:
    """ONNX Runtime on the checked device: CUDA then CPU (cuda), or the CPU alone (cpu: what --quick tests)."""
    providers = (CUDA, CPU) if device == "cuda" else (CPU,)
    return OrtSessionOptions(providers=providers, io_binding=io_binding, cuda_graph=cuda_graph and device == "cuda")


def service(target: Path | str, device: str | None, options: OrtSessionOptions | None = None, *,
            seer: bool | None = None, batch: int = 8, generation: GenerationConfig | None = None) -> Service:
    """A generation service on `target`, with the given ONNX Runtime session settings (an export) or torch device."""
    engine = (TargetOptions(device=device) if options is None else
              TargetOptions(providers=options.providers, io_binding=options.io_binding, cuda_graph=options.cuda_graph))
    opts = ServiceOptions(generation=generation or GenerationConfig(), batch_size=batch, target=engine,
                          seer=SeerOptions(on=seer))
    return Service(str(target), opts)


def tokens_of(run: Run) -> list[list[int]]:
    return [a.tokens for a in run.answers]


def same_share(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def exact_share(run: Run, answers: list[str]) -> float:
    return sum(a.text == want for a, want in zip(run.answers, answers, strict=True)) / max(len(answers), 1)


def timed_generate(svc: Service, requests: list[Prompt], **kwargs: Any) -> tuple[Run, float]:
    """A run and its wall seconds, after one warm-up batch (first calls at a shape allocate, capture, load kernels)."""
    svc.generate(requests[: svc.batch_size], **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    run = svc.generate(requests, **kwargs)
    return run, time.perf_counter() - start


def environment(record: dict[str, Any], device: str) -> None:
    record.update(
        device=device, python=platform.python_version(), torch=torch.__version__, onnxruntime=ort.__version__,
        providers=ort.get_available_providers(), torch_cuda=torch.cuda.is_available(),
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        if torch.cuda.is_available() else None,
        cpu_count=os.cpu_count(),
    )
    if device == "cuda" and CUDA not in ort.get_available_providers():
        raise RuntimeError("onnxruntime has no CUDAExecutionProvider: install onnxruntime-gpu")


def parity(record: dict[str, Any], export_dir: Path, device: str, sizes: Sizes, requests: list[Prompt]) -> None:
    """GPU tokens = CPU tokens: Seer (shipped), the paper's cut, full length, through ORT; torch GPU = torch CPU."""
    generation = GenerationConfig(sizes.gen_length, sizes.gen_length)
    cpu = service(export_dir, None, OrtSessionOptions(providers=(CPU,)), batch=sizes.batch, generation=generation)
    modes: dict[str, dict[str, Any]] = {"seer": {}, "paper_cut": {"seer": cpu.seer.with_(tail_context=0)
                                                                   if cpu.seer else None}, "full": {"full_length": True}}
    want = {mode: tokens_of(cpu.generate(requests, **kwargs)) for mode, kwargs in modes.items()}  # once per mode
    variants = {"io_binding": gpu_options(device), "cuda_graph": gpu_options(device, cuda_graph=True)}
    for name, options in variants.items():
        try:
            gpu = service(export_dir, None, options, batch=sizes.batch, generation=generation)
        except Exception as exc:  # noqa: BLE001  # CUDA graph capture may be refused: say so, check the rest
            record[name] = {"error": " ".join(str(exc).split())[:300]}
            continue
        rows: dict[str, Any] = {}
        for mode, kwargs in modes.items():
            got = tokens_of(gpu.generate(requests, **kwargs))
            rows[mode] = {"same_tokens": same_share(want[mode], got), "prompts": len(requests)}
        rows["bound_shapes"] = getattr(gpu.backend, "bound_shapes", {})
        record[name] = rows
    torch_generation = GenerationConfig(min(64, sizes.gen_length), min(64, sizes.gen_length))
    few = requests[: max(sizes.batch, 16)]
    want = tokens_of(service("demo", "cpu", batch=sizes.batch, generation=torch_generation).generate(few))
    got = tokens_of(service("demo", device, batch=sizes.batch, generation=torch_generation).generate(few))
    record["torch"] = {"same_tokens": same_share(want, got), "prompts": len(few), "gen_length": torch_generation.gen_length}


def demo_pass(record: dict[str, Any], export_dir: Path, device: str, sizes: Sizes, requests: list[Prompt]) -> None:
    """Per-pass time at full length (every pass the same shape): engine time and the host loop's share."""
    generation = GenerationConfig(sizes.gen_length, sizes.gen_length)
    few = requests[: sizes.pass_prompts]
    variants = {"session_run": gpu_options(device, io_binding=False), "io_binding": gpu_options(device),
                "cuda_graph": gpu_options(device, cuda_graph=True)}
    for name, options in variants.items():
        for core in ("c", "python"):
            if core == "python" and name != "io_binding":
                continue  # the twin's cost is the same whatever the engine: measured once
            os.environ[PURE_PYTHON_ENV] = "1" if core == "python" else "0"
            try:
                svc = service(export_dir, None, options, seer=False, batch=sizes.batch, generation=generation)
                timed = TimedBackend(svc.backend)
                svc.backend = timed  # type: ignore[assignment]  # the same calls, timed
                svc.generate(few[: sizes.batch])
                timed.seconds, timed.calls = 0.0, 0
                start = time.perf_counter()
                run = svc.generate(few)
                wall = time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001
                record[f"{name}/{core}"] = {"error": " ".join(str(exc).split())[:300]}
                continue
            finally:
                os.environ.pop(PURE_PYTHON_ENV, None)
            record[f"{name}/{core}"] = {
                "passes": run.passes, "wall_ms_per_pass": round(1e3 * wall / run.passes, 4),
                "engine_ms_per_pass": round(1e3 * timed.seconds / timed.calls, 4),
                "host_ms_per_pass": round(1e3 * (wall - timed.seconds) / run.passes, 4),
            }


def seer_speed(record: dict[str, Any], export_dir: Path, device: str, sizes: Sizes, requests: list[Prompt]) -> None:
    """Full length, Seer and the oracle on each GPU path: seconds, passes, ratios."""
    paths: dict[str, Callable[[], Service]] = {
        "ort_io_binding": lambda: service(export_dir, None, gpu_options(device), batch=sizes.batch,
                                          generation=GenerationConfig(sizes.gen_length, sizes.gen_length)),
        "torch": lambda: service("demo", device, batch=sizes.torch_batch,
                                 generation=GenerationConfig(sizes.gen_length, sizes.gen_length)),
    }
    for name, make in paths.items():
        svc = make()
        subset = requests[: sizes.torch_prompts] if name == "torch" else requests
        full, full_s = timed_generate(svc, subset, full_length=True)
        seer, seer_s = timed_generate(svc, subset)
        lengths = true_lengths(np.array(tokens_of(full)), {svc.info.eos_id} | ({svc.info.eot_id} - {None}))
        oracle_s = oracle_seconds(svc, subset, [int(n) for n in lengths])
        record[name] = {
            "prompts": len(subset), "batch": svc.batch_size, "full_s": round(full_s, 3), "seer_s": round(seer_s, 3),
            "oracle_s": round(oracle_s, 3), "full_passes": full.passes, "seer_passes": seer.passes,
            "seer_speedup": round(full_s / seer_s, 2), "seer_vs_oracle": round(oracle_s / seer_s, 3),
            "same_as_full": same_share(tokens_of(full), tokens_of(seer)),
        }


def oracle_seconds(svc: Service, requests: list[Prompt], lengths: list[int]) -> float:
    """Each request run on prompt + its true length from the first step: the bench's ort-oracle row (bench.rows),
    one pass over the service's batches."""
    run = oracle_row(svc, svc.options.generation, lengths)
    start = time.perf_counter()
    for idx in batches(len(requests), svc.batch_size):
        run([requests[i] for i in idx], idx)
    return time.perf_counter() - start


def device_bandwidth_gbs(device: str) -> float | None:
    """GB/s of a device-to-device copy of 1 GiB (read + write counted), the ceiling a step's weight reads meet."""
    if device != "cuda" or not torch.cuda.is_available():
        return None
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return round(2 * 10 * 2**30 / (time.perf_counter() - start) / 1e9, 1)


def large_model(record: dict[str, Any], work: Path, export_dir: Path, device: str, sizes: Sizes,
                requests: list[Prompt], seconds_left: float = float("inf")) -> None:
    """fp16: the demo's fp16 export against fp32 on the GPU; a large random model's step time against kept length."""
    fp16_demo = export_checkpoint("demo", work / "demo-fp16", ExportOptions(dtype="fp16", verify=False)).out
    generation = GenerationConfig(sizes.gen_length, sizes.gen_length)
    few = requests[: sizes.pass_prompts]
    runs = [service(d, None, gpu_options(device), batch=sizes.batch, generation=generation).generate(few)
            for d in (export_dir, fp16_demo)]
    record["demo_fp16_same_tokens_as_fp32"] = same_share(tokens_of(runs[0]), tokens_of(runs[1]))
    d_model, layers, heads, mlp, vocab = sizes.large
    if seconds_left < 240 and layers > 1:  # building and exporting the model is most of this section's time
        layers = 1
        record["note"] = f"1 layer instead of {sizes.large[1]}: {seconds_left:.0f} s of the budget were left"
    cfg = ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                      mlp_hidden=mlp, max_seq_len=sizes.prompt_tokens + max(sizes.kept_lengths),
                      mask_id=vocab - 1, eos_id=vocab - 2, pad_id=vocab - 2, bos_id=vocab - 3)
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.no_grad():
        model = MaskPredictor(cfg).eval()
        for p in model.parameters():
            p.normal_(0, 0.02)
    ckpt = save_checkpoint(model, work / "large-checkpoint")
    n_params = model.num_parameters()
    del model
    export = export_checkpoint(ckpt, work / "large-fp16",
                               ExportOptions(dtype="fp16", verify=False, seer=SeerConfig()))
    record["model"] = {"d_model": d_model, "layers": layers, "heads": heads, "mlp_hidden": mlp, "vocab": vocab,
                       "parameters": n_params, "fp16_gb": round(2 * n_params / 1e9, 2),
                       "build_and_export_s": round(time.perf_counter() - start, 1)}
    bandwidth = device_bandwidth_gbs(device)
    record["bandwidth_gbs"] = bandwidth
    bound_ms = None if bandwidth is None else round(1e3 * 2 * n_params / (bandwidth * 1e9), 3)
    record["weight_read_bound_ms"] = bound_ms
    rng = np.random.default_rng(0)
    for name, options in {"io_binding": gpu_options(device), "cuda_graph": gpu_options(device, cuda_graph=True)}.items():
        try:
            backend = OrtBackend(export.out, options)
        except Exception as exc:  # noqa: BLE001
            record[name] = {"error": " ".join(str(exc).split())[:300]}
            continue
        points = []
        for kept in sizes.kept_lengths:
            ids = step_inputs(cfg, 1, sizes.prompt_tokens + kept, rng)
            backend.step(StepInput(ids))  # warm-up (and capture)
            runs = []
            for _ in range(sizes.repeats):
                begun = time.perf_counter()
                backend.step(StepInput(ids))
                runs.append(1e3 * (time.perf_counter() - begun))
            ms = statistics.median(runs)
            points.append({"kept": kept, "seq": sizes.prompt_tokens + kept, "ms": round(ms, 3),
                           "x_bound": None if bound_ms is None else round(ms / bound_ms, 2)})
        record[name] = points
        del backend


def targets(data: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets against what was measured (None where a section did not run)."""
    sections = data["sections"]
    passes = sections.get("demo_pass", {})
    best_pass = min((v["wall_ms_per_pass"] for v in passes.values() if isinstance(v, dict) and "wall_ms_per_pass" in v),
                    default=None)
    speed = sections.get("seer_speed", {})
    large = sections.get("large_model", {})
    ratios = [p["x_bound"] for key in ("io_binding", "cuda_graph") if isinstance(large.get(key), list)
              for p in large[key] if p["kept"] == min(p2["kept"] for p2 in large[key]) and p["x_bound"] is not None]
    return {
        "demo_pass_ms_under_0.5": None if best_pass is None else {"best_ms": best_pass, "met": best_pass < 0.5},
        "large_step_within_2x_of_bound": None if not ratios else {"best_x": min(ratios), "met": min(ratios) <= 2},
        "seer_faster_than_full_everywhere": {k: v.get("seer_speedup", 0) > 1 for k, v in speed.items()
                                             if isinstance(v, dict) and "seer_speedup" in v} or None,
        "seer_vs_oracle_at_least_0.7": {k: v.get("seer_vs_oracle", 0) >= 0.7 for k, v in speed.items()
                                        if isinstance(v, dict) and "seer_vs_oracle" in v} or None,
    }


def render_markdown(data: dict[str, Any]) -> str:
    """The check's JSON as the tables BENCHMARKS.md shows (scripts/render_benchmarks.py includes the file)."""
    sections = data["sections"]
    env = sections.get("environment", {})
    lines = [f"Command: `{data.get('command', '')}` ({data.get('total_seconds', 0):.0f} s)", "",
             (f"Machine: {env.get('gpu') or 'no GPU'} ({env.get('device')}), torch {env.get('torch')}, onnxruntime "
             f"{env.get('onnxruntime')}, providers {', '.join(env.get('providers') or [])}, {env.get('cpu_count')} CPUs."),
             ""]
    failed = [f"{name}: {s['error']}" for name, s in sections.items() if not s.get("ok")]
    lines += [f"- section failed: {f}" for f in failed] + ([""] if failed else [])
    parity = sections.get("parity", {})
    lines += ["| parity (same tokens as the CPU) | Seer | paper's cut | full length |", "|---|---|---|---|"]
    for variant in ("io_binding", "cuda_graph"):
        row = parity.get(variant, {})
        if "error" in row:
            lines.append(f"| ONNX Runtime, {variant} | {row['error'][:80]} | | |")
        elif row:
            lines.append(f"| ONNX Runtime, {variant} | " + " | ".join(
                f"{row[m]['same_tokens']:.3f} of {row[m]['prompts']}" for m in ("seer", "paper_cut", "full")) + " |")
    if "torch" in parity:
        lines.append(f"| torch (gen_length {parity['torch']['gen_length']}) | | | "
                     f"{parity['torch']['same_tokens']:.3f} of {parity['torch']['prompts']} |")
    lines += ["", "| demo, per forward pass | wall ms | engine ms | host loop ms |", "|---|---|---|---|"]
    for name, row in sections.get("demo_pass", {}).items():
        if isinstance(row, dict) and "wall_ms_per_pass" in row:
            lines.append(f"| {name} | {row['wall_ms_per_pass']:.3f} | {row['engine_ms_per_pass']:.3f} | "
                         f"{row['host_ms_per_pass']:.3f} |")
    lines += ["", "| path | prompts | full s | Seer s | oracle s | Seer speed-up | oracle / Seer time | Seer = full |",
              "|---|---|---|---|---|---|---|---|"]
    for name, row in sections.get("seer_speed", {}).items():
        if isinstance(row, dict) and "seer_s" in row:
            lines.append(f"| {name} | {row['prompts']} | {row['full_s']} | {row['seer_s']} | {row['oracle_s']} | "
                         f"{row['seer_speedup']}x | {row['seer_vs_oracle']} | {row['same_as_full']:.3f} |")
    large = sections.get("large_model", {})
    if "model" in large:
        m = large["model"]
        lines += ["", (f"Large model: d_model {m['d_model']}, {m['layers']} layers, vocab {m['vocab']}: "
                  f"{m['parameters'] / 1e9:.2f}B parameters, {m['fp16_gb']} GB in fp16; copy bandwidth "
                  f"{large.get('bandwidth_gbs')} GB/s, weight-read bound {large.get('weight_read_bound_ms')} ms; the "
                  f"demo in fp16 gives the fp32 tokens on {large.get('demo_fp16_same_tokens_as_fp32')} of the prompts."),
                  "", "| kept length | " + " | ".join(k for k in ("io_binding", "cuda_graph") if isinstance(
                      large.get(k), list)) + " |", "|---|---|---|"]
        series = {k: {p["kept"]: p for p in large[k]} for k in ("io_binding", "cuda_graph")
                  if isinstance(large.get(k), list)}
        for kept in sorted({k for points in series.values() for k in points}):
            cells = [(f"{points[kept]['ms']} ms" + (f" ({points[kept]['x_bound']}x bound)"
                                                    if points[kept]['x_bound'] is not None else ""))
                     if kept in points else "" for points in series.values()]
            lines.append(f"| {kept} | " + " | ".join(cells) + " |")
    lines += ["", "Targets (reported, not asserted): " + json.dumps(data.get("targets", {})), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON file to write")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: the GPU check; cpu: the same code on a CPU (what the test runs)")
    ap.add_argument("--quick", action="store_true", help="small sizes (a CPU, a test)")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds; sections that would start later are skipped")
    ap.add_argument("--sections", default="environment,parity,demo_pass,seer_speed,large_model")
    args = ap.parse_args()
    sizes = QUICK if args.quick else Sizes()
    wanted = args.sections.split(",")
    check = Check(args.out, args.budget)
    check.data.update(command=" ".join(["python", *sys.argv]), sizes=sizes.__dict__)
    examples = heldout_examples(sizes.prompts)
    requests = [Prompt(e.prompt) for e in examples]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        export_dir = work / "demo-export"
        def export_demo(record: dict[str, Any]) -> None:
            begun = time.perf_counter()
            export_checkpoint("demo", export_dir, ExportOptions(verify=False))
            record["demo_export_s"] = round(time.perf_counter() - begun, 2)

        sections: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
            ("environment", lambda r: environment(r, args.device)),
            ("export", export_demo),
            ("parity", lambda r: parity(r, export_dir, args.device, sizes, requests)),
            ("demo_pass", lambda r: demo_pass(r, export_dir, args.device, sizes, requests)),
            ("seer_speed", lambda r: seer_speed(r, export_dir, args.device, sizes, requests)),
            ("large_model", lambda r: large_model(r, work, export_dir, args.device, sizes, requests,
                                                  check.seconds_left())),
        ]
        for name, body in sections:
            if name in wanted or name == "export":
                check.run(name, body)
        check.data["targets"] = targets(check.data)
        check.save()
    args.out.with_suffix(".md").write_text(render_markdown(check.data))
    print(json.dumps(check.data["targets"], indent=1))


if __name__ == "__main__":
    main()
