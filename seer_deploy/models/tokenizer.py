"""Tokenizers loaded from a checkpoint's `tokenizer.json`, with LLaDA's special tokens resolved."""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from seer_deploy.core.errors import CheckpointError

# LLaDA's special token strings (the demo's tokenizer uses the same ones).
SPECIAL_TOKENS: dict[str, str] = {
    "mask": "<|mdm_mask|>",
    "eos": "<|endoftext|>",
    "bos": "<|startoftext|>",
    "eot": "<|eot_id|>",
}
_HEADER_START, _HEADER_END = "<|start_header_id|>", "<|end_header_id|>"


def special_ids_from_tokenizer_file(file: Path) -> dict[str, int]:
    """The ids of LLaDA's special tokens that this tokenizer.json knows (an empty dict if there is no file)."""
    if not file.is_file():
        return {}
    tok = _load(file)
    found = {name: tok.token_to_id(text) for name, text in SPECIAL_TOKENS.items()}
    return {name: i for name, i in found.items() if i is not None}


def _load(file: Path) -> HFTokenizer:
    try:
        return HFTokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises a bare Exception on malformed files
        raise CheckpointError(f"{file} is not a readable tokenizer.json ({exc})") from exc


class Tokenizer:
    """Text <-> ids. LLaDA-Instruct checkpoints (header tokens present) get LLaDA's chat template."""

    def __init__(self, file: str | os.PathLike[str], eos_id: int, eot_id: int | None = None) -> None:
        path = Path(file)
        if not path.is_file():
            raise CheckpointError(f"{path} is missing; the checkpoint needs a tokenizer.json to encode prompts")
        self._tok = _load(path)
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.chat = self._tok.token_to_id(_HEADER_START) is not None

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | os.PathLike[str], eos_id: int, eot_id: int | None = None) -> Tokenizer:
        return cls(Path(checkpoint_dir) / "tokenizer.json", eos_id, eot_id)

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt ids as the model expects them (chat template for Instruct checkpoints)."""
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
