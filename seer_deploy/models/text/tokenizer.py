"""Tokenizers as checkpoints ship them (models.text.tokenizer_files), prompts built through the checkpoint's own chat
template (models.text.chat_template): the one place every backend's text goes through.

A prompt must be non-empty text, and special-token text typed into it (`<|mdm_mask|>` would become a real mask the
model fills in; LLaDA's `<role>`) is refused: every token the tokenizer or its configs mark special. A request is a
prompt (one user turn) or a conversation (role, content pairs, the server's chat messages); both are rendered by the
same template (`encode_request`). MMaDA prompts may carry pre-tokenized image codes, written
`<image_codes>12 7 4095</image_codes>` (whitespace-separated integers, each below the codebook size); they are put in
front of the templated text as `<|mmu|><|soi|>` + the codes' ids + `<|eoi|>`, as Gen-Verse/MMaDA's inference_mmu.py
builds its ids: code c is token len(text tokenizer) + c, and the marks are the tokenizer's `<|mmu|>`, `<|soi|>`,
`<|eoi|>` where it has them, else the reserved ids its UniversalPrompting(use_reserved_token=True) uses.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seer_deploy.core.checks import ascii_int, int_in
from seer_deploy.core.errors import CheckpointError, ConfigError, SeerDeployError
from seer_deploy.models.text.chat_template import chat_messages, find_template
from seer_deploy.models.text.tokenizer_files import (
    ADDED,
    MERGES,
    SPECIAL_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    VOCAB,
    TokenizerFacts,
    has_tokenizer,
    load_tokenizer,
    manifest_tokenizer_entry,
    resolve_special_ids,
    special_texts,
    text_tokens,
)

IMAGE_CODES = re.compile(r"<image_codes>(.*?)</image_codes>", re.DOTALL)
MMADA_TOKENS = ("<|mmu|>", "<|soi|>", "<|eoi|>")  # MMaDA's multimodal-understanding task and image delimiters
# Gen-Verse/MMaDA training/prompting_utils.py reserved_token_mapping (LLaDA's <|reserved_token_5|>, _0, _1).
MMADA_RESERVED = {"<|mmu|>": 126089, "<|soi|>": 126084, "<|eoi|>": 126085}
# Text a prompt may not contain whatever the tokenizer says, with what it means to the model.
RESERVED_TEXTS: dict[str, str] = {
    "<|mdm_mask|>": "mask token", "<|endoftext|>": "eos token", "<|startoftext|>": "bos token",
    "<|eot_id|>": "eot token", "<|start_header_id|>": "chat-template header token",
    "<|end_header_id|>": "chat-template header token",
}
Messages = Sequence[tuple[str, str]]  # (role, content), in order


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


def special_ids_from_tokenizer_file(file: Path) -> dict[str, Any]:
    """The special ids of the checkpoint beside this tokenizer file, in models.text.tokenizer_files' stated order, and
    "text_tokens" (len(tokenizer), where MMaDA's image codes start) when it has a tokenizer; {} without one."""
    directory = file.parent
    if not has_tokenizer(directory):
        return resolve_special_ids(directory).ids
    tok = load_tokenizer(directory)
    return {**resolve_special_ids(directory, tok).ids, "text_tokens": text_tokens(tok)}


def export_tokenizer(checkpoint: Path, out: Path) -> dict[str, Any]:
    """Write the checkpoint's tokenizer.json into the export `out` (converted from the slow BPE files where it ships
    none); return the manifest's extra entry: the files read, the chat template, the special tokens and where each
    special id came from. {} for a checkpoint without tokenizer files (an export of ids only)."""
    if not has_tokenizer(checkpoint):
        return {}
    tok = load_tokenizer(checkpoint)
    if (checkpoint / TOKENIZER_JSON).is_file():
        shutil.copyfile(checkpoint / TOKENIZER_JSON, out / TOKENIZER_JSON)
        read = [TOKENIZER_JSON]
    else:
        (out / TOKENIZER_JSON).write_text(tok.to_str(pretty=False))
        read = [VOCAB, MERGES]
    read += [n for n in (ADDED, TOKENIZER_CONFIG, SPECIAL_MAP, "generation_config.json") if (checkpoint / n).is_file()]
    return {"tokenizer": {"read": read, "converted": TOKENIZER_JSON not in read,
                          **find_template(checkpoint, tok).manifest_entry(),
                          "special_tokens": sorted(special_texts(checkpoint)),
                          "special_ids_from": resolve_special_ids(checkpoint, tok).sources}}


def image_codes_beside(directory: Path) -> tuple[int, int] | None:
    """MMaDA's image-code range (first id, count) from the config.json (a checkpoint) or manifest.json (an export)
    in `directory`; None for every other model, or when neither file says."""
    import json

    from seer_deploy.models.families.config import config_from_dict

    try:
        if (directory / "config.json").is_file():
            raw = json.loads((directory / "config.json").read_text())
            return config_from_dict(raw, special_ids_from_tokenizer_file(directory / TOKENIZER_JSON)).image_code_range
        if (directory / "manifest.json").is_file():
            config = json.loads((directory / "manifest.json").read_text())["model"]["config"]
            base, codes = config.get("image_code_base"), config.get("image_codes", 0)
            return (base, codes) if codes and isinstance(base, int) else None
    except (SeerDeployError, OSError, ValueError, KeyError, TypeError):
        return None  # the loaders name what is wrong with these files; the tokenizer just takes no codes
    return None


class Tokenizer:
    """Text <-> ids for a tokenizer.json file or a checkpoint / export directory (its tokenizer as shipped), with
    its chat template (`template`: (text, source) instead of its text, None text = raw: --chat-template /
    --no-chat-template; the special tokens' texts stay the checkpoint's); `image_codes` (base id, codebook size)
    enables MMaDA's image-code syntax."""

    def __init__(self, path: str | os.PathLike[str], eos_id: int, eot_id: int | None = None,
                 image_codes: tuple[int, int] | None = None, template: tuple[str | None, str] | None = None, *,
                 described: TokenizerFacts | None = None) -> None:
        """`described`: what the target's description says (image codes, the export's tokenizer entry), read once by
        the opener; without it they are read from the files beside `path`."""
        path = Path(path)
        directory = path if path.is_dir() else path.parent
        self._tok = load_tokenizer(path)
        self.eos_id = eos_id
        self.eot_id = eot_id
        own = find_template(directory, self._tok, described)
        self.template = own if template is None else own.replaced(*template)
        if described is None:
            self.image_codes = image_codes if image_codes is not None else image_codes_beside(directory)
            entry = manifest_tokenizer_entry(directory)
        else:
            self.image_codes, entry = image_codes or described.image_codes, described.manifest_entry
        named = set(entry.get("special_tokens") or []) if entry is not None else special_texts(directory)
        added = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        # A one-character special token (the demo's '=') is ordinary text too: refusing it would refuse plain prompts.
        self._specials = sorted(t for t in named | added if len(t) > 1)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | os.PathLike[str], eos_id: int, eot_id: int | None = None,
                        image_codes: tuple[int, int] | None = None) -> Tokenizer:
        return cls(Path(checkpoint_dir), eos_id, eot_id, image_codes)

    @property
    def chat(self) -> bool:
        """Whether prompts go through a chat template (False: raw text)."""
        return not self.template.raw

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt ids as the model expects them: one user turn through the chat template (raw text without one),
        image codes expanded."""
        check_prompt(text)
        return self.encode_chat([("user", text)])

    def encode_chat(self, messages: Messages) -> list[int]:
        """A conversation's prompt ids, through the chat template with the assistant's turn opened; a raw-text model
        takes one user message as is. Every content is checked for typed special tokens first."""
        if not messages:
            raise ConfigError("no messages; send at least one user message")
        images: list[int] = []
        plain: list[tuple[str, str]] = []
        for i, (role, content) in enumerate(messages):
            where = "the prompt" if len(messages) == 1 else f"messages[{i}].content"
            check_prompt(content, where)
            pieces = IMAGE_CODES.split(content)  # text, codes, text, codes, ..., text
            for piece in pieces[::2]:
                self._check_specials(piece, where)
            images += self._codes(pieces[1::2])
            text = content if len(pieces) == 1 else " ".join(p.strip() for p in pieces[::2] if p.strip())
            if text:
                plain.append((role, text))
        if not plain:
            return images
        if self.template.raw:
            if len(plain) != 1 or plain[0][0] != "user":
                raise ConfigError(f"this model takes raw text ({self.template.source}): send one user message, or "
                                  "give a chat template with --chat-template FILE")
            return images + self._ids(plain[0][1], add_special_tokens=True)
        return images + self._ids(self.template.render(chat_messages(plain)), add_special_tokens=False)

    def encode_request(self, prompt: str, messages: Messages = ()) -> list[int]:
        """The one way a request becomes ids: its conversation when it has one, else its prompt as a user turn."""
        return self.encode_chat(messages) if messages else self.encode_prompt(prompt)

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def _check_specials(self, text: str, where: str = "the prompt") -> None:
        for token in self._specials:
            if token in text:
                raise ConfigError(f"{where} contains {token!r}, a special token of this model's tokenizer: "
                                  "special-token text cannot be typed into a prompt; remove it")

    def _codes(self, blocks: Sequence[str]) -> list[int]:
        """`<image_codes>` blocks as MMaDA's ids: <|mmu|><|soi|> codes <|eoi|> per block."""
        if not blocks:
            return []
        if self.image_codes is None:
            raise ConfigError("this model takes no image codes (<image_codes>...</image_codes> is MMaDA's syntax for "
                              "pre-tokenized VQ images); remove the block")
        base, size = self.image_codes
        mmu, soi, eoi = self.mmada_marks()
        images: list[int] = []
        for block in blocks:
            codes = block.split()
            bad = next((c for c in codes if not int_in(ascii_int(c), 0, size - 1)), None)
            if not codes or bad is not None:
                raise ConfigError(f"<image_codes> holds {bad!r}: give whitespace-separated integers from 0 to "
                                  f"{size - 1} (the VQ codebook)" if codes else "<image_codes> is empty; give the "
                                  "image's VQ codes")
            images += [mmu, soi, *(base + int(c) for c in codes), eoi]
        return images

    def mmada_marks(self) -> tuple[int, int, int]:
        """<|mmu|>, <|soi|>, <|eoi|>: the tokenizer's own tokens, else MMaDA's reserved ids (LLaDA's tokenizer holds
        <|reserved_token_N|> there); CheckpointError when it has neither."""
        own = [self._tok.token_to_id(t) for t in MMADA_TOKENS]
        if all(i is not None for i in own):
            return own[0], own[1], own[2]  # type: ignore[return-value]
        reserved = [MMADA_RESERVED[t] for t in MMADA_TOKENS]
        if all((self._tok.id_to_token(i) or "").startswith("<|reserved_token_") for i in reserved):
            return reserved[0], reserved[1], reserved[2]
        raise CheckpointError(f"the tokenizer has neither MMaDA's image tokens {', '.join(MMADA_TOKENS)} nor the "
                              f"reserved ids {sorted(MMADA_RESERVED.values())} MMaDA uses for them; use the "
                              "checkpoint's own tokenizer")

    def answer_end(self, ids: Sequence[int]) -> int | None:
        """Where a response ends: the index of its first EOS / EoT (the stop set, decided here only); None if none."""
        stops = {self.eos_id} | ({self.eot_id} if self.eot_id is not None else set())
        return next((i for i, t in enumerate(ids) if t in stops), None)

    def decode_answer(self, ids: Sequence[int]) -> str:
        """The text of a response, up to its first EOS / EoT."""
        end = self.answer_end(ids)
        return self._tok.decode(list(ids[: len(ids) if end is None else end]), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()
