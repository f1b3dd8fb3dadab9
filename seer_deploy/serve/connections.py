"""uvicorn's HTTP protocol with what uvicorn leaves open: a read deadline for a request's headers, a cap on open
connections answered in OpenAI's error shape, and every request that never reaches the app (a half-sent request,
malformed HTTP) still counted once in /metrics and the access log.

uvicorn reads headers for as long as a client likes (its keep-alive timeout covers only idle time between
requests), so a client that sends half a request holds a socket forever; its `limit_concurrency` answers beyond the
cap with a plain-text 503. The body's deadline is the app's (`Observe`), where a 408 can be answered through it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from seer_deploy.serve.app import Message, Observe, Scope, ServeState, error_body

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional: uvicorn's "auto" falls back to h11 the same way
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


def _raw_response(status: int, reason: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes its connection, for answers written below the app."""
    data = json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(data)}",
            "connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def over_capacity(state: ServeState) -> Callable[[Scope, Callable[[], Awaitable[Message]],
                                                   Callable[[Message], Awaitable[None]]], Awaitable[None]]:
    """The app a connection beyond --max-connections gets: 503 in OpenAI's shape, then the connection closes
    (counted and logged like any request)."""
    limit, retry = state.options.max_connections, state.options.retry_after_s

    async def refuse(scope: Scope, receive: Callable[[], Awaitable[Message]],
                     send: Callable[[Message], Awaitable[None]]) -> None:
        data = json.dumps(error_body(503, f"this server holds its limit of {limit} open connections "
                                          "(--max-connections); retry shortly, or on another replica",
                                     "server_error")).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
            (b"connection", b"close"), (b"retry-after", str(retry).encode())]})
        await send({"type": "http.response.body", "body": data})

    return Observe(refuse, state)


class Guarded:
    """The mixin over uvicorn's protocol classes (h11 and httptools share the attributes it uses: `cycle`, set when
    a request's headers are complete; `app`, read then; `connections`; `transport`; `send_400_response`)."""

    cycle: Any
    app: Any
    connections: set[Any]
    transport: asyncio.Transport
    client: tuple[str, int] | None

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self.state: ServeState = config.app.state.serve
        self.deadline: asyncio.TimerHandle | None = None
        self.started = 0.0  # when the first byte of the request being read arrived (0: none yet)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.state.options.max_connections:
            self.app = over_capacity(self.state)
        self._arm()  # a connection that never sends a request is closed too

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            self._disarm()
            return
        if self.cycle is not before:  # headers are in: the app reads the body under its own deadline
            self._disarm()
            self.started = 0.0
        if self.reading_headers():  # a request began and its headers are not complete
            self.started = self.started or time.monotonic()
            if self.cycle is None or self.cycle.response_complete:  # (a pipelined one waits for the answer before)
                self._arm()

    def reading_headers(self) -> bool:
        raise NotImplementedError

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.started:  # a request's first bytes came, its headers never: the client left (499)
            self._record(499)
        super().connection_lost(exc)  # type: ignore[misc]

    def send_400_response(self, msg: str) -> None:
        """Malformed HTTP: OpenAI's shape instead of uvicorn's plain text, counted like any refusal."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_raw_response(400, "Bad Request", error_body(
                400, "the request is not valid HTTP/1.1; send a well-formed request", "invalid_request_error")))
            self.transport.close()
        self.started = self.started or time.monotonic()  # the parser may fail before a request was seen to begin
        self._record(400)

    def _arm(self) -> None:
        if self.deadline is None:
            loop = asyncio.get_running_loop()
            self.deadline = loop.call_later(self.state.options.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        """--read-timeout passed with the headers incomplete: 408 if the request began (an answer can still be
        sent), else just close."""
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.started:
            seconds = self.state.options.read_timeout_s
            self.transport.write(_raw_response(408, "Request Timeout", error_body(
                408, f"the request's headers did not arrive within {seconds:g} s (--read-timeout); send the request "
                     "whole and promptly", "invalid_request_error")))
            self._record(408)
        self.transport.close()

    def _record(self, status: int) -> None:
        if self.started:
            self.state.record("-", "-", status, time.monotonic() - self.started, (self.client or ("", 0))[0])
            self.started = 0.0


class GuardedH11(Guarded, H11Protocol):
    """uvicorn's h11 protocol, guarded."""

    def reading_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])


if HttpToolsProtocol is not None:
    class GuardedHttpTools(Guarded, HttpToolsProtocol):
        """uvicorn's httptools protocol (its default when httptools is installed), guarded."""

        reading = False

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.reading = True

        def on_headers_complete(self) -> None:
            self.reading = False
            super().on_headers_complete()

        def reading_headers(self) -> bool:
            return self.reading


def protocol_class() -> type[asyncio.Protocol]:
    """The guarded protocol over the implementation uvicorn's "auto" would pick."""
    return GuardedHttpTools if HttpToolsProtocol is not None else GuardedH11
