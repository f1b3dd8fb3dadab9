"""Model configuration, read from LLaDA's original `config.json` fields or from Llama-style fields; the other public
families (Dream, Dimple, MMaDA, LLaDA-MoE: models.families.families) set the options below from their own fields.

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
from seer_deploy.models.families.families import (
    FAMILIES,
    check_family,
    detect_family,
    family_keys,
    family_options,
    prefix_dlm_setting,
)

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
    "num_experts": (0, 1 << 12),
    "experts_per_token": (0, 1 << 12),
    "image_codes": (0, 1 << 20),
}
OPTION_INTS: tuple[str, ...] = ("num_experts", "experts_per_token", "image_codes")  # absent = 0
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
    # Family options (models.families.families); the defaults are LLaDA's.
    family: str = "llada"  # which public model family the checkpoint belongs to
    qkv_bias: bool = False  # Qwen2 (Dream, Dimple): the q/k/v projections carry biases
    qk_norm: bool = False  # OLMoE (LLaDA-MoE): RMSNorm over each head's queries and keys
    rotary_dim: int | None = None  # partial rotary embedding: the first rotary_dim dims of a head rotate; None = all
    shift_logits: bool = False  # Dream, Dimple: token i is read from position i - 1
    prefix_dlm: bool = False  # LaViDa: prompt positions do not attend to response positions
    num_experts: int = 0  # > 0: an MoE MLP of this many experts, each of mlp_hidden units (models.networks.moe)
    experts_per_token: int = 0  # top-k experts per position
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to 1
    image_codes: int = 0  # MMaDA: VQ image codes, ids image_code_base .. image_code_base + image_codes - 1
    image_code_base: int | None = None
    # Dimple: M-RoPE (Qwen2-VL's 3-D positions); how many of a head's rotary frequencies turn with the temporal,
    # height and width position (sum = rotary / 2). None: 1-D positions.
    mrope_section: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.mrope_section, list):  # read back from JSON (a manifest)
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        check_model_fields(dataclasses.asdict(self))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_embed_rows(self) -> int:
        return self.embedding_size or self.vocab_size

    @property
    def image_code_range(self) -> tuple[int, int] | None:
        """(first id, count) of MMaDA's VQ image codes (what Tokenizer's image_codes takes), None without codes."""
        return (self.image_code_base, self.image_codes) if self.image_codes and self.image_code_base is not None else None

    @property
    def rotary(self) -> int:
        """The dims of each head that rotary embeddings turn (all of them unless partial)."""
        return self.rotary_dim or self.head_dim

    def config_json(self, style: str) -> dict[str, Any]:
        """config.json's fields in `style`: 'llada' (LLaDA's original names, what `modeling_llada.py` reads) or
        'llama' (as LLaDA-V's language model uses); written from the names `config_from_dict` reads (STYLE_KEYS)."""
        d: dict[str, Any] = dict(STYLE_CONSTANTS[style])
        for field, key in STYLE_KEYS[style].items():
            d[key] = self.n_embed_rows if field == "embedding_size" else getattr(self, field)
        if style == "llama" and self.n_embed_rows != self.vocab_size:
            d["text_vocab_size"] = self.vocab_size  # LLaDA-V: the text vocabulary inside a larger embedding table
        for field, key in ID_KEYS.items():
            value = getattr(self, field)
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
        if value is None and field in ("embedding_size", *OPTION_INTS):
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
    _check_options(values, bad)
    for field in REQUIRED_IDS + OPTIONAL_IDS:
        value = values.get(field)
        if value is None and field in OPTIONAL_IDS:
            continue
        if not int_in(value, 0, vocab - 1):
            raise bad(field, f"a token id from 0 to {vocab - 1} (below the vocabulary size {vocab})")


def _check_options(values: Mapping[str, Any], bad: Any) -> None:
    """The family options (all optional; absent means LLaDA's choice)."""
    for flag in ("qkv_bias", "qk_norm", "shift_logits", "prefix_dlm", "norm_topk_prob"):
        if not isinstance(values.get(flag, False), bool):
            raise bad(flag, "true or false")
    if values.get("family", "llada") not in FAMILIES:
        raise bad("family", f"one of {', '.join(FAMILIES)}")
    head_dim = values["d_model"] // values["n_heads"]
    rotary = values.get("rotary_dim")
    if rotary is not None and not (int_in(rotary, 2, head_dim) and rotary % 2 == 0):
        raise bad("rotary_dim", f"an even number of dims from 2 to the head size {head_dim}")
    experts, top_k = values.get("num_experts", 0) or 0, values.get("experts_per_token", 0) or 0
    if experts and not 1 <= top_k <= experts:
        raise bad("experts_per_token", f"from 1 to the {experts} experts")
    section = values.get("mrope_section")
    if section is not None and (not isinstance(section, list | tuple) or len(section) != 3
                                or not all(int_in(s, 1, head_dim) for s in section)
                                or sum(section) != (rotary or head_dim) // 2):
        raise bad("mrope_section", f"3 positive integers summing to half the rotary dims ({(rotary or head_dim) // 2})")
    codes, base = values.get("image_codes", 0) or 0, values.get("image_code_base")
    if codes and not (int_in(base, 0, values["vocab_size"] - codes)):
        raise bad("image_code_base", f"an id such that its {codes} image codes lie inside the vocabulary "
                                     f"({values['vocab_size']})")


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
# What a writer adds to the STYLE_KEYS fields: the architecture the mask predictor implements, in each style's names.
STYLE_CONSTANTS: dict[str, dict[str, Any]] = {
    "llada": {"model_type": "llada", "architectures": ["LLaDAModelLM"], "activation_type": "silu",
              "block_type": "llama", "rope": True, "rope_full_precision": True, "layer_norm_type": "rms",
              "include_bias": False},
    "llama": {"model_type": "llada_llama", "architectures": ["LLaDAModelLM"], "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "is_causal": False},
}
REQUIRED_FIELDS: tuple[str, ...] = ("d_model", "n_layers", "n_heads", "mlp_hidden", "vocab_size", "max_seq_len")
# The config.json fields family options come from, for error messages.
OPTION_KEYS: dict[str, str] = {
    "rotary_dim": "partial_rotary_factor", "experts_per_token": "num_experts_per_tok", "num_experts": "num_experts",
    "image_codes": "codebook_size", "image_code_base": "llm_vocab_size", "mrope_section": "mrope_section",
}
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


def config_from_dict(raw: dict[str, Any], special_ids: dict[str, Any] | None = None) -> ModelConfig:
    """Build a ModelConfig from either field style and any family (models.families.families); `special_ids` (from the
    tokenizer) fills ids the config lacks."""
    family, prefix_dlm = detect_family(raw), prefix_dlm_setting(raw)
    for nested in ("text_config", "llm_config", "language_config"):
        if "d_model" not in raw and "hidden_size" not in raw and isinstance(raw.get(nested), dict):
            merged = dict(raw[nested])
            for key in ID_KEYS.values():
                merged.setdefault(key, raw.get(key))
            raw = merged
            break
    style = config_style(raw)
    _check_architecture(raw, style)
    check_family(family, raw)
    keys = {**STYLE_KEYS[style], **family_keys(family)}
    if style == "llama" and raw.get("text_vocab_size") is not None:
        keys["vocab_size"] = "text_vocab_size"  # LLaDA-V: the text vocabulary inside a larger embedding table
    for field in REQUIRED_FIELDS:
        _require(raw, keys[field], style)
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
    text_tokens = special.get("text_tokens")  # len(tokenizer): MMaDA's image-code base (models.families.families)
    fields.update(family_options(family, raw, fields["d_model"] // fields["n_heads"], fields["vocab_size"],
                                 text_tokens if isinstance(text_tokens, int) else None), prefix_dlm=prefix_dlm)
    check_model_fields(fields, {**keys, **OPTION_KEYS}, source="config.json")
    return ModelConfig(**fields)
