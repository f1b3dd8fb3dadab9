"""`seer-deploy serve --ray`: the app as a Ray Serve deployment on a local cluster the test starts on loopback.

Two replicas (one engine each) share the load; one is killed mid-load while it holds a request in flight; every
request is answered (the client retries what the dead replica dropped) with its solo answer, Ray starts a
replacement, and the kill shows in Ray's Prometheus metrics (a third replica started) and in the replicas' own
/metrics.

The request in flight at the kill is made, not hoped for: its body is sent only after the kill (Ray's proxy hands
a request to a replica before its body, which the replica then pulls), so the replica found holding it cannot have
answered it, and that replica is the one killed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.serve import ServeOptions
from seer_deploy.service import Prompt, Service, ServiceOptions, TargetOptions

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray Serve is not installed (pip install -e '.[ray]')")
GEN = GenerationConfig(gen_length=64, steps=8)
PROMPTS = [e.prompt for e in heldout_examples(20)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def until(check: Any, seconds: float, what: str) -> Any:
    """Poll `check()` until it returns something true (Ray reports on its own schedule)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {seconds} s")


def body(prompt: str) -> bytes:
    return json.dumps({"prompt": prompt, "tail_context": 0}).encode()


async def held(whole: bytes, release: asyncio.Event) -> AsyncIterator[bytes]:
    """A request body sent in two parts, the second once `release` is set: until then the request sits on the
    replica Ray handed it to, which cannot answer it."""
    yield whole[:1]
    await release.wait()
    yield whole[1:]


async def answer(http: httpx.AsyncClient, prompt: str, first: AsyncIterator[bytes] | None = None) -> tuple[str, int]:
    """(answer, tries) for a prompt; the first try sends `first` as the body if given. A try the dead replica
    dropped (a 5xx or a broken connection) is sent again."""
    for tries in range(1, 21):
        content = first if tries == 1 and first is not None else body(prompt)
        try:
            r = await http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
            if r.status_code == 200:
                return r.json()["choices"][0]["text"], tries
            assert r.status_code >= 500, r.text  # only the kill may fail a request
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.25)  # back off while Ray notices the dead replica
    raise AssertionError(f"{prompt!r} was not answered in 20 tries")


async def _load(url: str, hold: str, find_holder: Callable[[], str], prompts: list[str], concurrency: int,
                kill_after: int, kill: Callable[[str], None]) -> tuple[str, tuple[str, int], list[tuple[str, str, int]]]:
    """Send `hold` with its body held back, learn which replica holds it (find_holder), then send `prompts` and
    kill that replica once kill_after of them are answered; the held body follows the kill.
    Returns (the holder, the held prompt's (answer, tries), (prompt, answer, tries) for each prompt)."""
    gate, release = asyncio.Semaphore(concurrency), asyncio.Event()
    done = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        held_answer = asyncio.ensure_future(answer(http, hold, held(body(hold), release)))
        holder = await asyncio.to_thread(find_holder)

        async def one(prompt: str) -> tuple[str, str, int]:
            nonlocal done
            async with gate:
                text, tries = await answer(http, prompt)
            done += 1
            if done == kill_after:
                kill(holder)
                release.set()
            return prompt, text, tries

        answers = await asyncio.gather(*(one(p) for p in prompts))
        return holder, await held_answer, answers


def test_two_replicas_share_the_load_and_survive_a_kill() -> None:
    from seer_deploy.serve.ray_app import Replicas, deployment, local_cluster

    options = ServiceOptions(generation=GEN, batch_size=8, target=TargetOptions(threads=1))
    reference = Service("demo", options)
    cut = reference.seer.with_(tail_context=0) if reference.seer is not None else None
    expected = {p: reference.generate([Prompt(p)], seer=cut).answers[0].text for p in PROMPTS}
    metrics_port, http_port = free_port(), free_port()
    local_cluster(num_cpus=2, metrics_port=metrics_port)
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        # read_timeout_s: the held body waits for the kill however long the load before it takes (not a 408)
        serve_options = ServeOptions(model_name="demo", max_batch=8, read_timeout_s=3600)
        serve.run(deployment("demo", options, serve_options, Replicas(2, num_cpus=0.5)), name="seer-deploy",
                  route_prefix="/")
        url = f"http://127.0.0.1:{http_port}"
        replicas = {a["name"]: ray.get_actor(a["name"], namespace=a["namespace"])
                    for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]}
        assert len(replicas) == 2
        seen = {httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0]}).headers["x-seer-replica"]
                for _ in range(12)}
        assert len(seen) == 2  # requests spread over both replicas

        def busy() -> list[str]:  # the replicas with requests in flight (Ray's own count, which its router reads)
            return [name for name, actor in replicas.items() if ray.get(actor.get_num_ongoing_requests.remote())]

        until(lambda: not busy(), 30, "the replicas finishing the requests above")

        def holder() -> str:  # only the held request is in flight: the one busy replica holds it
            names = until(busy, 30, "the held request reaching a replica")
            assert len(names) == 1, names
            return str(names[0])

        def kill(name: str) -> None:
            ray.kill(replicas[name], no_restart=True)

        hold = PROMPTS[-1]
        victim, (held_text, held_tries), answers = asyncio.run(
            _load(url, hold, holder, PROMPTS * 3, 8, kill_after=15, kill=kill))
        # The held request was on the victim when it died, unanswered (its body came after): the client tried it
        # again, and another replica gave its solo answer.
        assert held_tries > 1 and held_text == expected[hold], (held_tries, held_text)
        assert [(p, a) for p, a, _ in answers] == [(p, expected[p]) for p in PROMPTS * 3]  # every one answered
        # Ray replaces the dead replica: a third replica id answers, and Ray's metrics count its start.
        new = until(lambda: {httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[1]}).headers[
            "x-seer-replica"] for _ in range(6)} - seen, 60, "a replacement replica answering")
        victim_id = victim.rsplit("#", 1)[-1]  # SERVE_REPLICA::app#deployment#id
        assert victim_id in seen and victim_id not in new

        def starts() -> set[str]:
            text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
            return {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
                    if line.startswith("ray_serve_deployment_replica_starts_total{") and 'replica="' in line}

        started = until(lambda: s if len(s := starts()) >= 3 else None, 30, "Ray's metrics counting 3 replica starts")
        assert seen | new <= started
        own = httpx.get(f"{url}/metrics").text
        assert "seer_serve_replica{" in own and "seer_serve_rows_total" in own
    finally:
        serve.shutdown()
        ray.shutdown()
