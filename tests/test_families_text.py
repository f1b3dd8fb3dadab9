"""The language-model families of issue 25 on tiny random checkpoints written in each family's public layout: Dream
(Qwen2 names, q/k/v biases, grouped-query attention, shifted logits, ChatML), LLaDA 1.5 (LLaDA-8B's config as is),
MMaDA (LLaDA's layout + VQ image codes), LLaDA-MoE (OLMoE-style experts, q/k norms, partial rotary), Dimple (text
only), and prefix-DLM attention (LaViDa). Each: load, generate, export, ONNX Runtime = torch token for token with
Seer on and off, and a loader error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from public_facts import LLADA_CONFIG
from safetensors import safe_open

from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from seer_deploy.models.families import families
from seer_deploy.models.families.config import ModelConfig, config_from_dict
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import Prompt, SeerOptions, ServiceOptions, generate

CPU = OrtSessionOptions(providers=("CPUExecutionProvider",))
WORDS = [str(d) for d in range(10)] + ["reverse", "sort", "system", "user", "assistant", "You", "are", "a", "helpful",
                                        "."]
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"]  # Dream's added tokens
LLADA = ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
MMADA = [*LLADA, "<|mmu|>", "<|soi|>", "<|eoi|>"]


def write_tokenizer(path: Path, specials: list[str]) -> dict[str, int]:
    """A word-level tokenizer.json with the family's special tokens (added as special, as the real ones are)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {tok: i for i, tok in enumerate(WORDS + specials)}
    tok = HFTokenizer(WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Fuse()
    tok.save(str(path))
    return vocab


def randomise(model: MaskPredictor, seed: int) -> MaskPredictor:
    """Weights (biases and norms too) far from their init, so every loaded tensor matters."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(1.0 if p.dim() == 1 and p.shape[0] <= 32 else 0.0, 0.3 if p.dim() > 1 else 0.1)
    return model.eval()


def family_checkpoint(root: Path, family: str, seed: int = 0, layout: str = "llama", **overrides: Any
                      ) -> tuple[MaskPredictor, Path]:
    """A tiny random checkpoint of `family`, written in its public layout with its tokenizer."""
    specials = {"dream": CHATML, "dimple": CHATML, "mmada": MMADA}.get(family, LLADA)
    root.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(root / "tokenizer.json", specials)
    mask = ids.get("<|mask|>", ids.get("<|mdm_mask|>"))
    fields: dict[str, Any] = {"vocab_size": len(ids), "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_hidden": 48,
                                  "max_seq_len": 96, "mask_id": mask, "eos_id": ids["<|endoftext|>"],
                                  "pad_id": ids["<|endoftext|>"], "family": family}
    if family in ("dream", "dimple"):
        fields.update(n_kv_heads=1, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True, shift_logits=True,
                      bos_id=ids["<|endoftext|>"])
    if family == "dimple":
        fields.update(mrope_section=(1, 1, 2))  # M-RoPE over the head's 4 rotary frequencies
    if family == "llada_moe":
        fields.update(n_kv_heads=4, mlp_hidden=16, num_experts=4, experts_per_token=2, qk_norm=True, rotary_dim=4,
                      rope_theta=50000.0)
    if family == "mmada":
        fields.update(vocab_size=len(ids) + 8, image_codes=8, image_code_base=len(ids))
    fields.update(overrides)
    model = randomise(MaskPredictor(ModelConfig(**fields)), seed)
    extra = None
    if family == "dimple":  # Qwen2.5-VL's tower and Dimple's projector, present and ignored
        extra = {"visual.patch_embed.proj.weight": torch.randn(16, 3, 2, 14, 14),
                 "img_projector.linear_1.weight": torch.randn(32, 16)}
    out = save_checkpoint(model, root / f"ckpt-{family}", layout,  # type: ignore[arg-type]
                          tokenizer_file=root / "tokenizer.json", extra_tensors=extra)
    return model, out


def weight_names(path: Path) -> set[str]:
    with safe_open(path / "model.safetensors", framework="pt") as f:
        return set(f.keys())


PROMPTS = [[10, 3, 5, 2, 17], [10, 8, 17], [10, 1, 2, 3, 4, 5, 6, 17]]
PLAIN = GenerationConfig(gen_length=16, steps=16)
BLOCKS = GenerationConfig(gen_length=16, steps=8, block_length=8)


def ort_equals_torch(model: MaskPredictor, export: Path, config: GenerationConfig = PLAIN,
                     prompts: list[list[int]] = PROMPTS) -> None:
    """ONNX Runtime = torch, token for token, with Seer off, on (a low floor so the random model is cut) and with
    forced kept lengths (cuts whatever the random model predicts); the Seer runs plan identical cuts on both."""
    cfg = model.cfg
    common = {"ids": SpecialIds(cfg.mask_id, cfg.pad_id, cfg.eos_id)}
    for extra in ({}, {"seer": SeerConfig(detector="eos", eos_floor=0.0)}, {"kept_lengths": [5, 16, 9][: len(prompts)]}):
        runs = [run_generation(b, prompts, config, **common, **extra)  # type: ignore[arg-type]
                for b in (TorchBackend(model), OrtBackend(export, CPU))]
        np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
        if "seer" in extra:
            assert runs[0].seer is not None and runs[1].seer is not None
            assert [r.kept for r in runs[0].seer] == [r.kept for r in runs[1].seer]
        if "kept_lengths" in extra:
            assert (runs[0].tokens[0, 5:] == cfg.eos_id).all()


# ---------------------------------------------------------------- Dream


@pytest.fixture(scope="module")
def dream(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path, Path]:
    root = tmp_path_factory.mktemp("dream")
    model, ckpt = family_checkpoint(root, "dream")
    return model, ckpt, export_checkpoint(ckpt, root / "export").out


def test_dream_checkpoint_is_in_dreams_public_layout_and_loads(dream: tuple[MaskPredictor, Path, Path]) -> None:
    model, ckpt, _ = dream
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["model_type"] == "Dream" and raw["architectures"] == ["DreamModel"]
    assert {raw[k] for k in ("num_attention_heads", "num_key_value_heads")} == {4, 1} and raw["rope_theta"] == 1e6
    names = weight_names(ckpt)
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias", "lm_head.weight",
            "model.embed_tokens.weight", "model.norm.weight"} <= names
    assert "model.layers.0.self_attn.o_proj.bias" not in names
    loaded = load_checkpoint(ckpt)
    cfg = loaded.config
    assert (cfg.family, cfg.qkv_bias, cfg.shift_logits, cfg.n_kv_heads, cfg.rope_theta) == ("dream", True, True, 1, 1e6)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    assert torch.equal(loaded.model(ids).logits, model(ids).logits)


def test_shifted_logits_and_statistics_belong_to_the_token_they_predict(dream: tuple[MaskPredictor, Path, Path]
                                                                        ) -> None:
    model, _, _ = dream
    unshifted = MaskPredictor(ModelConfig(**{**model.cfg.to_dict(), "shift_logits": False}))
    unshifted.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    spec = StatsSpec(layers=(0, 1))
    with torch.no_grad():
        got, raw = model(ids, stats=spec), unshifted.eval()(ids, stats=spec)
    assert got.stats is not None and raw.stats is not None
    assert torch.equal(got.logits[:, 1:], raw.logits[:, :-1]) and torch.equal(got.logits[:, 0], raw.logits[:, 0])
    assert torch.equal(got.stats[..., 1:], raw.stats[..., :-1])
    assert not torch.equal(got.logits, raw.logits)


def test_dream_generates_with_chatml_and_seer(dream: tuple[MaskPredictor, Path, Path]) -> None:
    model, ckpt, _ = dream
    tok = Tokenizer.from_checkpoint(ckpt, model.cfg.eos_id, load_checkpoint(ckpt).config.eot_id)
    ids = tok.encode_prompt("reverse 12")
    im_start = tok._tok.token_to_id("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 3
    assert [tok._tok.id_to_token(i) for i in ids] == [
        "<|im_start|>", "system", "You", "are", "a", "helpful", "assistant", ".", "<|im_end|>", "<|im_start|>", "user",
        "reverse", "1", "2", "<|im_end|>", "<|im_start|>", "assistant"]
    assert tok.eot_id == tok._tok.token_to_id("<|im_end|>")
    with pytest.raises(ConfigError, match="<\\|im_end\\|>"):
        tok.encode_prompt("reverse <|im_end|> 1")
    for seer in (False, True):
        run = generate([Prompt("reverse 12"), Prompt("sort 31")], ckpt,
                       ServiceOptions(generation=PLAIN, seer=SeerOptions(
                           on=seer, config=SeerConfig(detector="eos", eos_floor=0.0) if seer else None)))
        assert len(run.answers) == 2 and all(len(a.tokens) == 16 for a in run.answers)


def test_dream_export_runs_on_onnx_runtime_as_torch(dream: tuple[MaskPredictor, Path, Path]) -> None:
    model, _, export = dream
    ort_equals_torch(model, export)
    ort_equals_torch(model, export, BLOCKS)


def test_dream_refuses_a_malformed_checkpoint(dream: tuple[MaskPredictor, Path, Path], tmp_path: Path) -> None:
    """(Dream's --kv-cache runs: tests/test_prompt_cache.py.)"""
    _, ckpt, _ = dream
    raw = json.loads((ckpt / "config.json").read_text())
    with pytest.raises(CheckpointError, match="rope_scaling"):
        config_from_dict({**raw, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(CheckpointError, match="model_type 'qwen3'"):
        config_from_dict({**raw, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    # The biases Dream's attention needs, missing: named, with the family.
    broken = tmp_path / "broken"
    _, source = family_checkpoint(tmp_path / "src", "dream", qkv_bias=False)
    source.rename(broken)
    (broken / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"missing weights for a dream checkpoint.*q_proj\.bias"):
        load_checkpoint(broken)


# ---------------------------------------------------------------- prefix-DLM attention (LaViDa)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path]:
    """A LLaDA checkpoint whose config.json asks for prefix-DLM attention (`prefix_lm`, LaViDa's name), exported with
    the cache graphs."""
    root = tmp_path_factory.mktemp("prefix")
    model, ckpt = family_checkpoint(root, "llada", layout="llada", prefix_dlm=True)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert not config_from_dict(cfg).prefix_dlm
    (ckpt / "config.json").write_text(json.dumps({**cfg, "prefix_lm": True}))
    assert load_checkpoint(ckpt).config.prefix_dlm
    return model, export_checkpoint(ckpt, root / "export", ExportOptions(kv_cache=True)).out


def test_prefix_dlm_is_on_for_lavida_and_wherever_config_json_asks() -> None:
    llada = {k: v for k, v in LLADA_8B_CONFIG.items() if k != "auto_map"}
    assert not config_from_dict(llada).prefix_dlm
    assert config_from_dict({**llada, "prefix_lm": True}).prefix_dlm
    lavida = {**llada, "model_type": "llava_llada", "architectures": ["LlavaLladaForMaskedDiffusion"]}
    assert config_from_dict(lavida).prefix_dlm == families.LAVIDA_PREFIX_DEFAULT  # LaViDa's config has no key
    assert config_from_dict({**lavida, "prefix_dlm": True}).prefix_dlm  # an explicit setting wins
    assert not config_from_dict({**lavida, "prefix_dlm": False}).prefix_dlm


def test_prefix_dlm_keeps_the_prompt_blind_to_the_response(prefix: tuple[MaskPredictor, Path]) -> None:
    model, _ = prefix
    ids = torch.randint(0, 19, (2, 12), generator=torch.Generator().manual_seed(3))
    other = ids.clone()
    other[:, 8:] = (other[:, 8:] + 1) % 19  # the response changes
    width = torch.tensor([8, 8])
    with torch.no_grad():
        a, b = model(ids, prompt_width=width).logits, model(other, prompt_width=width).logits
        plain = MaskPredictor(ModelConfig(**{**model.cfg.to_dict(), "prefix_dlm": False}))
        plain.load_state_dict(model.state_dict())
        c = plain.eval()(ids).logits
    assert torch.equal(a[:, :8], b[:, :8])  # prompt positions never see the response
    assert not torch.allclose(a[:, 8:], b[:, 8:])  # the response sees itself
    assert not torch.allclose(a[:, :8], c[:, :8])  # without the option the prompt sees the response
    with pytest.raises(ConfigError, match="prompt_width"):
        model(ids)


def test_prefix_dlm_graphs_on_onnx_runtime_equal_torch(prefix: tuple[MaskPredictor, Path]) -> None:
    model, export = prefix
    manifest = json.loads((export / "manifest.json").read_text())
    assert "prompt_width" in manifest["graphs"]["step"]["inputs"] and "kv" in manifest["graphs"]["step"]["outputs"]
    ort = OrtBackend(export, CPU)  # declares the prefix graphs (prompt_width) from the export's config
    ids = np.random.default_rng(0).integers(0, 19, (2, 14))
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    for width in (6, 10):
        got = ort.step0(StepInput(ids, mask, prompt_width=width))
        with torch.no_grad():
            out = model(torch.from_numpy(ids), torch.from_numpy(mask), prompt_width=torch.full((2,), width),
                        stats=StatsSpec(layers=(0, 1)))
        np.testing.assert_array_equal(got.token_ids, out.logits.argmax(-1).numpy())
        np.testing.assert_allclose(got.sparsity, out.stats.reshape(2, 8, 14).numpy(), atol=1e-6)  # type: ignore[union-attr]
        st = ort.step(StepInput(ids, mask, prompt_width=width))
        np.testing.assert_array_equal(st.token_ids, got.token_ids)


# ---------------------------------------------------------------- LLaDA 1.5

# LLaDA-8B-Instruct's config.json (GSAI-ML), which LLaDA 1.5 (a fine-tune: GSAI-ML/LLaDA-1.5) ships unchanged.
LLADA_8B_CONFIG: dict[str, Any] = {**LLADA_CONFIG, "torch_dtype": "bfloat16"}  # tests/public_facts.py


def test_llada_1_5_config_loads_as_llada_8b(tmp_path: Path) -> None:
    cfg = config_from_dict(LLADA_8B_CONFIG)
    assert (cfg.family, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.mlp_hidden) == (
        "llada", 4096, 32, 32, 32, 12288)
    assert (cfg.vocab_size, cfg.mask_id, cfg.eos_id, cfg.rope_theta, cfg.max_seq_len) == (
        126464, 126336, 126081, 500000.0, 4096)
    assert not (cfg.qkv_bias or cfg.shift_logits or cfg.num_experts or cfg.qk_norm or cfg.prefix_dlm)
    # A tiny checkpoint with that config's every field (sizes shrunk) loads and generates as LLaDA, ...
    _, ckpt = family_checkpoint(tmp_path, "llada", layout="llada")
    small = {**LLADA_8B_CONFIG, **{k: v for k, v in json.loads((ckpt / "config.json").read_text()).items()
                                   if k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size",
                                            "vocab_size", "embedding_size", "max_sequence_length", "mask_token_id",
                                            "eos_token_id", "pad_token_id")}}
    (ckpt / "config.json").write_text(json.dumps(small))
    loaded = load_checkpoint(ckpt)
    assert loaded.config.family == "llada" and loaded.config.rope_theta == 500000.0
    run = run_generation(TorchBackend(loaded.model), PROMPTS, PLAIN, ids=SpecialIds(mask=loaded.config.mask_id, pad=loaded.config.eos_id), seer=SeerConfig(detector="eos", eos_floor=0.0))
    assert run.tokens.shape == (3, 16) and run.seer is not None
    # ... exports, and runs on ONNX Runtime as on torch, Seer off and on.
    ort_equals_torch(loaded.model, export_checkpoint(ckpt, tmp_path / "export").out)
    with pytest.raises(CheckpointError, match="block_type 'sequential'"):
        config_from_dict({**LLADA_8B_CONFIG, "block_type": "sequential"})


# ---------------------------------------------------------------- MMaDA


@pytest.fixture(scope="module")
def mmada(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path, Path]:
    root = tmp_path_factory.mktemp("mmada")
    model, ckpt = family_checkpoint(root, "mmada", layout="llada")
    return model, ckpt, export_checkpoint(ckpt, root / "export").out


def test_mmada_checkpoint_loads_with_its_image_codes(mmada: tuple[MaskPredictor, Path, Path]) -> None:
    _, ckpt, _ = mmada
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["model_type"] == "mmada" and raw["architectures"] == ["MMadaModelLM"]
    assert raw["vocab_size"] == raw["llm_vocab_size"] + raw["codebook_size"]
    assert "model.transformer.blocks.1.ff_proj.weight" in weight_names(ckpt)
    cfg = load_checkpoint(ckpt).config
    assert (cfg.family, cfg.image_codes, cfg.image_code_base) == ("mmada", 8, raw["llm_vocab_size"])
    with pytest.raises(CheckpointError, match="llm_vocab_size"):
        config_from_dict({**raw, "codebook_size": raw["vocab_size"]})


def test_mmada_prompts_carry_pre_tokenized_image_codes(mmada: tuple[MaskPredictor, Path, Path], tmp_path: Path
                                                        ) -> None:
    model, ckpt, _ = mmada
    cfg = model.cfg
    assert cfg.image_code_base is not None
    tok = Tokenizer.from_checkpoint(ckpt, cfg.eos_id, image_codes=(cfg.image_code_base, cfg.image_codes))
    text = tok.encode_prompt("reverse 12")
    ids = tok.encode_prompt("<image_codes>3 0\n7</image_codes> reverse 12")
    mmu, soi, eoi = (tok._tok.token_to_id(t) for t in ("<|mmu|>", "<|soi|>", "<|eoi|>"))
    base = cfg.image_code_base
    assert ids == [mmu, soi, base + 3, base, base + 7, eoi, *text]
    assert text[0] == tok._tok.token_to_id("<|startoftext|>")  # LLaDA's chat template around the text
    for bad, message in (("<image_codes>8</image_codes> hi", "'8'"), ("<image_codes>1 x</image_codes> a", "'x'"),
                         ("<image_codes> </image_codes> a", "empty"), ("a <|soi|> 1", "special token")):
        with pytest.raises(ConfigError, match=message):
            tok.encode_prompt(bad)
    # The range is read from the config.json beside tokenizer.json (what the runtime's Tokenizer(file, ...) gets).
    assert Tokenizer(ckpt / "tokenizer.json", cfg.eos_id).encode_prompt("<image_codes>3 0\n7</image_codes> reverse 12") == ids
    write_tokenizer(tmp_path / "tokenizer.json", MMADA)  # no config.json beside it: a model without image codes
    with pytest.raises(ConfigError, match="takes no image codes"):
        Tokenizer(tmp_path / "tokenizer.json", cfg.eos_id).encode_prompt("<image_codes>1</image_codes> a")


def test_mmada_export_runs_on_onnx_runtime_as_torch(mmada: tuple[MaskPredictor, Path, Path]) -> None:
    model, ckpt, export = mmada
    cfg = model.cfg
    assert cfg.image_code_base is not None
    tok = Tokenizer.from_checkpoint(ckpt, cfg.eos_id, image_codes=(cfg.image_code_base, cfg.image_codes))
    prompts = [tok.encode_prompt("<image_codes>1 2 3 4</image_codes> reverse 12"), tok.encode_prompt("sort 31"),
               tok.encode_prompt("<image_codes>7 7</image_codes> count")]
    assert any(t >= cfg.image_code_base for t in prompts[0])
    ort_equals_torch(model, export, prompts=prompts)


# ---------------------------------------------------------------- LLaDA-MoE


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path, Path]:
    root = tmp_path_factory.mktemp("moe")
    model, ckpt = family_checkpoint(root, "llada_moe")
    return model, ckpt, export_checkpoint(ckpt, root / "export", ExportOptions(kv_cache=True)).out


def test_llada_moe_checkpoint_is_in_its_public_layout_and_loads(moe: tuple[MaskPredictor, Path, Path]) -> None:
    model, ckpt, _ = moe
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["model_type"] == "llada" and raw["architectures"] == ["LLaDAMoEModelLM"] and "mask_token_id" not in raw
    names = weight_names(ckpt)
    assert {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
            "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"} <= names
    assert not any(".mlp.gate_proj." in n or "bias" in n for n in names)
    cfg = load_checkpoint(ckpt).config
    assert (cfg.family, cfg.num_experts, cfg.experts_per_token, cfg.qk_norm, cfg.rotary) == ("llada_moe", 4, 2, True, 4)
    assert cfg.mask_id == model.cfg.mask_id  # from tokenizer.json, as LLaDA-MoE's config.json has none
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(load_checkpoint(ckpt).model(ids).logits, model(ids).logits)
    for key, value in (("shared_expert_intermediate_size", 64), ("moe_router_enable_expert_bias", True),
                       ("moe_layer_freq", [0, 1])):
        with pytest.raises(CheckpointError, match=key):
            config_from_dict({**raw, key: value})


def test_moe_layer_routes_each_position_to_its_top_k_experts(moe: tuple[MaskPredictor, Path, Path]) -> None:
    """The dense-over-experts layer equals the per-position definition, and its statistics cover exactly the
    selected experts' units."""
    model, _, _ = moe
    layer = model.layers[0].mlp
    x = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(2))
    spec = StatsSpec(layers=(0,), abs_threshold=0.05)
    with torch.no_grad():
        out, stats = layer(x, spec)
        for s in range(5):
            probs = torch.softmax(layer.router(x[0, s]), -1)
            weights, chosen = probs.topk(2)
            want = sum(w * layer.experts[int(e)](x[0, s])[0] for w, e in zip(weights, chosen, strict=True))
            torch.testing.assert_close(out[0, s], want, rtol=1e-5, atol=1e-6)
            hidden = torch.cat([layer.experts[int(e)](x[0, s])[1] for e in chosen])
            assert stats is not None and hidden.numel() == 2 * 16
            assert stats[0, 0, s] == (hidden.abs() < 0.05).float().mean()
            torch.testing.assert_close(stats[0, 3, s], hidden.abs().mean())


def test_llada_moe_export_runs_on_onnx_runtime_as_torch(moe: tuple[MaskPredictor, Path, Path]) -> None:
    model, _, export = moe
    ort_equals_torch(model, export)
    # The block-wise KV cache (q/k norms and the partial rotary embedding in the window graph too).
    ort_equals_torch(model, export, GenerationConfig(gen_length=16, steps=16, block_length=8, kv_cache=True))
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, (2, 10))
    got = OrtBackend(export, CPU).step0(StepInput(ids))
    want = TorchBackend(model).step0(StepInput(ids))
    np.testing.assert_allclose(got.sparsity, want.sparsity, atol=1e-6)
    np.testing.assert_array_equal(got.token_ids, want.token_ids)


# ---------------------------------------------------------------- Dimple's language model (pictures: test_dimple.py)


def test_dimple_loads_its_language_model_and_generates_text(tmp_path: Path) -> None:
    model, ckpt = family_checkpoint(tmp_path, "dimple", seed=3)
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["model_type"] == "dimple" and "vision_config" in raw
    assert {"visual.patch_embed.proj.weight", "img_projector.linear_1.weight"} <= weight_names(ckpt)
    loaded = load_checkpoint(ckpt)
    assert (loaded.config.family, loaded.config.shift_logits, loaded.config.qkv_bias) == ("dimple", True, True)
    cfg = loaded.config
    run = run_generation(TorchBackend(loaded.model), PROMPTS, PLAIN, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id, eos=cfg.eos_id), seer=SeerConfig(detector="eos", eos_floor=0.0))
    ref = run_generation(TorchBackend(model), PROMPTS, PLAIN, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id, eos=cfg.eos_id), seer=SeerConfig(detector="eos", eos_floor=0.0))
    np.testing.assert_array_equal(run.tokens, ref.tokens)
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        config_from_dict({**raw, "use_sliding_window": True})
