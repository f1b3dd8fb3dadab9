"""Dimple with pictures, end to end, on a tiny checkpoint written from the public facts (tests/dimple_checkpoint.py):
the public names load; torch's answer to a prompt with two pictures is the one transformers' own parts give
(Qwen2.5-VL's processor and tower, Dimple's projector, the features scattered over <|image_pad|>, Qwen2-VL's
get_rope_index); bad pictures and prompts are refused in one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dimple_checkpoint import CONFIG, picture, qwen_rope_index, write_dimple
from PIL import Image
from public_facts import DIMPLE_PREPROCESSOR, DREAM_LAYER, DREAM_TOP
from safetensors import safe_open
from test_cli import run
from test_tensorrt_build import Handed, check_engine_dir, recording  # noqa: F401  (recording: a fixture)
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from seer_deploy.core.backend import StepInput
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.qwen_vision import DimpleVisionEncoder
from seer_deploy.models.pictures.qwen_layout import tower_inputs
from seer_deploy.seer.options import SeerOptions
from seer_deploy.service import Prompt, Service, ServiceOptions

IMAGE_PAD = CONFIG["image_token_id"]
PICTURES = [(100, 60), (60, 130)]  # two sizes and aspect ratios (resized to 112 x 56 and 56 x 140 px)


@pytest.fixture(scope="module")
def dimple(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]]:
    root = tmp_path_factory.mktemp("dimple")
    path, lm, vision = write_dimple(root)
    files = []
    for i, size in enumerate(PICTURES):
        picture(*size, seed=i).save(root / f"p{i}.png")
        files.append(str(root / f"p{i}.png"))
    return path, lm, vision, files


def test_the_checkpoint_holds_dimples_public_weight_names(dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder,
                                                                         list[str]]) -> None:
    path = dimple[0]
    with safe_open(path / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    tower = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**{
        k: v for k, v in CONFIG["vision_config"].items() if k != "model_type"}))
    visual = {f"visual.{n}" for n in tower.state_dict()}
    projector = {f"img_projector.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")}
    layers = {f"model.layers.{i}.{n}" for i in range(CONFIG["num_hidden_layers"]) for n in DREAM_LAYER}
    assert names == visual | projector | DREAM_TOP | layers


def test_torch_answers_two_pictures_as_transformers_parts_assembled(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]]) -> None:
    """Step zero of `seer-deploy generate CHECKPOINT` (the service on torch) on text, picture, text, picture equals
    the language model run on what Qwen2.5-VL's and Dimple's own code would feed it."""
    path, lm, vision, files = dimple
    service = Service(str(path), ServiceOptions(generation=GenerationConfig(gen_length=8, steps=8)))
    prompt = Prompt("hello <image> what is <image> the answer", tuple(files))
    (ids,) = service.prompt_ids([prompt])
    seq = np.array([ids + [lm.cfg.mask_id] * 8])
    got = service.backend.step0(StepInput(seq))

    id_base = lm.cfg.n_embed_rows
    qwen_ids = torch.from_numpy(np.where(seq >= id_base, IMAGE_PAD, seq))
    processor = Qwen2VLImageProcessorPil(**{k: v for k, v in DIMPLE_PREPROCESSOR.items() if "class" not in k
                                            and "type" not in k})
    batch = processor(images=[Image.open(f) for f in files], return_tensors="pt")
    tower = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**{
        k: v for k, v in CONFIG["vision_config"].items() if k != "model_type"})).eval()
    tower.load_state_dict({k.removeprefix("visual."): v for k, v in vision.state_dict().items()
                           if k.startswith("visual.")})
    with torch.no_grad():
        features = tower(batch["pixel_values"], batch["image_grid_thw"]).pooler_output
        p = vision.img_projector
        projected = p.linear_2(torch.nn.functional.silu(p.linear_1(features)))
        embeds = lm.embed(torch.where(qwen_ids == IMAGE_PAD, 0, qwen_ids))
        embeds = embeds.masked_scatter((qwen_ids == IMAGE_PAD)[..., None].expand_as(embeds), projected)
        positions = qwen_rope_index(qwen_ids, batch["image_grid_thw"].tolist())
        logits = lm(inputs_embeds=embeds, position_ids=positions).logits
    assert int((seq >= id_base).sum()) == len(projected)  # every feature has its placeholder
    np.testing.assert_array_equal(got.token_ids[0], logits.argmax(-1)[0].numpy())
    np.testing.assert_allclose(got.confidence[0], torch.log_softmax(logits.float(), -1).max(-1).values[0].numpy(),
                               atol=1e-4)
    flat = lm(torch.from_numpy(np.where(seq >= id_base, 0, seq))).logits  # without the pictures: other answers
    assert not torch.equal(flat.argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize(("size", "prompt", "named"), [
    ((20, 90), "<image> what", "at least 28 px a side"),
    ((28, 3000), "<image> what", "more than max_pixels"),
    ((64, 64), "<image> <image> what", "2 <image> placeholder(s) but 1 image(s)"),
    ((64, 64), "<image> <video> what", "videos are not run"),
])
def test_bad_pictures_and_prompts_exit_2_in_one_line(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]], tmp_path: Path, size: tuple[int, int],
        prompt: str, named: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = dimple[0]
    file = tmp_path / "bad.png"
    picture(*size).save(file)
    code, out, err = run(["generate", str(path), "-p", prompt, "--image", str(file), "--gen-length", "8"], capsys)
    assert code == 2 and out == "" and named in err and len(err.strip().splitlines()) == 1, err


def test_a_text_prompt_runs_as_dreams_language_model(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["generate", str(dimple[0]), "-p", "hello world", "--gen-length", "8", "--no-seer"], capsys)
    assert code == 0 and out.startswith("hello world -> "), err


# ---------------------------------------------------------------- the export: vision.onnx and M-RoPE step graphs


@pytest.fixture(scope="module")
def dimple_export(dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]],
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    from seer_deploy.export.dimple import prepare_dimple

    return prepare_dimple(dimple[0], tmp_path_factory.mktemp("dimple-export") / "onnx").start().out


def requests(files: list[str], large: str) -> list[Prompt]:
    """Rows of different picture counts and sizes: two pictures, one large one, none."""
    return [Prompt("hello <image> what is <image> the answer", (files[0], files[1])),
            Prompt("<image> hello world", (large,)), Prompt("what is the answer")]


def test_the_export_declares_the_vision_graph_and_positions(dimple_export: Path) -> None:
    from seer_deploy.contracts.export_manifest import ExportManifest
    from seer_deploy.contracts.graphs import QWEN_VISION

    manifest = ExportManifest.load(dimple_export)
    section = manifest.extra["multimodal"]
    assert [name for name in section["vision"]["inputs"]] == QWEN_VISION.input_names
    assert section["vision"]["inputs"]["pixel_patches"]["shape"] == ["image_tokens", 4, 1176]
    assert list(manifest.graphs["step"].inputs)[-1] == "position_ids"
    assert manifest.graphs["step"].inputs["position_ids"].shape == [3, "batch", "seq"]


def test_onnx_runtime_encodes_pictures_of_every_size_as_torch(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]], dimple_export: Path,
        tmp_path: Path) -> None:
    from seer_deploy.runtime.openers import open_target

    large = tmp_path / "large.png"
    picture(300, 170, seed=5).save(large)
    sizes = [Image.open(f) for f in dimple[3]] + [Image.open(large)]
    (torch_backend, info), (ort_backend, _) = open_target(str(dimple[0])), open_target(str(dimple_export))
    assert info.images is not None and info.images.qwen is not None
    for call in ([sizes[0]], [sizes[2]], sizes):
        want, _ = info.images.qwen.encode(torch_backend.encode_patches, call)  # type: ignore[attr-defined]
        got, _ = info.images.qwen.encode(ort_backend.encode_patches, call)  # type: ignore[attr-defined]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-4 * float(np.abs(w).max()))


@pytest.mark.parametrize("seer", [False, True])
def test_onnx_runtime_answers_as_torch_with_pictures_seer_on_and_off(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]], dimple_export: Path, tmp_path: Path,
        seer: bool) -> None:
    """Three rows of a batch with two, one and no pictures of different sizes (the hybrid batcher's groups when
    Seer cuts them differently): the same tokens and the same cuts on torch and on ONNX Runtime."""
    from seer_deploy.seer.config import SeerConfig

    large = tmp_path / "large.png"
    picture(300, 170, seed=5).save(large)
    options = ServiceOptions(generation=GenerationConfig(gen_length=16, steps=16), batch_size=3,
                             seer=SeerOptions(on=seer, config=SeerConfig(detector="eos", eos_floor=0.0) if seer else None))
    from seer_deploy.service import generate

    runs = [generate(requests(dimple[3], str(large)), target, options) for target in (str(dimple[0]),
                                                                                        str(dimple_export))]
    assert [a.tokens for a in runs[0].answers] == [a.tokens for a in runs[1].answers]
    if seer:
        kept = [[a.seer.kept for a in run.answers if a.seer is not None] for run in runs]
        assert kept[0] == kept[1] and len(kept[0]) == 3


def test_forced_cuts_give_the_same_tokens_on_torch_and_onnx_runtime(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]], dimple_export: Path,
        tmp_path: Path) -> None:
    """Kept lengths forced per row (rows of different picture counts cut to 5, 16 and 9): each row's tokens equal on
    both backends, and the cut tail is EOS."""
    from seer_deploy.runtime.loop import run_generation

    large = tmp_path / "large.png"
    picture(300, 170, seed=5).save(large)
    config = GenerationConfig(gen_length=16, steps=16)
    results = []
    for target in (str(dimple[0]), str(dimple_export)):
        service = Service(target, ServiceOptions(generation=config))
        ids = service.prompt_ids(requests(dimple[3], str(large)))
        info = service.info
        special = SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id)
        results.append(run_generation(service.backend, ids, config, special, kept_lengths=[5, 16, 9]))
    np.testing.assert_array_equal(results[0].tokens, results[1].tokens)
    assert (results[0].tokens[0, 5:] == dimple[1].cfg.eos_id).all()


def test_tensorrt_rtx_builds_dimples_vision_graph_with_profiles_over_the_image_tokens(
        dimple_export: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The vision graph's one dynamic axis (image tokens = patches / 4) gets a profile from 1 to what a batch's
    pictures can hold at max_pixels; the step graph's profiles carry position_ids [3, batch, seq]."""
    from seer_deploy.engines.build import BuildOptions, prepare_build

    built: Handed = request.getfixturevalue("recording")  # TensorRT-RTX's builder, recording what it is handed
    options = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx", buckets=(16,), max_batch=2,
                           max_pictures=2, compute_capabilities=("8.9",))
    engine = prepare_build(dimple_export, tmp_path / "engine", options).start().out
    manifest = check_engine_dir(dimple_export, engine, options, built)
    trt = manifest.tensorrt
    assert trt is not None and trt.images is not None and "vision" in manifest.files
    most = DIMPLE_PREPROCESSOR["max_pixels"] // 28**2  # a picture's most image tokens
    assert trt.images.image_tokens == min(2 * most, manifest.max_batch * manifest.max_prompt)
    (vision,) = trt.profiles["vision"]
    assert vision["shapes"]["pixel_patches"]["min"] == [1, 4, 1176]
    assert vision["shapes"]["pixel_patches"]["max"] == [trt.images.image_tokens, 4, 1176]
    (step,) = trt.profiles["step"]
    assert step["shapes"]["position_ids"]["max"] == [3, 2, manifest.max_prompt + 16]


def test_the_exports_checks_refuse_a_wrong_picture_order_and_wrong_positions(
        dimple: tuple[Path, MaskPredictor, DimpleVisionEncoder, list[str]], dimple_export: Path) -> None:
    """What the export's validation compares can fail: vision.onnx's output with the window order not undone is
    refused by the vision check, and the step graph fed 1-D positions (no picture layout) answers otherwise."""
    from seer_deploy.engines.ort_multimodal import DimpleOrtBackend
    from seer_deploy.export.multimodal import vision_diff
    from seer_deploy.export.validate import ExportValidationError
    from seer_deploy.runtime.openers import open_target

    (torch_backend, info), (ort, _) = open_target(str(dimple[0])), open_target(str(dimple_export))
    assert isinstance(ort, DimpleOrtBackend) and info.images is not None and info.images.qwen is not None
    qwen = info.images.qwen
    pictures = [Image.open(f) for f in dimple[3]] + [picture(300, 170, seed=5)]  # the last: 3 x 5 tokens, 2 windows
    made = [qwen.picture.patches(p) for p in pictures]
    feed = tower_inputs([m[0] for m in made], [m[1] for m in made], qwen.geometry)
    want = torch_backend.encode_patches(feed)  # type: ignore[attr-defined]
    assert vision_diff(ort.encode_patches(feed), want, "fp32") < 1e-4
    with pytest.raises(ExportValidationError, match="disagrees with torch"):
        vision_diff(ort.encode_patches({**feed, "restore_order": np.arange(len(feed["restore_order"]))}), want, "fp32")

    service = Service(str(dimple_export), ServiceOptions(generation=GenerationConfig(gen_length=8, steps=8)))
    (ids,) = service.prompt_ids([Prompt("hello <image> what is <image> the answer", tuple(dimple[3]))])
    step = StepInput(np.array([ids + [dimple[1].cfg.mask_id] * 8]))
    placed = service.backend.step0(step).confidence
    backend = service.backend
    assert isinstance(backend, DimpleOrtBackend)
    embeds, _ = qwen.encode(backend.encode_patches, pictures[:2])  # the prompt's two
    backend.set_image_table(embeds)  # no layout: each image token advances one position, as text
    assert not np.allclose(backend.step0(step).confidence, placed)
