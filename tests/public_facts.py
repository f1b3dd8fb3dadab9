"""Facts read from the families' public files, and tiny checkpoints written from them (sizes shrunk, nothing else).

Sources (read with `git show`, not copied):
- LLaDA-8B-Instruct, Dream-v0-Instruct-7B: github.com/monash-yann/dllm-research, models/LLaDA-8B-Instruct/ and
  models/Dream-7B-Instruct/ (config.json, generation_config.json, tokenizer_config.json, special_tokens_map.json,
  added_tokens.json, model.safetensors.index.json). LLaDA's tokenizer.json is a Git LFS pointer there, so its
  tokenizer is written here from tokenizer_config.json's added_tokens_decoder (ids 126080-126348).
- MMaDA: github.com/Gen-Verse/MMaDA, inference_mmu.py (image codes + len(uni_prompting.text_tokenizer); the marks
  from sptids_dict) and training/prompting_utils.py (reserved_token_mapping, use_reserved_token=True).
- Dimple: github.com/yu-rp/Dimple (commit 848f132), training-code/models/configuration_dimple.py (DimpleConfig and
  DimpleVisionConfig keys and defaults: Qwen2.5-VL-7B's tower, the picture ids, mrope_section) and modeling_dimple.py
  (module names: `visual` = the tower with transformers' Qwen2.5-VL names, `img_projector.linear_1/2`, `model.*` and
  `lm_head` = Dream's); its tokenizer is Dream's Qwen2 files (added tokens 151643-151666). Not confirmed against a
  real Dimple-7B config.json: `architectures`, the EOS id (Dream's 151643 here) and whether it ships
  `preprocessor_config.json` (Qwen2.5-VL's keys here).
- LLaDA-MoE: github.com/ZHZisZZ/dllm-trainer, dllm/pipelines/llada/models/modeling_lladamoe.py
  (LLaDAMoESparseMoeBlock: self.norm_topk_prob = False; softmax router whatever moe_router_score_function says).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# models/Dream-7B-Instruct/config.json: every key, values as published (sizes shrunk by `shrunk`).
DREAM_CONFIG: dict[str, Any] = {
    "_name_or_path": "Dream-org/Dream-v0-Instruct-7B", "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "mask_token_id": 151666, "max_position_embeddings": 131072,
    "max_window_layers": 28, "model_type": "Dream", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "pad_token_id": 151643, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.2", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
    "vocab_size": 152064,
}
DREAM_SHRUNK = {"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4, "num_hidden_layers": 2,
                "num_key_value_heads": 2, "max_window_layers": 2, "max_position_embeddings": 96}
# models/Dream-7B-Instruct/generation_config.json
DREAM_GENERATION = {"_from_model_config": True, "alg": "origin", "alg_temp": None, "bos_token_id": 151643,
                    "eos_token_id": 151643, "eps": 0.001, "mask_token_id": None, "output_history": False,
                    "pad_token_id": 151643, "steps": 512, "temperature": 0.0, "top_k": None, "top_p": None,
                    "transformers_version": "4.46.2"}
# models/Dream-7B-Instruct/tokenizer_config.json added_tokens_decoder: (id, content, special); added_tokens.json
# lists the same ids.
DREAM_ADDED = [
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True), (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True), (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True), (151657, "<tool_call>", False),
    (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False), (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False), (151665, "<|beginoftext|>", True), (151666, "<|mask|>", True),
]
# models/Dream-7B-Instruct/tokenizer_config.json chat_template (Qwen2.5's, with tool calls).
DREAM_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are a helpful assistant.' }}\n"
    "    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not "
    "loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "
    "\"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)
DREAM_SPECIAL_MAP = {"additional_special_tokens": ["<|beginoftext|>", "<|mask|>"], "bos_token": "<|beginoftext|>",
                     "eos_token": "<|endoftext|>", "mask_token": "<|mask|>", "pad_token": "<|endoftext|>"}
DREAM_TOKENIZER_CONFIG = {
    "add_bos_token": False, "add_prefix_space": False,
    "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": s} for i, c, s in DREAM_ADDED},
    "additional_special_tokens": ["<|beginoftext|>", "<|mask|>"],
    "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}, "bos_token": "<|beginoftext|>",
    "chat_template": DREAM_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
    "errors": "replace", "mask_token": "<|mask|>", "model_max_length": 131072, "pad_token": "<|endoftext|>",
    "split_special_tokens": False, "tokenizer_class": "DreamTokenizer", "unk_token": None,
}
# models/Dream-7B-Instruct/model.safetensors.index.json: names outside the layers, and each layer's.
DREAM_TOP = {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}
DREAM_LAYER = {"input_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "post_attention_layernorm.weight", "self_attn.k_proj.bias", "self_attn.k_proj.weight",
               "self_attn.o_proj.weight", "self_attn.q_proj.bias", "self_attn.q_proj.weight", "self_attn.v_proj.bias",
               "self_attn.v_proj.weight"}

# Dimple: DimpleConfig's keys over Dream's language model sizes, its vision_config (DimpleVisionConfig), the ids.
DIMPLE_VISION = {"depth": 32, "hidden_size": 1280, "hidden_act": "silu", "intermediate_size": 3420, "num_heads": 16,
                 "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                 "tokens_per_second": 2, "window_size": 112, "out_hidden_size": 3584,
                 "fullatt_block_indexes": [7, 15, 23, 31], "model_type": "dimple"}
DIMPLE_CONFIG: dict[str, Any] = {
    **{k: v for k, v in DREAM_CONFIG.items() if k not in ("auto_map", "_name_or_path", "use_mrope")},
    "architectures": ["DimpleModel"], "model_type": "dimple", "image_token_id": 151655, "video_token_id": 151656,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "mrope_section": [16, 24, 24], "full_attn_mask": True, "use_cache": False, "vision_config": DIMPLE_VISION,
}
# Shrunk: a head of 8 dims (4 rotary frequencies split 1 / 1 / 2), a 4-block tower with windowed and full blocks.
DIMPLE_SHRUNK = {**DREAM_SHRUNK, "hidden_size": 32, "intermediate_size": 48, "mrope_section": [1, 1, 2],
                 "max_position_embeddings": 256,
                 "vision_config": {**DIMPLE_VISION, "depth": 4, "hidden_size": 32, "intermediate_size": 48,
                                   "num_heads": 2, "out_hidden_size": 24, "fullatt_block_indexes": [1, 3]}}
# Qwen2.5-VL's preprocessor_config.json keys (max_pixels shrunk so that a picture is at most 16 image tokens).
DIMPLE_PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 28 * 28 * 16, "patch_size": 14, "temporal_patch_size": 2,
                       "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                       "image_std": [0.26862954, 0.26130258, 0.27577711],
                       "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}

# models/LLaDA-8B-Instruct/config.json: every key, values as published.
LLADA_CONFIG: dict[str, Any] = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                 "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32,
    "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 126464, "weight_tying": False,
}
LLADA_SHRUNK = {"d_model": 16, "mlp_hidden_size": 24, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2,
                "max_sequence_length": 96}
LLADA_GENERATION = {"_from_model_config": True, "bos_token_id": 126080, "eos_token_id": 126081,
                    "transformers_version": "4.38.2"}
# models/LLaDA-8B-Instruct/tokenizer_config.json chat_template.
LLADA_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                  "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
                  "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                  "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}")
LLADA_EXTRA_SPECIALS = ["<role>", "</role>", "<|arithmetic_start|>", "<|arithmetic_end|>", "<|number_start|>",
                        "<|number_end|>"]
# tokenizer_config.json added_tokens_decoder, ids 126080-126348, every one special.
LLADA_ADDED = ([(126080, "<|startoftext|>"), (126081, "<|endoftext|>"), (126082, "[CLS]"), (126083, "[gMASK]")]
               + [(126084 + n, f"<|reserved_token_{n}|>") for n in range(252)] + [(126336, "<|mdm_mask|>")]
               + [(126337 + n, f"<|reserved_token_{253 + n}|>") for n in range(3)]
               + [(126340 + n, t) for n, t in enumerate(LLADA_EXTRA_SPECIALS)]
               + [(126346, "<|start_header_id|>"), (126347, "<|end_header_id|>"), (126348, "<|eot_id|>")])
LLADA_SPECIAL_MAP = {"additional_special_tokens": LLADA_EXTRA_SPECIALS, "bos_token": "<|startoftext|>",
                     "cls_token": "[CLS]", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
LLADA_TOKENIZER_CONFIG = {
    "add_bos_token": False, "add_eos_token": False, "additional_special_tokens": LLADA_EXTRA_SPECIALS,
    "bos_token": "<|startoftext|>", "chat_template": LLADA_TEMPLATE, "clean_up_tokenization_spaces": False,
    "cls_token": "[CLS]", "eos_token": "<|endoftext|>", "fast_tokenizer": True, "gmask_token": "[gMASK]",
    "model_max_length": 1000000000000000019884624838656, "pad_token": "<|endoftext|>",
    "tokenizer_class": "PreTrainedTokenizerFast", "trust_remote_code": True,
    "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for i, c in LLADA_ADDED},
}
# models/LLaDA-8B-Instruct/model.safetensors.index.json
LLADA_TOP = {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"}
LLADA_LAYER = {"attn_norm.weight", "attn_out.weight", "ff_norm.weight", "ff_out.weight", "ff_proj.weight",
               "k_proj.weight", "q_proj.weight", "up_proj.weight", "v_proj.weight"}
# Gen-Verse/MMaDA training/prompting_utils.py reserved_token_mapping
MMADA_RESERVED = {"<|soi|>": 126084, "<|eoi|>": 126085, "<|mmu|>": 126089}

# Words the tiny byte-level BPE merges whole (bytes otherwise); Ġ is the byte-level space.
WORDS = ["hello", "world", "you", "are", "a", "helpful", "assistant", "system", "user", "reverse", "sort", "the",
         "answer", "is", "what", "how", "three", "turns", "question"]


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (the byte-level alphabet of Qwen2's and LLaDA's BPE)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = dict(zip(keep, keep, strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + n
            n += 1
    return [chr(chars[b]) for b in range(256)]


def write_bpe(directory: Path, first_added: int) -> tuple[dict[str, int], list[str]]:
    """vocab.json + merges.txt of a tiny byte-level BPE (bytes, then WORDS and 'Ġ'+WORDS merged letter by letter),
    filled with unreachable tokens up to `first_added`, the id of the first added token as the real files have it."""
    vocab = {c: i for i, c in enumerate(byte_chars())}
    merges: list[str] = []
    for word in WORDS + ["Ġ" + w for w in WORDS]:
        piece = word[0]
        for ch in word[1:]:
            if piece + ch not in vocab:
                merges.append(f"{piece} {ch}")
                vocab[piece + ch] = len(vocab)
            piece += ch
    while len(vocab) < first_added:
        vocab[f"<filler_{len(vocab)}>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return vocab, merges


def shrunk(config: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    return {**config, **sizes}
