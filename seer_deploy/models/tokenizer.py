"""Tokenizers loaded from a checkpoint's `tokenizer.json`, with the family's special tokens resolved.

Prompts are checked here, the one place every backend's text goes through: a prompt must be non-empty text, and
special-token text typed into it (`<|mdm_mask|>` would become a real mask the model fills in) is refused.

Chat templates follow the tokenizer's special tokens: LLaDA's header tokens give LLaDA's template, ChatML's
`<|im_start|>` (Dream, Dimple) gives ChatML with Qwen2.5's default system line. MMaDA prompts may carry pre-tokenized
image codes, written `<image_codes>12 7 4095</image_codes>` (whitespace-separated integers, each below the
codebook size); the tokenizer expands them in place to `<|mmu|><|soi|>` + the codes' ids + `<|eoi|>`, as MMaDA's
multimodal-understanding prompts hold them (code c is token image_code_base + c).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from seer_deploy.core.errors import CheckpointError, ConfigError, SeerDeployError
from seer_deploy.core.files import read_text

# LLaDA's special token strings (the demo's tokenizer uses the same ones).
SPECIAL_TOKENS: dict[str, str] = {
    "mask": "<|mdm_mask|>",
    "eos": "<|endoftext|>",
    "bos": "<|startoftext|>",
    "eot": "<|eot_id|>",
}
# Other families' spellings, tried after LLaDA's: Dream's mask and BOS, ChatML's end of turn (Dream, Dimple).
ALTERNATIVE_TOKENS: dict[str, tuple[str, ...]] = {"mask": ("<|mask|>",), "bos": ("<|beginoftext|>",),
                                                  "eot": ("<|im_end|>",)}
_IM_START, _IM_END = "<|im_start|>", "<|im_end|>"
CHATML_SYSTEM = "You are a helpful assistant."  # Qwen2.5's default system line, which Dream's template keeps
MMADA_TOKENS = ("<|mmu|>", "<|soi|>", "<|eoi|>")  # MMaDA's multimodal-understanding task and image delimiters
IMAGE_CODES = re.compile(r"<image_codes>(.*?)</image_codes>", re.DOTALL)
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
    found: dict[str, int] = {}
    for name, text in SPECIAL_TOKENS.items():
        for spelling in (text, *ALTERNATIVE_TOKENS.get(name, ())):
            token_id = tok.token_to_id(spelling)
            if token_id is not None:
                found[name] = token_id
                break
    return found


def image_codes_beside(file: Path) -> tuple[int, int] | None:
    """MMaDA's image-code range (first id, count) from the config.json (a checkpoint) or manifest.json (an export)
    beside a tokenizer file; None for every other model, or when neither file says."""
    import json

    from seer_deploy.models.config import config_from_dict

    try:
        if (file.parent / "config.json").is_file():
            return config_from_dict(json.loads((file.parent / "config.json").read_text())).image_code_range
        if (file.parent / "manifest.json").is_file():
            config = json.loads((file.parent / "manifest.json").read_text())["model"]["config"]
            base, codes = config.get("image_code_base"), config.get("image_codes", 0)
            return (base, codes) if codes and isinstance(base, int) else None
    except (SeerDeployError, OSError, ValueError, KeyError, TypeError):
        return None  # the loaders name what is wrong with these files; the tokenizer just takes no codes
    return None


def _load(file: Path) -> HFTokenizer:
    text = read_text(file, "tokenizer", error=CheckpointError,
                     fix="the checkpoint needs a tokenizer.json to encode prompts")
    try:
        return HFTokenizer.from_str(text)
    except Exception as exc:  # the tokenizers library raises a bare Exception on malformed files
        raise CheckpointError(f"{file} is not a readable tokenizer.json ({exc}); re-download it") from exc


class Tokenizer:
    """Text <-> ids. LLaDA-Instruct checkpoints (header tokens present) get LLaDA's chat template, ChatML tokenizers
    (Dream, Dimple) ChatML's; `image_codes` (base id, codebook size) enables MMaDA's image-code syntax."""

    def __init__(self, file: str | os.PathLike[str], eos_id: int, eot_id: int | None = None,
                 image_codes: tuple[int, int] | None = None) -> None:
        self._tok = _load(Path(file))
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.chat = self._tok.token_to_id(_HEADER_START) is not None
        self.chatml = self._tok.token_to_id(_IM_START) is not None
        self.image_codes = image_codes if image_codes is not None else image_codes_beside(Path(file))
        self._specials = [t.content for t in self._tok.get_added_tokens_decoder().values()
                          if t.special and t.content.startswith("<|") and t.content.endswith("|>")]

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | os.PathLike[str], eos_id: int, eot_id: int | None = None,
                        image_codes: tuple[int, int] | None = None) -> Tokenizer:
        return cls(Path(checkpoint_dir) / "tokenizer.json", eos_id, eot_id, image_codes)

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt ids as the model expects them (chat template for Instruct checkpoints, image codes expanded)."""
        check_prompt(text)
        pieces = IMAGE_CODES.split(text)  # text, codes, text, codes, ..., text
        for piece in pieces[::2]:
            self._check_specials(piece)
        if len(pieces) > 1:
            return self._with_codes(pieces)
        if self.chatml:
            text = (f"{_IM_START}system\n{CHATML_SYSTEM}{_IM_END}\n{_IM_START}user\n{text}{_IM_END}\n"
                    f"{_IM_START}assistant\n")
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        if self.chat:
            text = (
                f"{SPECIAL_TOKENS['bos']}{_HEADER_START}user{_HEADER_END}\n\n{text}{SPECIAL_TOKENS['eot']}"
                f"{_HEADER_START}assistant{_HEADER_END}\n\n"
            )
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text).ids)

    def _check_specials(self, text: str) -> None:
        for token in self._specials:
            if token in text:
                raise ConfigError(f"the prompt contains {token!r}, a special token of this model's tokenizer: "
                                  "special-token text cannot be typed into a prompt; remove it")

    def _with_codes(self, pieces: list[str]) -> list[int]:
        """A prompt with `<image_codes>` blocks: each block becomes <|mmu|><|soi|> codes <|eoi|>, the text around
        it goes through the chat template (the codes first, as MMaDA's understanding prompts put the image)."""
        if self.image_codes is None:
            raise ConfigError("this model takes no image codes (<image_codes>...</image_codes> is MMaDA's syntax for "
                              "pre-tokenized VQ images); remove the block")
        base, size = self.image_codes
        marks = [self._tok.token_to_id(t) for t in MMADA_TOKENS]
        if any(m is None for m in marks):
            raise CheckpointError(f"tokenizer.json lacks MMaDA's image tokens {', '.join(MMADA_TOKENS)}; use the "
                                  "checkpoint's own tokenizer.json")
        mmu, soi, eoi = (int(m) for m in marks if m is not None)
        images: list[int] = []
        for block in pieces[1::2]:
            codes = block.split()
            bad = next((c for c in codes if not (c.isdigit() and int(c) < size)), None)
            if not codes or bad is not None:
                raise ConfigError(f"<image_codes> holds {bad!r}: give whitespace-separated integers from 0 to "
                                  f"{size - 1} (the VQ codebook)" if codes else "<image_codes> is empty; give the "
                                  "image's VQ codes")
            images += [mmu, soi, *(base + int(c) for c in codes), eoi]
        text = " ".join(p.strip() for p in pieces[::2] if p.strip())
        return images + (self.encode_prompt(text) if text else [])

    def decode_answer(self, ids: list[int]) -> str:
        """The text of a response, up to its first EOS / EoT."""
        stops = {self.eos_id} | ({self.eot_id} if self.eot_id is not None else set())
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return self._tok.decode(list(ids[:cut]), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()
