"""A streamed answer as server-sent events (OpenAI's chunks): live while the rows settle, or at once when they are
done; and the response that closes its generator however the stream ends."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import StreamingResponse

from seer_deploy.serve import protocol
from seer_deploy.serve.responder import Result

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def sse(data: object) -> str:
    return f"data: {json.dumps(data)}\n\n"


class Streaming(StreamingResponse):
    """A stream whose generator is closed when the response ends, however it ends (a client that leaves cancels
    the sending, which may leave the generator suspended; its cleanup then runs here, not at garbage collection)."""

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


def tell(loop: asyncio.AbstractEventLoop, told: asyncio.Queue[tuple[int, str]], index: int, text: str) -> None:
    """From the engine's thread: hand a row's settled text to its request's event loop."""
    loop.call_soon_threadsafe(told.put_nowait, (index, text))


async def live_events(rid: str, model: str, chat: bool, n: int, first: tuple[int, str],
                told: asyncio.Queue[tuple[int, str]], waiter: asyncio.Future[list[Result]]) -> AsyncIterator[str]:
    """Answers as server-sent events while they settle: the role, each new piece of settled text (a denoising block's,
    or whatever the confidence order settled left to right), then what the final answer adds, a final chunk per
    answer with its finish reason (and usage), then [DONE]."""
    stream = protocol.Stream(rid, model, int(time.time()), chat)
    sent = [""] * n
    getter: asyncio.Future[tuple[int, str]] | None = None
    try:
        if chat:
            yield sse(protocol.chunk(stream, 0, role=True))
        pending: tuple[int, str] | None = first
        while True:
            while pending is not None:
                index, text = pending
                if text.startswith(sent[index]) and len(text) > len(sent[index]):
                    yield sse(protocol.chunk(stream, index, text=text[len(sent[index]):]))
                    sent[index] = text
                pending = told.get_nowait() if not told.empty() else None
            if waiter.done():
                break
            getter = asyncio.ensure_future(told.get())
            either: set[asyncio.Future[Any]] = {getter, waiter}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                pending = getter.result()
            else:
                getter.cancel()
            getter = None
    finally:  # closed early (the client left): nothing may outlive the response, pending or unretrieved
        if getter is not None:
            getter.cancel()
        if not waiter.done():
            waiter.cancel()  # its rows leave the queue, or their results are dropped
    try:
        results = waiter.result()
    except Exception as exc:  # noqa: BLE001  # the status line is sent: the error travels as an event
        yield sse({"error": {"message": " ".join(str(exc).split()) or type(exc).__name__, "type": "server_error"}})
        yield "data: [DONE]\n\n"
        return
    for i, result in enumerate(results):
        rest = result.text[len(sent[i]):] if result.text.startswith(sent[i]) else ""
        if rest:
            yield sse(protocol.chunk(stream, i, text=rest))
        last = i == len(results) - 1
        yield sse(protocol.chunk(stream, i, finish=result.finish_reason,
                                  usage_=protocol.usage(results) if last else None))
    yield "data: [DONE]\n\n"


async def finished_events(rid: str, model: str, chat: bool, results: list[Result]) -> AsyncIterator[str]:
    """Finished answers as server-sent events: the role, the text, a final chunk with the finish reason and usage
    (Seer's report included), then [DONE]."""
    stream = protocol.Stream(rid, model, int(time.time()), chat)
    for i, result in enumerate(results):
        if chat:
            yield sse(protocol.chunk(stream, i, role=True))
        if result.text:
            yield sse(protocol.chunk(stream, i, text=result.text))
        last = i == len(results) - 1
        yield sse(protocol.chunk(stream, i, finish=result.finish_reason,
                                  usage_=protocol.usage(results) if last else None))
    yield "data: [DONE]\n\n"
