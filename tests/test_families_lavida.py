"""LaViDa checkpoints (jacklishufan/LaViDa) in their public layout: load, pool, generate with a picture, export, and
ONNX Runtime = torch token for token with Seer on and off; one loader error per variant.

The tiny checkpoints are written as LaViDa's training code saves them: LLaDA's original LM names
(`model.transformer.blocks.N...`) and config fields, LLaVA's vision names, the SigLIP tower without its last layer,
`architectures` ["LlavaLladaForMaskedDiffusion"]. One deviation, needed for a tiny tower: config.json carries the
tower's shape as `vision_config` (LaViDa builds every tower with the so400m shape; a test below checks that shape).
The pictures are real photographs (matplotlib's sample data, a declared dependency), not rendered shapes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import cbook
from PIL import Image
from safetensors import safe_open

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.multimodal import load_multimodal, vision_config_from_dict
from seer_deploy.models.checkpoints.multimodal_writer import save_multimodal_checkpoint
from seer_deploy.models.demos.demo_vl_tasks import VOCAB, write_tokenizer
from seer_deploy.models.families.config import ModelConfig, config_from_dict
from seer_deploy.models.families.lavida import GRID_PINPOINTS, lavida_anyres, lavida_variant
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.vision import VisionConfig, VisionEncoder
from seer_deploy.models.pictures.anyres import (
    AnyresConfig,
    anyres_tokens,
    anyres_views,
    grid_shape,
    merge_views,
    select_best_resolution,
    unpadded_grid,
)
from seer_deploy.models.pictures.image import ImageConfig, load_image, pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, encode_pictures, expand_placeholders
from seer_deploy.models.prompts.prompt import assign_images
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import Run, SeerOptions, Service, ServiceOptions
from seer_deploy.service import generate as serve

IMAGE, PATCH = 28, 4  # a 7 x 7 patch grid: odd, as so400m's 27 x 27, so bilinear pooling rounds up to 4 x 4
CONFIG = GenerationConfig(gen_length=16, steps=16)
PROMPTS = ["<image> describe", "<image> colors"]


def tiny_lavida_models(seed: int = 0, variant: str = "llada") -> tuple[MaskPredictor, VisionEncoder]:
    """A 2-layer LM over the demo-vl words (LLaDA's, or Dream's: q/k/v biases, grouped-query attention, rope theta
    1e6, shifted logits) and a 3-layer SigLIP tower pooled 2x2 bilinear, as LaViDa does."""
    ids = {t: i for i, t in enumerate(VOCAB)}
    fields: dict[str, object] = {
        "vocab_size": len(VOCAB), "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden": 64,
        "max_seq_len": 128, "mask_id": ids["<|mdm_mask|>"], "eos_id": ids["<|endoftext|>"],
        "pad_id": ids["<|endoftext|>"], "bos_id": ids["<|startoftext|>"]}
    if variant == "dream":
        fields.update(family="dream", n_kv_heads=2, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True, shift_logits=True)
    siglip = {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 2,
              "num_channels": 3, "image_size": IMAGE, "patch_size": PATCH, "hidden_act": "gelu_pytorch_tanh",
              "layer_norm_eps": 1e-6}
    vcfg = VisionConfig(siglip=siglip, lm_hidden_size=32, mm_hidden_size=24, image=ImageConfig(IMAGE, aspect="pad"),
                        projector_type="mlp2x_gelu", patch_merge_type="spatial_unpad", pool_stride=2)
    torch.manual_seed(seed)
    lm, vision = MaskPredictor(ModelConfig(**fields)), VisionEncoder(vcfg)  # type: ignore[arg-type]
    with torch.no_grad():  # larger than default init so the answer depends on the picture
        for p in [*lm.parameters(), *vision.parameters()]:
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
        assert vision.image_newline is not None
        vision.image_newline.normal_()
    return lm.eval(), vision.eval()


def write_lavida(path: Path, seed: int = 0, variant: str = "llada", **config: object) -> Path:
    """A tiny LaViDa checkpoint of `variant` ('llada' or 'dream'), with `config` keys edited into its config.json."""
    lm, vision = tiny_lavida_models(seed, variant)
    tok = path.parent / f"{path.name}-tokenizer.json"
    write_tokenizer(tok)
    save_multimodal_checkpoint(lm, vision, path, tokenizer_file=tok, lavida=variant)
    edit_config(path, **config)
    return path


def write_lavida_llada(path: Path, seed: int = 0) -> Path:
    return write_lavida(path, seed)


def photos() -> list[str]:
    """Two real photographs of different aspect ratios (a portrait, a product shot)."""
    return [str(cbook.get_sample_data(name, asfileobj=False))
            for name in ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")]


def edit_config(path: Path, **changes: object) -> None:
    """Set (None: remove) keys of a checkpoint's config.json."""
    if not changes:
        return
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))


def run(target: Path | str, seer: SeerConfig | None, texts: list[str] = PROMPTS, config: GenerationConfig = CONFIG
        ) -> Run:
    """The service, as `seer-deploy generate TARGET --image ...` calls it (Seer off, or on with `seer`)."""
    options = ServiceOptions(generation=config, seer=SeerOptions(on=seer is not None, config=seer))
    return serve(assign_images(texts, photos()[: len(texts)]), str(target), options)


@pytest.fixture(scope="module")
def lavida(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A LaViDa-LLaDA checkpoint (prefix-DLM attention, LaViDa's default) and its export: vision.onnx with the pooling,
    step.onnx (with the keys and values), window_step.onnx and prompt_step.onnx (LaViDa's own speed-up is a cached
    prompt)."""
    root = tmp_path_factory.mktemp("lavida")
    ckpt = write_lavida_llada(root / "lavida-llada", seed=SEED)
    return ckpt, export_multimodal(ckpt, root / "export", ExportOptions(kv_cache=True)).out


# Step zero's EOS predictions place the cut; with this seed's weights a row ends in EOS wins (kept 14 of 16), so Seer
# cuts, the rows get different kept lengths and the answers before the cut are not all one token.
SEED = 30
SEER = SeerConfig(detector="eos", eos_floor=0.0, margin=0)
SEER_ANY = SeerConfig(detector="eos", eos_floor=0.0, margin=0, eos_tolerance=CONFIG.gen_length)  # first EOS win cuts


# ------------------------------------------------------------------------------------------------ layout and loading


def test_checkpoint_is_in_lavidas_layout(lavida) -> None:
    ckpt, _ = lavida
    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    blocks = "model.transformer.blocks.1."
    assert {blocks + n + ".weight" for n in ("attn_norm", "q_proj", "attn_out", "ff_proj", "up_proj", "ff_out")} <= names
    assert {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"} <= names
    tower = "model.vision_tower.vision_tower.vision_model."
    assert tower + "encoder.layers.1.mlp.fc1.weight" in names
    assert not any(n.startswith(tower + "encoder.layers.2.") for n in names)  # the last layer is dropped
    assert {"model.mm_projector.0.weight", "model.mm_projector.2.bias", "model.image_newline"} <= names
    assert not any(n.startswith(("model.layers.", "lm_head")) for n in names)
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["architectures"] == ["LlavaLladaForMaskedDiffusion"] and raw["model_type"] == "llava_llada"
    assert raw["d_model"] == 32 and "hidden_size" not in raw
    assert raw["mm_spatial_pool_mode"] == "bilinear" and raw["mm_patch_merge_type"] == "spatial_unpad"
    assert lavida_variant(raw) == "llada"


def test_loader_picks_lavida_and_pools_the_grid(lavida) -> None:
    """7 x 7 patches -> 4 x 4 after bilinear 2x2 pooling (+ image_newline): the pooling equals a bilinear resize with
    half-pixel centres written out in numpy, applied to the projected patch features."""
    ckpt, _ = lavida
    loaded = load_multimodal(ckpt)
    vcfg = loaded.vision_config
    assert loaded.lm.layout == "llada" and (vcfg.pool_stride, vcfg.pool_mode) == (2, "bilinear")
    assert loaded.config.prefix_dlm  # LaViDa generates with prefix-DLM attention (predict.py: prefix_lm=True)
    assert vcfg.layers_to_run == 2 and vcfg.tokens_per_image == 4 * 4 + 1
    px = torch.from_numpy(pixel_batch([load_image(p) for p in photos()], vcfg.image))
    with torch.no_grad():
        grid = loaded.vision.projector(loaded.vision.tower(px)).numpy().reshape(2, 7, 7, -1)
        got = loaded.vision(px).numpy()
    src = np.clip((np.arange(4) + 0.5) * 7 / 4 - 0.5, 0, None)
    lo = np.floor(src).astype(int)
    hi, w = np.minimum(lo + 1, 6), src - lo
    rows = grid[:, lo] * (1 - w)[None, :, None, None] + grid[:, hi] * w[None, :, None, None]
    want = rows[:, :, lo] * (1 - w)[None, None, :, None] + rows[:, :, hi] * w[None, None, :, None]
    assert np.allclose(got[:, :16], want.reshape(2, 16, -1), atol=1e-5)
    assert np.array_equal(got[:, 16], np.broadcast_to(loaded.vision.image_newline.numpy(), (2, 32)))


def test_published_configs_give_196_tokens_per_view_and_llada_v_stays_unpooled() -> None:
    """LaViDa names its tower by a path ending in the so400m name (its training scripts' /path/to/...); its tower is
    so400m whatever the name: 27 x 27 patches -> 14 x 14 = 196, + image_newline. LLaDA-V (model_type llava_llada too,
    Llama-style fields) is not LaViDa and keeps its 729 patches."""
    lm = {"vocab_size": 40, "mask_token_id": 2, "eos_token_id": 1}
    mm = {"mm_projector_type": "mlp2x_gelu", "mm_hidden_size": 1152, "mm_patch_merge_type": "spatial_unpad",
          "image_aspect_ratio": "pad", "mm_spatial_pool_stride": None, "mm_spatial_pool_mode": "bilinear"}
    lavida_raw = {"model_type": "llava_llada", "architectures": ["LlavaLladaForMaskedDiffusion"], "d_model": 64,
                  "n_layers": 2, "n_heads": 4, "mlp_hidden_size": 128, "max_sequence_length": 4096,
                  "mm_vision_tower": "/path/to/google/siglip-so400m-patch14-384", **lm, **mm}
    vcfg = vision_config_from_dict(lavida_raw)
    assert (vcfg.grid_side, vcfg.pooled_side, vcfg.tokens_per_image, vcfg.layers_to_run) == (27, 14, 197, 26)
    assert vision_config_from_dict({**lavida_raw, "mm_spatial_pool_stride": 1}).tokens_per_image == 729 + 1
    assert vision_config_from_dict({**lavida_raw, "mm_spatial_pool_mode": "average"}).tokens_per_image == 169 + 1
    llada_v = {"model_type": "llava_llada", "architectures": ["LlavaLLaDAModelLM"], "hidden_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
               "max_position_embeddings": 4096, "mm_vision_tower": "google/siglip-so400m-patch14-384", **lm, **mm}
    assert lavida_variant(llada_v) is None and vision_config_from_dict(llada_v).tokens_per_image == 729 + 1


# ------------------------------------------------------------------------------------------------ generation


def reference_tokens(ckpt: Path, texts: list[str], kept: list[int] | None = None) -> list[list[int]]:
    """The oracle: the checkpoint's tower on the photographs, then LLaDA's loop in torch (kept lengths forced)."""
    loaded = load_multimodal(ckpt)
    vcfg, cfg = loaded.vision_config, loaded.config
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    ids = expand_placeholders([tok.encode_prompt(t) for t in texts], [1] * len(texts), vcfg.tokens_per_image,
                              vcfg.image_token_index, cfg.n_embed_rows)
    px = torch.from_numpy(pixel_batch([load_image(p) for p in photos()[: len(texts)]], vcfg.image))
    with torch.no_grad():
        table = loaded.vision(px).reshape(-1, cfg.d_model)
    return generate(ImageConditionedModel(loaded.lm.model, table), ids, CONFIG, kept_lengths=kept).tokens.tolist()


def test_service_answers_a_photo_like_the_reference_loop_seer_off_and_on(lavida) -> None:
    ckpt, _ = lavida
    full = run(ckpt, None)
    assert full.backend == "torch" and [a.tokens for a in full.answers] == reference_tokens(ckpt, PROMPTS)
    cut = run(ckpt, SEER)
    kept = [r.kept for r in cut.reports if r is not None]
    assert len(kept) == 2 and min(kept) < CONFIG.gen_length  # Seer did cut
    assert [a.tokens for a in cut.answers] == reference_tokens(ckpt, PROMPTS, kept)


def test_the_picture_matters(lavida) -> None:
    ckpt, _ = lavida
    options = ServiceOptions(generation=CONFIG, seer=SeerOptions(on=False))
    a, b = (serve(assign_images(["<image> describe"], [p]), str(ckpt), options).answers[0].tokens for p in photos())
    assert a != b


# ------------------------------------------------------------------------------------------------ export and ORT


def test_export_folds_the_pooling_into_vision_onnx(lavida) -> None:
    import onnx

    _, out = lavida
    manifest = json.loads((out / "manifest.json").read_text())
    section = manifest["extra"]["multimodal"]
    assert section["vision"]["outputs"]["image_embeds"]["shape"][1:] == [17, 32]
    assert section["vision_config"]["pool_stride"] == 2 and section["vision_config"]["tokens_per_image"] == 17
    ops = {n.op_type for n in onnx.load(str(out / "vision.onnx"), load_external_data=False).graph.node}
    assert "Resize" in ops  # the bilinear pooling runs in the graph
    assert manifest["extra"]["validation"]["verified"] and manifest["extra"]["validation"]["max_diff"]["vision"] < 1e-4


@pytest.mark.parametrize("seer", [None, SEER], ids=["seer-off", "seer-on"])
def test_onnx_runtime_equals_torch_token_for_token(lavida, seer: SeerConfig | None) -> None:
    ckpt, out = lavida
    ort, ref = run(out, seer), run(ckpt, seer)
    assert ort.backend.startswith("onnxruntime")
    assert [a.tokens for a in ort.answers] == [a.tokens for a in ref.answers]
    kept = [r.kept if r else None for r in ort.reports]
    assert kept == [r.kept if r else None for r in ref.reports]
    if seer is None:
        assert kept == [None, None]
    else:
        assert min(k for k in kept if k is not None) < CONFIG.gen_length  # Seer did cut


@pytest.mark.parametrize("seer", [None, SEER], ids=["seer-off", "seer-on"])
def test_cached_parallel_decoding_on_onnx_runtime_equals_torch(lavida, seer: SeerConfig | None) -> None:
    """Fast-dLLM's threshold decoding with the block-wise KV cache (the pictures' and the prompt's keys and values
    cached, which prefix-DLM makes exact for the prompt): ORT's refresh (with prompt_width) and window_step graphs =
    torch's cached loop."""
    ckpt, out = lavida
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["graphs"]["step"]["inputs"])[-1] == "prompt_width"  # the step graph refreshes the cache
    cached = GenerationConfig(gen_length=16, steps=16, block_length=8, kv_cache=True, decode="threshold",
                              threshold=0.5)
    ort, ref = run(out, seer, config=cached), run(ckpt, seer, config=cached)
    assert [a.tokens for a in ort.answers] == [a.tokens for a in ref.answers]
    assert [r.kept if r else None for r in ort.reports] == [r.kept if r else None for r in ref.reports]


@pytest.mark.parametrize("seer", [None, SEER], ids=["seer-off", "seer-on"])
def test_prompt_cache_over_a_photo_gives_the_uncached_tokens(lavida, seer: SeerConfig | None) -> None:
    """LaViDa's own speed-up: the prompt (a photo's 197 tokens and the question) prefilled at step zero, every later
    pass runs the last prompt token and the answer only. Prefix-DLM makes it exact: the tokens without the cache, on
    torch and ONNX Runtime (prompt_step.onnx), with fewer positions processed (582 against 1152 here: step zero runs
    the whole prompt either way)."""
    ckpt, out = lavida
    plain = run(ckpt, seer)
    for target in (ckpt, out):
        cached = run(target, seer, config=replace(CONFIG, prompt_cache=True))
        assert [a.tokens for a in cached.answers] == [a.tokens for a in plain.answers]
        assert cached.passes == plain.passes and cached.tokens_processed < plain.tokens_processed


# ------------------------------------------------------------------------------------------------ LaViDa-Dream, prefix-DLM


def test_lavida_dream_is_in_its_layout_loads_and_answers_like_the_reference_loop(tmp_path: Path) -> None:
    """Dream's Qwen2 names (q/k/v biases, lm_head) with LLaVA's vision keys; the loader takes Dream's options from
    llava_dream; the service answers a photo as the reference loop does, Seer off and on."""
    ckpt = write_lavida(tmp_path / "lavida-dream", seed=1, variant="dream")
    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert {"model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias", "model.embed_tokens.weight",
            "model.norm.weight", "lm_head.weight", "model.mm_projector.2.weight", "model.image_newline"} <= names
    assert "model.layers.1.self_attn.o_proj.bias" not in names
    raw = json.loads((ckpt / "config.json").read_text())
    assert (raw["model_type"], raw["architectures"]) == ("llava_dream", ["LlavaDreamForMaskedDiffusion"])
    assert lavida_variant(raw) == "dream" and "hidden_size" in raw and "d_model" not in raw
    loaded = load_multimodal(ckpt)
    cfg = loaded.config
    assert (cfg.family, cfg.qkv_bias, cfg.shift_logits, cfg.n_kv_heads) == ("dream", True, True, 2)
    assert loaded.vision_config.tokens_per_image == 17
    full = run(ckpt, None)
    assert [a.tokens for a in full.answers] == reference_tokens(ckpt, PROMPTS)
    cut = run(ckpt, SEER_ANY)
    kept = [r.kept for r in cut.reports if r is not None]
    assert len(kept) == 2 and min(kept) < CONFIG.gen_length  # Seer did cut
    assert [a.tokens for a in cut.answers] == reference_tokens(ckpt, PROMPTS, kept)


def test_prefix_dlm_lavida_dream_exports_and_onnx_runtime_equals_torch(tmp_path: Path) -> None:
    """LaViDa generates with prefix-DLM attention (on by default for LaViDa checkpoints): the step graphs take
    prompt_width after the image table; the prompt's logits do not depend on the answer (they do with it off);
    ONNX Runtime = torch token for token, Seer off and on."""
    ckpt = write_lavida(tmp_path / "lavida-dream-prefix", seed=1, variant="dream")
    loaded = load_multimodal(ckpt)
    cfg, vcfg = loaded.config, loaded.vision_config
    assert cfg.prefix_dlm and not config_from_dict({**json.loads((ckpt / "config.json").read_text()),
                                                    "prefix_lm": False}).prefix_dlm
    out = export_multimodal(ckpt, tmp_path / "export").out
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["graphs"]["step"]["inputs"])[-2:] == ["image_table", "prompt_width"]
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    ids = expand_placeholders([tok.encode_prompt(t) for t in PROMPTS], [1, 1], vcfg.tokens_per_image,
                              vcfg.image_token_index, cfg.n_embed_rows)
    width = len(ids[0])
    assert {len(i) for i in ids} == {width}  # one prompt width for the batch
    px = pixel_batch([load_image(p) for p in photos()], vcfg.image)
    backend = MultimodalOrtBackend(out)
    embeds = backend.encode_images(px)
    backend.set_image_table([embeds])
    model = ImageConditionedModel(loaded.lm.model, torch.from_numpy(embeds.reshape(-1, cfg.d_model)))
    plain = ImageConditionedModel(loaded.lm.model, model.image_table)
    plain.cfg = replace(cfg, prefix_dlm=False)
    x = torch.cat([torch.tensor(ids[:1]), torch.full((1, CONFIG.gen_length), cfg.mask_id)], dim=1)
    y = x.clone()
    y[0, -CONFIG.gen_length:] = cfg.eos_id
    with torch.no_grad():  # the prompt columns' logits (shifted: computed at columns -1..P-2, all prompt)
        prefix = [model(t, prompt_width=torch.tensor([width])).logits[0, :width] for t in (x, y)]
        full = [plain(t).logits[0, :width] for t in (x, y)]
    assert torch.equal(prefix[0], prefix[1]) and not torch.allclose(full[0], full[1])
    common = {"ids": SpecialIds(cfg.mask_id, cfg.pad_id, cfg.eos_id)}
    for seer in (None, SEER_ANY):
        ort = run_generation(backend, ids, CONFIG, seer=seer, **common)  # type: ignore[arg-type]
        ref = run_generation(TorchBackend(model), ids, CONFIG, seer=seer, **common)  # type: ignore[arg-type]
        assert np.array_equal(ort.tokens, ref.tokens)
        if seer is not None:
            assert ort.seer is not None and ref.seer is not None
            assert [r.kept for r in ort.seer] == [r.kept for r in ref.seer]
            assert min(r.kept for r in ort.seer) < CONFIG.gen_length  # Seer did cut


# ------------------------------------------------------------------------------------------------ anyres


ANYRES = AnyresConfig(tuple((w * IMAGE // 384, h * IMAGE // 384) for w, h in GRID_PINPOINTS), IMAGE)  # LaViDa's, scaled


def test_anyres_views_fit_the_picture_into_the_best_pinpoint() -> None:
    """A 1:2 portrait goes to 2 x 1 crops (LaViDa's 384 x 768, scaled), a wide landscape to 1 x 3; the crops tile the
    fitted picture, centred on black; the base view is the whole picture resized."""
    portrait, landscape = Image.new("RGB", (300, 600), (200, 10, 10)), Image.new("RGB", (600, 260), (10, 200, 10))
    assert grid_shape(portrait.size, ANYRES) == (2, 1) and grid_shape(landscape.size, ANYRES) == (1, 3)
    assert select_best_resolution((100, 100), ANYRES.pinpoints) == (2 * IMAGE, 2 * IMAGE)  # most pixels kept
    views = anyres_views(landscape, ANYRES)
    assert len(views) == 4 and all(v.size == (IMAGE, IMAGE) for v in views)
    canvas = np.concatenate([np.asarray(v) for v in views[1:]], axis=1)  # 28 x 84: the picture scaled to 65 x 28
    assert (canvas[:, :9] == 0).all() and (canvas[:, -10:] == 0).all() and (canvas[:, 10:-11, 1] > 150).all()
    assert (np.asarray(views[0])[..., 1] > 150).all()


def test_anyres_merge_lays_out_base_then_unpadded_rows_closed_by_image_newline() -> None:
    """Tokens that carry their origin (view, row, column): the base view's patches first, then the crops' patches as
    one grid row by row, the rows that only covered padding cut, image_newline after every row."""
    size, side = (600, 260), 4  # a wide landscape: 1 x 3 crops, padded left and right
    rows, cols = grid_shape(size, ANYRES)
    views = 1 + rows * cols
    embeds = np.zeros((views, side * side + 1, 3), np.float32)
    for v in range(views):
        for r in range(side):
            for c in range(side):
                embeds[v, r * side + c] = (v, r, c)
        embeds[v, -1] = (-1, -1, -1)  # image_newline
    merged = merge_views(embeds, size, ANYRES)
    assert len(merged) == anyres_tokens(size, ANYRES, side)
    assert [tuple(t) for t in merged[: side * side]] == [(0, r, c) for r in range(side) for c in range(side)]
    top, bottom, left, right = unpadded_grid(rows * side, cols * side, size)
    assert (top, bottom, left, right) == (0, 4, 1, 11)  # 600 / 260 of 4 rows = 9.2 columns -> 9: 1 cut each side
    grid = merged[side * side :].reshape(bottom - top, right - left + 1, 3)
    assert (grid[:, -1] == -1).all()  # a newline closes every row
    for i, row in enumerate(grid[:, :-1]):
        r = top + i
        assert [tuple(t) for t in row] == [(1 + c // side, r, c % side) for c in range(left, right)]


def test_anyres_pictures_run_on_onnx_runtime_as_on_torch(lavida) -> None:
    """The same vision graph encodes every view; merged per picture (different token counts), expanded with one count
    per picture: ONNX Runtime = torch token for token, Seer off and on."""
    ckpt, out = lavida
    loaded = load_multimodal(ckpt)
    cfg, vcfg = loaded.config, loaded.vision_config
    square = replace(vcfg.image, aspect="square")
    pictures = [load_image(p) for p in photos()]
    backend = MultimodalOrtBackend(out)

    def torch_encode(px: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return loaded.vision(torch.from_numpy(px)).numpy()

    ort_embeds = encode_pictures(backend.encode_images, pictures, square, ANYRES)
    torch_embeds = encode_pictures(torch_encode, pictures, square, ANYRES)
    counts = [len(e) for e in torch_embeds]
    assert counts == [anyres_tokens(p.size, ANYRES, vcfg.pooled_side) for p in pictures] and counts[0] != counts[1]
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(ort_embeds, torch_embeds, strict=True))
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    ids = expand_placeholders([tok.encode_prompt(t) for t in PROMPTS], [1, 1], counts, vcfg.image_token_index,
                              cfg.n_embed_rows)
    backend.set_image_table(ort_embeds)
    model = ImageConditionedModel(loaded.lm.model, torch.from_numpy(np.concatenate(ort_embeds)))
    common = {"ids": SpecialIds(cfg.mask_id, cfg.pad_id, cfg.eos_id)}
    for seer in (None, SEER_ANY):
        ort = run_generation(backend, ids, CONFIG, seer=seer, **common)  # type: ignore[arg-type]
        ref = run_generation(TorchBackend(model), ids, CONFIG, seer=seer, **common)  # type: ignore[arg-type]
        assert np.array_equal(ort.tokens, ref.tokens)
    assert np.array_equal(ref.tokens, generate(model, ids, CONFIG, kept_lengths=[r.kept for r in ref.seer or []]
                                               ).tokens.numpy())


def test_anyres_settings_from_config() -> None:
    raw = {"image_aspect_ratio": "anyres", "mm_patch_merge_type": "spatial_unpad"}
    assert lavida_anyres(raw, 384) == AnyresConfig(tuple(map(tuple, GRID_PINPOINTS)), 384)  # type: ignore[arg-type]
    assert lavida_anyres({**raw, "image_grid_pinpoints": "[(384, 768), (768, 384)]"}, 384) == AnyresConfig(
        ((384, 768), (768, 384)), 384)
    assert lavida_anyres({**raw, "image_aspect_ratio": "pad"}, 384) is None
    with pytest.raises(ConfigError, match="'anyres_max_9'.*not LaViDa's tiling"):
        lavida_anyres({**raw, "image_aspect_ratio": "anyres_max_9"}, 384)
    with pytest.raises(CheckpointError, match=r"entry \[400, 768\] must be whole multiples of the tower's 384 px"):
        lavida_anyres({**raw, "image_grid_pinpoints": [[400, 768]]}, 384)


def test_the_servers_usage_counts_each_anyres_picture_as_the_service_does(tmp_path: Path) -> None:
    """An anyres picture is its base view and crops: the server's usage.prompt_tokens is the service's count for the
    same request (`Service.prepare`, which the server's rows come from), not one view's fixed count."""
    import base64
    import io

    import httpx

    from seer_deploy.serve import BackgroundServer, ServeOptions, create_app, protocol

    ckpt = write_lavida_llada(tmp_path / "ck", seed=SEED)
    edit_config(ckpt, image_aspect_ratio="anyres", image_grid_pinpoints=[list(p) for p in ANYRES.pinpoints])
    service = Service(str(ckpt), ServiceOptions(generation=CONFIG, seer=SeerOptions(on=False)))
    png = io.BytesIO()
    picture = load_image(photos()[1])
    picture.save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    body = {"model": "lavida", "max_tokens": CONFIG.gen_length, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "describe"}]}]}
    request = protocol.parse(protocol.ChatBody, json.dumps(body).encode())
    assert isinstance(request, protocol.ChatBody)
    prepared = service.prepare([request.request()])
    images = service.info.images
    assert images is not None
    one_view = len(prepared.ids[0]) - 1 + images.tokens_per_image
    anyres = len(prepared.ids[0]) - 1 + anyres_tokens(picture.size, ANYRES, load_multimodal(ckpt).vision_config.pooled_side)
    assert prepared.prompt_tokens == [anyres] and anyres != one_view
    with BackgroundServer(create_app(service, ServeOptions(model_name="lavida", gen_lengths=(CONFIG.gen_length,)))) \
            as server:
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == anyres


# ------------------------------------------------------------------------------------------------ loader errors


def test_anyres_checkpoint_answers_through_the_service_on_torch_and_onnx_runtime(tmp_path: Path) -> None:
    """`image_aspect_ratio: anyres` end to end: each picture becomes its base view and crops, its placeholder that
    picture's own token count; the export records the tiling; ONNX Runtime = torch token for token, Seer off and on."""
    ckpt = write_lavida_llada(tmp_path / "ck", seed=SEED)
    edit_config(ckpt, image_aspect_ratio="anyres", image_grid_pinpoints=[list(p) for p in ANYRES.pinpoints])
    loaded = load_multimodal(ckpt)
    assert loaded.vision_config.anyres == ANYRES and loaded.vision_config.image.aspect == "square"
    out = export_multimodal(ckpt, tmp_path / "export").out
    assert json.loads((out / "manifest.json").read_text())["extra"]["multimodal"]["vision_config"]["anyres"] == \
        ANYRES.to_dict()
    requests = assign_images(PROMPTS, photos()[:2])
    for seer in (None, SEER_ANY):
        options = ServiceOptions(generation=CONFIG, seer=SeerOptions(on=seer is not None, config=seer))
        runs = [Service(str(t), options) for t in (ckpt, out)]
        ids = [svc.prompt_ids(requests) for svc in runs]
        assert ids[0] == ids[1]
        want = [anyres_tokens(load_image(p).size, ANYRES, loaded.vision_config.pooled_side) for p in photos()[:2]]
        base = runs[0].info.images.id_base  # type: ignore[union-attr]
        assert [sum(t >= base for t in row) for row in ids[0]] == want and want[0] != want[1]
        answers = [[a.tokens for a in svc.generate(requests).answers] for svc in runs]
        assert answers[0] == answers[1]


def test_lavida_llada_loader_errors(tmp_path: Path) -> None:
    ckpt = write_lavida_llada(tmp_path / "ck")
    edit_config(ckpt, image_aspect_ratio="pad", mm_spatial_pool_stride="2")
    with pytest.raises(CheckpointError, match="LaViDa-LLaDA: config.json 'mm_spatial_pool_stride' is '2'"):
        load_multimodal(ckpt)
    edit_config(ckpt, mm_spatial_pool_stride=None, mm_spatial_pool_mode="nearest")
    with pytest.raises(CheckpointError, match="mm_spatial_pool_mode 'nearest' is not supported"):
        load_multimodal(ckpt)
    edit_config(ckpt, mm_spatial_pool_mode=None, mm_patch_merge_type="unpad")
    with pytest.raises(CheckpointError, match="LaViDa-LLaDA: mm_patch_merge_type 'unpad' is not one LaViDa runs"):
        load_multimodal(ckpt)
