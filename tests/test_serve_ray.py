"""`seer-deploy serve --ray`: the app as a Ray Serve deployment on a local cluster the test starts on loopback.

Two replicas (one engine each) share the load; one is killed mid-load; every request is answered (the client
retries what the dead replica dropped) with its solo answer, Ray starts a replacement, and the kill shows in Ray's
Prometheus metrics (a third replica started) and in the replicas' own /metrics.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import time
from typing import Any

import httpx
import pytest

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.demo_tasks import heldout_examples
from seer_deploy.serve import ServeOptions
from seer_deploy.service import Request, Service, ServiceOptions

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


async def _load(url: str, prompts: list[str], concurrency: int, kill_after: int, kill: Any
                ) -> list[tuple[str, str, int]]:
    """(prompt, answer, tries) for each prompt; kill() once kill_after answers are back. A request the dead
    replica dropped (a 5xx or a broken connection) is sent again."""
    gate = asyncio.Semaphore(concurrency)
    done = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def one(prompt: str) -> tuple[str, str, int]:
            nonlocal done
            async with gate:
                for tries in range(1, 21):
                    try:
                        r = await http.post("/v1/completions", json={"prompt": prompt, "tail_context": 0})
                        if r.status_code == 200:
                            break
                        assert r.status_code >= 500, r.text  # only the kill may fail a request
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.25)  # back off while Ray notices the dead replica
                else:
                    raise AssertionError(f"{prompt!r} was not answered in 20 tries")
            done += 1
            if done == kill_after:
                kill()
            return prompt, r.json()["choices"][0]["text"], tries

        return await asyncio.gather(*(one(p) for p in prompts))


def test_two_replicas_share_the_load_and_survive_a_kill() -> None:
    from seer_deploy.serve.ray_app import deployment, local_cluster

    options = ServiceOptions(generation=GEN, batch_size=8, threads=1)
    reference = Service("demo", options)
    cut = reference.seer.with_(tail_context=0) if reference.seer is not None else None
    expected = {p: reference.generate([Request(p)], seer=cut).answers[0].text for p in PROMPTS}
    metrics_port, http_port = free_port(), free_port()
    local_cluster(num_cpus=2, metrics_port=metrics_port)
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        app = deployment("demo", options, ServeOptions(model_name="demo", max_batch=8), replicas=2, num_cpus=0.5)
        serve.run(app, name="seer-deploy", route_prefix="/")
        url = f"http://127.0.0.1:{http_port}"
        replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]
        assert len(replicas) == 2
        seen = {httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0]}).headers["x-seer-replica"]
                for _ in range(12)}
        assert len(seen) == 2  # requests spread over both replicas
        victim = replicas[0]

        def kill() -> None:
            ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)

        answers = asyncio.run(_load(url, PROMPTS * 3, 8, kill_after=15, kill=kill))
        assert [(p, a) for p, a, _ in answers] == [(p, expected[p]) for p in PROMPTS * 3]  # every one answered
        assert any(tries > 1 for _, _, tries in answers)  # the kill hit requests in flight; their retries answered
        # Ray replaces the dead replica: a third replica id answers, and Ray's metrics count its start.
        new = until(lambda: {httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[1]}).headers[
            "x-seer-replica"] for _ in range(6)} - seen, 60, "a replacement replica answering")
        victim_id = victim["name"].rsplit("#", 1)[-1]  # SERVE_REPLICA::app#deployment#id
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
