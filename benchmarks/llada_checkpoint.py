"""A random checkpoint in LLaDA's original layout, of any shape: LLaDA-8B-Instruct's config.json keys and values,
its tensor names, bf16 safetensors shards with an index, and a byte-level BPE tokenizer.json whose special tokens sit at
LLaDA's ids. Written shard by shard (each shard's tensors generated, saved and dropped), so LLaDA-8B's full shape
(about 16 GB) is written with a few GB of memory. Used by benchmarks/scale_export.py and benchmarks/llama_cpp/compare.py;
not part of the package (tests write their tiny checkpoints with seer_deploy.models.checkpoints.checkpoint.save_checkpoint).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# LLaDA-8B-Instruct's special tokens and ids (its tokenizer.json / config.json).
SPECIALS = {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336, "<|eot_id|>": 126348}
BOS, EOS, MASK = 126080, 126081, 126336
# The chat template written into tokenizer_config.json: the prompt unchanged (llama-diffusion-cli always formats its
# prompt with the model's template, ChatML when there is none, and has no flag to turn that off).
IDENTITY_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
STAMP_FORMAT = 3  # bump when the writer changes: an older checkpoint is rewritten


@dataclass(frozen=True)
class Shape:
    d_model: int
    n_layers: int
    mlp_hidden: int
    n_heads: int
    vocab: int

    @property
    def tag(self) -> str:
        return f"d{self.d_model}-l{self.n_layers}-m{self.mlp_hidden}-h{self.n_heads}-v{self.vocab}"

    @property
    def params(self) -> int:
        d, m = self.d_model, self.mlp_hidden
        return 2 * self.vocab * d + d + self.n_layers * (4 * d * d + 3 * d * m + 2 * d)


def llada_config(shape: Shape, max_seq_len: int) -> dict[str, Any]:
    """LLaDA-8B-Instruct's config.json, keys and values, with this shape (no auto_map: nothing runs remote code)."""
    return {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": shape.d_model,
        "embedding_dropout": 0.0, "embedding_size": shape.vocab, "eos_token_id": EOS, "flash_attention": False,
        "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": MASK, "max_sequence_length": max_seq_len,
        "mlp_hidden_size": shape.mlp_hidden, "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None,
        "n_heads": shape.n_heads, "n_kv_heads": shape.n_heads, "n_layers": shape.n_layers, "pad_token_id": EOS,
        "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True,
        "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3", "use_cache": False, "vocab_size": shape.vocab, "weight_tying": False,
    }


def training_corpus(limit: int = 6 * 2**20) -> list[str]:
    """Deterministic English-and-code text for the BPE trainer: the Python standard library's sources."""
    import sysconfig

    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="ignore")
        texts.append(text)
        size += len(text)
        if size >= limit:
            break
    return texts


def write_tokenizer(ckpt: Path, vocab_size: int, bpe_vocab: int) -> None:
    """A byte-level BPE tokenizer.json (GPT-2 pre-tokenizer regex) trained by `tokenizers`, LLaDA's special tokens at
    LLaDA's ids, filler tokens `<idN>` for the other ids up to the vocabulary size, BOS prepended by the
    post-processor; and a tokenizer_config.json for llama.cpp's converter (special tokens, identity chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    assert max(vocab.values()) < min(SPECIALS.values()), "trained vocabulary overlaps LLaDA's special ids"
    assert max(SPECIALS.values()) < vocab_size, f"vocabulary {vocab_size} too small for LLaDA's special ids"
    # Every other id below the vocabulary size gets a filler token of its own (no merge makes one, so no prompt
    # holds one) whose text names the id: answers then print the same on both sides, id for id.
    specials = set(SPECIALS.values())
    vocab.update({f"<id{i}>": i for i in range(len(vocab), vocab_size) if i not in specials})
    vocab.update(SPECIALS)
    data["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for t, i in sorted(SPECIALS.items(), key=lambda x: x[1])]
    tok = Tokenizer.from_str(json.dumps(data))
    tok.post_processor = processors.TemplateProcessing(single="<|startoftext|> $A", pair="<|startoftext|> $A $B",
                                                       special_tokens=[("<|startoftext|>", BOS)])
    for t, i in SPECIALS.items():
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "mask_token": "<|mdm_mask|>", "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 4096, "chat_template": IDENTITY_TEMPLATE,
    }, indent=2))
    (ckpt / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "mask_token": "<|mdm_mask|>"}, indent=2))


def layer_tensors(shape: Shape, i: int, rnd: Any, ones: Any) -> dict[str, Any]:
    d, m, p = shape.d_model, shape.mlp_hidden, f"model.transformer.blocks.{i}."
    return {p + "attn_norm.weight": ones(d), p + "q_proj.weight": rnd(d, d), p + "k_proj.weight": rnd(d, d),
            p + "v_proj.weight": rnd(d, d), p + "attn_out.weight": rnd(d, d), p + "ff_norm.weight": ones(d),
            p + "ff_proj.weight": rnd(m, d), p + "up_proj.weight": rnd(m, d), p + "ff_out.weight": rnd(d, m)}


def write_checkpoint(ckpt: Path, shape: Shape, max_seq_len: int, seed: int, bpe_vocab: int,
                     shard_bytes: int = 4 * 2**30, log: Any = print) -> None:
    """Random weights (normal, std 0.02; norms 1) in LLaDA's tensor names, bf16, shards of about `shard_bytes` +
    index, written beside `ckpt` and renamed into place (an interrupted run leaves no half checkpoint there)."""
    import torch
    from safetensors.torch import save_file

    tmp = ckpt.with_name(ckpt.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)

    def rnd(*dims: int) -> torch.Tensor:
        return (torch.randn(*dims, generator=g) * 0.02).to(torch.bfloat16)

    def ones(d: int) -> torch.Tensor:
        return torch.ones(d, dtype=torch.bfloat16)

    def pieces() -> Iterator[dict[str, torch.Tensor]]:  # in file order, each made only when its shard is written
        yield {"model.transformer.wte.weight": rnd(shape.vocab, shape.d_model)}
        for i in range(shape.n_layers):
            yield layer_tensors(shape, i, rnd, ones)
        yield {"model.transformer.ln_f.weight": ones(shape.d_model),
               "model.transformer.ff_out.weight": rnd(shape.vocab, shape.d_model)}

    names: list[list[str]] = []
    total, shard, size = 0, {}, 0
    files: list[Path] = []

    def flush() -> None:
        nonlocal shard, size
        if shard:
            file = tmp / f"shard-{len(files):05d}.safetensors"
            save_file(shard, str(file), metadata={"format": "pt"})
            files.append(file)
            names.append(list(shard))
            log(f"  wrote {file.name}: {size / 2**30:.2f} GiB")
            shard, size = {}, 0

    for piece in pieces():
        nbytes = sum(t.numel() * t.element_size() for t in piece.values())
        if shard and size + nbytes > shard_bytes:
            flush()
        shard.update(piece)
        size += nbytes
        total += nbytes
    flush()
    weight_map = {}
    for k, (file, keys) in enumerate(zip(files, names, strict=True), 1):
        final = f"model-{k:05d}-of-{len(files):05d}.safetensors"
        file.rename(tmp / final)
        weight_map.update(dict.fromkeys(keys, final))
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    (tmp / "config.json").write_text(json.dumps(llada_config(shape, max_seq_len), indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": BOS, "eos_token_id": EOS,
                                                            "pad_token_id": EOS}, indent=2))
    write_tokenizer(tmp, shape.vocab, bpe_vocab)
    (tmp / "stamp.json").write_text(json.dumps(stamp(shape, seed, bpe_vocab, max_seq_len)))
    shutil.rmtree(ckpt, ignore_errors=True)
    tmp.rename(ckpt)


def stamp(shape: Shape, seed: int, bpe_vocab: int, max_seq_len: int) -> dict[str, Any]:
    """What a checkpoint was written with: a checkpoint whose stamp.json differs is rewritten."""
    return {"shape": shape.__dict__, "seed": seed, "bpe_vocab": bpe_vocab, "max_seq_len": max_seq_len,
            "format": STAMP_FORMAT}


def is_current(ckpt: Path, shape: Shape, seed: int, bpe_vocab: int, max_seq_len: int) -> bool:
    try:
        return bool(json.loads((ckpt / "stamp.json").read_text()) == stamp(shape, seed, bpe_vocab, max_seq_len))
    except (OSError, ValueError):
        return False


# LLaDA-8B-Instruct's shape (its config.json: d_model 4096, 32 layers, mlp_hidden_size 12288, 32 heads, vocabulary 126464)
LLADA_8B = Shape(d_model=4096, n_layers=32, mlp_hidden=12288, n_heads=32, vocab=126464)
