"""Generation with images through the service and the CLI: torch checkpoints, ORT exports, and the bad-input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_multimodal import pictures, write_tiny_vl

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.models.checkpoints.multimodal import load_multimodal
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.pictures.image import load_image, pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.models.prompts.prompt import assign_images
from seer_deploy.runtime.reference import generate
from seer_deploy.service import Prompt, Run, SeerOptions, ServiceOptions
from seer_deploy.service import generate as serve

CONFIG = GenerationConfig(gen_length=8, steps=8)


def generate_vl(target: str, texts: list[str], images: list[str], config: GenerationConfig) -> Run:
    """The service, as `seer-deploy generate TARGET --image ... --no-seer` calls it."""
    return serve(assign_images(texts, images), target, ServiceOptions(generation=config, seer=SeerOptions(on=False)))


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    out = []
    for i, img in enumerate(pictures(3)):
        file = tmp_path / f"pic{i}.png"
        img.save(file)
        out.append(str(file))
    return out


def test_images_go_to_placeholders_in_order() -> None:
    requests = assign_images(["<image> a", "b", "<image> <image> c"], ["x", "y", "z"])
    assert requests == [Prompt("<image> a", ("x",)), Prompt("b"), Prompt("<image> <image> c", ("y", "z"))]
    with pytest.raises(ConfigError, match=r"hold 0 <image> placeholder\(s\) but 1 image.*put '<image>' in the prompt"):
        assign_images(["colors"], ["x"])
    with pytest.raises(ConfigError, match=r"hold 1 <image> placeholder\(s\) but 2 image.*drop the extra --image"):
        assign_images(["<image> colors"], ["x", "y"])
    with pytest.raises(ConfigError, match=r"hold 2 <image> placeholder\(s\) but 1 image.*one --image per '<image>'"):
        assign_images(["<image> <image> colors"], ["x"])


def torch_reference(ckpt: Path, texts: list[str], images: list[Path | str], config: GenerationConfig
                    ) -> list[list[int]]:
    """The oracle for prompts with one picture each: the checkpoint's tower, then LLaDA's loop in torch."""
    loaded = load_multimodal(ckpt)
    vcfg, cfg = loaded.vision_config, loaded.config
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    ids = expand_placeholders([tok.encode_prompt(t) for t in texts], [1] * len(texts), vcfg.tokens_per_image,
                              vcfg.image_token_index, cfg.n_embed_rows)
    pixels = pixel_batch([load_image(i) for i in images], vcfg.image)
    with torch.no_grad():
        table = loaded.vision(torch.from_numpy(pixels)).reshape(-1, cfg.d_model)
    return generate(ImageConditionedModel(loaded.lm.model, table), ids, config).tokens.tolist()


def test_generate_vl_torch_matches_the_reference_loop(tmp_path: Path, images: list[str]) -> None:
    ckpt, _, _ = write_tiny_vl(tmp_path / "ck")
    run = generate_vl(str(ckpt), ["<image> colors", "<image> count"], images[:2], CONFIG)
    want = torch_reference(ckpt, ["<image> colors", "<image> count"], images[:2], CONFIG)
    assert [a.tokens for a in run.answers] == want
    assert run.backend == "torch" and run.answers[0].request.images == (images[0],)


def test_generate_vl_on_an_export_equals_torch(tmp_path: Path, images: list[str]) -> None:
    ckpt, _, _ = write_tiny_vl(tmp_path / "ck", seed=2)
    out = export_multimodal(ckpt, tmp_path / "export").out
    texts = ["<image> describe", "<image> shapes"]
    ort = generate_vl(str(out), texts, images[1:], CONFIG)
    ref = generate_vl(str(ckpt), texts, images[1:], CONFIG)
    assert ort.backend.startswith("onnxruntime")
    assert [a.tokens for a in ort.answers] == [a.tokens for a in ref.answers]


def test_json_output_and_bad_images(tmp_path: Path, images: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    ckpt, _, _ = write_tiny_vl(tmp_path / "ck")
    assert _cli(["generate", str(ckpt), "-p", "<image> colors", "--image", images[0], "--gen-length", "8", "--json",
                 "--no-seer"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt"] == "<image> colors" and record["images"] == images[:1] and len(record["tokens"]) == 8
    with pytest.raises(ConfigError, match="does not exist"):
        generate_vl(str(ckpt), ["<image> colors"], [str(tmp_path / "missing.png")], CONFIG)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(ConfigError, match="not a readable image"):
        generate_vl(str(ckpt), ["<image> colors"], [str(tmp_path / "bad.png")], CONFIG)
    with pytest.raises(ConfigError, match=r"1 <image> placeholder\(s\) but 2 image"):
        generate_vl(str(ckpt), ["<image> colors"], images[:2], CONFIG)


def _cli(argv: list[str]) -> int:
    from seer_deploy.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_export_command_writes_the_vision_graph_and_its_engine_dir_answers_like_torch(
    tmp_path: Path, images: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`seer-deploy export` on a LLaDA-V-layout checkpoint takes the multimodal exporter (vision.onnx included), and
    an ONNX Runtime engine dir built from it is a valid TARGET for generation with images."""
    ckpt, _, _ = write_tiny_vl(tmp_path / "ck", seed=3)
    out = tmp_path / "export"
    assert _cli(["export", str(ckpt), "--out", str(out), "--build", "ort"]) == 0
    assert "vision.onnx" in capsys.readouterr().out
    assert {"vision.onnx", "step.onnx"} <= {p.name for p in out.iterdir()}
    texts = ["<image> describe", "<image> count"]
    engine = generate_vl(str(out / "engine"), texts, images[:2], CONFIG)
    ref = generate_vl(str(ckpt), texts, images[:2], CONFIG)
    assert engine.backend.startswith("onnxruntime")
    assert [a.tokens for a in engine.answers] == [a.tokens for a in ref.answers]


def test_tensorrt_build_of_a_multimodal_checkpoint_is_refused_before_exporting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, _, _ = write_tiny_vl(tmp_path / "ck")
    assert _cli(["export", str(ckpt), "--out", str(tmp_path / "export"), "--build", "tensorrt"]) == 2
    err = capsys.readouterr().err
    assert "multimodal checkpoint" in err and "--build ort" in err
    assert not (tmp_path / "export").exists()
