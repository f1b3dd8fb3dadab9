"""Running the app on uvicorn: in the foreground (the `serve` verb) or in a background thread (tests, the load
generator), on a socket bound before the server starts (so port 0 gives a known free port).

The HTTP protocol is uvicorn's, guarded (serve/connections.py): a read deadline for headers (--read-timeout) and a
cap on open connections (--max-connections).

Shutdown (SIGTERM, SIGINT or `stop()`): /ready turns 503 at once, the listening socket closes, requests already
received run to their answers (the worker keeps batching them), then the app's lifespan closes the batcher.
"""

from __future__ import annotations

import socket
import threading
from types import FrameType
from typing import Self

import uvicorn
from fastapi import FastAPI

from seer_deploy.serve.app import ServeState
from seer_deploy.serve.connections import protocol_class


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one; read it back with `sock.getsockname()`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown begins and the caller when it is serving."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                        timeout_keep_alive=5, http=protocol_class()))
        self.state: ServeState = app.state.serve
        self.serving = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.serving.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.state.drain()
        super().handle_exit(sig, frame)


class BackgroundServer:
    """The app served from a thread on host:port (port 0: a free one), as a context manager."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.server = DrainingServer(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="seer-serve",
                                       daemon=True)
        bound = self.sock.getsockname()
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"

    def __enter__(self) -> Self:
        self.thread.start()
        if not self.server.serving.wait(60) or not self.thread.is_alive():
            raise RuntimeError("the server did not start within 60 s")
        return self

    def stop(self) -> None:
        """Graceful: what was received is answered, then the thread ends."""
        self.server.state.drain()
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
