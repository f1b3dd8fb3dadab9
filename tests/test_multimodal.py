"""LLaDA-V-layout checkpoints: writing, loading, prompt assembly, generation with images, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.checkpoints.multimodal import (
    LLAVA_IMAGE_TOKEN_INDEX,
    load_multimodal,
    vision_config_from_dict,
)
from seer_deploy.models.checkpoints.multimodal_files import is_multimodal_checkpoint
from seer_deploy.models.checkpoints.multimodal_writer import save_multimodal_checkpoint
from seer_deploy.models.demos.demo_vl_tasks import VOCAB, heldout_examples, write_tokenizer
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.image_prompts import ImageConditionedModel, embed_with_images, image_table
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.vision import VisionConfig, VisionEncoder, projector_depth
from seer_deploy.models.pictures.image import ImageConfig, pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.runtime.reference import generate

IMAGE = 16  # pixels; patch 4 -> 16 patches


def tiny_vl_configs(newline: bool = True, select_layer: int = -2, projector: str = "mlp2x_gelu") -> tuple[ModelConfig, VisionConfig]:
    """A 2-layer LM over the demo-vl vocabulary and a 3-layer SigLIP tower (16 px, patch 4)."""
    ids = {t: i for i, t in enumerate(VOCAB)}
    lm = ModelConfig(
        vocab_size=len(VOCAB), d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=64, max_seq_len=96,
        mask_id=ids["<|mdm_mask|>"], eos_id=ids["<|endoftext|>"], pad_id=ids["<|endoftext|>"],
        bos_id=ids["<|startoftext|>"],
    )
    siglip = {
        "hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 2,
        "num_channels": 3, "image_size": IMAGE, "patch_size": 4, "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    vision = VisionConfig(
        siglip=siglip, lm_hidden_size=32, mm_hidden_size=24, image=ImageConfig(IMAGE, aspect="pad"),
        select_layer=select_layer, projector_type=projector, patch_merge_type="spatial_unpad" if newline else "flat",
    )
    return lm, vision


def tiny_vl_models(seed: int = 0, **kwargs: object) -> tuple[MaskPredictor, VisionEncoder]:
    lm_cfg, vcfg = tiny_vl_configs(**kwargs)  # type: ignore[arg-type]
    torch.manual_seed(seed)
    lm, vision = MaskPredictor(lm_cfg), VisionEncoder(vcfg)
    with torch.no_grad():  # larger than default init so predictions depend on the input
        for p in [*lm.parameters(), *vision.parameters()]:
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
        if vision.image_newline is not None:
            vision.image_newline.normal_()
    return lm.eval(), vision.eval()


def write_tiny_vl(path: Path, seed: int = 0, unused_layers: bool = False, **kwargs: object) -> tuple[Path, MaskPredictor, VisionEncoder]:
    lm, vision = tiny_vl_models(seed, **kwargs)
    tok = path.parent / f"{path.name}-tokenizer.json"
    write_tokenizer(tok)
    save_multimodal_checkpoint(lm, vision, path, tokenizer_file=tok, unused_layers=unused_layers)
    return path, lm, vision


def pictures(n: int) -> list[Image.Image]:
    return [ex.image() for ex in heldout_examples(n)]


@pytest.fixture
def tiny_vl(tmp_path: Path) -> tuple[Path, MaskPredictor, VisionEncoder]:
    return write_tiny_vl(tmp_path / "tiny-vl", unused_layers=True)


# ------------------------------------------------------------------------------------------------ layout and loading


def test_checkpoint_has_llada_v_names_and_config_keys(tiny_vl) -> None:
    path, _, _ = tiny_vl
    with safe_open(path / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names and "model.norm.weight" in names
    assert "model.layers.1.mlp.gate_proj.weight" in names
    tower = "model.vision_tower.vision_tower.vision_model."
    assert tower + "embeddings.patch_embedding.weight" in names
    assert tower + "embeddings.position_embedding.weight" in names
    assert tower + "encoder.layers.0.self_attn.q_proj.weight" in names
    assert tower + "encoder.layers.2.mlp.fc1.weight" in names  # the unused last layer of the full tower
    assert {"model.mm_projector.0.weight", "model.mm_projector.2.bias", "model.image_newline"} <= names
    raw = json.loads((path / "config.json").read_text())
    assert raw["mm_projector_type"] == "mlp2x_gelu"
    assert raw["mm_vision_select_layer"] == -2
    assert raw["mm_hidden_size"] == 24
    assert raw["image_aspect_ratio"] == "pad"
    assert raw["image_token_index"] == LLAVA_IMAGE_TOKEN_INDEX
    assert raw["hidden_size"] == 32 and raw["vision_config"]["patch_size"] == 4


def test_round_trip_gives_identical_embeddings_and_logits(tiny_vl) -> None:
    path, lm, vision = tiny_vl
    loaded = load_multimodal(path)
    px = torch.from_numpy(pixel_batch(pictures(3), vision.cfg.image))
    with torch.no_grad():
        assert torch.equal(loaded.vision(px), vision(px))
    ids = torch.randint(0, lm.cfg.vocab_size, (2, 9))
    assert torch.equal(loaded.lm.model(ids).logits, lm(ids).logits)
    # The text-only loader reads the same checkpoint and ignores the vision weights.
    assert torch.equal(load_checkpoint(path).model(ids).logits, lm(ids).logits)


def test_multimodal_checkpoints_are_told_apart(tiny_vl, make_checkpoint) -> None:
    path, _, _ = tiny_vl
    assert is_multimodal_checkpoint(path) and is_multimodal_checkpoint("demo-vl")
    assert not is_multimodal_checkpoint(make_checkpoint("llama")) and not is_multimodal_checkpoint("demo")


def test_features_come_from_the_selected_siglip_layer(tiny_vl) -> None:
    """The tower's output equals transformers' full SiglipVisionModel hidden_states[select_layer]."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    path, _, vision = tiny_vl
    raw = json.loads((path / "config.json").read_text())["vision_config"]
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    full = SiglipVisionModel(SiglipVisionConfig(**fields, vision_use_head=False)).eval()
    weights = load_file(path / "model.safetensors")
    prefix = "model.vision_tower.vision_tower.vision_model."
    full.load_state_dict({k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)})
    px = torch.from_numpy(pixel_batch(pictures(2), vision.cfg.image))
    with torch.no_grad():
        hidden = full(px, output_hidden_states=True).hidden_states
        assert len(hidden) == 4  # embeddings + 3 layers
        assert torch.allclose(vision.tower(px), hidden[-2], atol=1e-6)
        assert not torch.allclose(vision.tower(px), hidden[-1], atol=1e-3)


def test_select_layer_changes_how_many_layers_run() -> None:
    assert tiny_vl_configs(select_layer=-2)[1].layers_to_run == 2
    assert tiny_vl_configs(select_layer=-1)[1].layers_to_run == 3
    assert tiny_vl_configs(select_layer=1)[1].layers_to_run == 1
    with pytest.raises(CheckpointError, match="mm_vision_select_layer -5"):
        tiny_vl_configs(select_layer=-5)


def test_projector_types() -> None:
    assert projector_depth("mlp2x_gelu") == 2
    assert projector_depth("mlp3x_gelu") == 3
    assert projector_depth("linear") == 1
    with pytest.raises(CheckpointError, match="mm_projector_type 'pooler'"):
        projector_depth("pooler")
    _, vision = tiny_vl_models(projector="mlp3x_gelu")
    kinds = [type(m).__name__ for m in vision.projector]
    assert kinds == ["Linear", "GELU", "Linear", "GELU", "Linear"]


def test_checkpoint_without_unused_layers_loads_the_same(tmp_path: Path) -> None:
    """LLaVA-OneVision stores the tower without its last layer; both layouts load to the same encoder."""
    a, _, vision = write_tiny_vl(tmp_path / "full", unused_layers=True)
    b, _, _ = write_tiny_vl(tmp_path / "truncated", unused_layers=False)
    with safe_open(b / "model.safetensors", framework="pt") as f:
        assert not any(".encoder.layers.2." in k for k in f.keys())  # noqa: SIM118 - safe_open is not a dict
    px = torch.from_numpy(pixel_batch(pictures(2), vision.cfg.image))
    with torch.no_grad():
        assert torch.equal(load_multimodal(a).vision(px), load_multimodal(b).vision(px))


def test_known_tower_name_gives_the_so400m_shape() -> None:
    raw = {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 40, "max_position_embeddings": 64, "mask_token_id": 2, "eos_token_id": 1,
        "mm_vision_tower": "google/siglip-so400m-patch14-384", "mm_projector_type": "mlp2x_gelu",
        "mm_vision_select_layer": -2, "mm_hidden_size": 1152, "image_aspect_ratio": "pad",
    }
    vcfg = vision_config_from_dict(raw)
    assert vcfg.patches_per_image == 729 and vcfg.layers_to_run == 26 and vcfg.lm_hidden_size == 64


# ------------------------------------------------------------------------------------------------ prompt assembly


def test_tokenizer_maps_image_to_placeholder(tiny_vl) -> None:
    path, _, _ = tiny_vl
    tok = MultimodalTokenizer.for_checkpoint(load_multimodal(path))
    ids = tok.encode_prompt("<image> colors")
    assert ids.count(LLAVA_IMAGE_TOKEN_INDEX) == 1 and ids[1] == LLAVA_IMAGE_TOKEN_INDEX
    assert tok.encode_prompt("colors").count(LLAVA_IMAGE_TOKEN_INDEX) == 0
    assert tok.encode_prompt("<image> <image> count").count(LLAVA_IMAGE_TOKEN_INDEX) == 2


def test_spliced_embeddings_are_the_image_embeddings_in_place(tiny_vl) -> None:
    _, lm, vision = tiny_vl
    T = vision.cfg.tokens_per_image
    base, marker = lm.cfg.n_embed_rows, vision.cfg.image_token_index
    prompt = [0, marker, 24, 3]
    (expanded,) = expand_placeholders([prompt], [1], T, marker, base)
    assert len(expanded) == 3 + T and expanded[1 : 1 + T] == list(range(base, base + T))
    with torch.no_grad():
        img = vision(torch.from_numpy(pixel_batch(pictures(1), vision.cfg.image)))[0]
        got = embed_with_images(lm.embed, torch.tensor([expanded]), img)
        want = torch.cat([lm.embed(torch.tensor([0])), img, lm.embed(torch.tensor([24, 3]))])
        assert torch.equal(got[0], want)
        # The conditioned model equals the LM run on those embeddings.
        model = ImageConditionedModel(lm, img)
        assert torch.equal(model(torch.tensor([expanded])).logits, lm(inputs_embeds=want[None]).logits)


def test_two_images_in_one_prompt_and_batches_keep_their_own_images(tiny_vl) -> None:
    _, lm, vision = tiny_vl
    T, base, marker = vision.cfg.tokens_per_image, lm.cfg.n_embed_rows, vision.cfg.image_token_index
    prompts = [[0, marker, 5, marker, 24, 3], [0, marker, 25, 3], [0, 23, 3]]
    counts = [2, 1, 0]
    expanded = expand_placeholders(prompts, counts, T, marker, base)
    assert [len(p) for p in expanded] == [4 + 2 * T, 3 + T, 3]
    with torch.no_grad():
        embeds = vision(torch.from_numpy(pixel_batch(pictures(3), vision.cfg.image)))
    table = image_table(list(embeds), lm.cfg.d_model)
    assert table.shape == (3 * T, lm.cfg.d_model)
    config = GenerationConfig(gen_length=8, steps=8)
    together = generate(ImageConditionedModel(lm, table), expanded, config).tokens
    # Each prompt alone (its own table) gives the same tokens as in the left-padded batch.
    alone_tables = [embeds[0:2], embeds[2:3], torch.zeros(0, T, lm.cfg.d_model)]
    for i in range(3):
        (solo,) = expand_placeholders([prompts[i]], [counts[i]], T, marker, base)
        out = generate(ImageConditionedModel(lm, image_table([alone_tables[i]], lm.cfg.d_model)), [solo], config)
        assert torch.equal(out.tokens[0], together[i])
    # The image changes the answer's logits (the model does look at it).
    swapped = image_table([embeds[2], embeds[1], embeds[0]], lm.cfg.d_model)
    x = torch.tensor([expanded[1]])
    with torch.no_grad():
        assert not torch.allclose(ImageConditionedModel(lm, table)(x).logits, ImageConditionedModel(lm, swapped)(x).logits)


def test_seer_grouping_keeps_rows_on_their_images(tiny_vl) -> None:
    """Forced kept lengths regroup rows; each row's tokens equal its solo run with the same kept length."""
    _, lm, vision = tiny_vl
    T, base, marker = vision.cfg.tokens_per_image, lm.cfg.n_embed_rows, vision.cfg.image_token_index
    prompts = [[0, marker, 24, 3], [0, marker, 25, 3], [0, marker, 26, 3]]
    expanded = expand_placeholders(prompts, [1, 1, 1], T, marker, base)
    with torch.no_grad():
        embeds = vision(torch.from_numpy(pixel_batch(pictures(3), vision.cfg.image)))
    model = ImageConditionedModel(lm, image_table(list(embeds), lm.cfg.d_model))
    config = GenerationConfig(gen_length=16, steps=16)
    kept = [4, 16, 4]
    batch = generate(model, expanded, config, kept_lengths=kept)
    for i in range(3):
        (solo,) = expand_placeholders([prompts[i]], [1], T, marker, base)
        alone = generate(ImageConditionedModel(lm, embeds[i]), [solo], config, kept_lengths=[kept[i]])
        assert torch.equal(alone.tokens[0], batch.tokens[i])


# ------------------------------------------------------------------------------------------------ bad input


def test_placeholder_and_image_counts_must_match(tiny_vl) -> None:
    _, lm, vision = tiny_vl
    T, base, marker = vision.cfg.tokens_per_image, lm.cfg.n_embed_rows, vision.cfg.image_token_index
    with pytest.raises(ConfigError, match=r"0 <image> placeholder\(s\) but 1 image"):
        expand_placeholders([[0, 24, 3]], [1], T, marker, base)
    with pytest.raises(ConfigError, match=r"2 <image> placeholder\(s\) but 1 image"):
        expand_placeholders([[0, marker, marker, 3]], [1], T, marker, base)


def test_missing_vision_weights_are_named(tmp_path: Path) -> None:
    path, _, _ = write_tiny_vl(tmp_path / "ck")
    weights = load_file(path / "model.safetensors")
    del weights["model.mm_projector.2.weight"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing vision weights: model\.mm_projector\.2\.weight"):
        load_multimodal(path)


def test_text_only_checkpoint_is_refused_with_the_reason(tmp_path: Path) -> None:
    path, _, _ = write_tiny_vl(tmp_path / "ck")
    weights = {k: v for k, v in load_file(path / "model.safetensors").items() if "vision_tower" not in k}
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="no vision tower weights"):
        load_multimodal(path)
    raw = json.loads((path / "config.json").read_text())
    for key in ("mm_vision_tower", "vision_config"):
        raw.pop(key)
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="describes no vision tower"):
        load_multimodal(path)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"image_aspect_ratio": "anyres_max_4"}, ConfigError, "'anyres_max_4'.*not supported.*\"pad\""),
        ({"mm_projector_type": "identity"}, CheckpointError, "mm_projector_type 'identity'"),
        ({"mm_hidden_size": 99}, CheckpointError, "mm_hidden_size 99 differs"),
        ({"mm_vision_select_feature": "cls"}, CheckpointError, "mm_vision_select_feature 'cls'"),
        ({"vision_config": None, "mm_vision_tower": "someone/unknown-tower"}, CheckpointError, "holds no 'vision_config'"),
        ({"vision_config": {"model_type": "clip_vision_model"}}, CheckpointError, "model_type 'clip_vision_model'"),
    ],
)
def test_bad_multimodal_configs(tmp_path: Path, change: dict, error: type, match: str) -> None:
    path, _, _ = write_tiny_vl(tmp_path / "ck")
    raw = json.loads((path / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            raw.pop(key)
        elif isinstance(value, dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(error, match=match):
        load_multimodal(path)


def test_vision_weight_of_wrong_shape(tmp_path: Path) -> None:
    path, _, _ = write_tiny_vl(tmp_path / "ck")
    weights = load_file(path / "model.safetensors")
    weights["model.mm_projector.0.weight"] = torch.zeros(32, 25)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.mm_projector\.0\.weight has shape \(32, 25\)"):
        load_multimodal(path)


def test_image_ids_beyond_the_table_fail_in_the_ort_feed_not_silently() -> None:
    """Guard: the torch lookup raises on an id past the table (the ORT backend checks it before the call)."""
    lm, _ = tiny_vl_models()
    with pytest.raises(IndexError):
        embed_with_images(lm.embed, torch.tensor([[0, lm.cfg.n_embed_rows + 5]]), torch.zeros(2, lm.cfg.d_model))

