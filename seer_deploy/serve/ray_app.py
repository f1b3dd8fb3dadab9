"""Scale-out on Ray Serve: the same app as a deployment, one engine (Service) per replica.

Each replica builds its own app in its own process (`build_app`), so replicas share nothing; Ray's proxy spreads
requests over them, restarts a replica that dies, and scales between --replicas and --max-replicas on the rows in
flight. Ray is optional (`pip install -e ".[ray]"`): nothing here imports it until it is used.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from seer_deploy.core.errors import ConfigError
from seer_deploy.serve.app import create_app
from seer_deploy.serve.options import ServeOptions
from seer_deploy.service import Service, ServiceOptions

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is 127.0.0.1, not the machine's
PROXY_READY_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"  # read by the Serve controller at its start


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--ray needs Ray Serve, which is not installed; pip install -e \".[ray]\" (or "
                          "'ray[serve]')") from exc
    return ray


def local_cluster(num_cpus: int | None = None, metrics_port: int | None = None) -> None:
    """Start a local Ray cluster that stays on loopback (call before anything imports ray: Ray reads the setting
    at import). metrics_port: where Ray exports its Prometheus metrics (replica starts, health)."""
    if "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    # Ray Serve kills a proxy not ready within 5 s and serve.start then fails (ActorDiedError): seen on this 2-core
    # machine under load. The cluster's processes inherit this environment, so a local cluster gives it a minute.
    os.environ.setdefault(PROXY_READY_ENV, "60")
    ray = _ray()
    kwargs: dict[str, Any] = {"num_cpus": num_cpus, "include_dashboard": False, "log_to_driver": False}
    if metrics_port is not None:
        kwargs["_metrics_export_port"] = metrics_port
        kwargs["_system_config"] = {"metrics_report_interval_ms": 1000}
    ray.init(**kwargs)


def build_app(target: str, service_options: ServiceOptions, serve_options: ServeOptions, access_log: bool) -> FastAPI:
    """A replica's app: its own Service, its replica id in responses (x-seer-replica) and /metrics."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        replica: str | None = serve.get_replica_context().replica_id.unique_id
    except RayServeException:  # built outside a replica
        replica = None
    options = dataclasses.replace(serve_options, replica=replica, access_log=sys.stderr if access_log else None)
    return create_app(Service(target, service_options), options)


@dataclass(frozen=True)
class Replicas:
    """How many engines Ray runs: `count` replicas (autoscaling up to `most` if given), `num_cpus` each, each with
    its own access log on stderr when `access_log`."""

    count: int = 1
    most: int | None = None
    num_cpus: float = 1.0
    access_log: bool = False

    def check(self) -> None:
        if self.count < 1 or (self.most is not None and self.most < self.count):
            raise ConfigError(f"--replicas {self.count} / --max-replicas {self.most}: need 1 <= replicas <= "
                              "max-replicas")


def deployment(target: str, service_options: ServiceOptions, serve_options: ServeOptions,
               replicas: Replicas = Replicas()) -> Any:
    """The bound Ray Serve application: its replicas, each one engine."""
    serve_options.check()
    service_options.check()
    replicas.check()
    _ray()
    from ray import serve

    scaling: dict[str, Any] = {"num_replicas": replicas.count} if replicas.most is None else {"autoscaling_config": {
        "min_replicas": replicas.count, "max_replicas": replicas.most,
        "target_ongoing_requests": serve_options.max_batch}}
    shipped = dataclasses.replace(serve_options, access_log=None)  # a stream does not travel; each replica opens its own

    def builder() -> FastAPI:  # a plain function: Ray calls it in each replica (a partial would pass for an app)
        return build_app(target, service_options, shipped, replicas.access_log)


    @serve.deployment(name="seer-deploy", max_ongoing_requests=serve_options.max_queue,
                      ray_actor_options={"num_cpus": replicas.num_cpus}, **scaling)
    @serve.ingress(builder)
    class SeerServe:
        """The app's routes, served by each replica."""

    return SeerServe.bind()  # type: ignore[attr-defined]


def run(target: str, service_options: ServiceOptions, serve_options: ServeOptions, replicas: Replicas, *, host: str,
        port: int, say: Any = print) -> None:
    """Serve on Ray until interrupted: a local loopback cluster unless RAY_ADDRESS names one."""
    app = deployment(target, service_options, serve_options, replicas)
    ray = _ray()
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            local_cluster()
    from ray import serve

    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name="seer-deploy", route_prefix="/")
        say(f"serving {target} on Ray Serve ({replicas.count} replica(s)) at http://{host}:{port}")
        while True:
            signal.pause()  # until SIGTERM / SIGINT (the CLI turns them into SystemExit / KeyboardInterrupt)
    finally:
        serve.shutdown()  # replicas finish their requests (Ray's graceful shutdown), then stop
        ray.shutdown()
