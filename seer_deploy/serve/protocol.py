"""OpenAI's request and response shapes for /v1/completions and /v1/chat/completions, with Seer's extras.

Bodies are parsed strictly: an unknown field is refused (a typo such as `tail_contxt` would otherwise be silently
ignored), except the OpenAI sampling fields that have no meaning for this model (top_p, penalties, ...), which
clients send by default and which are accepted and ignored; and types are not coerced, as OpenAI's API refuses them
(pydantic's strict mode: `max_tokens: true`, `"16"` or `16.0` is not an integer, `stream: 1` not a boolean). A chat
request's messages (a system message, several turns, ending with a user turn) go through the model's own chat template
(models.text.tokenizer.Tokenizer.encode_chat); image_url parts become `<image>` placeholders where they stand, unless the
text already places them (as `seer-deploy generate --prompt '<image> ...'` does).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.checkpoints.multimodal_files import IMAGE_TOKEN
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.models.text.tokenizer import check_prompt
from seer_deploy.serve.images import decode_data_url
from seer_deploy.serve.responder import Result


class BadField(ConfigError):
    """A request field with a wrong type or value; `param` names it (OpenAI's error `param`)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class Body(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stop: str | list[str] | None = None
    n: int = 1
    # Seer's extras
    seer: bool | None = None
    tail_context: int | Literal["all"] | None = None
    steps: int | None = Field(default=None, ge=1)
    block_length: int | None = Field(default=None, ge=1)
    # The decoding rule (generate --decode ...; core.decoding): None keeps the server's. top_p / top_k are used by the
    # Dream family's sampler only (OpenAI clients send top_p to every server: ignored under LLaDA's rules).
    decode: str | None = None
    remasking: str | None = None
    eps: float | None = None
    alg_temp: float | None = None
    threshold: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    # OpenAI fields with no meaning here: accepted, ignored
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    stream_options: dict[str, Any] | None = None

    def rule(self) -> dict[str, Any]:
        """The decoding-rule fields the request sets (GenerationConfig's names)."""
        fields = ("decode", "remasking", "eps", "alg_temp", "threshold", "top_p", "top_k")
        return {name: getattr(self, name) for name in fields if getattr(self, name) is not None}

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)


class CompletionBody(Body):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None

    def requests(self, max_prompts: int) -> list[Prompt]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not prompts:
            raise ConfigError("prompt is an empty list; give a prompt or a list of prompts")
        if len(prompts) > max_prompts:
            raise ConfigError(f"prompt holds {len(prompts)} prompts, above this server's {max_prompts}; split the "
                              "request")
        if self.echo or self.logprobs:
            raise ConfigError("echo and logprobs are not supported (the model's graphs return only the chosen "
                              "tokens); drop them")
        where = "prompt" if len(prompts) == 1 else "prompt[{}]"
        return [Prompt(check_prompt(p, where.format(i)), where=where.format(i)) for i, p in enumerate(prompts)]


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="ignore")
    url: str


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[Part]


class ChatBody(Body):
    messages: list[Message]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None

    def request(self) -> Prompt:
        """The conversation (a system message, several turns) as one request, rendered by the model's chat template
        when it is encoded; image parts become `<image>` placeholders where they stand in their message."""
        if not self.messages:
            raise ConfigError("messages is empty; send at least one message with role 'user'")
        if self.logprobs:
            raise ConfigError("logprobs is not supported (the model's graphs return only the chosen tokens); drop it")
        turns: list[tuple[str, str]] = []
        images = []
        for m, message in enumerate(self.messages):
            where = f"messages[{m}].content"
            text, pictures = _content(message.content, where)
            if pictures and message.role != "user":
                raise ConfigError(f"{where}: images go in user messages, not {message.role!r} ones; move the image")
            turns.append((message.role, check_prompt(text, where)))
            images.extend(pictures)
        if turns[-1][0] != "user":
            raise ConfigError(f"the last message has role {turns[-1][0]!r}; end the conversation with a user message "
                              "(the model answers it)")
        prompt = "\n".join(content for _, content in turns)
        return Prompt(prompt, tuple(images), "messages", messages=tuple(turns))


def _content(content: str | list[Part], where: str) -> tuple[str, list[Any]]:
    """A message's text and its pictures; image parts stand as `<image>` unless the text places them itself."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    images = []
    for i, part in enumerate(content):
        if part.type == "text":
            if part.text is None:
                raise ConfigError(f"{where}[{i}] is a text part without 'text'; add the text")
            texts.append(part.text)
        else:
            if part.image_url is None:
                raise ConfigError(f"{where}[{i}] is an image_url part without 'image_url'; add {{\"url\": ...}}")
            images.append(decode_data_url(part.image_url.url, f"{where}[{i}]"))
            texts.append(IMAGE_TOKEN)
    placed = sum(t.count(IMAGE_TOKEN) for t in texts if t != IMAGE_TOKEN)
    if placed:  # the text places its pictures itself: image parts only supply them, in order
        texts = [t for t in texts if t != IMAGE_TOKEN]
    return " ".join(t.strip() for t in texts if t.strip()), images


def parse(model: type[Body], raw: bytes) -> Any:
    """The body as `model`, or ConfigError naming the first bad field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "the body"
        param = str(error["loc"][0]) if error["loc"] else None
        if error["type"] == "json_invalid":
            raise ConfigError(f"the body is not valid JSON ({error['msg']}); send a JSON object") from exc
        if error["type"] == "model_type":
            raise ConfigError("the body is not a JSON object; send one, e.g. {\"prompt\": \"...\"}") from exc
        if error["type"] == "extra_forbidden":
            raise BadField(f"unknown field '{where}'; see docs/serving.md for the fields this server takes",
                           param) from exc
        given = f" (got {json.dumps(error['input'])})" if error["type"].endswith("_type") and _short(error) else ""
        raise BadField(f"{where}: {error['msg']}{given}", param) from exc


def _short(error: Any) -> bool:
    """Whether an error's input is worth quoting in a one-line message (a scalar, not a picture's data URL)."""
    value = error.get("input")
    return value is None or isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 40)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def completion(rid: str, model: str, results: list[Result]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None}
                        for i, r in enumerate(results)],
            "usage": usage(results)}


def chat_completion(rid: str, model: str, result: Result) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                         "finish_reason": result.finish_reason, "logprobs": None}],
            "usage": usage([result])}


def usage(results: list[Result]) -> dict[str, Any]:
    """OpenAI's token counts summed over the choices, and per choice what Seer did."""
    rows = [r.usage() for r in results]
    total: dict[str, Any] = {k: sum(u[k] for u in rows) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    if len(rows) == 1:
        total.update({k: v for k, v in rows[0].items() if k not in total})
    else:
        total["choices"] = [{k: v for k, v in u.items() if k not in total} for u in rows]
    return total


@dataclass(frozen=True)
class Stream:
    """What every event of one streamed response repeats: its id, the model, when it was created, chat or not."""

    rid: str
    model: str
    created: int
    chat: bool


def chunk(stream: Stream, index: int, *, role: bool = False, text: str | None = None, finish: str | None = None,
          usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    """One server-sent event's data for a streamed answer."""
    chat = stream.chat
    choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    out: dict[str, Any] = {"id": stream.rid, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": stream.created, "model": stream.model, "choices": [choice]}
    if usage_ is not None:
        out["usage"] = usage_
    return out
