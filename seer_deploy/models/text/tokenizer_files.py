"""A checkpoint's tokenizer as it ships, read from data files only (never its tokenization_*.py), and its special ids.

`tokenizer.json` is read where there is one. Otherwise the slow byte-level BPE files of Qwen2-derived checkpoints
(Dream, Dimple: `vocab.json`, `merges.txt`, with `added_tokens.json` and the `added_tokens_decoder` of
`tokenizer_config.json`) are converted with the `tokenizers` library the way transformers' Qwen2Tokenizer builds
them (NFC, Qwen2's split regex, byte-level BPE), every added token at the id its files give; an export writes the
result as its tokenizer.json.

Special ids are resolved in one stated order (SPECIAL_ID_ORDER), the first file that names a token winning:
config.json, generation_config.json (`<name>_token_id`; a list's first id), tokenizer_config.json, then
special_tokens_map.json (`<name>_token` strings), then the tokenizer's own spellings of the token (LLaDA's, Dream's,
ChatML's `<|im_end|>` for the end of turn).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from seer_deploy.core.checks import ascii_int
from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.files import read_json, read_text

TOKENIZER_JSON = "tokenizer.json"
VOCAB, MERGES, ADDED, TOKENIZER_CONFIG, SPECIAL_MAP = ("vocab.json", "merges.txt", "added_tokens.json",
                                                       "tokenizer_config.json", "special_tokens_map.json")
SLOW_FILES = (VOCAB, MERGES, ADDED, TOKENIZER_CONFIG, SPECIAL_MAP)
SPECIAL_ID_ORDER = ("config.json", "generation_config.json", TOKENIZER_CONFIG, SPECIAL_MAP, "tokenizer")
SPECIAL_NAMES = ("mask", "eos", "pad", "bos", "eot")
# The tokenizer's own spellings, tried last: LLaDA's first, then Dream's and ChatML's (Dream, Dimple).
KNOWN_SPELLINGS: dict[str, tuple[str, ...]] = {
    "mask": ("<|mdm_mask|>", "<|mask|>"),
    "eos": ("<|endoftext|>",),
    "bos": ("<|startoftext|>", "<|beginoftext|>"),
    "eot": ("<|eot_id|>", "<|im_end|>"),
}
# transformers' Qwen2Tokenizer split pattern (models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX).
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "cls_token", "sep_token")


def optional_json(directory: Path, name: str) -> dict[str, Any]:
    """A JSON object file of the checkpoint, {} when absent."""
    file = directory / name
    if not file.is_file():
        return {}
    data = read_json(file, name, error=CheckpointError, fix=f"fix or remove {name}")
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} is not a JSON object; re-download it")
    return data


def token_text(value: object) -> str | None:
    """A special token's text as tokenizer_config.json / special_tokens_map.json write it (a string or an
    AddedToken object with 'content')."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def has_tokenizer(directory: Path) -> bool:
    return (directory / TOKENIZER_JSON).is_file() or (directory / VOCAB).is_file() or (directory / MERGES).is_file()


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of a tokenizer.json file, or of a directory: its tokenizer.json, else its slow BPE files
    converted; CheckpointError naming the files found and the files needed."""
    if path.is_file() or path.suffix == ".json":
        return _from_json(path)
    if (path / TOKENIZER_JSON).is_file():
        return _from_json(path / TOKENIZER_JSON)
    if (path / VOCAB).is_file() and (path / MERGES).is_file():
        return convert_slow_bpe(path)
    found = sorted(p.name for p in path.iterdir() if p.name in (*SLOW_FILES, "config.json")) if path.is_dir() else []
    raise CheckpointError(f"no readable tokenizer in {path} (found: {', '.join(found) or 'none of its files'}); it "
                          f"needs {TOKENIZER_JSON}, or {VOCAB} + {MERGES} (Qwen2-style BPE, with {TOKENIZER_CONFIG}): "
                          "copy them from the checkpoint's release")


def _from_json(file: Path) -> Tokenizer:
    text = read_text(file, "tokenizer", error=CheckpointError, fix="the checkpoint needs a tokenizer.json to encode "
                     "prompts")
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the tokenizers library raises a bare Exception on malformed files
        raise CheckpointError(f"{file} is not a readable tokenizer.json ({exc}); re-download it") from exc


def convert_slow_bpe(directory: Path) -> Tokenizer:
    """vocab.json + merges.txt (+ added tokens) as transformers' Qwen2Tokenizer builds them, in `tokenizers`."""
    vocab = read_json(directory / VOCAB, VOCAB, error=CheckpointError, fix=f"re-download {VOCAB}")
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise CheckpointError(f"{directory / VOCAB} is not a token -> id object; re-download it")
    lines = read_text(directory / MERGES, MERGES, error=CheckpointError, fix=f"re-download {MERGES}").splitlines()
    merges: list[tuple[str, str]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip() or (n == 1 and line.startswith("#version")):
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise CheckpointError(f"{directory / MERGES}:{n} is not a merge ('left right'); re-download it")
        merges.append((pair[0], pair[1]))
    settings = optional_json(directory, TOKENIZER_CONFIG)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=bool(settings.get("add_prefix_space", False)), use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for token_id, token in sorted(added_tokens(directory, settings).items()):
        tok.add_tokens([token])
        if tok.token_to_id(token.content) != token_id:
            raise CheckpointError(f"{directory}: added token {token.content!r} should have id {token_id} but "
                                  f"{VOCAB} holds {len(vocab)} tokens, so it gets {tok.token_to_id(token.content)}; "
                                  "the tokenizer files disagree: re-download them")
    return tok


def added_tokens(directory: Path, settings: dict[str, Any]) -> dict[int, AddedToken]:
    """Id -> added token: tokenizer_config.json's added_tokens_decoder (with its flags), then added_tokens.json
    (special when a special-token entry of the configs names it)."""
    out: dict[int, AddedToken] = {}
    decoder = settings.get("added_tokens_decoder") or {}
    for key, entry in decoder.items() if isinstance(decoder, dict) else ():
        token_id = ascii_int(str(key))
        if token_id is not None and token_id >= 0 and isinstance(entry, dict) and isinstance(entry.get("content"), str):
            out[token_id] = AddedToken(entry["content"], single_word=bool(entry.get("single_word", False)),
                                       lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
                                       normalized=bool(entry.get("normalized", False)),
                                       special=bool(entry.get("special", True)))
    named = special_texts(directory)
    for content, token_id in optional_json(directory, ADDED).items():
        if isinstance(token_id, int) and token_id not in out:
            out[token_id] = AddedToken(content, normalized=False, special=content in named)
    return out


def special_texts(directory: Path) -> set[str]:
    """Every token text tokenizer_config.json and special_tokens_map.json name as special (bos, eos, ..., the
    additional special tokens, the added tokens flagged special)."""
    texts: set[str] = set()
    for name in (TOKENIZER_CONFIG, SPECIAL_MAP):
        data = optional_json(directory, name)
        texts.update(t for t in (token_text(data.get(key)) for key in NAMED_TOKENS) if t)
        extra = data.get("additional_special_tokens") or []
        texts.update(t for t in (token_text(v) for v in (extra if isinstance(extra, list) else [])) if t)
        decoder = data.get("added_tokens_decoder") or {}
        texts.update(e["content"] for e in (decoder.values() if isinstance(decoder, dict) else [])
                     if isinstance(e, dict) and e.get("special") and isinstance(e.get("content"), str))
    return texts


@dataclass(frozen=True)
class FoundSpecialIds:
    """The resolved ids (name -> id) and, for each, the file and entry it came from."""

    ids: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def resolve_special_ids(directory: Path, tok: Tokenizer | None = None) -> FoundSpecialIds:
    """Mask, EOS, pad, BOS and end-of-turn ids in SPECIAL_ID_ORDER (the module docstring); names nobody gives are
    left out. `tok` (loaded from `directory` when None and there is one) turns token texts into ids."""
    if tok is None and has_tokenizer(directory):
        tok = load_tokenizer(directory)
    ids: dict[str, int] = {}
    sources: dict[str, str] = {}
    for file in SPECIAL_ID_ORDER[:2]:
        data = optional_json(directory, file)
        for name in SPECIAL_NAMES:
            value = data.get(f"{name}_token_id")
            value = value[0] if isinstance(value, list) and value else value
            if name not in ids and isinstance(value, int) and not isinstance(value, bool):
                ids[name], sources[name] = value, f"{file} {name}_token_id"
    if tok is not None:
        for file in SPECIAL_ID_ORDER[2:4]:
            data = optional_json(directory, file)
            for name in SPECIAL_NAMES:
                text = token_text(data.get(f"{name}_token"))
                token_id = tok.token_to_id(text) if text else None
                if name not in ids and token_id is not None:
                    ids[name], sources[name] = token_id, f"{file} {name}_token {text}"
        for name, spellings in KNOWN_SPELLINGS.items():
            found = next(((t, i) for t in spellings if (i := tok.token_to_id(t)) is not None), None)
            if name not in ids and found is not None:
                ids[name], sources[name] = found[1], f"tokenizer {found[0]}"
    return FoundSpecialIds(ids, sources)


def text_tokens(tok: Tokenizer) -> int:
    """len(tokenizer) as transformers counts it: the vocabulary with its added tokens (MMaDA's image codes start
    here, as Gen-Verse/MMaDA inference_mmu.py adds len(uni_prompting.text_tokenizer) to every code)."""
    return len(tok.get_vocab(with_added_tokens=True))


@dataclass(frozen=True)
class TokenizerFacts:
    """What a target's description (its export manifest, parsed once by the opener) already says about its tokenizer,
    so building the tokenizer opens neither manifest.json nor config.json again."""

    image_codes: tuple[int, int] | None  # MMaDA's image-code range (the model config's), None for other models
    manifest_entry: dict[str, Any] | None  # the export's "tokenizer" entry; None: read the tokenizer's own files


def manifest_tokenizer_entry(directory: Path) -> dict[str, Any] | None:
    """An export's "tokenizer" manifest entry (None for a checkpoint, or an export made before it was written)."""
    if not (directory / "manifest.json").is_file():
        return None
    try:
        entry = json.loads((directory / "manifest.json").read_text()).get("extra", {}).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return None  # the manifest's loader names what is wrong with it
    return entry if isinstance(entry, dict) else None
