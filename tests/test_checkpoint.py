"""Checkpoint layouts: both naming schemes load to the same model; malformed checkpoints fail with clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file, save_file

from seer_deploy.core.errors import CheckpointError
from seer_deploy.models.checkpoints.checkpoint import (
    checkpoint_fingerprint,
    detect_layout,
    load_checkpoint,
    save_checkpoint,
    weight_files,
)
from seer_deploy.models.families.config import config_from_dict


def _logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    return load_checkpoint(path).model(ids).logits


def test_both_layouts_give_identical_logits(make_checkpoint) -> None:
    model = tiny_model()
    llada = make_checkpoint("llada", model=model)
    llama = make_checkpoint("llama", model=model)
    assert detect_layout(list(weight_files(llada))) == "llada"
    assert detect_layout(list(weight_files(llama))) == "llama"
    assert "d_model" in json.loads((llada / "config.json").read_text())
    assert "hidden_size" in json.loads((llama / "config.json").read_text())
    ids = torch.randint(0, 19, (2, 11))
    ref = model(ids).logits
    a, b = _logits(llada, ids), _logits(llama, ids)
    assert torch.equal(a, b)
    assert torch.equal(a, ref)


def test_sharded_checkpoint_with_index_loads(make_checkpoint) -> None:
    model = tiny_model(seed=3)
    path = make_checkpoint("llada", name="sharded", model=model, max_shard_bytes=20_000)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2
    assert not (path / "model.safetensors").exists()
    ids = torch.randint(0, 19, (1, 9))
    assert torch.equal(_logits(path, ids), model(ids).logits)


def test_written_checkpoint_honours_the_umask_and_replaces_the_old_one(tmp_path: Path) -> None:
    """mkdtemp (0700) and safetensors' save_file (0600) would make a checkpoint unreadable to other users."""
    dest = tmp_path / "ckpt"
    old = os.umask(0o022)
    try:
        save_checkpoint(tiny_model(seed=1), dest, max_shard_bytes=20_000)
        save_checkpoint(tiny_model(seed=2), dest)  # over the sharded one: no stale shard survives
    finally:
        os.umask(old)
    assert dest.stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in dest.iterdir()} == {"config.json": 0o644, "model.safetensors": 0o644}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp directory left beside it
    assert torch.equal(load_checkpoint(dest).model.embed.weight, tiny_model(seed=2).embed.weight)


def test_tied_embeddings_and_gqa_round_trip(make_checkpoint) -> None:
    model = tiny_model(tie_embeddings=True, n_kv_heads=1)
    path = make_checkpoint("llama", model=model)
    loaded = load_checkpoint(path).model
    assert loaded.lm_head.weight.data_ptr() == loaded.embed.weight.data_ptr()
    ids = torch.randint(0, 19, (1, 7))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_bf16_load(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    loaded = load_checkpoint(path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.model(torch.randint(0, 19, (1, 5))).logits.shape == (1, 5, 19)


def _rewrite_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)


def test_missing_weight_is_named(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    _rewrite_weights(path, lambda t: t.pop("model.transformer.blocks.1.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing weights.*blocks\.1\.up_proj"):
        load_checkpoint(path)


def test_wrong_shape_is_named(make_checkpoint) -> None:
    path = make_checkpoint("llama")
    key = "model.layers.0.mlp.gate_proj.weight"
    _rewrite_weights(path, lambda t: t.__setitem__(key, torch.zeros(3, 3)))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight has shape \(3, 3\)"):
        load_checkpoint(path)


def test_unexpected_weight_is_named(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    _rewrite_weights(path, lambda t: t.__setitem__("model.transformer.blocks.0.q_norm.weight", torch.ones(4)))
    with pytest.raises(CheckpointError, match=r"unexpected weights.*q_norm"):
        load_checkpoint(path)


def test_unknown_layout_lists_keys(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    _rewrite_weights(path, lambda t: [t.__setitem__(k.replace("model.transformer.", "gpt."), t.pop(k)) for k in list(t)])
    with pytest.raises(CheckpointError, match=r"unknown checkpoint layout.*gpt\."):
        load_checkpoint(path)


def test_missing_config_field_is_named(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["mlp_hidden_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing 'mlp_hidden_size'"):
        load_checkpoint(path)


def test_corrupt_safetensors(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(path)


def test_missing_shard_and_missing_dir(make_checkpoint, tmp_path: Path) -> None:
    path = make_checkpoint("llada", name="sharded", max_shard_bytes=20_000)
    next(path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-.* is missing"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_checkpoint(tmp_path / "empty")


def test_pickle_weights_are_refused_with_a_fix(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="safe_serialization"):
        load_checkpoint(path)


def test_llada_8b_config_fields_parse() -> None:
    """The field names and values of LLaDA-8B-Instruct's config.json (from its model card) map as expected."""
    raw = {
        "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288,
        "activation_type": "silu", "block_type": "llama", "vocab_size": 126464, "embedding_size": 126464,
        "max_sequence_length": 4096, "rope_theta": 500000.0, "layer_norm_type": "rms", "rms_norm_eps": 1e-5,
        "include_bias": False, "weight_tying": False, "mask_token_id": 126336, "eos_token_id": 126081,
        "pad_token_id": 126081,
    }
    cfg = config_from_dict(raw)
    assert (cfg.d_model, cfg.head_dim, cfg.mlp_hidden, cfg.mask_id, cfg.eos_id) == (4096, 128, 12288, 126336, 126081)
    with pytest.raises(CheckpointError, match="mask token id is unknown"):
        config_from_dict({k: v for k, v in raw.items() if k != "mask_token_id"})
    with pytest.raises(CheckpointError, match="activation_type 'gelu'"):
        config_from_dict({**raw, "activation_type": "gelu"})


def _write_index(path: Path, weight_map: dict[str, str]) -> None:
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "link.safetensors", "sub/../../x"])
def test_shards_outside_the_checkpoint_are_refused_before_opening(make_checkpoint, tmp_path: Path, shard: str) -> None:
    path = make_checkpoint("llada", name="sharded", max_shard_bytes=20_000)
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"secret")
    (path / "link.safetensors").symlink_to(outside)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    _write_index(path, {**index["weight_map"], first: shard})
    with pytest.raises(CheckpointError, match="outside|absolute path"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="outside|absolute path"):
        checkpoint_fingerprint(path)


def test_a_truncated_shard_is_refused_before_it_is_hashed(make_checkpoint) -> None:
    path = make_checkpoint("llada", name="sharded", max_shard_bytes=20_000)
    shard = next(path.glob("model-00002-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=r"model-00002.*not a readable safetensors file.*header describes"):
        checkpoint_fingerprint(path)


def test_an_index_that_misplaces_a_weight_is_named(make_checkpoint) -> None:
    path = make_checkpoint("llada", name="sharded", max_shard_bytes=20_000)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    name = "model.transformer.blocks.1.up_proj.weight"
    wrong = next(s for s in sorted(set(index["weight_map"].values())) if s != index["weight_map"][name])
    _write_index(path, {**index["weight_map"], name: wrong})
    with pytest.raises(CheckpointError, match=f"places weight {name} in {wrong}"):
        load_checkpoint(path)


def test_nan_weights_are_named(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    key = "model.transformer.blocks.0.q_proj.weight"
    _rewrite_weights(path, lambda t: t[key].view(-1).__setitem__(3, float("nan")))
    with pytest.raises(CheckpointError, match=f"weight {key} holds NaN or infinite values"):
        load_checkpoint(path)


def test_non_utf8_and_non_object_config_are_named(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    (path / "config.json").write_bytes(b'{"d_model": "\xff"}')
    with pytest.raises(CheckpointError, match=r"config.json is not UTF-8 text \(byte 0xff at offset 13\)"):
        load_checkpoint(path)
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json holds an array, not an object"):
        load_checkpoint(path)
    (path / "config.json").write_text('{"d_model": NaN}')
    with pytest.raises(CheckpointError, match="not valid JSON.*NaN"):
        load_checkpoint(path)


LLADA_8B = {
    "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288, "vocab_size": 126464,
    "max_sequence_length": 4096, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "weight_tying": False,
    "mask_token_id": 126336, "eos_token_id": 126081,
}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"n_heads": 0}, "'n_heads' is 0; it must be an integer from 1"),
        ({"n_heads": 4.5}, "'n_heads' is 4.5; it must be an integer"),
        ({"n_heads": "32"}, "'n_heads' is '32'; it must be an integer"),
        ({"n_heads": True}, "'n_heads' is True; it must be an integer"),
        ({"n_heads": 31}, "'n_heads' is 31; it must be a divisor of the width 4096"),
        ({"n_kv_heads": 5}, "'n_kv_heads' is 5; it must be a divisor of the 32 attention heads"),
        ({"n_heads": 4096}, "head size .* is even"),
        ({"n_layers": 1e9}, "'n_layers' is 1000000000.0; it must be an integer from 1 to 1024"),
        ({"n_layers": 10**9}, "'n_layers' is 1000000000; it must be an integer from 1 to 1024"),
        ({"n_layers": -1}, "'n_layers' is -1"),
        ({"vocab_size": -5}, "'vocab_size' is -5"),
        ({"embedding_size": 100}, "'embedding_size' is 100; it must be at least the vocabulary size 126464"),
        ({"max_sequence_length": 0}, "'max_sequence_length' is 0"),
        ({"rms_norm_eps": -1}, "'rms_norm_eps' is -1; it must be a finite number above 0"),
        ({"rms_norm_eps": float("nan")}, "'rms_norm_eps' is nan"),
        ({"rope_theta": float("inf")}, "'rope_theta' is inf"),
        ({"rope_theta": "big"}, "'rope_theta' is 'big'"),
        ({"weight_tying": "false"}, "'weight_tying' is 'false'; it must be true or false"),
        ({"eos_token_id": -1}, "'eos_token_id' is -1; it must be a token id from 0 to 126463"),
        ({"mask_token_id": 126464}, "'mask_token_id' is 126464; it must be a token id from 0 to 126463"),
        ({"pad_token_id": 1.5}, "'pad_token_id' is 1.5"),
        ({"eos_token_id": ["x"]}, "'eos_token_id' is 'x'"),
        ({"include_bias": "no"}, "include_bias='no' is not supported"),
        ({"activation_type": ["silu"]}, r"activation_type \['silu'\] is not supported"),
        ({"d_model": None}, "missing 'd_model'"),
    ],
)
def test_bad_config_values_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        config_from_dict({**LLADA_8B, **changes})


def test_special_ids_from_the_tokenizer_are_checked_against_the_vocabulary() -> None:
    raw = {k: v for k, v in LLADA_8B.items() if k != "mask_token_id"}
    with pytest.raises(CheckpointError, match=r"'mask_token_id \(from tokenizer.json\)' is 200000"):
        config_from_dict(raw, {"mask": 200_000})
    assert config_from_dict(raw, {"mask": 7}).mask_id == 7
    assert config_from_dict({**LLADA_8B, "eos_token_id": [126081, 126348]}).eos_id == 126081


def test_llama_style_names_are_used_in_messages() -> None:
    raw = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0, "intermediate_size": 128,
           "vocab_size": 32, "max_position_embeddings": 64, "mask_token_id": 1, "eos_token_id": 2}
    with pytest.raises(CheckpointError, match="'num_attention_heads' is 0"):
        config_from_dict(raw)
    assert config_from_dict({**raw, "num_attention_heads": 4, "num_key_value_heads": None}).n_kv_heads == 4


def test_an_absurdly_large_config_is_refused_unread(make_checkpoint) -> None:
    path = make_checkpoint("llada")
    with open(path / "config.json", "r+b") as fh:
        fh.truncate(300 << 20)  # sparse: 300 MiB on paper, nothing on disk
    with pytest.raises(CheckpointError, match=r"config.json is larger than 256 MiB"):
        load_checkpoint(path)
