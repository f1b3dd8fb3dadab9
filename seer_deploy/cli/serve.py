"""`seer-deploy serve TARGET`: the OpenAI-compatible server (docs/serving.md), on uvicorn or (--ray) Ray Serve.

Options are checked and the target opened before the port is bound, so a bad flag or artifact is one line and no
server ever answers with a broken engine. SIGTERM drains: accepted requests are answered, then the process exits
(128 + 15, as every verb stopped by a signal).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import (
    API_KEY_ENV,
    generation_options,
    parse_sizes,
    seed_option,
    seer_options,
    serving_options,
    target_options,
    template_options,
)
from seer_deploy.cli.verbs import summary
from seer_deploy.core.errors import ConfigError
from seer_deploy.service import SeerOptions, ServiceOptions, TargetOptions, TemplateChoice

if TYPE_CHECKING:  # the server's modules (FastAPI, uvicorn) load only when `serve` runs
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.serve.options import ServeOptions


@click.command("serve", short_help=summary("serve"))
@click.argument("target")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the default keeps the server on this machine.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: a free port.")
@generation_options()
@seed_option()
@target_options()
@seer_options(on={"help": "Seer by default for requests that do not say [default: on when a calibrated config is "
                          "found]."},
              tail_context={"help": "Seer's tail context by default (see generate)."})
@click.option("--max-batch", type=int, default=32, show_default=True,
              help="Rows live at once (--batching step), or rows in one generate call (call).")
@click.option("--gen-lengths", default=None, metavar="N,N,...",
              help="Response sizes max_tokens rounds up to [default: powers of two from 16 that fit the model; "
                   "--gen-length is the size without max_tokens].")
@serving_options()
@click.option("--model-name", default=None, help="The model id clients send [default: the target's name].")
@click.option("--ray", "use_ray", is_flag=True, help="Serve on Ray Serve (pip install -e \".[ray]\"): one engine per "
              "replica; a local loopback cluster unless RAY_ADDRESS names one.")
@click.option("--replicas", type=int, default=1, show_default=True, help="--ray: replicas (engines).")
@click.option("--max-replicas", type=int, default=None, help="--ray: autoscale from --replicas up to this.")
@template_options()
def command(target: str, host: str, port: int, generation: GenerationConfig, seed: int, target_options: TargetOptions,
            seer: SeerOptions, max_batch: int, gen_lengths: str | None, serving: ServeOptions, model_name: str | None,
            use_ray: bool, replicas: int, max_replicas: int | None, template: TemplateChoice | None) -> None:
    """Serve TARGET (a checkpoint, 'demo', 'demo-vl', an export or engine directory) over HTTP with OpenAI's
    /v1/completions and /v1/chat/completions, continuous batching through the generation service, /health, /ready
    and /metrics."""
    from seer_deploy.serve.options import is_loopback

    serve_options = dataclasses.replace(serving, model_name=model_name or Path(target.rstrip("/")).name or target,
                                        max_batch=max_batch, gen_lengths=parse_sizes(gen_lengths))
    serve_options.check()
    service_options = ServiceOptions(generation=generation, target=target_options, seer=seer, template=template,
                                     batch_size=serve_options.max_batch, seed=seed)
    service_options.check()
    if not is_loopback(host) and serve_options.api_key is None:
        click.echo(f"warning: serving on {host} without --api-key: anyone who reaches this address can use the "
                   f"model (set --api-key or {API_KEY_ENV})", err=True)
    if use_ray:
        if port == 0:
            raise ConfigError("--ray needs a fixed --port (Ray's proxy does not report a port it picked); give one, "
                              "e.g. --port 8000")
        from seer_deploy.serve import ray_app

        ray_app.run(target, service_options, serve_options,
                    ray_app.Replicas(replicas, max_replicas, access_log=serve_options.access_log is not None),
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
