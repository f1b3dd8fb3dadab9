"""`seer-deploy serve` under client faults (issue 39), against real servers on loopback started and stopped here:
clients that leave at every point of a request's life (one 499 each, no traceback, no asyncio task left behind),
OpenAI's strict types and error shapes (while the openai client and lm-eval's requests still get 200), the row
balance in /metrics, the read deadline and the connection cap (raw sockets for the half-sent requests).

Nothing here asserts a duration, except that a half-sent request is closed within a generous bound of a 1 s
--read-timeout; the points of a request's life are reached by holding the worker (a gate around the engine), not
by sleeping.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import requests

from seer_deploy.cli import main
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
from seer_deploy.serve.batcher import CallBatcher
from seer_deploy.serve.connections import GuardedH11
from seer_deploy.serve.responder import Row
from seer_deploy.service import Service, ServiceOptions, TargetOptions

GEN = GenerationConfig(gen_length=64, steps=64)
PROMPTS = [e.prompt for e in heldout_examples(8)]
KEY = "s3cret"


@pytest.fixture(scope="module")
def export_dir(shared_demo_export: Callable[[str], Path]) -> Path:
    return shared_demo_export("demo")


def serve(export_dir: Path, **options: Any) -> BackgroundServer:
    service = Service(export_dir, ServiceOptions(generation=GEN, batch_size=8, target=TargetOptions(threads=1)))
    return BackgroundServer(create_app(service, ServeOptions(model_name="demo", **options)))


class Gate:
    """Holds the server's worker where a test needs it: before a batch (per call) or a round (step-level) runs, and
    after a streamed row's first settled text (test-only: it wraps the batcher's runner, or the responder's round
    and admission)."""

    def __init__(self, server: BackgroundServer) -> None:
        state = server.server.state
        self.start, self.after_text = threading.Event(), threading.Event()
        self.start.set()
        self.after_text.set()
        if isinstance(state.batcher, CallBatcher):
            self.run = state.batcher._runner
            state.batcher._runner = self.gated
        else:
            responder = state.responder
            self.round, self.admit = responder.round, responder.admit
            responder.round = self.gated_round  # type: ignore[method-assign]
            responder.admit = self.gated_admit  # type: ignore[method-assign]

    def gated(self, rows: list[Row]) -> Sequence[Any]:
        self.start.wait()
        return self.run([self.listening(r) for r in rows])

    def gated_round(self) -> Any:
        self.start.wait()
        return self.round()

    def gated_admit(self, row: Row) -> int:
        return self.admit(self.listening(row))

    def listening(self, row: Row) -> Row:
        return replace(row, on_text=self.holding(row.on_text)) if row.on_text else row

    def holding(self, tell: Callable[[str], None]) -> Callable[[str], None]:
        def told(text: str) -> None:
            tell(text)
            if text:
                self.after_text.wait()

        return told


def metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """/metrics as {sample name with labels: value}."""
    text = httpx.get(f"{url}/metrics", headers=headers).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def total(sample: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in sample.items() if k.split("{")[0] == name and all(w in k for w in want))


def until(condition: Callable[[], bool], what: str, bound: float = 60.0) -> None:
    """Wait for a condition the server reaches on its own loop (a bound against hanging, not a timing check)."""
    end = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.01)


def raw(server: BackgroundServer) -> socket.socket:
    sock = socket.create_connection(server.sock.getsockname()[:2])
    sock.settimeout(60)
    return sock


def post_head(path: str, length: int, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def request_bytes(body: dict[str, Any], path: str = "/v1/completions") -> bytes:
    data = json.dumps(body).encode()
    return post_head(path, len(data)) + data


def read_to_close(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def trickle_until_closed(sock: socket.socket, data: bytes) -> bool:
    """Send `data` a byte every 0.1 s (the wait for an answer paces it); False once the server answers or closes,
    True if the whole of it went through with the connection open."""
    sock.settimeout(0.1)
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
            if sock.recv(65536) is not None:  # an answer (408) or the close
                return False
        except TimeoutError:
            continue
        except OSError:  # reset: closed
            return False
    return True


def loop_of(server: BackgroundServer) -> asyncio.AbstractEventLoop:
    return server.server.servers[0].get_loop()


def tasks(server: BackgroundServer) -> list[str]:
    """The coroutines of the tasks alive on the server's loop (the probe's own excluded)."""
    async def names() -> list[str]:
        me = asyncio.current_task()
        return sorted(t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not me)  # type: ignore[union-attr]

    return asyncio.run_coroutine_threadsafe(names(), loop_of(server)).result(30)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_leaving_at_each_point_is_one_499_with_no_traceback_and_no_task_left(export_dir: Path) -> None:
    """Queued, running, streaming, halfway through its body: each departure is one 499 in /metrics and the access
    log, its rows cancelled (rows_dropped{reason="cancelled"}, settled as cancelled), no 5xx, no log record with
    a traceback, and no asyncio task pending or unretrieved afterwards."""
    log = io.StringIO()
    running = serve(export_dir, access_log=log, max_wait_ms=0)
    with running:
        url, gate = running.url, Gate(running)
        errors: list[dict[str, Any]] = []
        loop_of(running).call_soon_threadsafe(loop_of(running).set_exception_handler,
                                              lambda loop, context: errors.append(context))
        uvicorn_log = Records()
        logging.getLogger("uvicorn.error").addHandler(uvicorn_log)
        before = tasks(running)
        gate.start.clear()
        # Running: the worker takes the row and is held; queued: a second row waits behind it.
        first = raw(running)
        first.sendall(request_bytes({"prompt": PROMPTS[0], "seer": False}))
        until(lambda: total(metrics(url), "seer_serve_rows_in_flight") == 1
              and total(metrics(url), "seer_serve_queue_depth") == 0, "the first row running")
        second = raw(running)
        second.sendall(request_bytes({"prompt": PROMPTS[1], "seer": False}))
        until(lambda: total(metrics(url), "seer_serve_queue_depth") == 1, "the second row queued")
        first.close()
        second.close()
        until(lambda: total(metrics(url), "seer_serve_requests_total", status="499") == 2, "two 499s")
        gate.start.set()
        until(lambda: total(metrics(url), "seer_serve_rows_in_flight") == 0, "the held batch settled")
        # Streaming: the first piece arrives, then the client leaves while the row still runs.
        gate.after_text.clear()
        third = raw(running)
        third.sendall(request_bytes({"prompt": PROMPTS[2], "seer": False, "stream": True, "block_length": 8}))
        received = b""
        while b"data: " not in received:
            received += third.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
        third.close()
        until(lambda: total(metrics(url), "seer_serve_requests_total", status="499") == 3, "the stream's 499")
        gate.after_text.set()
        until(lambda: total(metrics(url), "seer_serve_rows_in_flight") == 0, "the streamed row settled")
        # Halfway through the body.
        fourth = raw(running)
        fourth.sendall(post_head("/v1/completions", 200) + b'{"prompt": "sort 1')
        until(lambda: total(metrics(url), "seer_serve_inflight_requests") == 2, "the body being read")  # + /metrics
        fourth.close()
        until(lambda: total(metrics(url), "seer_serve_requests_total", status="499") == 4, "the half body's 499")
        # A normal request still answers.
        assert httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[3]}).status_code == 200
        sample = metrics(url)
        gc.collect()
        after = tasks(running)
        logging.getLogger("uvicorn.error").removeHandler(uvicorn_log)
    assert after == before, (before, after)
    assert errors == []  # no "Task exception was never retrieved", no "Task was destroyed but it is pending"
    assert [r.getMessage() for r in uvicorn_log.records if r.exc_info or r.levelno >= logging.ERROR] == []
    codes = {k: v for k, v in sample.items() if k.startswith("seer_serve_requests_total{")}
    assert total(sample, "seer_serve_requests_total", route="/v1/completions", status="499") == 4
    assert not any('status="5' in k for k in codes), codes
    assert total(sample, "seer_serve_rows_dropped_total", reason="cancelled") == 3
    assert total(sample, "seer_serve_rows_settled_total", outcome="cancelled") == 3
    assert total(sample, "seer_serve_rows_settled_total", outcome="answered") == 1
    assert total(sample, "seer_serve_rows_admitted_total") == 4
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["status"] for e in lines if e.get("path") == "/v1/completions"] == [499, 499, 499, 499, 200]
    assert lines[-1] == {"event": "drained", "admitted": 4, "settled": 4}


@pytest.fixture(scope="module")
def keyed(export_dir: Path) -> Iterator[BackgroundServer]:
    with serve(export_dir, api_key=KEY) as running:
        yield running


AUTH = {"Authorization": f"Bearer {KEY}"}
COERCIONS = [  # what pydantic's lax mode read as valid, and OpenAI's API refuses
    ({"max_tokens": True}, "max_tokens"), ({"max_tokens": "16"}, "max_tokens"), ({"max_tokens": 16.0}, "max_tokens"),
    ({"temperature": "0"}, "temperature"), ({"stream": "yes"}, "stream"), ({"stream": 1}, "stream"),
    ({"seer": "true"}, "seer"), ({"seed": "1"}, "seed"), ({"steps": 8.5}, "steps"), ({"n": True}, "n"),
    ({"tail_context": "0"}, "tail_context"), ({"stop": 5}, "stop"), ({"top_p": "1"}, "top_p"),
]


@pytest.mark.parametrize(("extra", "param"), COERCIONS)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_coerced_type_is_refused_in_openais_shape_naming_the_field(keyed: BackgroundServer, path: str,
                                                                     extra: dict[str, Any], param: str) -> None:
    body = {"prompt": PROMPTS[0]} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": PROMPTS[0]}]}
    r = httpx.post(f"{keyed.url}{path}", headers=AUTH, json={**body, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]
    assert "\n" not in error["message"]


def test_every_refusal_is_in_openais_shape_and_real_clients_still_get_200(keyed: BackgroundServer) -> None:
    url = keyed.url

    def refused(r: httpx.Response | requests.Response, status: int, fragment: str) -> dict[str, Any]:
        assert r.status_code == status, r.text
        error: dict[str, Any] = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and fragment in error["message"], error
        return error

    body = json.dumps({"prompt": PROMPTS[0]})
    for headers in ({"Content-Type": "text/plain"}, {}, {"Content-Type": "application/x-www-form-urlencoded"}):
        refused(httpx.post(f"{url}/v1/completions", headers={**AUTH, **headers}, content=body), 415,
                "Content-Type: application/json")
    refused(httpx.post(f"{url}/v1/chat/completions", headers=AUTH, json={"messages": "hi"}), 400, "messages")
    refused(httpx.post(f"{url}/v1/completions", headers=AUTH, json=[1, 2]), 400, "not a JSON object")
    refused(httpx.post(f"{url}/v1/completions", headers=AUTH, content=b"{", ), 415, "application/json")
    refused(httpx.post(f"{url}/v1/completions", headers={**AUTH, "Content-Type": "application/json"}, content=b"{"),
            400, "not valid JSON")
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/completions"), ("DELETE", "/")):
        refused(httpx.request(method, f"{url}{path}", headers=AUTH), 404, "no route")
    for method, path, allowed in (("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
                                  ("POST", "/v1/models", "GET"), ("POST", "/metrics", "GET")):
        r = httpx.request(method, f"{url}{path}", headers=AUTH)
        refused(r, 405, "not allowed")
        assert allowed in {m.strip() for m in r.headers["allow"].split(",")}
    assert refused(httpx.post(f"{url}/v1/completions", json={"prompt": "x"}), 401, "API key")["type"] == \
        "authentication_error"
    # The official openai client, streaming and not.
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    plain = oa.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=64, temperature=0, seed=1)
    streamed = "".join(c.choices[0].text for c in oa.completions.create(model="demo", prompt=PROMPTS[0], stream=True))
    chat = oa.chat.completions.create(model="demo", messages=[{"role": "user", "content": PROMPTS[0]}],
                                      max_completion_tokens=64, temperature=0.0)
    assert plain.choices[0].text and plain.choices[0].text == streamed == chat.choices[0].message.content
    # lm-eval's local-completions / local-chat-completions payloads (lm_eval/models/openai_completions.py), sent as
    # its TemplateAPI sends them: requests (json=) and aiohttp (json=), a bearer token.
    completions: dict[str, Any] = {"prompt": PROMPTS[:2], "model": "demo", "max_tokens": 64, "temperature": 0, "stop": ["\n\n"],
                   "seed": 1234}
    chats: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPTS[0]}], "model": "demo", "max_tokens": 64,
             "temperature": 0, "stop": ["\n\n"], "seed": 1234}
    answer = requests.post(f"{url}/v1/completions", json=completions, headers=AUTH, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == plain.choices[0].text
    answer = requests.post(f"{url}/v1/chat/completions", json=chats, headers=AUTH, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == plain.choices[0].text

    async def aio() -> list[int]:
        async with aiohttp.ClientSession() as session:
            statuses = []
            for path, payload in (("/v1/completions", completions), ("/v1/chat/completions", chats)):
                async with session.post(f"{url}{path}", json=payload, headers=AUTH) as response:
                    statuses.append(response.status)
            return statuses

    assert asyncio.run(aio()) == [200, 200]
    if shutil.which("curl"):
        done = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", f"{url}/v1/completions", "-H",
                               "Content-Type: application/json", "-H", f"Authorization: Bearer {KEY}", "-d",
                               json.dumps({"prompt": PROMPTS[0]})], capture_output=True, text=True, check=True)
        assert done.stdout.rsplit("\n", 1)[1] == "200"
        done = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", f"{url}/v1/completions", "-H",
                               f"Authorization: Bearer {KEY}", "-d", json.dumps({"prompt": PROMPTS[0]})],
                              capture_output=True, text=True, check=True)  # curl -d alone: a form, refused
        assert done.stdout.rsplit("\n", 1)[1] == "415" and "application/json" in done.stdout


def test_the_row_balance_holds_in_every_scrape(export_dir: Path) -> None:
    """admitted = settled (answered + refused + expired + cancelled) + in flight in every scrape while 96
    requests run at concurrency 16, some of which leave early; and at the end nothing is in flight."""
    with serve(export_dir, max_batch=8) as running:
        url, stop, scrapes = running.url, threading.Event(), []

        def scrape() -> None:
            while not stop.is_set():
                scrapes.append(metrics(url))

        scraper = threading.Thread(target=scrape)
        scraper.start()

        async def load() -> list[int | str]:
            gate = asyncio.Semaphore(16)
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                async def one(i: int) -> int | str:
                    async with gate:
                        body = {"prompt": PROMPTS[i % len(PROMPTS)], "steps": 8 if i % 3 else 64}
                        try:
                            r = await http.post("/v1/completions", json=body, timeout=None if i % 5 else 0.05)
                        except httpx.TimeoutException:
                            return "left"
                        return r.status_code

                return await asyncio.gather(*(one(i) for i in range(96)))

        outcomes = asyncio.run(load())
        until(lambda: total(metrics(url), "seer_serve_rows_in_flight") == 0, "every row settled")
        stop.set()
        scraper.join()
        final = metrics(url)
    assert set(outcomes) <= {200, "left"} and outcomes.count(200) >= sum(1 for i in range(96) if i % 5)
    assert len(scrapes) > 5
    for sample in [*scrapes, final]:
        admitted = total(sample, "seer_serve_rows_admitted_total")
        settled = total(sample, "seer_serve_rows_settled_total")
        assert admitted == settled + total(sample, "seer_serve_rows_in_flight"), sample
    # Every request answered was admitted; one whose client left within 0.05 s may have left before its body was
    # read (a 499, never admitted: on a loaded machine the event loop may not get to it in time).
    admitted = total(final, "seer_serve_rows_admitted_total")
    assert admitted == total(final, "seer_serve_rows_settled_total") and outcomes.count(200) <= admitted <= 96
    assert total(final, "seer_serve_rows_settled_total", outcome="refused") == 0
    served = total(final, "seer_serve_requests_total", route="/v1/completions", status="200")
    left = total(final, "seer_serve_requests_total", route="/v1/completions", status="499")
    assert served + left == 96 and outcomes.count(200) <= served and left <= outcomes.count("left")
    # a client that left cancelled its row, unless its answer was already on its way (then answered, not delivered)
    assert total(final, "seer_serve_rows_settled_total", outcome="cancelled") <= left


@pytest.mark.parametrize("http", ["auto", "h11"])
def test_a_half_sent_request_is_closed_within_the_read_timeout(export_dir: Path, http: str) -> None:
    """--read-timeout 1: half the headers, or the headers and half the body, get 408 in OpenAI's shape and the
    connection closed; a connection that sends nothing is closed; the deadline is not stretched by trickling;
    malformed HTTP gets 400 in OpenAI's shape. On uvicorn's default protocol (httptools here) and on h11."""
    running = serve(export_dir, read_timeout_s=1.0)
    if http == "h11":
        running.server.config.http = GuardedH11  # before it starts: uvicorn loads the protocol class then
    with running:
        url = running.url
        garbage = raw(running)
        garbage.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        malformed = read_to_close(garbage)
        garbage.close()
        answers = []
        for sent in (b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: appl",
                     post_head("/v1/completions", 500) + b'{"prompt": "sort 12'):
            sock = raw(running)
            start = time.monotonic()
            sock.sendall(sent)
            answers.append((read_to_close(sock), time.monotonic() - start))
            sock.close()
        silent = raw(running)
        start = time.monotonic()
        assert read_to_close(silent) == b"" and time.monotonic() - start < 30
        silent.close()
        trickle = raw(running)
        stretched = trickle_until_closed(trickle, b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n" +
                                         b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 4)
        trickle.close()
        sample = metrics(url)
        assert httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0]}).status_code == 200
    for response, seconds in answers:
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), response
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and "--read-timeout" in error["message"]
        assert seconds < 30  # 1 s asked; generous for a loaded machine
    head, _, rest = malformed.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and json.loads(rest)["error"]["type"] == "invalid_request_error"
    assert total(sample, "seer_serve_requests_total", route="other", status="400") == 1
    assert not stretched  # closed while a byte still came every 0.1 s (the whole trickle takes about 20 s)
    assert total(sample, "seer_serve_requests_total", status="408") >= 2


def test_connections_beyond_the_cap_get_503_in_openais_shape(export_dir: Path) -> None:
    with serve(export_dir, max_connections=4) as running:
        url = running.url
        idle = [raw(running) for _ in range(4)]
        until(lambda: len(running.server.server_state.connections) == 4, "four connections held")
        r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0]})
        assert r.status_code == 503 and r.headers["connection"] == "close" and "retry-after" in r.headers
        error = r.json()["error"]
        assert error["type"] == "server_error" and "--max-connections" in error["message"]
        for sock in idle:
            sock.close()
        until(lambda: len(running.server.server_state.connections) == 0, "the idle connections closed")
        assert httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0]}).status_code == 200
        assert total(metrics(url), "seer_serve_requests_total", status="503") == 1


def test_the_new_flags_are_checked_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, fragment in ((["--read-timeout", "0"], "--read-timeout is 0"),
                           (["--max-connections", "0"], "--max-connections is 0")):
        with pytest.raises(SystemExit) as exc:
            main(["serve", "no-such-target", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and fragment in err, err
