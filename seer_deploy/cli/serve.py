"""`seer-deploy serve TARGET`: the OpenAI-compatible server (docs/serving.md), on uvicorn or (--ray) Ray Serve.

Options are checked and the target opened before the port is bound, so a bad flag or artifact is one line and no
server ever answers with a broken engine. SIGTERM drains: accepted requests are answered, then the process exits
(128 + 15, as every verb stopped by a signal).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import generation_options, seed_option, seer_options, target_options, template_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.checks import ascii_int
from seer_deploy.core.errors import ConfigError
from seer_deploy.service import SeerOptions, ServiceOptions, TargetOptions, TemplateChoice

if TYPE_CHECKING:  # the server's modules (FastAPI, uvicorn) load only when `serve` runs
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.serve.options import ServeOptions

API_KEY_ENV = "SEER_DEPLOY_API_KEY"


def parse_sizes(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    sizes = [ascii_int(part) for part in text.split(",")]
    if any(size is None for size in sizes):
        raise ConfigError(f"--gen-lengths '{text}' must be integers (digits 0-9) separated by commas, e.g. 32,64,128")
    return tuple(size for size in sizes if size is not None)


@click.command("serve", short_help=summary("serve"))
@click.argument("target")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the default keeps the server on this machine.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: a free port.")
@generation_options()
@seed_option()
@click.option("--gen-lengths", default=None, metavar="N,N,...",
              help="Response sizes max_tokens rounds up to [default: powers of two from 16 that fit the model; "
                   "--gen-length is the size without max_tokens].")
@target_options()
@seer_options(on={"help": "Seer by default for requests that do not say [default: on when a calibrated config is "
                          "found]."},
              tail_context={"help": "Seer's tail context by default (see generate)."})
@click.option("--batching", type=click.Choice(["step", "call"]), default="step", show_default=True,
              help="step: rows join and leave the running batch between forward passes; call: rows of one setting "
              "run together to the end of their call (the batcher before issue 46).")
@click.option("--max-batch", type=int, default=32, show_default=True,
              help="Rows live at once (step), or rows in one generate call (call).")
@click.option("--max-wait-ms", type=float, default=5.0, show_default=True,
              help="--batching call: how long a batch waits to fill after its first row arrives.")
@click.option("--max-queue", type=int, default=256, show_default=True,
              help="Rows waiting; beyond it requests get 429 with Retry-After.")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="Per-request deadline in seconds, queueing included (504 past it).")
@click.option("--max-body-bytes", type=int, default=8 << 20, show_default=True, help="Larger bodies get 413.")
@click.option("--read-timeout", "read_timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds a request's headers, then its body, may take to arrive (408 and the connection closed).")
@click.option("--max-connections", type=int, default=512, show_default=True,
              help="Open connections; a request on one beyond it gets 503 (put a reverse proxy in front for more).")
@click.option("--max-prompts", type=int, default=32, show_default=True,
              help="Prompts one /v1/completions request may list.")
@click.option("--retry-after", "retry_after_s", type=int, default=1, show_default=True,
              help="Seconds a 429 tells the client to wait (Retry-After).")
@click.option("--api-key", default=None, envvar=API_KEY_ENV, show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1/* and /metrics.")
@click.option("--model-name", default=None, help="The model id clients send [default: the target's name].")
@click.option("--access-log/--no-access-log", default=True, show_default=True,
              help="One JSON line per request on stderr.")
@click.option("--ray", "use_ray", is_flag=True, help="Serve on Ray Serve (pip install -e \".[ray]\"): one engine per "
              "replica; a local loopback cluster unless RAY_ADDRESS names one.")
@click.option("--replicas", type=int, default=1, show_default=True, help="--ray: replicas (engines).")
@click.option("--max-replicas", type=int, default=None, help="--ray: autoscale from --replicas up to this.")
@template_options()
def command(target: str, host: str, port: int, generation: GenerationConfig, seed: int, gen_lengths: str | None,
            target_options: TargetOptions, seer: SeerOptions, batching: str, max_batch: int, max_wait_ms: float,
            max_queue: int, timeout_s: float, max_body_bytes: int, read_timeout_s: float, max_connections: int, max_prompts: int,
            retry_after_s: int, api_key: str | None, model_name: str | None, access_log: bool, use_ray: bool,
            replicas: int, max_replicas: int | None, template: TemplateChoice | None) -> None:
    """Serve TARGET (a checkpoint, 'demo', 'demo-vl', an export or engine directory) over HTTP with OpenAI's
    /v1/completions and /v1/chat/completions, continuous batching through the generation service, /health, /ready
    and /metrics."""
    from seer_deploy.serve.options import ServeOptions, is_loopback

    name = model_name or Path(target.rstrip("/")).name or target
    serve_options = ServeOptions(model_name=name, batching=batching, max_batch=max_batch, max_wait_ms=max_wait_ms,
                                 max_queue=max_queue, timeout_s=timeout_s, max_body_bytes=max_body_bytes, max_prompts=max_prompts,
                                 retry_after_s=retry_after_s, read_timeout_s=read_timeout_s,
                                 max_connections=max_connections,
                                 gen_lengths=parse_sizes(gen_lengths), api_key=api_key,
                                 access_log=sys.stderr if access_log else None)
    serve_options.check()
    service_options = ServiceOptions(generation=generation, target=target_options, seer=seer, template=template,
                                     batch_size=max_batch, seed=seed)
    service_options.check()
    if not is_loopback(host) and api_key is None:
        click.echo(f"warning: serving on {host} without --api-key: anyone who reaches this address can use the "
                   f"model (set --api-key or {API_KEY_ENV})", err=True)
    if use_ray:
        if port == 0:
            raise ConfigError("--ray needs a fixed --port (Ray's proxy does not report a port it picked); give one, "
                              "e.g. --port 8000")
        from seer_deploy.serve import ray_app

        ray_app.run(target, service_options, serve_options, ray_app.Replicas(replicas, max_replicas,
                                                                             access_log=access_log),
                    host=host, port=port, say=lambda line: click.echo(line, err=True))
        return
    if replicas != 1 or max_replicas is not None:
        raise ConfigError("--replicas and --max-replicas need --ray (one process serves one engine); add --ray")
    _serve_here(target, service_options, serve_options, host, port)


def _serve_here(target: str, service_options: ServiceOptions, serve_options: ServeOptions, host: str, port: int
                ) -> None:
    """Open the engine, bind, say where, serve until a signal drains it."""
    from seer_deploy.serve.app import create_app
    from seer_deploy.serve.server import DrainingServer, bind
    from seer_deploy.service import Service

    service = Service(target, service_options, warn=lambda message: click.echo(message, err=True))
    app = create_app(service, serve_options)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    click.echo(json.dumps({"event": "serving", "target": target, "backend": service.backend.name,
                           "url": f"http://{shown}:{bound}", "pid": os.getpid()}), err=True)
    try:
        DrainingServer(app).run(sockets=[sock])
    finally:
        sock.close()
