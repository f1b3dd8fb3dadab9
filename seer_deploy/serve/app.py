"""The FastAPI app: OpenAI-compatible routes over the batcher, health and readiness, Prometheus metrics.

`create_app(service, options)` builds one app around one open Service (its engine); everything the app keeps
(queue, worker, metrics registry, draining flag) lives on the app, so two apps in a process share nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as RoutingError
from starlette.requests import ClientDisconnect

from seer_deploy.core.errors import ConfigError, SeerDeployError
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.seer.config import parse_tail_context
from seer_deploy.serve import protocol
from seer_deploy.serve.batcher import Batcher, CallBatcher, Closed, DeadlineExceeded, Job, QueueFull
from seer_deploy.serve.events import Message, Scope, Streaming, finished_events, live_events, tell
from seer_deploy.serve.metrics import Metrics
from seer_deploy.serve.options import ServeOptions
from seer_deploy.serve.responder import Responder, Result, Row
from seer_deploy.serve.sizes import gen_length_for, request_generation, supported_sizes
from seer_deploy.serve.stepper import StepBatcher
from seer_deploy.service import Service

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics")
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class HTTPError(Exception):
    """A refusal with its status, OpenAI error type, the field at fault (`param`) and extra headers."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.headers, self.param = status, kind, headers or {}, param


class ClientGone(Exception):
    """The client disconnected while its rows waited; its queued rows were cancelled."""


class ServeState:
    """What the app holds: the responder, its batcher, the metrics, and whether it is draining."""

    def __init__(self, service: Service, options: ServeOptions) -> None:
        self.options = options
        self.responder = Responder(service)
        self.metrics = Metrics(options.replica)
        self.batcher: Batcher[Row]
        if options.batching == "step":
            self.batcher = StepBatcher(self.responder, max_batch=options.max_batch, max_wait_ms=options.max_wait_ms,
                                       max_queue=options.max_queue, observer=self.metrics)
        else:
            self.batcher = CallBatcher(self.responder.run, max_batch=options.max_batch,
                                       max_wait_ms=options.max_wait_ms, max_queue=options.max_queue,
                                       observer=self.metrics)
        generation = service.options.generation
        self.sizes = supported_sizes(options.gen_lengths, generation.gen_length, service.backend.max_seq_len)
        self.draining = False
        self.metrics.watch(self.batcher.balance)

    def record(self, method: str, path: str, status: int, seconds: float, client: str) -> None:
        """Count one request in /metrics and write its access-log line (each request once, whatever its end)."""
        route = path if path in ROUTES else "other"
        self.metrics.requests.labels(route, str(status)).inc()
        self.metrics.latency.labels(route).observe(seconds)
        log, replica = self.options.access_log, self.options.replica
        if log is not None:
            log.write(json.dumps({"ts": round(time.time(), 3), "method": method, "path": path, "status": status,
                                  "ms": round(seconds * 1000, 1), "client": client,
                                  **({"replica": replica} if replica else {})}) + "\n")
            log.flush()

    def drain(self) -> None:
        """Shutdown began (SIGTERM): /ready says no; work already accepted still runs (see server.py)."""
        self.draining = True

    def rows(self, body: protocol.Body, prompts: list[Prompt], max_tokens: int | None) -> list[Row]:
        """Checked rows of a request (ConfigError, with the CLI's messages, for one that cannot run)."""
        if body.n != 1:
            raise ConfigError(f"n is {body.n}; this server returns one answer per prompt (n = 1)")
        if body.model is not None and body.model != self.options.model_name:
            raise HTTPError(404, f"model '{body.model}' is not served here; use '{self.options.model_name}' "
                                 "(GET /v1/models)", "invalid_request_error")
        base = self.responder.service.options.generation
        size = gen_length_for(max_tokens, self.sizes, base.gen_length)
        generation = request_generation(base, size, body.steps, body.block_length, body.temperature, body.rule())
        tail = None if body.tail_context is None else parse_tail_context(body.tail_context)
        seed = body.seed if body.seed is not None else self.responder.service.options.seed
        return [self.responder.prepare(p, generation, seer=body.seer, tail_context=tail, max_tokens=max_tokens,
                                       stop=body.stops(), seed=seed) for p in prompts]

    def submit(self, rows: list[Row]) -> list[Job[Row]]:
        deadline = time.monotonic() + self.options.timeout_s
        try:
            return self.batcher.submit([(r, r.key) for r in rows], deadline)
        except QueueFull as exc:
            raise HTTPError(429, f"{exc}; retry after {self.options.retry_after_s} s", "rate_limit_error",
                            {"Retry-After": str(self.options.retry_after_s)}) from exc
        except Closed as exc:
            raise HTTPError(503, f"{exc}; retry on another replica", "server_error",
                            {"Retry-After": str(self.options.retry_after_s)}) from exc

    async def wait(self, request: Request, jobs: list[Job[Row]]) -> list[Result]:
        """The rows' results; cancels them if the client goes away (ClientGone) or the deadline passes (504)."""
        gathered: asyncio.Future[list[Any]] = asyncio.gather(*(j.future for j in jobs))
        gone: asyncio.Future[None] = asyncio.ensure_future(_disconnected(request))
        try:
            timeout = max(0.0, min(j.deadline for j in jobs) - time.monotonic())
            waiting: set[asyncio.Future[Any]] = {gathered, gone}
            try:
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the response went away (a closed stream): its rows are not wanted
                self.batcher.cancel(jobs)
                raise
            if gathered in done:
                results: list[Result] = gathered.result()
                for result in results:
                    self.metrics.answered(result)
                return results
            if gone in done:
                self.batcher.cancel(jobs)
                raise ClientGone()
            self.batcher.cancel(jobs, "deadline")
            raise DeadlineExceeded("the request ran past its deadline")
        finally:
            gone.cancel()
            gathered.add_done_callback(_retrieve)
            gathered.cancel()  # a no-op once done


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's outcome as seen (asyncio logs an exception nobody retrieved)."""
    if not future.cancelled():
        future.exception()


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _body(request: Request, limit: int) -> bytes:
    """The JSON request body: 415 for another Content-Type (OpenAI's API takes JSON only; a form or text body would
    otherwise be read as JSON by luck), 413 once it passes `limit` bytes (declared or streamed), ClientGone if the
    client leaves while sending it."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        given = f"Content-Type '{media}'" if media else "no Content-Type"
        raise HTTPError(415, f"the body was sent with {given}; send JSON with 'Content-Type: application/json'",
                        "invalid_request_error")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"the request body is {declared} bytes, above this server's {limit} (--max-body-bytes); "
                             "send a smaller request (scale pictures down)", "invalid_request_error")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the request body is above this server's {limit} bytes (--max-body-bytes); send "
                                     "a smaller request (scale pictures down)", "invalid_request_error")
            chunks.append(chunk)
    except ClientDisconnect:  # the client's network, not the server's fault: a 499 like any other departure
        raise ClientGone() from None
    return b"".join(chunks)


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None,
           param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind, param), status, headers=headers)


class Observe:
    """ASGI middleware: per-request metrics, the access log (one JSON line a request), the replica header, and the
    body's read deadline (--read-timeout, from the end of the headers: 408, and the connection closed).

    A request whose response was not sent to its end is counted 499 (the client left), however far it got."""

    def __init__(self, app: ASGIApp, state: ServeState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, finished = time.monotonic(), 499, False  # 499: the client left before the whole answer
        replica = self.state.options.replica
        read_by, body_read = start + self.state.options.read_timeout_s, False

        async def receiving() -> Message:
            nonlocal body_read
            if body_read:  # after the body, only the disconnect is left to hear: no deadline
                return await receive()
            try:
                async with asyncio.timeout(read_by - time.monotonic()):
                    message = await receive()
            except TimeoutError:
                raise HTTPError(408, f"the request body did not arrive within {self.state.options.read_timeout_s:g} s "
                                     "(--read-timeout); send it whole and promptly", "invalid_request_error",
                                {"Connection": "close"}) from None
            body_read = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def sending(message: Message) -> None:
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = message["status"]
                if replica is not None:
                    message["headers"] = [*message.get("headers", []), (b"x-seer-replica", replica.encode())]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        metrics = self.state.metrics
        metrics.inflight.inc()
        try:
            await self.app(scope, receiving, sending)
        except Exception:
            status, finished = 500, True
            raise
        finally:
            metrics.inflight.dec()
            client = scope.get("client") or ("", 0)
            self.state.record(scope["method"], scope["path"], status if finished else 499, time.monotonic() - start,
                              client[0])


def create_app(service: Service, options: ServeOptions | None = None) -> FastAPI:
    """The OpenAI-compatible app around an open Service (which it then owns: only its worker thread calls it)."""
    options = options or ServeOptions()
    options.check()
    state = ServeState(service, options)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.drain()
        await asyncio.to_thread(state.batcher.close)  # runs what was queued, then stops the worker
        if options.access_log is not None:  # what shutdown left: every admitted row answered, or not
            options.access_log.write(json.dumps({"event": "drained", "admitted": state.batcher.admitted,
                                                 "settled": state.batcher.settled}) + "\n")
            options.access_log.flush()

    app = FastAPI(title="seer-deploy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state

    def authorize(request: Request) -> None:
        if options.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), options.api_key.encode()):
            raise HTTPError(401, "missing or wrong API key; send 'Authorization: Bearer <key>' (the server's "
                                 "--api-key or SEER_DEPLOY_API_KEY)", "authentication_error",
                            {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.kind, exc.headers, exc.param)

    @app.exception_handler(RoutingError)
    async def routing(request: Request, exc: RoutingError) -> JSONResponse:
        """The router's 404 and 405 (its Allow header kept), in OpenAI's shape like every other refusal."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"no route {where}; this server answers {', '.join(ROUTES)}"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{where} is not allowed; {request.url.path} takes {allowed or 'another method'}"
        else:
            message = f"{where}: {exc.detail}"
        return _error(exc.status_code, message, "invalid_request_error", dict(exc.headers or {}))

    @app.exception_handler(SeerDeployError)
    async def refused(request: Request, exc: SeerDeployError) -> JSONResponse:
        if isinstance(exc, ConfigError):  # the request's fault: the CLI's one-line message
            return _error(400, " ".join(str(exc).split()), "invalid_request_error", param=getattr(exc, "param", None))
        return _error(500, " ".join(str(exc).split()), "server_error")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        """A bug: OpenAI's shape for the client (the traceback still goes to the log)."""
        return _error(500, f"internal error ({type(exc).__name__}); see the server's log", "server_error")

    @app.exception_handler(DeadlineExceeded)
    async def deadline(request: Request, exc: DeadlineExceeded) -> JSONResponse:
        return _error(504, f"{exc} ({options.timeout_s:g} s, --timeout); retry later or lower max_tokens",
                      "timeout_error")

    @app.exception_handler(ClientGone)
    async def gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it

    async def answer(request: Request, chat: bool) -> Response:
        authorize(request)
        raw = await _body(request, options.max_body_bytes)
        if chat:
            body: protocol.Body = protocol.parse(protocol.ChatBody, raw)
            assert isinstance(body, protocol.ChatBody)
            prompts = [body.request()]
            max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
        else:
            body = protocol.parse(protocol.CompletionBody, raw)
            assert isinstance(body, protocol.CompletionBody)
            prompts, max_tokens = body.requests(options.max_prompts), body.max_tokens
        rows = state.rows(body, prompts, max_tokens)
        rid = protocol.new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            return await stream(request, rid, chat, rows)
        results = await state.wait(request, state.submit(rows))
        if chat:
            return JSONResponse(protocol.chat_completion(rid, options.model_name, results[0]))
        return JSONResponse(protocol.completion(rid, options.model_name, results))

    async def stream(request: Request, rid: str, chat: bool, rows: list[Row]) -> Response:
        """Server-sent events as the answers settle: the rows tell their settled text from the worker's thread; the
        response starts once the first text arrives (the rows are running: queue refusals and deadlines keep their
        status codes) or, if none comes first, once the answers are done."""
        loop = asyncio.get_running_loop()
        told: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        rows = [dataclasses.replace(r, on_text=partial(tell, loop, told, i)) for i, r in enumerate(rows)]
        waiter = asyncio.ensure_future(state.wait(request, state.submit(rows)))
        waiter.add_done_callback(_retrieve)  # its ClientGone is an outcome, seen or not
        first = asyncio.ensure_future(told.get())
        either: set[asyncio.Future[Any]] = {waiter, first}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            told_first = first.done() and not first.cancelled()
            if not told_first:
                first.cancel()  # (a task is cancelled only once it runs again: read told_first, not first)
        if not told_first:  # the answers were done before any text was told
            results = await waiter  # raises the request's HTTP error, if any
            return Streaming(finished_events(rid, options.model_name, chat, results), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
        return Streaming(live_events(rid, options.model_name, chat, len(rows), first.result(), told, waiter),
                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, chat=True)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        service = state.responder.service
        return {"object": "list", "data": [{
            "id": options.model_name, "object": "model", "created": 0, "owned_by": "seer-deploy",
            "backend": service.backend.name, "multimodal": state.responder.multimodal,
            "gen_lengths": list(state.sizes), "default_gen_length": service.options.generation.gen_length,
            "seer": service.seer is not None,
        }]}

    @app.get("/health")
    async def health() -> Response:
        alive = state.batcher.alive
        return JSONResponse({"status": "ok" if alive else "worker stopped"}, 200 if alive else 503)

    @app.get("/ready")
    async def ready() -> Response:
        ok = state.batcher.accepting and not state.draining
        return JSONResponse({"ready": ok, "draining": state.draining}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        authorize(request)
        return Response(state.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(Observe, state=state)
    return app
