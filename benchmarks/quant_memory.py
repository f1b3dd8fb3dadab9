"""Memory as a measured figure (issue 31): what `export --quantize int8|int4` saves on disk and in resident memory,
against fp32 and fp16, on the demo and on a random checkpoint in LLaDA's layout at LLaDA-8B's width and vocabulary.

For each variant (fp32, fp16, int8, int4 and the others in VARIANTS), one run:
 1. `seer-deploy export` as one process (benchmarks/scale_export.py's export: wall time, peak resident memory through
    benchmarks/measured.py, verification on);
 2. the weights file split by what reads each tensor (step.onnx's external-data offsets): the embedding, the linear
    layers of each transformer layer, the LM head, the rest (norms) - the issue's target speaks of the linear layers;
 3. `seer-deploy generate` on a few prompts as one process: peak resident memory (the kernel's high-water mark) and
    seconds, for context only (2 CPU cores, shared);
 4. `seer-deploy serve` on loopback (benchmarks/load_generator.py's start_server), one request, then the server's
    VmHWM from /proc, then SIGTERM.
Then the export is deleted (only the figures are kept) and the next variant runs. Writes one JSON per model into
--results; `--render` turns those into table.md with the projection to LLaDA-8B (32 layers) as a calculation.

    PYTHONPATH=. .venv/bin/python benchmarks/quant_memory.py demo
    PYTHONPATH=. .venv/bin/python benchmarks/quant_memory.py llada --layers 1 --work /tmp/qm-work
    PYTHONPATH=. .venv/bin/python benchmarks/quant_memory.py --render
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llada_checkpoint import LLADA_8B, Shape, is_current, write_checkpoint
from load_generator import start_server
from scale_export import export, generate, log

RESULTS = HERE / "results-quant-memory"
MiB, GiB = 2**20, 2**30
# name -> (--dtype, --quantize, --keep-head); int8 / int4 keep fp32 activations, embedding and scales as the bench's
# ort-int4-seer rows do; the -fp16 ones take fp16 scales and embedding (activations fp16: cast per MatMul on a CPU)
VARIANTS: dict[str, tuple[str, str | None, bool]] = {
    "fp32": ("fp32", None, False), "fp16": ("fp16", None, False), "int8": ("fp32", "int8", False),
    "int4": ("fp32", "int4", False), "int4-keep-head": ("fp32", "int4", True), "int8-fp16": ("fp16", "int8", False),
    "int4-fp16": ("fp16", "int4", False)}
LLADA_PROMPTS = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge",
                 "def fibonacci(n):\n    return n if n < 2 else", "Memory decides what runs at all on a small machine:")
LINEAR_OPS = {"MatMul", "MatMulNBits", "DequantizeLinear"}
LAYER = re.compile(r"layers\.(\d+)\.")


def weight_split(export_dir: Path) -> dict[str, Any]:
    """The weights file's bytes by what reads them: embedding (Gather), each layer's linear layers, the LM head (the
    one projection outside the layers), the rest; each stored range counted once (the step graphs share one file)."""
    import onnx

    model = onnx.load(str(export_dir / "step.onnx"), load_external_data=False)
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    seen: set[tuple[str, str]] = set()
    split: dict[str, Any] = {"embedding": 0, "head": 0, "rest": 0, "layers_linear": {}, "layers_rest": {}}
    for init in model.graph.initializer:
        ext = {e.key: e.value for e in init.external_data}
        if init.data_location != onnx.TensorProto.EXTERNAL or (ext["offset"], ext["length"]) in seen:
            continue
        seen.add((ext["offset"], ext["length"]))
        size, ops, layer = int(ext["length"]), readers.get(init.name, set()), LAYER.search(init.name)
        linear = bool(ops & LINEAR_OPS)
        if "Gather" in ops and "embed" in init.name:
            split["embedding"] += size
        elif linear and layer is None:  # the only projection outside the layers: the LM head
            split["head"] += size
        elif layer is not None:
            part = split["layers_linear" if linear else "layers_rest"]
            part[layer[1]] = part.get(layer[1], 0) + size
        else:
            split["rest"] += size
    cfg = json.loads((export_dir / "manifest.json").read_text())["model"]["config"]
    d, m = cfg["d_model"], cfg["mlp_hidden"]
    split |= {"layers": cfg["n_layers"], "layer_weights": 4 * d * d + 3 * d * m, "head_weights": cfg["vocab_size"] * d}
    split["file"] = (export_dir / "weights.bin").stat().st_size
    split["linear"] = sum(split["layers_linear"].values()) + split["head"]
    split["padding"] = split["file"] - split["linear"] - split["embedding"] - split["rest"] - sum(
        split["layers_rest"].values())  # alignment of large tensors to 64 KiB (export/weights.py)
    return split


def serve_one(export_dir: Path, prompt: str, gen_length: int, threads: int) -> dict[str, Any]:
    """The server's resident memory after loading, its high-water mark after one request, and how it stopped."""
    import httpx

    def status(pid: int) -> dict[str, int]:
        text = Path(f"/proc/{pid}/status").read_text()
        return {k: int(re.search(rf"{k}:\s+(\d+)", text)[1]) * 1024 for k in ("VmRSS", "VmHWM")}  # type: ignore[index]

    started = time.perf_counter()
    opts = argparse.Namespace(gen_length=gen_length, max_batch=1, threads=threads)
    proc, url = start_server(str(export_dir), opts, "--steps", str(gen_length), "--no-seer")
    ready_s = time.perf_counter() - started
    try:
        loaded = status(proc.pid)
        t = time.perf_counter()
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "seer": False}, timeout=1200)
        r.raise_for_status()
        request_s = time.perf_counter() - t
        after = status(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
    record = {"ready_s": round(ready_s, 1), "rss_loaded_mib": round(loaded["VmRSS"] / MiB),
              "request_s": round(request_s, 2), "peak_rss_mib": round(after["VmHWM"] / MiB),
              "peak_rss_gib": round(after["VmHWM"] / GiB, 2), "exit_code": rc}
    log(f"  serve: {record}")
    return record


def measure(target: str, name: str, work: Path, prompts: list[str], gen_length: int, threads: int,
            extra: list[str]) -> dict[str, Any]:
    """One variant end to end; the export is removed afterwards."""
    dtype, scheme, keep_head = VARIANTS[name]
    out = work / f"export-{name}"
    flags = [*extra, *(["--quantize", scheme, "--block-size", "32", "--quant-format", "nbits"] if scheme else []),
             *(["--keep-head"] if keep_head else [])]
    record: dict[str, Any] = {"variant": name, "dtype": dtype, "quantize": scheme, "keep_head": keep_head,
                              "export": export(Path(target), out, dtype, kv_cache=False, extra=flags)}
    if record["export"]["rc"] == 0:
        record["weights"] = weight_split(out)
        log(f"  weights: {record['weights']}")
        record["generate"] = generate(out, gen_length, prompts, ["--threads", str(threads)])
        record["generate"].pop("answer_tokens", None)
        record["serve"] = serve_one(out, prompts[0], gen_length, threads)
    shutil.rmtree(out, ignore_errors=True)
    return record


def size(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def rss(r: dict[str, Any] | None) -> str:
    return "-" if not r or "peak_rss_mib" not in r else mib(r["peak_rss_mib"])


def mib(n: int) -> str:
    return f"{n / 1024:.2f} GiB" if n >= 1024 else f"{n} MiB"


def model_table(data: dict[str, Any]) -> list[str]:
    """One row per variant: the weights file and its parts, the export, generate and serve."""
    fp16 = data["variants"].get("fp16", {}).get("weights", {}).get("linear")
    rows = [("| variant | weights file | linear layers (share of fp16's) | bytes per weight in a layer | embedding | "
            "export: s, peak RSS | generate: peak RSS, s (passes) | serve: peak RSS after 1 request (loaded) |"),
            "|---|---|---|---|---|---|---|---|"]
    for name, v in data["variants"].items():
        w, e, g, sv = v.get("weights"), v["export"], v.get("generate", {}), v.get("serve", {})
        if w is None:
            rows.append(f"| {name} | export failed: {e.get('error', '?')} |  |  |  |  |  |  |")
            continue
        share = f" ({w['linear'] / fp16:.1%})" if fp16 else ""
        per_weight = w["layers_linear"]["0"] / w["layer_weights"]
        gen = f"{rss(g)}, {g['seconds']:.1f} s ({g['passes']})" if "seconds" in g else rss(g)
        serve = f"{rss(sv)} ({mib(sv['rss_loaded_mib'])})" if sv else "-"
        rows.append(f"| {name} | {size(w['file'])} | {size(w['linear'])}{share} | {per_weight:.4g} | "
                    f"{size(w['embedding'])} | {e['wall_s']:.0f} s, {rss(e)}{'' if e.get('verified') else ' UNVERIFIED'} "
                    f"| {gen} | {serve} |")
    return rows


def projection(data: dict[str, Any], layers: int = LLADA_8B.n_layers) -> list[str]:
    """LLaDA-8B from a model measured at its width and vocabulary: the parts outside the layers (embedding E, LM head
    H, the rest R with the 64 KiB alignment) plus `layers` times one measured layer's bytes (linear L, norms N); its
    generate peak as the measured one plus the weights of the layers added (the rest assumed unchanged)."""
    fp16 = data["variants"].get("fp16", {}).get("weights")
    head16 = fp16 and fp16["head"] + layers * fp16["layers_linear"]["0"]
    rows = [(f"| variant | weights file at {layers} layers: E + H + R + {layers} x (L + N) | linear layers: H + {layers} "
            "x L (share of fp16's) | generate peak RSS estimate: measured + "
            f"{layers - 1} x (L + N) |"), "|---|---|---|---|"]
    g = GiB
    for name, v in data["variants"].items():
        w = v.get("weights")
        if w is None or w["layers"] != 1:
            continue
        L, N = w["layers_linear"]["0"], w["layers_rest"].get("0", 0)
        R = w["rest"] + w["padding"]
        total, linear = w["embedding"] + w["head"] + R + layers * (L + N), w["head"] + layers * L
        share = f" ({linear / head16:.1%})" if head16 else ""
        gen = v.get("generate", {})
        est = (f"{gen['peak_rss_mib'] * MiB / g:.2f} + {layers - 1} x {(L + N) / g:.4f} = "
               f"**{(gen['peak_rss_mib'] * MiB + (layers - 1) * (L + N)) / g:.2f} GiB**" if "peak_rss_mib" in gen else "-")
        rows.append(f"| {name} | {w['embedding'] / g:.3f} + {w['head'] / g:.3f} + {R / g:.3f} + {layers} x "
                    f"({L / g:.4f} + {N / g:.5f}) = **{total / g:.2f} GiB** | {w['head'] / g:.3f} + {layers} x "
                    f"{L / g:.4f} = **{linear / g:.2f} GiB**{share} | {est} |")
    return rows


def render(results: Path) -> str:
    """table.md: each model's table under its command and machine, then the projection to LLaDA-8B."""
    out: list[str] = []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        m = data["machine"]
        shape = data["shape"]
        what = ("the bundled demo" if data["model"] == "demo" else
                f"random LLaDA-layout checkpoint, d_model {shape['d_model']}, MLP {shape['mlp_hidden']}, "
                f"{shape['n_heads']} heads, vocabulary {shape['vocab']:,}, {shape['n_layers']} layer(s): "
                f"{shape['parameters'] / 1e9:.2f}B parameters")
        out += [f"## {what}", "", (f"Command: `{data['command']}` ({data['date']}; {m['cpu']}, {m['cores']} cores, "
                f"{m['memory_gib']} GiB; load average {m['load_average'][0]:.1f} before, "
                f"{m.get('load_average_after', [0])[0]:.1f} after). generate: {data['prompts']} prompts in one batch, "
                f"--gen-length {data['gen_length']} --steps {data['gen_length']} --no-seer --threads {data['threads']}"
                "; serve: one /v1/completions request, the first prompt."), "", *model_table(data), ""]
        if data["model"] == "llada":
            out += ["### Projection to LLaDA-8B (32 layers), from the figures above", "", *projection(data), ""]
    return "\n".join(out)


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    return {"cpu": model[1] if model else "?", "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1),
            "load_average": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", choices=["demo", "llada"], help="the bundled demo, or a random LLaDA-layout "
                    "checkpoint at LLaDA-8B's width and vocabulary with --layers layers")
    ap.add_argument("--variants", default="fp32,fp16,int8,int4,int4-keep-head,int8-fp16,int4-fp16")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--max-seq-len", type=int, default=256, help="llada: the export's longest sequence")
    ap.add_argument("--gen-length", type=int, default=None, help="[demo 32, llada 8]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qm-work"))
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--render", action="store_true", help="write RESULTS/table.md from the JSON files and stop")
    args = ap.parse_args()
    if args.render:
        (args.results / "table.md").write_text(render(args.results))
        print((args.results / "table.md").read_text())
        return
    if args.model is None:
        ap.error("name a model (demo or llada), or --render")
    names = args.variants.split(",")
    if unknown := sorted(set(names) - set(VARIANTS)):
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.model == "demo":
        from seer_deploy.models.demos.demo_tasks import heldout_examples

        target, tag, extra = "demo", "demo", []
        prompts, gen_length = [e.prompt for e in heldout_examples(4)], args.gen_length or 32
        shape: dict[str, Any] = {}
    else:
        s = Shape(LLADA_8B.d_model, args.layers, LLADA_8B.mlp_hidden, LLADA_8B.n_heads, LLADA_8B.vocab)
        ckpt, tag, extra = work / f"checkpoint-{s.tag}", f"llada-{s.tag}", ["--max-seq-len", str(args.max_seq_len)]
        prompts, gen_length, shape = list(LLADA_PROMPTS), args.gen_length or 8, {**s.__dict__, "parameters": s.params}
        if not is_current(ckpt, s, 0, 8000, 4096):
            log(f"writing the random checkpoint {ckpt} ({s.params / 1e9:.2f}B parameters)")
            write_checkpoint(ckpt, s, 4096, 0, 8000, log=log)
        target = str(ckpt)
    path = args.results / f"{tag}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data |= {"model": args.model, "shape": shape, "prompts": len(prompts), "gen_length": gen_length,
             "threads": args.threads, "command": "PYTHONPATH=. .venv/bin/python benchmarks/quant_memory.py "
             + " ".join(sys.argv[1:]), "machine": machine(), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    data.setdefault("variants", {})
    args.results.mkdir(parents=True, exist_ok=True)
    for name in names:  # each variant's figures saved as soon as measured: a later failure keeps them
        log(f"== {tag}: {name}")
        data["variants"][name] = measure(target, name, work, prompts, gen_length, args.threads, extra)
        data["machine"]["load_average_after"] = os.getloadavg()
        path.write_text(json.dumps(data, indent=1) + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
