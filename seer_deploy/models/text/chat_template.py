"""The checkpoint's own chat template, rendered as transformers renders it, and the one way a prompt is built.

A template is found in this order (`find_template`): an export's manifest entry (what the export carried over),
tokenizer_config.json's `chat_template` (a string, or the entry named "default" of a list), a `chat_template.jinja`
file beside it; only a checkpoint that carries none gets a built-in one, chosen by its tokenizer's tokens (LLaDA's
header tokens: LLaDA's template; ChatML's `<|im_start|>`: ChatML with Qwen2.5's default system line); the rest (the
demos, base models) take raw text. `--chat-template FILE` replaces the template, `--no-chat-template` sends raw text.

Rendering follows transformers' `apply_chat_template`: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, loop controls, `raise_exception`, a `tojson` that keeps non-ASCII text, `strftime_now`, the special
tokens' texts (bos_token, eos_token, ...) and add_generation_prompt; the text is then encoded without adding special
tokens. The template is data: nothing in the checkpoint is imported or executed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.files import read_text
from seer_deploy.models.text.tokenizer_files import (
    NAMED_TOKENS,
    SPECIAL_MAP,
    TOKENIZER_CONFIG,
    TokenizerFacts,
    manifest_tokenizer_entry,
    optional_json,
    token_text,
)

TEMPLATE_FILE = "chat_template.jinja"
# Built-in templates, for checkpoints that carry none. LLaDA's renders as LLaDA-8B-Instruct's own (its
# tokenizer_config.json, monash-yann/dllm-research models/LLaDA-8B-Instruct); ChatML's as Dream-v0-Instruct-7B's
# without tools (a default system line when the conversation has none).
LLADA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
                  "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
                  "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
                   "<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                   "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
RAW = "raw text (no chat template)"


class _GenerationTag(Extension):
    """transformers' `{% generation %}` block (it marks assistant tokens for training masks): rendered as is."""

    tags = {"generation"}  # noqa: RUF012  (jinja2 declares it an instance attribute)

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(text: str, source: str) -> jinja2.Template:
    """The template in transformers' sandbox; ConfigError naming `source` when it does not parse."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(text)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ConfigError(f"the chat template from {source} does not parse (line {exc.lineno}: {exc.message}); fix "
                          "it or give another with --chat-template FILE") from exc


@dataclass(frozen=True)
class ChatTemplate:
    """A template (None: raw text), where it came from, and the special tokens' texts it may use."""

    text: str | None
    source: str
    tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... (transformers passes them all)

    @property
    def raw(self) -> bool:
        return self.text is None

    @cached_property
    def compiled(self) -> jinja2.Template:
        """The template compiled once (a server renders it per request)."""
        return compile_template(self.text or "", self.source)

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text of `messages`; ConfigError with the template's own message when it refuses them."""
        if self.text is None:
            raise ConfigError("this model takes raw text (no chat template): send one prompt, or give a template "
                              "with --chat-template FILE")
        try:
            return self.compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt, tools=None,
                                   documents=None, **self.tokens)
        except jinja2.exceptions.TemplateError as exc:
            raise ConfigError(f"the chat template ({self.source}) cannot take these messages: {exc}; send the roles "
                              "and contents it takes (e.g. alternating user and assistant turns)") from exc
        except (TypeError, KeyError, AttributeError, IndexError) as exc:
            raise ConfigError(f"the chat template ({self.source}) failed on these messages ({exc}); send plain text "
                              "contents with the roles system, user and assistant") from exc

    def manifest_entry(self) -> dict[str, Any]:
        return {"chat_template": self.text, "chat_template_source": self.source, "template_tokens": dict(self.tokens)}

    def replaced(self, text: str | None, source: str) -> ChatTemplate:
        return ChatTemplate(text, source, self.tokens)


def template_tokens(directory: Path) -> dict[str, str]:
    """The special tokens' texts a template may use, as transformers passes them: special_tokens_map.json's, then
    tokenizer_config.json's."""
    out: dict[str, str] = {}
    for name in (SPECIAL_MAP, TOKENIZER_CONFIG):
        data = optional_json(directory, name)
        out.update({key: text for key in NAMED_TOKENS if (text := token_text(data.get(key))) and key not in out})
    return out


def find_template(directory: Path, tok: Tokenizer, facts: TokenizerFacts | None = None) -> ChatTemplate:
    """The template of a checkpoint or export directory (the module docstring's order); `facts`: what the target's
    description says instead of its manifest.json."""
    entry = manifest_tokenizer_entry(directory) if facts is None else facts.manifest_entry
    if entry is not None and "chat_template_source" in entry:
        text = entry.get("chat_template")
        tokens = entry.get("template_tokens") or {}
        return ChatTemplate(text if isinstance(text, str) else None, str(entry["chat_template_source"]),
                            {str(k): str(v) for k, v in tokens.items()})
    tokens = template_tokens(directory)
    own = _own_template(directory)
    if own is not None:
        return ChatTemplate(own[0], own[1], tokens)
    if tok.token_to_id("<|start_header_id|>") is not None:
        return ChatTemplate(LLADA_TEMPLATE, "built-in LLaDA template", {"bos_token": "<|startoftext|>", **tokens})
    if tok.token_to_id("<|im_start|>") is not None:
        return ChatTemplate(CHATML_TEMPLATE, "built-in ChatML template", tokens)
    return ChatTemplate(None, RAW, tokens)


def _own_template(directory: Path) -> tuple[str, str] | None:
    """(template, source) from tokenizer_config.json's chat_template or chat_template.jinja; None without one."""
    value = optional_json(directory, TOKENIZER_CONFIG).get("chat_template")
    if isinstance(value, list):  # [{"name": ..., "template": ...}, ...]: transformers uses "default"
        named = {e.get("name"): e.get("template") for e in value if isinstance(e, dict)}
        value = named.get("default")
    if isinstance(value, str) and value.strip():
        return value, f"{TOKENIZER_CONFIG} chat_template"
    if (directory / TEMPLATE_FILE).is_file():
        return read_text(directory / TEMPLATE_FILE, "chat template", error=CheckpointError), TEMPLATE_FILE
    return None


def read_template_file(path: Path) -> str:
    """--chat-template FILE: a Jinja template, checked to parse."""
    text = read_text(path, "chat template", fix="give a Jinja chat template file to --chat-template")
    compile_template(text, str(path))
    return text


def chat_messages(messages: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """(role, content) pairs as the template's `messages`."""
    return [{"role": role, "content": content} for role, content in messages]
