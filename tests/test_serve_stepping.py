"""`serve --batching step`: rows join and leave the running batch between passes (issue 46), on servers started and
stopped here on loopback, over the demo's ONNX export (with its KV cache graphs).

Nothing waits on time: the backend is gated (`PassGate`: it makes the passes a test allows, then holds), so "the long
row is still running" is a fact the test arranged, not a race it hopes to win.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.runtime.targets import TargetOptions
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
from seer_deploy.service import Service, ServiceOptions

GEN = GenerationConfig(gen_length=64, steps=64)
PROMPTS = [e.prompt for e in heldout_examples(24)]
LONG = {"max_tokens": 128, "seer": False}  # a full 128-pass canvas
SHORT = {"max_tokens": 16}  # Seer on: a handful of passes


@pytest.fixture(scope="module")
def export_dir(shared_demo_export: Callable[[str], Path]) -> Path:
    return shared_demo_export("demo-kv")


@pytest.fixture(scope="module")
def reference(export_dir: Path) -> Service:
    """A service of its own for the solo answers."""
    return Service(export_dir, ServiceOptions(generation=GEN, batch_size=1, target=TargetOptions(threads=1)))


def options(**given: Any) -> ServeOptions:
    """The servers' options: a deadline far beyond what a loaded machine needs (no 504 in these tests)."""
    return ServeOptions(model_name="demo", timeout_s=3600, **given)


def open_service(export_dir: Path, generation: GenerationConfig = GEN) -> Service:
    return Service(export_dir, ServiceOptions(generation=generation, batch_size=32, target=TargetOptions(threads=1)))


class PassGate:
    """The backend makes the passes a test allows, then holds (test-only: wraps the backend's calls); it records
    each pass's input shape."""

    def __init__(self, service: Service) -> None:
        self.cond = threading.Condition()
        self.allowed = self.made = self.waiting = 0
        self.shapes: list[tuple[int, ...]] = []
        backend = service.backend
        for name in ("step0", "step", "refresh", "window_step"):
            setattr(backend, name, self.gated(getattr(backend, name)))

    def gated(self, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(inputs: Any) -> Any:
            with self.cond:
                while self.made >= self.allowed:
                    self.waiting += 1
                    self.cond.notify_all()
                    self.cond.wait()
                    self.waiting -= 1
                self.made += 1
                self.shapes.append(tuple(inputs[0].shape))
            return call(inputs)

        return run

    def allow(self, passes: int) -> None:
        with self.cond:
            self.allowed += passes
            self.cond.notify_all()

    def held(self) -> None:
        """Return once every allowed pass is made and the worker waits for the next (bounded against hanging)."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.made == self.allowed and self.waiting > 0, timeout=120), \
                "the worker never got held"


def solo(reference: Service, prompt: str, size: int, seer: bool = True, kv_cache: bool = False) -> str:
    """The request alone, at the server's size for it (max_tokens a size here) and one token a step."""
    config = GenerationConfig(gen_length=size, steps=size, kv_cache=kv_cache)
    return reference.generate([Prompt(prompt)], generation=config, full_length=not seer).answers[0].text


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=300)


def metric(url: str, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line and not line.startswith("#")
               and line.split("{")[0].split(" ")[0] == name and all(w in line for w in want))


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a state the server reaches on its own (a bound against hanging, not a timing check)."""
    for _ in range(12000):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"never happened: {what}")


@pytest.mark.parametrize("batching", ["step", "call"])
def test_a_request_arriving_while_a_long_one_runs_is_answered_first(export_dir: Path, reference: Service,
                                                                      batching: str) -> None:
    """The long row (128 passes) is held by the gate after 60 passes in all; a short request sent after its step
    zero is answered within them (step-level), both answers equal alone. Per call, the short request is still
    waiting when the gate holds: the same check fails on the old batcher."""
    service = open_service(export_dir)
    gate = PassGate(service)
    with BackgroundServer(create_app(service, options(batching=batching))) as server, \
            ThreadPoolExecutor(2) as pool:
        long = pool.submit(post, server.url, {"prompt": PROMPTS[0], **LONG})
        gate.held()
        gate.allow(2)  # the long row's step zero and one more pass
        gate.held()
        short = pool.submit(post, server.url, {"prompt": PROMPTS[1], **SHORT})
        until(lambda: metric(server.url, "seer_serve_rows_admitted_total") == 2, "the short request admitted")
        gate.allow(58)
        gate.held()
        if batching == "call":
            assert not short.done() and not long.done()
            gate.allow(10**6)
            assert short.result().status_code == 200
            return
        answered = short.result(timeout=120)
        assert answered.status_code == 200 and not long.done()
        assert answered.json()["choices"][0]["text"] == solo(reference, PROMPTS[1], 16)
        gate.allow(10**6)
        assert long.result().json()["choices"][0]["text"] == solo(reference, PROMPTS[0], 128, seer=False)


def test_a_cancelled_row_leaves_at_the_next_pass_and_its_slot_is_used(export_dir: Path, reference: Service) -> None:
    """One live row at most: a long row runs, a short one waits for its slot; the long row's client leaves. The
    pass in flight finishes, then every pass is the short row's (its input shape), and it answers as alone."""
    service = open_service(export_dir)
    gate = PassGate(service)
    with BackgroundServer(create_app(service, options(max_batch=1))) as server, \
            ThreadPoolExecutor(1) as pool:
        leaving = socket.create_connection(server.sock.getsockname()[:2])
        data = httpx.Request("POST", f"{server.url}/v1/completions", json={"prompt": PROMPTS[2], **LONG})
        leaving.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(data.content)}\r\n\r\n".encode() + data.content)
        gate.held()
        gate.allow(3)
        gate.held()
        waiting = pool.submit(post, server.url, {"prompt": PROMPTS[3], **SHORT})
        until(lambda: metric(server.url, "seer_serve_queue_depth") == 1, "the short row queued behind the long")
        leaving.close()
        until(lambda: metric(server.url, "seer_serve_requests_total", status="499") == 1, "the client's 499")
        before = len(gate.shapes)
        gate.allow(10**6)
        answer = waiting.result(timeout=120)
        assert answer.json()["choices"][0]["text"] == solo(reference, PROMPTS[3], 16)
        after = gate.shapes[before:]
        long_width = gate.shapes[0][1]
        assert sum(1 for shape in after if shape[1] == long_width) <= 1, after  # only the pass in flight
        assert metric(server.url, "seer_serve_rows_settled_total", outcome="cancelled") == 1
        assert metric(server.url, "seer_serve_rows_settled_total", outcome="answered") == 1


def test_a_row_past_its_deadline_is_504_and_leaves_at_the_next_pass(export_dir: Path) -> None:
    """The gate holds the worker inside a round; the request's deadline passes (504); once the gate opens, the pass
    in flight ends and the row makes no further pass (settled as expired)."""
    service = open_service(export_dir)
    gate = PassGate(service)
    app = create_app(service, ServeOptions(model_name="demo", timeout_s=1.0))
    with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
        late = pool.submit(post, server.url, {"prompt": PROMPTS[8], **LONG})
        gate.held()
        answer = late.result(timeout=120)
        assert answer.status_code == 504 and "deadline" in answer.json()["error"]["message"]
        gate.allow(10**6)
        until(lambda: metric(server.url, "seer_serve_rows_in_flight") == 0, "the row settled")
        assert gate.made == 1  # its step zero, in flight when the deadline passed; nothing after it
        assert metric(server.url, "seer_serve_rows_settled_total", outcome="expired") == 1


def test_rows_of_different_temperatures_and_sizes_share_passes(export_dir: Path, reference: Service) -> None:
    """Greedy and sampled rows, three sizes, Seer on and off, one with the KV cache off and on: held until all are
    queued, then they run together; passes mixing settings and mixing step zero with later steps are counted, and
    every answer equals its request alone (the sampled one its seeded solo run)."""
    service = open_service(export_dir)
    gate = PassGate(service)
    bodies = [{"prompt": PROMPTS[4], "max_tokens": 64, "seer": False},
              {"prompt": PROMPTS[5], "max_tokens": 16},
              {"prompt": PROMPTS[6], "max_tokens": 32, "temperature": 6.0, "seed": 3},
              {"prompt": PROMPTS[7], "max_tokens": 32, "temperature": 0.5, "seer": False}]
    with BackgroundServer(create_app(service, options())) as server, \
            ThreadPoolExecutor(len(bodies)) as pool:
        first = pool.submit(post, server.url, bodies[0])
        gate.held()
        gate.allow(1)
        gate.held()
        rest = [pool.submit(post, server.url, b) for b in bodies[1:]]
        until(lambda: metric(server.url, "seer_serve_queue_depth") == 3, "three rows queued")
        gate.allow(10**6)
        texts = [f.result(timeout=300).json()["choices"][0]["text"] for f in (first, *rest)]
        assert metric(server.url, "seer_serve_mixed_passes_total", mixes="settings") > 0
        assert metric(server.url, "seer_serve_mixed_passes_total", mixes="steps") > 0
        assert metric(server.url, "seer_serve_round_admitted_rows_sum") >= 3
    sampled = GenerationConfig(gen_length=32, steps=32, temperature=6.0)
    want = [solo(reference, PROMPTS[4], 64, seer=False), solo(reference, PROMPTS[5], 16),
            reference.generate([Prompt(PROMPTS[6])], generation=sampled, seed=3).answers[0].text,
            reference.generate([Prompt(PROMPTS[7])], generation=GenerationConfig(gen_length=32, steps=32,
                                                                                temperature=0.5),
                               full_length=True, seed=0).answers[0].text]
    assert texts == want


def test_the_balance_holds_under_a_burst_with_clients_leaving(export_dir: Path, reference: Service) -> None:
    """A burst of mixed requests (short and long, Seer on and off, streamed, cached), a third of whose clients
    leave early: every scrape reads admitted = settled + in flight; at the end every row settled, answered or
    cancelled, and every answer that arrived equals its request alone."""
    service = open_service(export_dir, GenerationConfig(gen_length=64, steps=64, kv_cache=True))
    bodies: list[dict[str, Any]] = [{"prompt": PROMPTS[i % len(PROMPTS)], **(LONG if i % 3 == 0 else SHORT),
               **({"stream": True} if i % 4 == 1 else {})} for i in range(24)]
    scrapes: list[tuple[float, float, float]] = []

    async def burst(url: str) -> list[str | None]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:
            async def one(i: int) -> str | None:
                sending = http.post("/v1/completions", json=bodies[i])
                try:  # a third of the clients leave soon after sending
                    response = await (asyncio.wait_for(sending, 0.05 * (i % 5)) if i % 3 == 2 else sending)
                except TimeoutError:
                    return None
                assert response.status_code == 200, response.text
                if bodies[i].get("stream"):
                    return "".join(chunk["choices"][0]["text"] for chunk in _events(response.text))
                return str(response.json()["choices"][0]["text"])

            async def scrape() -> None:
                while True:
                    text = (await http.get("/metrics")).text
                    scrapes.append((_sample(text, "seer_serve_rows_admitted_total"),
                                    _sample(text, "seer_serve_rows_settled_total"),
                                    _sample(text, "seer_serve_rows_in_flight")))
                    await asyncio.sleep(0.02)

            watcher = asyncio.ensure_future(scrape())
            try:
                return await asyncio.gather(*(one(i) for i in range(len(bodies))))
            finally:
                watcher.cancel()

    with BackgroundServer(create_app(service, options())) as server:
        answers = asyncio.run(burst(server.url))
        until(lambda: metric(server.url, "seer_serve_rows_in_flight") == 0, "every row settled")
        admitted = metric(server.url, "seer_serve_rows_admitted_total")
        answered = metric(server.url, "seer_serve_rows_settled_total", outcome="answered")
        cancelled = metric(server.url, "seer_serve_rows_settled_total", outcome="cancelled")
    assert scrapes and all(a == s + f for a, s, f in scrapes)
    assert admitted == answered + cancelled and cancelled > 0
    for body, got in zip(bodies, answers, strict=True):
        if got is not None:
            assert got == solo(reference, str(body["prompt"]), int(body["max_tokens"]), body.get("seer") is not False,
                               kv_cache=True), body


def _events(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        if line.startswith("data: {") and '"choices"' in line:
            yield json.loads(line[len("data: "):])


def _sample(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)

