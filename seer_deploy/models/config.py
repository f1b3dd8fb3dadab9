"""Model configuration, read from LLaDA's original `config.json` fields or from Llama-style fields.

Every value is checked in one place (`check_model_fields`) before anything is built from it: integers are integers,
numbers finite and in range, heads divide the width, special-token ids lie below the vocabulary, and sizes are
bounded, so a typo (`n_layers: 1e9`, `n_heads: 0`) is one clear error instead of a crash or exhausted memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.errors import CheckpointError

# Inclusive ranges. Generous for real models (LLaDA-8B: d_model 4096, 32 layers, 126464 tokens, 4096 positions).
INT_RANGES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 24),
    "embedding_size": (1, 1 << 24),
    "d_model": (2, 1 << 16),
    "n_layers": (1, 1024),
    "n_heads": (1, 1 << 12),
    "n_kv_heads": (1, 1 << 12),
    "mlp_hidden": (1, 1 << 20),
    "max_seq_len": (2, 1 << 22),
}
FLOAT_RANGES: dict[str, tuple[float, float]] = {"rope_theta": (0.0, 1e12), "rms_eps": (0.0, 1.0)}  # exclusive low
REQUIRED_IDS: tuple[str, ...] = ("mask_id", "eos_id")
OPTIONAL_IDS: tuple[str, ...] = ("pad_id", "bos_id", "eot_id")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the mask predictor needs to be built, plus the special token ids."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    max_seq_len: int
    mask_id: int
    eos_id: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    embedding_size: int | None = None  # rows of the embedding table (LLaDA pads the vocab); None = vocab_size
    pad_id: int | None = None
    bos_id: int | None = None
    eot_id: int | None = None

    def __post_init__(self) -> None:
        check_model_fields(dataclasses.asdict(self))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_embed_rows(self) -> int:
        return self.embedding_size or self.vocab_size

    def to_llada_dict(self) -> dict[str, Any]:
        """LLaDA's original config.json field names (what `modeling_llada.py` reads)."""
        d: dict[str, Any] = {
            "model_type": "llada",
            "architectures": ["LLaDAModelLM"],
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "mlp_hidden_size": self.mlp_hidden,
            "activation_type": "silu",
            "block_type": "llama",
            "vocab_size": self.vocab_size,
            "embedding_size": self.n_embed_rows,
            "max_sequence_length": self.max_seq_len,
            "rope": True,
            "rope_theta": self.rope_theta,
            "rope_full_precision": True,
            "layer_norm_type": "rms",
            "rms_norm_eps": self.rms_eps,
            "include_bias": False,
            "weight_tying": self.tie_embeddings,
            "mask_token_id": self.mask_id,
            "eos_token_id": self.eos_id,
        }
        for key, value in (("pad_token_id", self.pad_id), ("bos_token_id", self.bos_id), ("eot_token_id", self.eot_id)):
            if value is not None:
                d[key] = value
        return d

    def to_llama_dict(self) -> dict[str, Any]:
        """Llama-style field names (as LLaDA-V's language model uses)."""
        d: dict[str, Any] = {
            "model_type": "llada_llama",
            "architectures": ["LLaDAModelLM"],
            "hidden_size": self.d_model,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.mlp_hidden,
            "hidden_act": "silu",
            "vocab_size": self.n_embed_rows,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_eps,
            "attention_bias": False,
            "mlp_bias": False,
            "is_causal": False,
            "tie_word_embeddings": self.tie_embeddings,
            "mask_token_id": self.mask_id,
            "eos_token_id": self.eos_id,
        }
        if self.embedding_size is not None and self.embedding_size != self.vocab_size:
            d["text_vocab_size"] = self.vocab_size
        for key, value in (("pad_token_id", self.pad_id), ("bos_token_id", self.bos_id), ("eot_token_id", self.eot_id)):
            if value is not None:
                d[key] = value
        return d

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_model_fields(values: Mapping[str, Any], keys: Mapping[str, str] | None = None,
                       source: str = "model config") -> None:
    """CheckpointError naming the first bad value: `values` are ModelConfig's fields, `keys` the names the user
    wrote them under (config.json's), `source` where they came from."""
    names = keys or {}

    def bad(field: str, must: str) -> CheckpointError:
        return CheckpointError(f"{source}: '{names.get(field, field)}' is {values.get(field)!r}; it must be {must}; "
                               f"fix it in {source}")

    for field, (lo, hi) in INT_RANGES.items():
        value = values.get(field)
        if value is None and field == "embedding_size":
            continue
        if not int_in(value, lo, hi):
            raise bad(field, f"an integer from {lo} to {hi}")
    for field, (lo_f, hi_f) in FLOAT_RANGES.items():
        if not number_in(values.get(field), lo_f, hi_f, above_lo=True):
            raise bad(field, f"a finite number above {lo_f:g} and at most {hi_f:g}")
    if not isinstance(values.get("tie_embeddings"), bool):
        raise bad("tie_embeddings", "true or false")
    vocab, width, heads, kv = (values[k] for k in ("vocab_size", "d_model", "n_heads", "n_kv_heads"))
    if values.get("embedding_size") is not None and values["embedding_size"] < vocab:
        raise bad("embedding_size", f"at least the vocabulary size {vocab}")
    if width % heads:
        raise bad("n_heads", f"a divisor of the width {width} ('{names.get('d_model', 'd_model')}')")
    if heads % kv:
        raise bad("n_kv_heads", f"a divisor of the {heads} attention heads")
    if (width // heads) % 2:
        raise bad("n_heads", f"such that the head size (width {width} / heads) is even, for rotary embeddings")
    for field in REQUIRED_IDS + OPTIONAL_IDS:
        value = values.get(field)
        if value is None and field in OPTIONAL_IDS:
            continue
        if not int_in(value, 0, vocab - 1):
            raise bad(field, f"a token id from 0 to {vocab - 1} (below the vocabulary size {vocab})")


def _require(raw: dict[str, Any], key: str, source: str) -> Any:
    if raw.get(key) is None:
        raise CheckpointError(
            f"config.json ({source} fields) is missing '{key}'; add it to the checkpoint's config.json"
        )
    return raw[key]


def _optional(raw: dict[str, Any], key: str, default: Any) -> Any:
    """raw[key], or `default` when it is absent or null."""
    value = raw.get(key)
    return default if value is None else value


def _first_id(value: Any) -> Any:
    """Token id fields may be an int, a list of ints (HF allows several EOS ids) or null; checked later."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def config_style(raw: dict[str, Any]) -> str:
    """'llada' for LLaDA's original field names, 'llama' for Llama-style ones."""
    if "d_model" in raw:
        return "llada"
    if "hidden_size" in raw:
        return "llama"
    # LLaDA-V and other multimodal configs nest the language model config.
    for nested in ("text_config", "llm_config", "language_config"):
        if isinstance(raw.get(nested), dict):
            return config_style(raw[nested])
    raise CheckpointError(
        "config.json has neither LLaDA fields (d_model, n_layers, ...) nor Llama-style fields "
        "(hidden_size, num_hidden_layers, ...): unknown model family"
    )


# ModelConfig field -> config.json key, per field style.
STYLE_KEYS: dict[str, dict[str, str]] = {
    "llada": {
        "d_model": "d_model", "n_layers": "n_layers", "n_heads": "n_heads", "n_kv_heads": "n_kv_heads",
        "mlp_hidden": "mlp_hidden_size", "vocab_size": "vocab_size", "embedding_size": "embedding_size",
        "max_seq_len": "max_sequence_length", "rope_theta": "rope_theta", "rms_eps": "rms_norm_eps",
        "tie_embeddings": "weight_tying",
    },
    "llama": {
        "d_model": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
        "n_kv_heads": "num_key_value_heads", "mlp_hidden": "intermediate_size", "vocab_size": "vocab_size",
        "embedding_size": "vocab_size", "max_seq_len": "max_position_embeddings", "rope_theta": "rope_theta",
        "rms_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings",
    },
}
REQUIRED_FIELDS: tuple[str, ...] = ("d_model", "n_layers", "n_heads", "mlp_hidden", "vocab_size", "max_seq_len")
ID_KEYS: dict[str, str] = {
    "mask_id": "mask_token_id", "eos_id": "eos_token_id", "pad_id": "pad_token_id", "bos_id": "bos_token_id",
    "eot_id": "eot_token_id",
}


def _check_architecture(raw: dict[str, Any], style: str) -> None:
    """Refuse the block variants the mask predictor does not implement, naming the option."""
    if style == "llama":
        if raw.get("hidden_act", "silu") != "silu":
            raise CheckpointError(
                f"config.json hidden_act {raw['hidden_act']!r} is not supported (only silu / SwiGLU MLPs)"
            )
        return
    if raw.get("activation_type", "silu") not in ("silu", "swiglu"):
        raise CheckpointError(
            f"config.json activation_type {raw['activation_type']!r} is not supported (only silu / SwiGLU MLPs)"
        )
    if raw.get("block_type", "llama") != "llama":
        raise CheckpointError(f"config.json block_type {raw['block_type']!r} is not supported (only 'llama' blocks)")
    if raw.get("include_bias", False) is not False:
        raise CheckpointError(
            f"config.json include_bias={raw['include_bias']!r} is not supported (LLaDA blocks have no biases: false)"
        )


def config_from_dict(raw: dict[str, Any], special_ids: dict[str, int] | None = None) -> ModelConfig:
    """Build a ModelConfig from either field style; `special_ids` (from the tokenizer) fills ids the config lacks."""
    for nested in ("text_config", "llm_config", "language_config"):
        if "d_model" not in raw and "hidden_size" not in raw and isinstance(raw.get(nested), dict):
            merged = dict(raw[nested])
            for key in ID_KEYS.values():
                merged.setdefault(key, raw.get(key))
            raw = merged
            break
    style = config_style(raw)
    _check_architecture(raw, style)
    keys = dict(STYLE_KEYS[style])
    if style == "llama" and raw.get("text_vocab_size") is not None:
        keys["vocab_size"] = "text_vocab_size"  # LLaDA-V: the text vocabulary inside a larger embedding table
    for field in REQUIRED_FIELDS:
        _require(raw, STYLE_KEYS[style][field], style)
    fields: dict[str, Any] = {field: raw.get(key) for field, key in keys.items()}
    defaults = {"n_kv_heads": fields["n_heads"], "embedding_size": fields["vocab_size"], "rope_theta": 10000.0,
                "rms_eps": _optional(raw, "layer_norm_eps", 1e-5), "tie_embeddings": False}
    fields.update({field: value for field, value in defaults.items() if fields[field] is None})
    special = special_ids or {}
    keys.update(ID_KEYS)
    for field, key in ID_KEYS.items():
        fields[field] = _first_id(raw.get(key))
        if fields[field] is None and field.removesuffix("_id") in special:
            fields[field] = special[field.removesuffix("_id")]
            keys[field] = f"{key} (from tokenizer.json)"
    if fields["mask_id"] is None:
        raise CheckpointError(
            "the mask token id is unknown: set 'mask_token_id' in config.json or add a mask token "
            "(e.g. '<|mdm_mask|>') to tokenizer.json"
        )
    if fields["eos_id"] is None:
        raise CheckpointError("the EOS token id is unknown: set 'eos_token_id' in config.json or in tokenizer.json")
    check_model_fields(fields, keys, source="config.json")
    return ModelConfig(**fields)
