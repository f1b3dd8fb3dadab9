"""The open-loop mode of benchmarks/load_generator.py (issue 46): seeded Poisson arrivals of a short/long mix, sent
whatever the server's pace, to `serve --batching call` and `serve --batching step` side by side in one run.

    python benchmarks/load_generator.py demo-onnx --open-loop --rates 3,cap70,sat --requests 60 --rounds 2

Both servers are started (subprocesses on loopback, --threads 1 each) and stay up; each round runs every rate on
both, alternating which goes first, with the same arrivals (seeded: one schedule per rate and round). A request is
short (max_tokens 16, Seer on: a handful of passes) or long (max_tokens 128, "seer": false: a full 128-pass canvas),
half and half in a seeded order. Latency is from the scheduled arrival to the last byte; throughput is answers over
the time from the first arrival to the last answer. `sat` sends every request at once (the saturation throughput);
`cap70` is 70% of the per-call server's saturation throughput measured before it in the same round. Every answer is
compared between the two servers (each equals the request alone: tests/test_serve_stepping.py). From the step
server's /metrics: forward passes, and the passes mixing rows at step zero with later steps, or different settings.
Writes open-loop.json (every request's class, arrival and latency) and open-loop.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

MODES = ("call", "step")
CLASSES = {"short": {"max_tokens": 16, "seer": True}, "long": {"max_tokens": 128, "seer": False}}


def schedule(n: int, rate: float | None, seed: int) -> tuple[list[float], list[str]]:
    """Arrival offsets in seconds (Poisson at `rate`; all at 0 for None) and each request's class, seeded."""
    rng = np.random.default_rng(seed)
    gaps = np.zeros(n) if rate is None else rng.exponential(1.0 / rate, n)
    arrivals = np.cumsum(gaps) - (gaps[0] if n else 0.0)
    kinds = ["short" if k else "long" for k in rng.permutation(np.arange(n) % 2 == 0)]
    return arrivals.tolist(), kinds


async def drive(url: str, prompts: list[str], arrivals: list[float], kinds: list[str]) -> dict[str, Any]:
    """Send each request at its arrival time (open loop); (latencies, answers, wall) of the whole schedule."""
    latencies = [0.0] * len(prompts)
    answers = [""] * len(prompts)
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=900) as http:
        start = time.perf_counter() + 0.05

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            r = await http.post("/v1/completions", json={"prompt": prompts[i], **CLASSES[kinds[i]]})
            latencies[i] = time.perf_counter() - (start + arrivals[i])
            r.raise_for_status()
            answers[i] = r.json()["choices"][0]["text"]

        await asyncio.gather(*(one(i) for i in range(len(prompts))))
        wall = time.perf_counter() - start
    return {"latencies": latencies, "answers": answers, "wall": wall}


def summary(kinds: list[str], run: dict[str, Any]) -> dict[str, Any]:
    ms = np.asarray(run["latencies"]) * 1000
    out: dict[str, Any] = {"throughput": len(kinds) / run["wall"]}
    for name, pick in (("short", "short"), ("long", "long"), ("all", None)):
        values = ms[[pick is None or k == pick for k in kinds]]
        out[name] = {q: float(np.percentile(values, p)) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))}
    return out


def passes(url: str) -> dict[str, float]:
    """The step server's pass counters (cumulative)."""
    text = httpx.get(f"{url}/metrics").text
    found = {"forward_passes": 0.0, "mixing_steps": 0.0, "mixing_settings": 0.0, "rows_in_passes": 0.0}
    for line in text.splitlines():
        if line.startswith("seer_serve_forward_passes_total "):
            found["forward_passes"] = float(line.split()[-1])
        elif line.startswith('seer_serve_mixed_passes_total{mixes="steps"}'):
            found["mixing_steps"] = float(line.split()[-1])
        elif line.startswith('seer_serve_mixed_passes_total{mixes="settings"}'):
            found["mixing_settings"] = float(line.split()[-1])
        elif line.startswith("seer_serve_pass_rows_sum "):
            found["rows_in_passes"] = float(line.split()[-1])
    return found


def run_open_loop(args: argparse.Namespace, start_server: Callable[..., Any], prompts: list[str],
                  machine: Callable[[], dict[str, Any]]) -> int:
    rates = [r.strip() for r in args.rates.split(",")]
    for r in rates:
        if r not in ("sat", "cap70") and not r.replace(".", "", 1).isdigit():
            sys.exit(f"--rates takes requests per second, 'sat' or 'cap70'; got {r!r}")
    servers = {mode: start_server(args.target, args, "--batching", mode) for mode in MODES}
    urls = {mode: url for mode, (_, url) in servers.items()}
    before = machine()
    runs: list[dict[str, Any]] = []
    try:
        for mode in MODES:  # warm up: the sessions, every size
            asyncio.run(drive(urls[mode], prompts[:4], [0.0] * 4, ["short", "long", "short", "long"]))
        for round_ in range(args.rounds):
            capacity: float | None = None
            for rate_name in sorted(rates, key=lambda r: r != "sat"):  # saturation first: cap70 needs it
                rate = None if rate_name == "sat" else capacity * 0.7 if rate_name == "cap70" else float(rate_name)
                if rate_name == "cap70" and capacity is None:
                    sys.exit("--rates cap70 needs sat in the same run (70% of the per-call saturation throughput)")
                arrivals, kinds = schedule(args.requests, rate, seed=1000 * round_ + rates.index(rate_name))
                batch = [prompts[i % len(prompts)] for i in range(args.requests)]
                order = MODES if round_ % 2 == 0 else MODES[::-1]
                for mode in order:
                    counted = passes(urls["step"]) if mode == "step" else None
                    run = asyncio.run(drive(urls[mode], batch, arrivals, kinds))
                    row = {"round": round_, "rate_name": rate_name, "rate": rate, "mode": mode,
                           **summary(kinds, run), "kinds": kinds, "arrivals": arrivals, **run}
                    if counted is not None:
                        after = passes(urls["step"])
                        row["passes"] = {k: after[k] - counted[k] for k in after}
                    runs.append(row)
                    if rate_name == "sat" and mode == "call":
                        capacity = row["throughput"]
                    print(json.dumps({k: row[k] for k in ("round", "rate_name", "mode", "throughput", "short",
                                                          "all")}), flush=True)
                pair = runs[-2:]
                same = sum(a == b for a, b in zip(pair[0]["answers"], pair[1]["answers"], strict=True))
                for r in pair:
                    r["answers_equal_across_modes"] = f"{same}/{len(batch)}"
                save(args, before, machine, rates, runs)  # after every pair: a long run keeps what it measured
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    print(report(runs))
    return 0


def save(args: argparse.Namespace, before: dict[str, Any], machine: Callable[[], dict[str, Any]], rates: list[str],
         runs: list[dict[str, Any]]) -> None:
    command = "python benchmarks/load_generator.py " + shlex.join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"command": command, "machine": {**before, "load_average_after": machine()["load_average_before"]},
              "rates": rates, "requests": args.requests, "rounds": args.rounds, "runs": runs}
    (args.out / "open-loop.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "open-loop.md").write_text(f"```\n{command}\n```\n\n{report(runs)}")


def report(runs: list[dict[str, Any]]) -> str:
    """Medians over rounds per (rate, mode), and the step/call ratios the issue's targets read."""
    lines = [("| rate | batching | rate (req/s) | throughput (req/s) | short p50 ms | short p99 ms | long p50 ms | "
              "all p99 ms | passes (mixing steps / settings) | answers equal |"), "|" + "---|" * 10]
    ratios = ["", "| rate | short p50 step/call | all p99 step/call | throughput step/call |", "|---|---|---|---|"]
    names = list(dict.fromkeys(r["rate_name"] for r in runs))
    for name in names:
        med: dict[str, dict[str, float]] = {}
        for mode in MODES:
            mine = [r for r in runs if r["rate_name"] == name and r["mode"] == mode]
            med[mode] = {"rate": float(np.median([r["rate"] or 0 for r in mine])),
                         "throughput": float(np.median([r["throughput"] for r in mine])),
                         "short50": float(np.median([r["short"]["p50"] for r in mine])),
                         "short99": float(np.median([r["short"]["p99"] for r in mine])),
                         "long50": float(np.median([r["long"]["p50"] for r in mine])),
                         "all99": float(np.median([r["all"]["p99"] for r in mine]))}
            p = [r["passes"] for r in mine if "passes" in r]
            mix = (f"{sum(x['forward_passes'] for x in p):.0f} ({sum(x['mixing_steps'] for x in p):.0f} / "
                   f"{sum(x['mixing_settings'] for x in p):.0f})") if p else "-"
            m = med[mode]
            lines.append(f"| {name} | {mode} | {m['rate']:.2f} | {m['throughput']:.2f} | {m['short50']:.0f} | "
                         f"{m['short99']:.0f} | {m['long50']:.0f} | {m['all99']:.0f} | {mix} | "
                         f"{mine[-1].get('answers_equal_across_modes', '-')} |")
        s, c = med["step"], med["call"]
        ratios.append(f"| {name} | {s['short50'] / c['short50']:.2f} | {s['all99'] / c['all99']:.2f} | "
                      f"{s['throughput'] / c['throughput']:.2f} |")
    return "\n".join(lines + ratios) + "\n"
