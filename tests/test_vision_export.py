"""Multimodal export: vision.onnx + image-aware step graphs, validated and run by ONNX Runtime, equal to torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import onnx_interface
from test_multimodal import pictures, write_tiny_vl

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import VISION, Size, export_graphs
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.multimodal import load_multimodal
from seer_deploy.models.networks.image_prompts import ImageConditionedModel, image_table
from seer_deploy.models.pictures.image import pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vl-export")
    ckpt, _, _ = write_tiny_vl(root / "tiny-vl", seed=1)
    result = export_multimodal(ckpt, root / "export")
    return ckpt, result.out


def test_export_writes_two_graphs_and_a_manifest(exported) -> None:
    ckpt, out = exported
    files = {"vision.onnx", "step.onnx", "weights.bin", "manifest.json", "tokenizer.json"}
    assert {p.name for p in out.iterdir()} == files | {".seer-deploy.json"}
    assert json.loads((out / ".seer-deploy.json").read_text())["files"] == sorted(files)
    manifest = json.loads((out / "manifest.json").read_text())
    section = manifest["extra"][MULTIMODAL_KEY]
    assert section["vision"]["inputs"]["pixel_values"]["shape"][1:] == [3, 16, 16]
    assert section["vision"]["outputs"]["image_embeds"]["shape"][1:] == [17, 32]  # 16 patches + image_newline
    assert manifest["graphs"]["step"]["inputs"]["image_table"]["shape"][1] == 32
    assert section["image_id_base"] == load_multimodal(ckpt).config.n_embed_rows
    assert manifest["extra"]["validation"]["verified"]
    diffs = manifest["extra"]["validation"]["max_diff"]
    assert diffs["vision"] < 1e-4 and diffs["step0 confidence"] < 1e-4


def test_the_graphs_are_what_spec_graphs_declares(exported) -> None:
    """vision.onnx and the image-aware step graphs have the declared inputs, outputs, dtypes and dynamic axes."""
    _, out = exported
    m = ExportManifest.load(out)
    vision_config = m.extra[MULTIMODAL_KEY]["vision_config"]
    sizes = {
        Size.STAT_ROWS: len(m.seer.sparsity_rows),
        Size.D_MODEL: m.model_config().d_model,
        Size.IMAGE_SIZE: vision_config["image"]["image_size"],
        Size.TOKENS_PER_IMAGE: vision_config["tokens_per_image"],
    }
    files = {graph.name: m.graphs[graph.name].file for graph in export_graphs(multimodal=True)}
    files[VISION.name] = m.extra[MULTIMODAL_KEY]["vision"]["file"]
    for graph in (VISION, *export_graphs(multimodal=True)):
        assert files[graph.name] == graph.file
        assert onnx_interface(out / graph.file) == graph.interface(sizes)


def test_ort_runtime_tokens_equal_torch(exported) -> None:
    ckpt, out = exported
    loaded = load_multimodal(ckpt)
    vcfg, cfg = loaded.vision_config, loaded.config
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    texts = ["<image> colors", "<image> describe", "<image> <image> count"]
    ids = expand_placeholders([tok.encode_prompt(t) for t in texts], [1, 1, 2], vcfg.tokens_per_image,
                              vcfg.image_token_index, cfg.n_embed_rows)
    px = pixel_batch(pictures(4), vcfg.image)
    backend = MultimodalOrtBackend(out)
    embeds = backend.encode_images(px)
    with torch.no_grad():
        want = loaded.vision(torch.from_numpy(px)).numpy()
    assert np.allclose(embeds, want, atol=1e-5)
    backend.set_image_table([embeds])
    config = GenerationConfig(gen_length=12, steps=12)
    pad = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    ort_tokens = run_generation(backend, ids, config, ids=SpecialIds(mask=cfg.mask_id, pad=pad)).tokens
    model = ImageConditionedModel(loaded.lm.model, image_table([torch.from_numpy(embeds)], cfg.d_model))
    ref = generate(model, ids, config).tokens.numpy()
    torch_backend = run_generation(TorchBackend(model), ids, config, ids=SpecialIds(mask=cfg.mask_id, pad=pad)).tokens
    assert np.array_equal(ort_tokens, ref)
    assert np.array_equal(torch_backend, ref)
    # Truncated runs regroup the rows by kept length; each row still reads its own images.
    kept = [4, 12, 8]
    ort_cut = run_generation(backend, ids, config, ids=SpecialIds(mask=cfg.mask_id, pad=pad, eos=cfg.eos_id), kept_lengths=kept)
    ref_cut = generate(model, ids, config, kept_lengths=kept).tokens.numpy()
    assert np.array_equal(ort_cut.tokens, ref_cut)
    assert [r.kept for r in ort_cut.seer or []] == kept


def test_ort_backend_refuses_ids_past_its_table(exported) -> None:
    _, out = exported
    backend = MultimodalOrtBackend(out)
    base = backend.image_id_base
    with pytest.raises(ConfigError, match="image table has 1 rows; call set_image_table"):
        backend.step0(StepInput(np.array([[0, base + 3, 4]]), None))
    with pytest.raises(ConfigError, match=r"pixel_values must be \[N, 3, 16, 16\]"):
        backend.encode_images(np.zeros((1, 3, 8, 8), np.float32))


def test_text_export_is_not_a_multimodal_one(exported, tmp_path: Path) -> None:
    _, out = exported
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["extra"][MULTIMODAL_KEY]
    copy = tmp_path / "text-only"
    copy.mkdir()
    for p in out.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="text-only export"):
        MultimodalOrtBackend(copy)


def test_export_refuses_a_too_short_max_seq_len(exported, tmp_path: Path) -> None:
    ckpt, _ = exported
    with pytest.raises(ConfigError, match="cannot hold one image"):
        export_multimodal(ckpt, tmp_path / "short", ExportOptions(max_seq_len=10))
    assert not (tmp_path / "short").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["vision"].update(file="../vision.onnx"), r"extra.multimodal.vision.file '../vision.onnx'.*outside"),
        (lambda s: s.update(image_id_base=3), "'extra.multimodal.image_id_base' is 3"),
        (lambda s: s["vision_config"].update(tokens_per_image=0), "tokens_per_image' is 0"),
        (lambda s: s["vision_config"].update(image_token_index=5), "image_token_index' is 5"),
        (lambda s: s["vision_config"]["image"].update(mean=[1]), "image_mean"),
        (lambda s: s["vision_config"]["image"].update(image_size="big"), "image_size' must be an integer"),
        (lambda s: s.pop("vision_config"), "vision_config' is missing"),
    ],
)
def test_a_damaged_multimodal_section_is_refused_on_load(exported, tmp_path: Path, change, message: str) -> None:
    """The values the ONNX Runtime backend and the image pipeline read from the section are checked when the
    manifest loads, so a damaged one is one ArtifactError, not a crash later."""
    _, out = exported
    manifest = json.loads((out / "manifest.json").read_text())
    change(manifest["extra"][MULTIMODAL_KEY])
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=message):
        ExportManifest.load(tmp_path)
