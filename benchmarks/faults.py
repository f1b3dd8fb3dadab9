"""The load generator's faults mode (`load_generator.py --faults`, issue 39): careless and hostile clients mixed
with normal ones, then the server's health checked from outside (its answers, /metrics, its memory, its log).

Each request is one kind from KINDS (cycled in a fixed shuffled order); the kind says what the client does and what
the server must answer. Normal requests go through httpx (keep-alive, as real clients); the faults through raw
sockets (asyncio streams), so that a client can stop anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from seer_deploy.models.demos.demo_tasks import heldout_examples

KEY = "faults-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
READ_TIMEOUT = 1.0  # the server's --read-timeout here: the half-sent requests left to time out wait this long
# kind -> share per 100 requests
KINDS = {
    "completion": 20, "chat": 14, "stream": 10, "stream-chat": 6, "models": 3,  # normal: 200, answers checked
    "leave-after-send": 10, "leave-after-first-piece": 8, "leave-mid-body": 5, "leave-mid-headers": 5,  # 499
    "timeout-mid-headers": 1, "timeout-mid-body": 1,  # 408, then closed
    "malformed": 8, "wrong-path": 3, "wrong-method": 3, "wrong-key": 3,  # 400/415, 404, 405, 401
}
NORMAL = ("completion", "chat", "stream", "stream-chat", "models")
LEAVING = ("leave-after-send", "leave-after-first-piece", "leave-mid-body", "leave-mid-headers")
MALFORMED: list[tuple[bytes, str, int]] = [  # body, Content-Type, status
    (b'{"prompt": "sort 1", "max_tokens": true}', "application/json", 400),
    (b'{"prompt": "sort 1", "max_tokens": "16"}', "application/json", 400),
    (b'{"prompt": "sort 1", "max_tokens": 16.0}', "application/json", 400),
    (b'{"prompt": "sort 1", "temperature": "0"}', "application/json", 400),
    (b'{"prompt": "sort 1", "stream": "yes"}', "application/json", 400),
    (b'{"prompt": "sort 1", "seer": "true"}', "application/json", 400),
    (b'{"prompt": "sort 1", "tail_contxt": 0}', "application/json", 400),
    (b'{"prompt": "sort 1"', "application/json", 400),
    (b'["sort 1"]', "application/json", 400),
    (b'{"prompt": "sort 1"}', "text/plain", 415),
    (b'prompt=sort+1', "application/x-www-form-urlencoded", 415),
]
WARNINGS = re.compile(r"Traceback|Exception in ASGI|Task exception was never retrieved|Task was destroyed|"
                      r"was never awaited|Unclosed|Error|error", re.IGNORECASE)


def body(kind: str, prompt: str) -> dict[str, Any]:
    chat = kind in ("chat", "stream-chat")
    out: dict[str, Any] = ({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    if kind.startswith("stream"):
        out["stream"] = True
    return out


def path_of(kind: str) -> str:
    return "/v1/chat/completions" if kind in ("chat", "stream-chat") else "/v1/completions"


def http_bytes(method: str, path: str, data: bytes = b"", content_type: str | None = "application/json",
               auth: bool = True, length: int | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(["Authorization: Bearer " + KEY] if auth else []),
            *([f"Content-Type: {content_type}"] if content_type else []),
            f"Content-Length: {len(data) if length is None else length}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


class Run:
    """One faults run against one server: what was sent, what came back, what did not match."""

    def __init__(self, url: str, prompts: list[str]) -> None:
        self.url, self.prompts = url, prompts
        split = urlsplit(url)
        self.host, self.port = split.hostname or "127.0.0.1", split.port or 80
        self.alone: dict[tuple[str, str], str] = {}
        self.sent = 0
        self.seen: Counter[str] = Counter()  # client-side statuses ("200", "499-left", ...)
        self.problems: list[str] = []

    def problem(self, what: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(what)

    async def reference(self) -> None:
        """Each prompt alone, on both endpoints (the answers every later one must equal)."""
        async with httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=600) as http:
            for prompt in self.prompts:
                for kind in ("completion", "chat"):
                    r = await http.post(path_of(kind), json=body(kind, prompt))
                    self.sent += 1
                    r.raise_for_status()
                    data = r.json()["choices"][0]
                    self.alone[(path_of(kind), prompt)] = data["text"] if kind == "completion" else \
                        data["message"]["content"]

    async def raw(self, data: bytes, until: bytes | None = None, leave: bool = False) -> bytes:
        """Send `data` on a fresh connection; leave at once, or once `until` arrives, or read to the close."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        got = b""
        try:
            writer.write(data)
            await writer.drain()
            if not leave:
                while chunk := await asyncio.wait_for(reader.read(65536), 60):
                    got += chunk
                    if until is not None and until in got:
                        break
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
        return got

    async def one(self, http: httpx.AsyncClient, kind: str, i: int) -> None:
        prompt = self.prompts[i % len(self.prompts)]
        path = path_of(kind)
        data = json.dumps(body(kind, prompt)).encode()
        self.sent += 1
        try:
            if kind in ("completion", "chat"):
                r = await http.post(path, json=body(kind, prompt))
                self.seen[str(r.status_code)] += 1
                choice = r.json()["choices"][0] if r.status_code == 200 else {}
                text = choice.get("text") if kind == "completion" else choice.get("message", {}).get("content")
                if r.status_code != 200 or text != self.alone[(path, prompt)]:
                    self.problem(f"{kind} {prompt!r}: {r.status_code} {text!r} != {self.alone[(path, prompt)]!r}")
            elif kind in ("stream", "stream-chat"):
                pieces = []
                async with http.stream("POST", path, json=body(kind, prompt)) as r:
                    self.seen[str(r.status_code)] += 1
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            event = json.loads(line[6:])
                            choice = event["choices"][0]
                            pieces.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
                if r.status_code != 200 or "".join(pieces) != self.alone[(path, prompt)]:
                    self.problem(f"{kind} {prompt!r}: {r.status_code} {''.join(pieces)!r}")
            elif kind == "models":
                r = await http.get("/v1/models")
                self.seen[str(r.status_code)] += 1
                if r.status_code != 200:
                    self.problem(f"models: {r.status_code}")
            elif kind == "leave-after-send":
                await self.raw(http_bytes("POST", path, data), leave=True)
                self.seen["left"] += 1
            elif kind == "leave-after-first-piece":
                streamed = json.dumps(body("stream" if i % 2 else "stream-chat", prompt)).encode()
                await self.raw(http_bytes("POST", path_of("stream" if i % 2 else "stream-chat"), streamed),
                               until=b"data: ")
                self.seen["left"] += 1
            elif kind == "leave-mid-body":
                await self.raw(http_bytes("POST", path, data[: len(data) // 2], length=len(data)), leave=True)
                self.seen["left"] += 1
            elif kind == "leave-mid-headers":
                await self.raw(http_bytes("POST", path, data)[:40], leave=True)
                self.seen["left"] += 1
            elif kind in ("timeout-mid-headers", "timeout-mid-body"):
                full = http_bytes("POST", path, data)
                cut = full[:40] if kind == "timeout-mid-headers" else full[: full.index(b"\r\n\r\n") + 10]
                self.expect(kind, await self.raw(cut), 408)
            elif kind == "malformed":
                raw_body, content_type, status = MALFORMED[i % len(MALFORMED)]
                self.expect(kind, await self.raw(http_bytes("POST", path, raw_body, content_type), until=b"}}"),
                            status)
            elif kind == "wrong-path":
                self.expect(kind, await self.raw(http_bytes("POST", "/v1/complete", data), until=b"}}"), 404)
            elif kind == "wrong-method":
                self.expect(kind, await self.raw(http_bytes("GET", path, b"", None), until=b"}}"), 405)
            elif kind == "wrong-key":
                self.expect(kind, await self.raw(http_bytes("POST", path, data, auth=i % 2 == 0).replace(
                    KEY.encode(), b"wrong"), until=b"}}"), 401)
        except (TimeoutError, httpx.HTTPError, OSError) as exc:
            self.seen[f"error {type(exc).__name__}"] += 1
            self.problem(f"{kind}: {type(exc).__name__} {exc}")

    def expect(self, kind: str, response: bytes, status: int) -> None:
        """A refusal: its status line and OpenAI's error shape."""
        head, _, rest = response.partition(b"\r\n\r\n")
        got = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.1 ") else "none"
        self.seen[got] += 1
        try:
            error = json.loads(rest[rest.index(b"{"): rest.rindex(b"}") + 1])["error"]
            shaped = {"message", "type", "param", "code"} <= set(error)
        except ValueError:
            shaped = False
        if got != str(status) or not shaped:
            self.problem(f"{kind}: expected {status} in OpenAI's shape, got {response[:300]!r}")

    async def load(self, kinds: list[str], concurrency: int) -> float:
        gate = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=self.url, headers=AUTH, limits=limits, timeout=600) as http:
            async def guarded(kind: str, i: int) -> None:
                async with gate:
                    await self.one(http, kind, i)

            start = time.perf_counter()
            await asyncio.gather(*(guarded(kind, i) for i, kind in enumerate(kinds)))
            return time.perf_counter() - start


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=60).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def total(sample: dict[str, float], name: str, test: Callable[[str], bool] = lambda labels: True) -> float:
    return sum(v for k, v in sample.items() if k.split("{")[0] == name and test(k))


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024  # type: ignore[index]


def run_faults(args: argparse.Namespace, levels: list[int], start_server: Callable[..., Any]) -> int:
    """The run: reference answers, the faults at each concurrency, the checks; writes faults.json / faults.md."""
    prompts = [e.prompt for e in heldout_examples(40)]
    share = [kind for kind, n in KINDS.items() for _ in range(n)]
    random.Random(39).shuffle(share)
    log: list[str] = []
    proc, url = start_server(args.target, args, "--api-key", KEY, "--read-timeout", str(READ_TIMEOUT), log=log)
    rows: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    try:
        run = Run(url, prompts)
        asyncio.run(run.reference())
        before, rss_before = scrape(url), rss_mb(proc.pid)
        per_level = args.requests // len(levels)
        for n, level in enumerate(levels):
            count = per_level if n < len(levels) - 1 else args.requests - per_level * (len(levels) - 1)
            kinds = [share[(n * per_level + i) % len(share)] for i in range(count)]
            seen_before, problems_before = Counter(run.seen), len(run.problems)
            wall = asyncio.run(run.load(kinds, level))
            rows.append({"concurrency": level, "requests": count, "seconds": round(wall, 1),
                         "kinds": dict(Counter(kinds)), "seen": dict(run.seen - seen_before),
                         "problems": len(run.problems) - problems_before, "rss_mb": round(rss_mb(proc.pid), 1)})
            print(json.dumps(rows[-1]), flush=True)
        after = scrape(url)
        for _ in range(600):  # the server settles the last departures on its own loop
            if total(after, "seer_serve_rows_in_flight") == 0:
                break
            time.sleep(0.1)
            after = scrape(url)
        rss_after = rss_mb(proc.pid)
        counted = total(after, "seer_serve_requests_total", lambda k: 'route="/metrics"' not in k)
        by_status: Counter[str] = Counter()  # during the faults (the reference answers' 200s left out)
        for k, v in after.items():
            if k.startswith("seer_serve_requests_total{") and 'route="/metrics"' not in k:
                by_status[k.split('status="')[1].split('"')[0]] += int(v - before.get(k, 0.0))
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(120)
        time.sleep(0.5)  # the reader thread takes the last lines
    finally:
        if proc.poll() is None:
            proc.kill()
    access = [json.loads(line) for line in log if line.startswith("{")]
    drained = [e for e in access if e.get("event") == "drained"]
    other = [line.rstrip() for line in log if not line.startswith("{")]
    warnings = [line for line in other if WARNINGS.search(line)]
    server_5xx = sum(v for s, v in by_status.items() if s.startswith("5"))
    client_5xx = sum(v for s, v in run.seen.items() if s.startswith("5"))
    admitted = total(after, "seer_serve_rows_admitted_total")
    settled = total(after, "seer_serve_rows_settled_total")
    checks = {
        "requests_sent": run.sent,
        "metrics_requests_total": counted,
        "metrics_total_equals_sent": counted == run.sent,
        "statuses_counted": {s: int(v) for s, v in sorted(by_status.items()) if v},
        "statuses_seen_by_clients": dict(sorted(run.seen.items())),
        "5xx_counted": server_5xx, "5xx_seen": client_5xx,
        "answers_checked": sum(rows_["kinds"].get(k, 0) for rows_ in rows for k in NORMAL if k != "models"),
        "problems": len(run.problems), "first_problems": run.problems[:10],
        "rows_admitted": admitted, "rows_settled": settled,
        "rows_settled_by_outcome": {k.split('"')[1]: v for k, v in after.items()
                                    if k.startswith("seer_serve_rows_settled_total{")},
        "rows_dropped_cancelled": total(after, "seer_serve_rows_dropped_total", lambda k: "cancelled" in k),
        "rss_mb_before": round(rss_before, 1), "rss_mb_after": round(rss_after, 1),
        "log_lines": len(log), "log_lines_not_access": len(other), "log_warnings": warnings[:20],
        "drained": drained[0] if drained else None, "exit_code": exit_code,
    }
    ok = (checks["metrics_total_equals_sent"] and server_5xx == 0 and client_5xx == 0 and not run.problems
          and admitted == settled and not warnings and bool(drained)
          and drained[0]["admitted"] == drained[0]["settled"] and exit_code == 128 + signal.SIGTERM)
    checks["ok"] = ok
    command = "python benchmarks/load_generator.py " + shlex.join(sys.argv[1:])
    machine = {"cores": os.cpu_count(), "load_average_after": os.getloadavg()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.json").write_text(json.dumps({"command": command, "machine": machine, "rows": rows,
                                                      "checks": checks}, indent=1) + "\n")
    (args.out / "faults.md").write_text(render(command, rows, checks))
    print(render(command, rows, checks))
    return 0 if ok else 1


def render(command: str, rows: list[dict[str, Any]], checks: dict[str, Any]) -> str:
    lines = [f"```\n{command}\n```", "",
             "| concurrency | requests | seconds | statuses seen by the clients | problems | server RSS after (MB) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        seen = ", ".join(f"{k}: {v}" for k, v in sorted(r["seen"].items()))
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['seconds']} | {seen} | {r['problems']} | "
                     f"{r['rss_mb']} |")
    c = checks
    lines += ["", (f"- requests sent {c['requests_sent']} (the reference answers included); /metrics counted "
              f"{c['metrics_requests_total']:.0f} ({'equal' if c['metrics_total_equals_sent'] else 'NOT equal'})"),
              f"- statuses counted by the server: {c['statuses_counted']}",
              (f"- 5xx counted {c['5xx_counted']:.0f}, seen {c['5xx_seen']}; answers checked against the request alone: "
              f"{c['answers_checked']}, problems {c['problems']}"),
              (f"- rows admitted {c['rows_admitted']:.0f} = settled {c['rows_settled']:.0f} "
              f"({', '.join(f'{k} {v:.0f}' for k, v in c['rows_settled_by_outcome'].items())}); "
              f"rows_dropped{{reason=\"cancelled\"}} {c['rows_dropped_cancelled']:.0f}"),
              f"- RSS {c['rss_mb_before']} MB after the reference answers, {c['rss_mb_after']} MB at the end",
              (f"- log: {c['log_lines']} lines, {c['log_lines_not_access']} not access-log JSON, tracebacks / asyncio "
              f"task warnings: {len(c['log_warnings'])}"),
              f"- SIGTERM: exit {c['exit_code']}, drained {c['drained']}",
              f"- all checks: {'passed' if c['ok'] else 'FAILED'}", ""]
    return "\n".join(lines)
