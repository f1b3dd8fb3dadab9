"""Model configuration, read from LLaDA's original `config.json` fields or from Llama-style fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from seer_deploy.core.errors import CheckpointError


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
        if self.d_model % self.n_heads:
            raise CheckpointError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise CheckpointError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise CheckpointError(f"head dim {self.head_dim} must be even for rotary embeddings")

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


def _require(raw: dict[str, Any], key: str, source: str) -> Any:
    if key not in raw:
        raise CheckpointError(f"config.json ({source} fields) is missing '{key}'; add it to the checkpoint's config.json")
    return raw[key]


def _first_id(value: Any) -> int | None:
    """Token id fields may be an int, a list of ints (HF allows several EOS ids) or null."""
    if value is None:
        return None
    if isinstance(value, list):
        return int(value[0]) if value else None
    return int(value)


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


def config_from_dict(raw: dict[str, Any], special_ids: dict[str, int] | None = None) -> ModelConfig:
    """Build a ModelConfig from either field style; `special_ids` (from the tokenizer) fills ids the config lacks."""
    for nested in ("text_config", "llm_config", "language_config"):
        if "d_model" not in raw and "hidden_size" not in raw and isinstance(raw.get(nested), dict):
            merged = dict(raw[nested])
            for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id", "eot_token_id"):
                merged.setdefault(key, raw.get(key))
            raw = merged
            break
    style = config_style(raw)
    special = special_ids or {}
    if style == "llada":
        act = raw.get("activation_type", "silu")
        if act not in ("silu", "swiglu"):
            raise CheckpointError(f"config.json activation_type '{act}' is not supported (only silu / SwiGLU MLPs)")
        if raw.get("block_type", "llama") != "llama":
            raise CheckpointError(f"config.json block_type '{raw['block_type']}' is not supported (only 'llama' blocks)")
        if raw.get("include_bias", False):
            raise CheckpointError("config.json include_bias=true is not supported (LLaDA blocks have no biases)")
        n_heads = int(_require(raw, "n_heads", style))
        vocab = int(_require(raw, "vocab_size", style))
        fields: dict[str, Any] = {
            "d_model": int(_require(raw, "d_model", style)),
            "n_layers": int(_require(raw, "n_layers", style)),
            "n_heads": n_heads,
            "n_kv_heads": int(raw.get("n_kv_heads") or n_heads),
            "mlp_hidden": int(_require(raw, "mlp_hidden_size", style)),
            "vocab_size": vocab,
            "embedding_size": int(raw.get("embedding_size") or vocab),
            "max_seq_len": int(_require(raw, "max_sequence_length", style)),
            "rope_theta": float(raw.get("rope_theta", 10000.0)),
            "rms_eps": float(raw.get("rms_norm_eps", raw.get("layer_norm_eps", 1e-5))),
            "tie_embeddings": bool(raw.get("weight_tying", False)),
        }
    else:
        n_heads = int(_require(raw, "num_attention_heads", style))
        vocab = int(_require(raw, "vocab_size", style))
        fields = {
            "d_model": int(_require(raw, "hidden_size", style)),
            "n_layers": int(_require(raw, "num_hidden_layers", style)),
            "n_heads": n_heads,
            "n_kv_heads": int(raw.get("num_key_value_heads") or n_heads),
            "mlp_hidden": int(_require(raw, "intermediate_size", style)),
            "vocab_size": int(raw.get("text_vocab_size") or vocab),
            "embedding_size": vocab,
            "max_seq_len": int(_require(raw, "max_position_embeddings", style)),
            "rope_theta": float(raw.get("rope_theta", 10000.0)),
            "rms_eps": float(raw.get("rms_norm_eps", 1e-5)),
            "tie_embeddings": bool(raw.get("tie_word_embeddings", False)),
        }
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"config.json hidden_act '{act}' is not supported (only silu / SwiGLU MLPs)")

    def pick(name: str, key: str) -> int | None:
        value = _first_id(raw.get(key))
        return value if value is not None else special.get(name)

    mask_id = pick("mask", "mask_token_id")
    eos_id = pick("eos", "eos_token_id")
    if mask_id is None:
        raise CheckpointError(
            "the mask token id is unknown: set 'mask_token_id' in config.json or add a mask token "
            "(e.g. '<|mdm_mask|>') to tokenizer.json"
        )
    if eos_id is None:
        raise CheckpointError("the EOS token id is unknown: set 'eos_token_id' in config.json or in tokenizer.json")
    return ModelConfig(
        mask_id=mask_id,
        eos_id=eos_id,
        pad_id=pick("pad", "pad_token_id"),
        bos_id=pick("bos", "bos_token_id"),
        eot_id=pick("eot", "eot_token_id"),
        **fields,
    )
