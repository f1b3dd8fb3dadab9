"""Tokenizers loaded from a checkpoint's `tokenizer.json`, with LLaDA's special tokens resolved.

Prompts are checked here, the one place every backend's text goes through: a prompt must be non-empty text, and
special-token text typed into it (`<|mdm_mask|>` would become a real mask the model fills in) is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.files import read_text

# LLaDA's special token strings (the demo's tokenizer uses the same ones).
SPECIAL_TOKENS: dict[str, str] = {
    "mask": "<|mdm_mask|>",
    "eos": "<|endoftext|>",
    "bos": "<|startoftext|>",
    "eot": "<|eot_id|>",
}
_HEADER_START, _HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
# Text a prompt may not contain, with what it means to the model.
RESERVED_TEXTS: dict[str, str] = {
    **{text: f"{name} token" for name, text in SPECIAL_TOKENS.items()},
    _HEADER_START: "chat-template header token",
    _HEADER_END: "chat-template header token",
}


def check_prompt(text: object, where: str = "the prompt") -> str:
    """`text` if it is a usable prompt; ConfigError naming the problem otherwise (`where` names the prompt)."""
    if not isinstance(text, str):
        kinds = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", list: "a list"}
        kind = "null" if text is None else kinds.get(type(text), f"a {type(text).__name__}")
        raise ConfigError(f"{where} is {kind}, not text; give each prompt as a string")
    if not text.strip():
        raise ConfigError(f"{where} is empty; give a prompt with some text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{where} holds a character that is not valid Unicode (at {exc.start}); fix it") from exc
    for token, meaning in RESERVED_TEXTS.items():
        if token in text:
            raise ConfigError(
                f"{where} contains {token!r}, the model's {meaning}: special-token text cannot be typed into a "
                "prompt; remove it"
            )
    return text


def special_ids_from_tokenizer_file(file: Path) -> dict[str, int]:
    """The ids of LLaDA's special tokens that this tokenizer.json knows (an empty dict if there is no file)."""
    if not file.is_file():
        return {}
    tok = _load(file)
    found = {name: tok.token_to_id(text) for name, text in SPECIAL_TOKENS.items()}
    return {name: i for name, i in found.items() if i is not None}


def _load(file: Path) -> HFTokenizer:
    text = read_text(file, "tokenizer", error=CheckpointError,
                     fix="the checkpoint needs a tokenizer.json to encode prompts")
    try:
        return HFTokenizer.from_str(text)
    except Exception as exc:  # the tokenizers library raises a bare Exception on malformed files
        raise CheckpointError(f"{file} is not a readable tokenizer.json ({exc}); re-download it") from exc


class Tokenizer:
    """Text <-> ids. LLaDA-Instruct checkpoints (header tokens present) get LLaDA's chat template."""

    def __init__(self, file: str | os.PathLike[str], eos_id: int, eot_id: int | None = None) -> None:
        self._tok = _load(Path(file))
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.chat = self._tok.token_to_id(_HEADER_START) is not None

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | os.PathLike[str], eos_id: int, eot_id: int | None = None) -> Tokenizer:
        return cls(Path(checkpoint_dir) / "tokenizer.json", eos_id, eot_id)

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt ids as the model expects them (chat template for Instruct checkpoints)."""
        check_prompt(text)
        if self.chat:
            text = (
                f"{SPECIAL_TOKENS['bos']}{_HEADER_START}user{_HEADER_END}\n\n{text}{SPECIAL_TOKENS['eot']}"
                f"{_HEADER_START}assistant{_HEADER_END}\n\n"
            )
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text).ids)

    def decode_answer(self, ids: list[int]) -> str:
        """The text of a response, up to its first EOS / EoT."""
        stops = {self.eos_id} | ({self.eot_id} if self.eot_id is not None else set())
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return self._tok.decode(list(ids[:cut]), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()
