"""A bounded load generator for `seer-deploy serve`: throughput and p50 / p95 / p99 latency at several concurrencies,
Seer on and off, beside the same prompts run through the CLI (`seer-deploy generate --prompts`).

    python benchmarks/load_generator.py demo-onnx --requests 96 --concurrency 1,8,32 --out benchmarks/results-serve

It starts the server itself (a subprocess on 127.0.0.1, port 0) unless --url names one, sends exactly --requests
requests per setting (the demo's held-out prompts, cycled), checks every answer against the CLI's for the same
prompt and setting, and writes results.json and results.md. Loopback only; it stops by itself.

    python benchmarks/load_generator.py demo-onnx --faults --requests 10000 --concurrency 1,8,32,64

    python benchmarks/load_generator.py demo-onnx --open-loop --rates sat,3,cap70 --requests 60 --rounds 2

--open-loop (issue 46; its code in benchmarks/open_loop.py) sends seeded Poisson arrivals of a short/long mix to
`serve --batching call` and `serve --batching step` side by side, and writes open-loop.json and open-loop.md.

--faults (issue 39) drives a server it starts (with --api-key and --read-timeout 1) as careless and hostile clients
would, --requests in all spread over the concurrencies: normal and streamed requests on both endpoints mixed with
clients that leave (right after sending, after the first streamed piece, halfway through the headers or the body),
half-sent requests left to time out, malformed bodies, wrong paths, methods and keys. Then it checks the server:
every normal answer equal to the same request alone (sent first, one at a time; temperature 0), every refusal the
status it should be in OpenAI's error shape, no 5xx seen or counted, /metrics' request total = requests sent, rows
admitted = settled, RSS before and after, the log free of tracebacks and asyncio task warnings, and SIGTERM's exit.
It writes faults.json and faults.md and exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from seer_deploy.models.demos.demo_tasks import heldout_examples

CLI = [sys.executable, "-c", "from seer_deploy.cli import main; main()"]


def start_server(target: str, args: argparse.Namespace, *extra: str, log: list[str] | None = None
                 ) -> tuple[subprocess.Popen[str], str]:
    """`seer-deploy serve TARGET` on a free loopback port; returns the process and its URL. log: where its stderr
    lines go (else the access log is off)."""
    cmd = [*CLI, "serve", target, "--port", "0", "--gen-length", str(args.gen_length), "--max-batch",
           str(args.max_batch), "--threads", str(args.threads), "--max-queue", "4096", "--timeout", "600",
           *([] if log is not None else ["--no-access-log"]), *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in proc.stderr or []:
            if log is not None:
                log.append(line)
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    while True:
        line = lines.get(timeout=900)  # a loaded machine may take minutes to import and open the model
        if line.startswith("{") and '"serving"' in line:
            return proc, json.loads(line)["url"]


async def load(url: str, prompts: list[str], concurrency: int, seer: bool, tail: str | None
               ) -> tuple[list[float], list[str], float]:
    """Send every prompt with `concurrency` in flight: (latencies in s, answers, wall seconds)."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = [0.0] * len(prompts)
    answers: list[str] = [""] * len(prompts)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as http:
        async def one(i: int) -> None:
            async with gate:
                start = time.perf_counter()
                body: dict[str, Any] = {"prompt": prompts[i], "seer": seer}
                if seer and tail is not None:
                    body["tail_context"] = tail if tail == "all" else int(tail)
                r = await http.post("/v1/completions", json=body)
                latencies[i] = time.perf_counter() - start
                r.raise_for_status()
                answers[i] = r.json()["choices"][0]["text"]

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(prompts))))
        return latencies, answers, time.perf_counter() - start


def cli_run(target: str, prompts: list[str], seer: bool, batch_size: int, args: argparse.Namespace
            ) -> tuple[list[str], float]:
    """The same prompts through `seer-deploy generate --prompts --json`: (answers, the run's own seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "prompts.jsonl"
        file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        done = subprocess.run([*CLI, "generate", target, "--prompts", str(file), "--json", "--gen-length",
                               str(args.gen_length), "--batch-size", str(batch_size), "--threads", str(args.threads),
                               "--seer" if seer else "--no-seer",
                               *(["--tail-context", args.tail_context] if seer and args.tail_context else [])],
                              capture_output=True, text=True, check=True)
    answers = [json.loads(line)["answer"] for line in done.stdout.splitlines()]
    seconds = float(re.search(r": ([0-9.]+)s,", done.stderr.strip().splitlines()[-1])[1])  # type: ignore[index]
    return answers, seconds


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| path | Seer | concurrency / batch | requests | throughput (req/s) | p50 (ms) | p95 (ms) | p99 (ms) | "
            "answers = CLI |\n|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        lat = r.get("latency_ms")
        cells = [r["path"], "on" if r["seer"] else "off", str(r["concurrency"]), str(r["requests"]),
                 f"{r['throughput']:.1f}", *(f"{lat[k]:.0f}" if lat else "-" for k in ("p50", "p95", "p99")),
                 r.get("same_as_cli", "-")]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(out) + "\n"


def machine() -> dict[str, Any]:
    """The machine a figure was measured on, with the commit and date, and its load now."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    return {"cpu": model[1] if model else platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "commit": commit,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average_before": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="what `seer-deploy serve` and `generate` run (an export dir, 'demo', ...)")
    parser.add_argument("--url", help="an already running server instead of starting one")
    parser.add_argument("--requests", type=int, default=96, help="requests per setting (bounded)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tail-context", default=None, metavar="N|all",
                        help="Seer's tail context for the Seer-on rows [default: the target's config]")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results-serve"))
    parser.add_argument("--faults", action="store_true", help="the faults mode (see above): faults.json, faults.md")
    parser.add_argument("--open-loop", action="store_true", help="the open-loop mode (see above): open-loop.json/md")
    parser.add_argument("--rates", default="sat,3,cap70", help="--open-loop: requests/s, 'sat', 'cap70'")
    parser.add_argument("--rounds", type=int, default=2, help="--open-loop: rounds of every rate on both servers")
    args = parser.parse_args()
    if not 1 <= args.requests <= 10_000:
        parser.error("--requests must be from 1 to 10000 (the load is bounded)")
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.faults:
        if args.url:
            parser.error("--faults starts its own server (it reads its log and memory); drop --url")
        from faults import run_faults  # benchmarks/faults.py, beside this script

        sys.exit(run_faults(args, levels, start_server))
    prompts = [e.prompt for e in heldout_examples(40)]
    if args.open_loop:
        if args.url:
            parser.error("--open-loop starts its own two servers (per call and step-level); drop --url")
        from open_loop import run_open_loop  # benchmarks/open_loop.py, beside this script

        sys.exit(run_open_loop(args, start_server, prompts, machine))
    batch = [prompts[i % len(prompts)] for i in range(args.requests)]
    load_before = os.getloadavg()
    proc, url = (None, args.url) if args.url else start_server(args.target, args)
    rows: list[dict[str, Any]] = []
    try:
        for seer in (True, False):
            reference, _ = cli_run(args.target, prompts, seer, args.max_batch, args)
            expected = dict(zip(prompts, reference, strict=True))
            for level in levels:
                asyncio.run(load(url, batch[: min(level, len(batch))], level, seer, args.tail_context))  # warm up
                latencies, answers, wall = asyncio.run(load(url, batch, level, seer, args.tail_context))
                ms = np.asarray(latencies) * 1000
                same = sum(a == expected[p] for a, p in zip(answers, batch, strict=True))
                rows.append({"path": "serve", "seer": seer, "concurrency": level, "requests": len(batch),
                             "throughput": len(batch) / wall, "seconds": wall,
                             "latency_ms": {k: float(np.percentile(ms, q)) for k, q in
                                            (("p50", 50), ("p95", 95), ("p99", 99))},
                             "same_as_cli": f"{same}/{len(batch)}"})
                print(json.dumps(rows[-1]), flush=True)
            for size in (1, args.max_batch):
                _, seconds = cli_run(args.target, batch, seer, size, args)
                rows.append({"path": "cli generate", "seer": seer, "concurrency": f"batch {size}",
                             "requests": len(batch), "throughput": len(batch) / seconds, "seconds": seconds})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    command = "python benchmarks/load_generator.py " + shlex.join(sys.argv[1:])
    about = {**machine(), "load_average_before": load_before, "load_average_after": os.getloadavg()}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "results" if args.tail_context is None else f"results-tail-{args.tail_context}"
    (args.out / f"{stem}.json").write_text(json.dumps({"command": command, "machine": about, "rows": rows},
                                                      indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(f"```\n{command}\n```\n\n{table(rows)}")
    print(table(rows))


if __name__ == "__main__":
    main()
