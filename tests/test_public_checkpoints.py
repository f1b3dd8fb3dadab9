"""Checkpoints as they ship (issue 36), on tiny checkpoints written from the families' public files (tests/public_facts
names each source): Dream without tokenizer.json converts, exports and generates, its ids equal transformers' Qwen2
tokenizer's and its end of turn is recorded; the server renders a system message and three turns with the
checkpoint's own template as transformers' apply_chat_template does; MMaDA's image-code ids as its inference code
builds them; LLaDA-MoE's routing as its public code runs it; nothing in a checkpoint directory runs or is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from public_facts import (
    DREAM_ADDED,
    DREAM_CONFIG,
    DREAM_GENERATION,
    DREAM_LAYER,
    DREAM_SHRUNK,
    DREAM_SPECIAL_MAP,
    DREAM_TEMPLATE,
    DREAM_TOKENIZER_CONFIG,
    DREAM_TOP,
    LLADA_ADDED,
    LLADA_CONFIG,
    LLADA_GENERATION,
    LLADA_LAYER,
    LLADA_SHRUNK,
    LLADA_SPECIAL_MAP,
    LLADA_TOKENIZER_CONFIG,
    LLADA_TOP,
    MMADA_RESERVED,
    shrunk,
    write_bpe,
)
from test_cli import run

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.families.config import config_from_dict
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.moe import MoEMLP
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.models.text.tokenizer_files import load_tokenizer
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
from seer_deploy.service import Service, ServiceOptions, TargetOptions

# Python files a checkpoint ships beside its weights; if anything imported or ran them, MARKER would appear.
MARKER = "EXECUTED"
TRAP = f"from pathlib import Path\nPath(__file__).with_name({MARKER!r}).write_text('ran')\n"
TEXTS = ["hello world", "You are a helpful assistant.", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
         " the answer is 42!\n\n", "héllo wörld 你好 🙂", "<tool_call>sort</tool_call><|mask|><|endoftext|>",
         "  spaces   and\ttabs\r\n", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<|beginoftext|>what"]
CONVERSATION = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"},
                {"role": "user", "content": "what is the answer"}, {"role": "assistant", "content": "the answer"},
                {"role": "user", "content": "how are you"}]


def write_json(directory: Path, files: dict[str, Any]) -> None:
    for name, data in files.items():
        (directory / name).write_text(json.dumps(data, indent=2))


def write_model(path: Path, config: dict[str, Any], layout: str) -> None:
    """Random weights for the (shrunk) public config.json, under the names the public index uses."""
    cfg = config_from_dict(config, {"mask": config.get("mask_token_id", 0)})
    torch.manual_seed(0)
    model = MaskPredictor(cfg).eval()
    save_checkpoint(model, path, layout)  # type: ignore[arg-type]
    write_json(path, {"config.json": config})  # the public key set, not the writer's


def dream_checkpoint(root: Path) -> Path:
    """Dream-v0-Instruct-7B as shipped: no tokenizer.json, the slow BPE files, its Python files (traps here)."""
    path = root / "dream"
    write_model(path, shrunk(DREAM_CONFIG, DREAM_SHRUNK), "llama")
    write_bpe(path, DREAM_ADDED[0][0])
    write_json(path, {"generation_config.json": DREAM_GENERATION, "special_tokens_map.json": DREAM_SPECIAL_MAP,
                      "tokenizer_config.json": DREAM_TOKENIZER_CONFIG,
                      "added_tokens.json": {c: i for i, c, _ in DREAM_ADDED}})
    for name in ("tokenization_dream.py", "modeling_dream.py", "configuration_dream.py", "generation_utils.py"):
        (path / name).write_text(TRAP)
    return path


def llada_checkpoint(root: Path, config: dict[str, Any] | None = None) -> Path:
    """LLaDA-8B-Instruct's files; its tokenizer.json written from the public added tokens (ids 126080-126348)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    path = root / "llada"
    write_model(path, config or shrunk(LLADA_CONFIG, LLADA_SHRUNK), "llada")
    vocab, merges = write_bpe(path, LLADA_ADDED[0][0])
    tok = Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(c, special=True, normalized=False) for _, c in LLADA_ADDED])
    tok.save(str(path / "tokenizer.json"))
    (path / "vocab.json").unlink()
    (path / "merges.txt").unlink()
    write_json(path, {"generation_config.json": LLADA_GENERATION, "special_tokens_map.json": LLADA_SPECIAL_MAP,
                      "tokenizer_config.json": LLADA_TOKENIZER_CONFIG})
    return path


@pytest.fixture(scope="module")
def dream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dream_checkpoint(tmp_path_factory.mktemp("public"))


@pytest.fixture(scope="module")
def llada(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llada_checkpoint(tmp_path_factory.mktemp("public"))


def test_the_written_checkpoints_hold_the_public_weight_names(dream: Path, llada: Path) -> None:
    from seer_deploy.models.checkpoints.checkpoint_files import weight_files

    assert set(weight_files(dream)) == DREAM_TOP | {f"model.layers.{i}.{n}" for i in range(2) for n in DREAM_LAYER}
    assert set(weight_files(llada)) == LLADA_TOP | {f"model.transformer.blocks.{i}.{n}" for i in range(2)
                                                   for n in LLADA_LAYER}


def test_dream_tokenizer_converted_from_its_slow_files_equals_transformers_qwen2(dream: Path) -> None:
    from transformers import Qwen2Tokenizer

    ours, ref = load_tokenizer(dream), Qwen2Tokenizer.from_pretrained(str(dream))
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=False).ids == ref.encode(text, add_special_tokens=False), text
    assert ours.token_to_id("<|im_end|>") == 151645 and ours.token_to_id("<|mask|>") == 151666


def test_dream_as_shipped_exports_and_generates_without_running_its_code(
        dream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted((p.name, p.stat().st_mtime_ns) for p in dream.iterdir())
    out = tmp_path / "dream-onnx"
    result = export_checkpoint(dream, out, ExportOptions(verify=False))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["special_ids"] == {"mask": 151666, "eos": 151643, "pad": 151643, "bos": 151643, "eot": 151645}
    entry = manifest["extra"]["tokenizer"]
    assert entry["converted"] and entry["chat_template"] == DREAM_TEMPLATE
    assert entry["special_ids_from"]["eot"] == "tokenizer <|im_end|>"
    assert entry["special_ids_from"]["mask"] == "config.json mask_token_id"
    assert result.manifest.special_ids["eot"] == 151645
    assert load_tokenizer(out).encode(TEXTS[5]).ids == load_tokenizer(dream).encode(TEXTS[5]).ids
    for target in (str(out), str(dream)):
        code, stdout, err = run(["generate", target, "--prompt", "hello world", "--gen-length", "8", "--threads", "1"],
                                capsys)
        assert code == 0, err
        assert stdout.startswith("hello world -> ")
    code, _, err = run(["generate", str(out), "--prompt", "hello <|im_end|>", "--gen-length", "8"], capsys)
    assert code == 2 and "'<|im_end|>', a special token" in err
    assert not (dream / MARKER).exists() and not (out / MARKER).exists()
    assert sorted((p.name, p.stat().st_mtime_ns) for p in dream.iterdir()) == before  # nothing written there


def test_a_tokenizer_that_cannot_be_read_names_the_files(tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"found: tokenizer_config.json, vocab.json\); it needs tokenizer.json, "
                                              r"or vocab.json \+ merges.txt"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_server_renders_a_system_message_and_three_turns_as_transformers(
        family: str, dream: Path, llada: Path) -> None:
    if family == "dream":
        from transformers import Qwen2Tokenizer

        path, ref = dream, Qwen2Tokenizer.from_pretrained(str(dream))
    else:
        from transformers import PreTrainedTokenizerFast

        path, ref = llada, PreTrainedTokenizerFast.from_pretrained(str(llada))
    want = ref.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    service = Service(path, ServiceOptions(generation=GenerationConfig(gen_length=8, steps=8),
                                           target=TargetOptions(threads=1)))
    assert service.tokenizer.encode_chat([(m["role"], m["content"]) for m in CONVERSATION]) == list(want)
    with BackgroundServer(create_app(service, ServeOptions(model_name=family, gen_lengths=(8,)))) as server:
        reply = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": CONVERSATION, "max_tokens": 8},
                           timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["prompt_tokens"] == len(want)
        refused = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                             json={"messages": [*CONVERSATION, {"role": "assistant", "content": "hi"}]})
        assert refused.status_code == 400 and "end the conversation with a user message" in refused.text


def test_llada_special_tokens_are_refused_in_typed_text(llada: Path) -> None:
    tok = Tokenizer(llada, eos_id=126081, eot_id=126348)
    for typed in ("<role>user</role> hi", "a </role>", "[gMASK] x", "<|number_start|>1"):
        with pytest.raises(ConfigError, match="a special token of this model's tokenizer"):
            tok.encode_prompt(typed)
    with pytest.raises(ConfigError, match="cannot take these messages: only user"):
        only_user = ("{% for m in messages %}{% if m.role != 'user' %}{{ raise_exception('only user') }}{% endif %}"
                     "{{ m.content }}{% endfor %}")
        Tokenizer(llada, 126081, template=(only_user, "test")).encode_chat([("system", "x"), ("user", "y")])


def test_mmada_image_codes_are_the_public_inference_ids(tmp_path: Path) -> None:
    """Gen-Verse/MMaDA inference_mmu.py: [<|mmu|>, <|soi|>, codes + len(text tokenizer), <|eoi|>] + the chat ids,
    the marks as reserved ids (use_reserved_token=True)."""
    from transformers import PreTrainedTokenizerFast

    config = shrunk(LLADA_CONFIG, {**LLADA_SHRUNK, "model_type": "mmada", "architectures": ["MMadaModelLM"],
                                   "llm_vocab_size": 126464, "codebook_size": 8192, "vocab_size": 134656,
                                   "embedding_size": 134656, "num_vq_tokens": 256, "new_vocab_size": 134656})
    path = llada_checkpoint(tmp_path, config)
    ref = PreTrainedTokenizerFast.from_pretrained(str(path))
    codes = [3, 0, 8191, 7]
    chat = ref.apply_chat_template([{"role": "user", "content": "what is this"}], add_generation_prompt=True,
                                   tokenize=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    want = [MMADA_RESERVED["<|mmu|>"], MMADA_RESERVED["<|soi|>"], *(c + len(ref) for c in codes),
            MMADA_RESERVED["<|eoi|>"], *chat]
    tok = Tokenizer(path, eos_id=126081)
    assert tok.encode_prompt("<image_codes>3 0 8191 7</image_codes> what is this") == want
    assert len(ref) == 126349 and config_from_dict(config, {"text_tokens": len(ref)}).image_code_base == 126349


MOE_CONFIG = {"model_type": "llada", "architectures": ["LLaDAMoEModelLM"], "vocab_size": 64, "hidden_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 32,
              "num_experts": 4, "num_experts_per_tok": 2, "expert_intermediate_size": 8, "norm_topk_prob": True,
              "moe_router_score_function": "softmax", "clip_qkv": None, "qk_layernorm": True,
              "partial_rotary_factor": 1.0, "eos_token_id": 1, "mask_token_id": 2}


def test_llada_moe_routes_as_its_public_code_whatever_norm_topk_prob_says() -> None:
    """modeling_lladamoe.py: softmax over the experts, top k, the weights NOT renormalised (norm_topk_prob fixed to
    False), the output the weighted sum of the chosen experts."""
    cfg = config_from_dict(MOE_CONFIG)
    assert cfg.norm_topk_prob is False
    torch.manual_seed(1)
    moe = MoEMLP(cfg).eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        got, _ = moe(x)
        probs = torch.softmax(moe.router(x.view(-1, 16)).float(), dim=1)
        weights, chosen = torch.topk(probs, 2, dim=-1)
        want = torch.zeros(5, 16)
        for row in range(5):
            for w, e in zip(weights[row], chosen[row], strict=True):
                want[row] += w * moe.experts[int(e)](x.view(-1, 16)[row])[0]
    torch.testing.assert_close(got.view(-1, 16), want)


@pytest.mark.parametrize(("key", "value"), [("moe_router_score_function", "sigmoid"), ("clip_qkv", 8.0)])
def test_llada_moe_settings_not_implemented_are_refused(key: str, value: object) -> None:
    with pytest.raises(CheckpointError, match=f"config.json {key}={value!r} is not supported for LLaDA-MoE"):
        config_from_dict({**MOE_CONFIG, key: value})
