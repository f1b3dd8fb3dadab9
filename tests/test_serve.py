"""`seer-deploy serve`: the OpenAI-compatible server on the demo's ONNX export (and demo-vl), on loopback.

The answers are checked against `Service.generate` run solo on the same prompts (the CLI's path), through the
official `openai` client, streaming and not; a 1,000-request load at concurrency 32 gets every answer right with
zero errors; a small queue refuses the excess with 429 and loses or duplicates nothing; a SIGTERM during load
answers every request the server admitted. Each server runs in a thread (or, for SIGTERM, a subprocess) on
127.0.0.1 with port 0, and is stopped by its test.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from seer_deploy.cli import main
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
from seer_deploy.serve.sizes import gen_length_for, request_generation, supported_sizes
from seer_deploy.service import Prompt, Run, Service, ServiceOptions, TargetOptions

GEN = GenerationConfig(gen_length=64, steps=64)
FAST = GenerationConfig(gen_length=64, steps=8)  # the load tests' setting: 8 tokens a step, as requests ask
PROMPTS = [e.prompt for e in heldout_examples(40)]


@pytest.fixture(scope="module")
def export_dir(shared_demo_export: Callable[[str], Path]) -> Path:
    """The demo's ONNX export (the run's shared one)."""
    return shared_demo_export("demo")


def open_service(target: str | Path, batch_size: int = 32) -> Service:
    return Service(target, ServiceOptions(generation=GEN, batch_size=batch_size, target=TargetOptions(threads=1)))


@pytest.fixture(scope="module")
def reference(export_dir: Path) -> Service:
    """A service of its own for the solo answers (a served Service belongs to its server's worker)."""
    return open_service(export_dir, batch_size=1)


def solo(service: Service, prompt: str, generation: GenerationConfig = GEN, full_length: bool = False) -> Run:
    return service.generate([Prompt(prompt)], generation=generation, full_length=full_length)


@pytest.fixture(scope="module")
def server(export_dir: Path) -> Iterator[BackgroundServer]:
    log = io.StringIO()
    app = create_app(open_service(export_dir), ServeOptions(model_name="demo", max_batch=32, max_wait_ms=5,
                                                            max_queue=1024, access_log=log))
    with BackgroundServer(app) as running:
        yield running
    assert '"event": "drained"' in log.getvalue()


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_a_sampled_request_is_its_seeded_solo_run(server: BackgroundServer, reference: Service) -> None:
    """temperature > 0 with a seed: the answer of `generate --temperature T --seed S` (the row runs alone), so two
    seeds give (here) different answers and one seed the same answer twice."""
    oa = client(server.url)
    sampled = replace(GEN, temperature=6.0)  # the demo is so sure of itself that milder ones sample one answer
    answers = {}
    for seed in (3, 4):
        want = reference.generate([Prompt(PROMPTS[5])], generation=sampled, seed=seed).answers[0].tokens
        got = [oa.completions.create(model="demo", prompt=PROMPTS[5], temperature=6.0, seed=seed)
               for _ in range(2)]
        assert got[0].choices[0].text == got[1].choices[0].text
        answers[seed] = got[0].choices[0].text
        assert got[0].choices[0].text == reference.tokenizer.decode_answer(want)
    assert answers[3] != answers[4]


def test_a_stream_sends_the_answer_as_it_settles(server: BackgroundServer, reference: Service) -> None:
    """Denoising blocks of 8: the stream carries the settled text block by block (several content chunks, the first
    before the answer is done), and the pieces add up to the solo answer."""
    oa = client(server.url)
    blocks = replace(GEN, block_length=8)
    for prompt in PROMPTS[6:9]:
        expected = reference.generate([Prompt(prompt)], generation=blocks, full_length=True).answers[0]
        chunks = list(oa.completions.create(model="demo", prompt=prompt, stream=True,
                                            extra_body={"block_length": 8, "seer": False}))
        pieces = [c.choices[0].text for c in chunks if c.choices[0].text]
        assert "".join(pieces) == expected.text and len(pieces) >= 2, pieces
        assert chunks[-1].choices[0].finish_reason == "stop"
        chat = list(oa.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                               stream=True, extra_body={"block_length": 8, "seer": False}))
        assert chat[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chat) == expected.text


def test_the_openai_client_gets_the_solo_answers_streaming_and_not(server: BackgroundServer,
                                                                   reference: Service) -> None:
    oa = client(server.url)
    assert [m.id for m in oa.models.list().data] == ["demo"]
    for prompt in PROMPTS[:3]:
        expected = solo(reference, prompt).answers[0]
        assert expected.seer is not None and expected.text
        plain = oa.completions.create(model="demo", prompt=prompt, max_tokens=64)
        assert plain.choices[0].text == expected.text and plain.choices[0].finish_reason == "stop"
        usage: Any = plain.usage
        assert usage.seer["kept"] == expected.seer.kept and usage.passes == expected.passes
        assert usage.seer["tokens_processed"] == expected.seer.tokens_processed < usage.seer["full_tokens_processed"]
        assert usage.completion_tokens == expected.tokens.index(reference.info.eos_id)
        chat = oa.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}])
        assert chat.choices[0].message.content == expected.text
        chunks = list(oa.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                                 stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
        assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage is not None
        streamed = list(oa.completions.create(model="demo", prompt=prompt, stream=True))
        assert "".join(c.choices[0].text for c in streamed) == expected.text
    # Seer's extras and the length rule: full length, a shorter canvas, a cut answer.
    full = solo(reference, PROMPTS[3], full_length=True).answers[0]
    off = oa.completions.create(model="demo", prompt=PROMPTS[3], extra_body={"seer": False})
    assert off.choices[0].text == full.text and off.usage.seer is None  # type: ignore[union-attr]
    at32 = solo(reference, PROMPTS[3], GenerationConfig(gen_length=32, steps=32)).answers[0]
    short = oa.completions.create(model="demo", prompt=PROMPTS[3], max_tokens=20)  # rounds up to 32
    assert short.usage.gen_length == 32  # type: ignore[union-attr]
    assert short.choices[0].text == at32.text
    cut = oa.completions.create(model="demo", prompt=PROMPTS[3], max_tokens=2)  # canvas 16, answer cut to 2 tokens
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 2  # type: ignore[union-attr]


def test_a_picture_as_a_data_url_gets_the_solo_answer(tmp_path: Path) -> None:
    from seer_deploy.models.demos.demo_vl_tasks import heldout_examples as picture_examples

    example = picture_examples(1)[0]
    picture = example.image()
    expected = open_service("demo-vl", 1).generate([Prompt(example.prompt, (picture,))]).answers[0]
    png = io.BytesIO()
    picture.save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    task = example.prompt.replace("<image>", "").strip()
    with BackgroundServer(create_app(open_service("demo-vl", 4), ServeOptions(model_name="demo-vl"))) as running:
        oa = client(running.url)
        content: Any = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": task}]
        answer = oa.chat.completions.create(model="demo-vl", messages=[{"role": "user", "content": content}])
        streamed = oa.chat.completions.create(model="demo-vl", messages=[{"role": "user", "content": content}],
                                              stream=True)
        assert answer.choices[0].message.content == expected.text
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected.text
        with pytest.raises(openai.BadRequestError, match="not a base64 data URL"):
            oa.chat.completions.create(model="demo-vl", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": task}]}])


async def _load(url: str, bodies: list[dict[str, Any]], concurrency: int, fresh: bool = False,
                after: tuple[int, Callable[[], None]] | None = None) -> list[httpx.Response | Exception]:
    """POST each body to /v1/completions with `concurrency` in flight; a response or the exception per body.
    fresh: a new connection per request. after (n, call): call() once the n-th answer is back."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0 if fresh else concurrency)
    answered = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        async def one(body: dict[str, Any]) -> httpx.Response | Exception:
            nonlocal answered
            async with gate:
                try:
                    response = await http.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    return exc
            answered += 1
            if after is not None and answered == after[0]:
                after[1]()
            return response

        return await asyncio.gather(*(one(b) for b in bodies))


def _bodies(n: int) -> list[dict[str, Any]]:
    """n requests over the 40 prompts: 8 steps (8 tokens a step) and the paper's cut (tail_context 0), so the
    rows' step counts follow their kept lengths; the first prompt at full length (a batch kind of its own)."""
    return [{"prompt": PROMPTS[i % len(PROMPTS)], "steps": 8, "tail_context": 0} if i % len(PROMPTS) else
            {"prompt": PROMPTS[0], "steps": 8, "seer": False} for i in range(n)]


def _expected(reference: Service) -> dict[str, str]:
    """Each prompt's solo answer under _bodies' settings."""
    cut = replace(reference.seer, tail_context=0) if reference.seer is not None else None
    return {p: reference.generate([Prompt(p)], generation=FAST, full_length=i == 0, seer=cut).answers[0].text
            for i, p in enumerate(PROMPTS)}


def test_a_thousand_requests_at_concurrency_32_all_answer_as_solo(server: BackgroundServer,
                                                                  reference: Service) -> None:
    expected = _expected(reference)
    bodies = _bodies(1000)
    responses = asyncio.run(_load(server.url, bodies, 32))
    errors = [r for r in responses if not isinstance(r, httpx.Response) or r.status_code != 200]
    assert errors == []
    for body, response in zip(bodies, responses, strict=True):
        assert isinstance(response, httpx.Response)
        assert response.json()["choices"][0]["text"] == expected[body["prompt"]], body
    metrics = httpx.get(f"{server.url}/metrics").text
    batches = _sample(metrics, "seer_serve_batch_size_count")
    assert _sample(metrics, "seer_serve_rows_total") >= 1000
    assert batches < 500  # rows were batched (each batch one Service.generate call)
    assert _sample(metrics, "seer_serve_tokens_processed_total") < _sample(metrics, "seer_serve_full_length_tokens_total")


def _sample(metrics: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.split("{")[0].split(" ")[0] == name)


def test_a_small_queue_refuses_the_excess_with_429_and_loses_nothing(export_dir: Path, reference: Service) -> None:
    expected = _expected(reference)
    app = create_app(open_service(export_dir, 4), ServeOptions(max_batch=4, max_wait_ms=20, max_queue=4,
                                                               retry_after_s=2))
    bodies = _bodies(48)
    with BackgroundServer(app) as running:
        responses = asyncio.run(_load(running.url, bodies, 24))
        metrics = httpx.get(f"{running.url}/metrics").text
    batcher = app.state.serve.batcher
    codes = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in responses]
    assert set(codes) == {200, 429}, codes
    refused = [r for r in responses if isinstance(r, httpx.Response) and r.status_code == 429]
    assert all(r.headers["retry-after"] == "2" and "queue is full" in r.json()["error"]["message"] for r in refused)
    answered = [(b, r) for b, r in zip(bodies, responses, strict=True)
                if isinstance(r, httpx.Response) and r.status_code == 200]
    for body, response in answered:
        assert response.json()["choices"][0]["text"] == expected[body["prompt"]]
    ids = [r.json()["id"] for _, r in answered]
    assert len(set(ids)) == len(ids)  # no answer delivered twice
    assert batcher.admitted == batcher.settled == len(answered)  # every admitted row answered once, none lost
    assert _sample(metrics, 'seer_serve_rows_dropped_total') == len(refused)


def test_limits_auth_deadline_and_operations(export_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long_prompt = "reverse " + "1" * 300
    assert main_exit(["generate", str(export_dir), "--prompt", long_prompt, "--gen-length", "64"]) == 2
    cli_message = capsys.readouterr().err.strip().removeprefix("error: ")
    assert "exceeds the model's" in cli_message
    # Per call: the queue's wait to fill a batch holds a row past its deadline (step-level: test_serve_stepping).
    app = create_app(open_service(export_dir, 4), ServeOptions(api_key="s3cret", max_body_bytes=2048, batching="call",
                                                               max_wait_ms=2000, timeout_s=0.3))
    with BackgroundServer(app) as running:
        auth = {"Authorization": "Bearer s3cret"}
        url = running.url
        assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/ready").json()["ready"]
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert "seer_serve_queue_depth" in httpx.get(f"{url}/metrics", headers=auth).text
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model="x", prompt="sort 1")
        r = httpx.post(f"{url}/v1/completions", headers=auth, json={"prompt": long_prompt})
        assert r.status_code == 400 and r.json()["error"]["message"] == cli_message
        r = httpx.post(f"{url}/v1/completions", headers=auth, json={"prompt": "sort 1" + " " * 4000})
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]
        for body, fragment in (({"prompt": "sort 1", "tail_contxt": 1}, "unknown field 'tail_contxt'"),
                               ({"prompt": "sort 1", "max_tokens": 5000}, "above the largest response size"),
                               ({"prompt": "sort 1", "seer": False, "tail_context": 2}, "tail_context applies"),
                               ({"prompt": "sort 1", "steps": 7, "block_length": 16}, "cannot be split evenly"),
                               ({"prompt": ""}, "prompt is empty"),
                               ({"prompt": "sort 1", "model": "other"}, "is not served here")):
            r = httpx.post(f"{url}/v1/completions", headers=auth, json=body)
            assert r.status_code in (400, 404) and fragment in r.json()["error"]["message"], (body, r.text)
        # The queue waits 2 s to fill a batch; the deadline is 0.3 s: the row is dropped before it runs.
        r = httpx.post(f"{url}/v1/completions", headers=auth, json={"prompt": "sort 1"})
        assert r.status_code == 504 and "deadline" in r.json()["error"]["message"]
        # A client that gives up leaves the queue too.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", headers=auth, json={"prompt": "sort 2"}, timeout=0.1)
        batcher = app.state.serve.batcher
        metrics = ""
        for _ in range(200):  # the server notices the disconnect on its loop; wait for it to say so
            metrics = httpx.get(f"{url}/metrics", headers=auth).text
            if 'reason="cancelled"' in metrics:
                break
            threading.Event().wait(0.01)
        assert _sample(metrics, "seer_serve_rows_dropped_total") == 2 and 'reason="cancelled"' in metrics
        assert batcher.admitted == batcher.settled == 2
        for outcome, rows in (("answered", 0), ("refused", 0), ("expired", 1), ("cancelled", 1)):
            assert f'seer_serve_rows_settled_total{{outcome="{outcome}"}} {rows}.0' in metrics


def main_exit(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_max_tokens_rounds_up_to_a_supported_size_and_steps_keep_the_servers_ratio() -> None:
    assert supported_sizes((), 64, 96) == (16, 32, 64)  # demo-vl: 96 positions
    assert supported_sizes((), 48, 320) == (16, 32, 48, 64, 128, 256)  # --gen-length is always a size
    assert supported_sizes((32, 128), 64, 320) == (32, 64, 128)
    sizes = (16, 32, 64, 128, 256)
    assert [gen_length_for(m, sizes, 64) for m in (None, 1, 16, 17, 64, 65, 256)] == [64, 16, 16, 32, 64, 128, 256]
    with pytest.raises(ConfigError, match="above the largest response size"):
        gen_length_for(257, sizes, 64)
    base = GenerationConfig(gen_length=64, steps=16, block_length=32)  # 4 tokens a step, blocks of 32
    assert request_generation(base, 128, None, None, None) == replace(base, gen_length=128, steps=32)
    assert request_generation(base, 16, None, None, 0.5) == replace(base, gen_length=16, steps=4, block_length=None,
                                                                    temperature=0.5)
    assert request_generation(base, 64, 8, 16, None) == replace(base, steps=8, block_length=16)
    with pytest.raises(ConfigError, match="cannot be split evenly"):
        request_generation(base, 64, 6, 16, None)


def test_bad_serve_flags_are_one_line_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, fragment in ((["--max-batch", "0"], "--max-batch is 0"), (["--replicas", "2"], "need --ray"),
                           (["--ray", "--port", "0"], "--ray needs a fixed --port"),
                           (["--timeout", "0"], "--timeout is 0"), (["--gen-lengths", "a,b"], "--gen-lengths")):
        assert main_exit(["serve", "no-such-target", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and fragment in err, err


def test_sigterm_during_load_answers_every_admitted_request(export_dir: Path, reference: Service) -> None:
    expected = _expected(reference)
    proc = subprocess.Popen([sys.executable, "-c", "from seer_deploy.cli import main; main()", "serve",
                             str(export_dir), "--port", "0", "--threads", "1", "--max-batch", "8"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr or []], daemon=True)
    reader.start()
    try:
        url = json.loads(lines.get(timeout=60))["url"]
        bodies = _bodies(64)
        signalled = threading.Event()

        def stop() -> None:  # SIGTERM once the first answers are back, with more in flight
            proc.send_signal(signal.SIGTERM)
            signalled.set()

        responses = asyncio.run(_load(url, bodies, 16, fresh=True, after=(8, stop)))
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    log = [json.loads(line) for line in lines.queue]
    drained = [e for e in log if e.get("event") == "drained"]
    ok = [(b, r) for b, r in zip(bodies, responses, strict=True)
          if isinstance(r, httpx.Response) and r.status_code == 200]
    refused = [r for r in responses if not isinstance(r, httpx.Response)]
    assert signalled.is_set() and drained and drained[0]["admitted"] == drained[0]["settled"] == len(ok)
    assert all(isinstance(r, httpx.TransportError) for r in refused)  # never accepted (connection refused / reset)
    assert len(ok) + len(refused) == len(bodies) and len(ok) > 8  # some answered after the signal
    for body, response in ok:
        assert response.json()["choices"][0]["text"] == expected[body["prompt"]]

