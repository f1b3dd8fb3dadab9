"""Each family's public config.json, written back from a ModelConfig: what `save_checkpoint` puts beside the weights
of a tiny test checkpoint, so the loaders are tested on the fields real checkpoints hold (models.families.families)."""

from __future__ import annotations

from typing import Any

from seer_deploy.models.families.config import ModelConfig


def family_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """A family's public config.json fields for `cfg` (what a real checkpoint of that family holds)."""
    if cfg.family in ("llada", "mmada"):
        d = cfg.config_json("llada")
        if cfg.family == "mmada":
            d.update(model_type="mmada", architectures=["MMadaModelLM"], llm_vocab_size=cfg.image_code_base,
                     codebook_size=cfg.image_codes, num_vq_tokens=256, new_vocab_size=cfg.vocab_size)
        return d
    d = cfg.config_json("llama")
    d.pop("is_causal", None)
    d.pop("eot_token_id", None)
    if cfg.family in ("dream", "dimple"):
        d.update(model_type="Dream", architectures=["DreamModel"], rope_scaling=None, use_sliding_window=False,
                 sliding_window=None, max_window_layers=cfg.n_layers, attention_dropout=0.0, use_cache=False,
                 auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"})
        d.pop("attention_bias", None)
        d.pop("mlp_bias", None)
        if cfg.family == "dimple":
            d.update(model_type="dimple", architectures=["DimpleModel"],
                     vision_config={"depth": 1, "hidden_size": 16, "out_hidden_size": cfg.d_model})
            if cfg.mrope_section is not None:
                d["mrope_section"] = list(cfg.mrope_section)
        return d
    d.pop("intermediate_size", None)
    d.pop("mask_token_id", None)  # absent from LLaDA-MoE's config.json: it comes from the tokenizer
    d.update(model_type="llada", architectures=["LLaDAMoEModelLM"], num_experts=cfg.num_experts,
             num_experts_per_tok=cfg.experts_per_token, expert_intermediate_size=cfg.mlp_hidden,
             dense_intermediate_size=cfg.mlp_hidden * 2, shared_expert_intermediate_size=None,
             moe_layer_freq=[1] * cfg.n_layers, qk_layernorm=cfg.qk_norm, norm_topk_prob=cfg.norm_topk_prob,
             partial_rotary_factor=cfg.rotary / cfg.head_dim, routed_scaling_factor=1, router_num_group=None,
             moe_router_enable_expert_bias=False, rope_scaling=None)
    return d
