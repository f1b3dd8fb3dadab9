"""`calibrate` on prompts with pictures: demo-vl and a LLaDA-V-layout directory, and bad input (seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_multimodal import write_tiny_vl
from test_seer_cli import run

from seer_deploy.calibration.collect import full_generation
from seer_deploy.calibration.prompt_set import prepare_prompts
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.multimodal import load_multimodal
from seer_deploy.models.demos.demo_vl_tasks import heldout_examples
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.pictures.image import pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.models.prompts.prompt import Prompt, read_prompts_file
from seer_deploy.seer.config import SeerConfig

CONFIG = GenerationConfig(gen_length=12, steps=12)


def write_prompts(directory: Path, n: int) -> Path:
    """n held-out demo-vl pictures as PNGs in `directory/pictures`, and a prompts file naming them relatively."""
    (directory / "pictures").mkdir(parents=True)
    lines = []
    for i, ex in enumerate(heldout_examples(n)):
        ex.image().save(directory / "pictures" / f"{i}.png")
        lines.append(json.dumps({"prompt": ex.prompt, "image": f"pictures/{i}.png"}))
    file = directory / "prompts.jsonl"
    file.write_text("\n".join(lines) + "\n")
    return file


def test_calibrate_demo_vl_on_pictures(tmp_path: Path, capsys) -> None:
    prompts = write_prompts(tmp_path / "set", 8)
    out = tmp_path / "seer.json"
    code, stdout, err = run(["calibrate", "demo-vl", "--prompts", str(prompts), "--out", str(out), "--gen-length", "12",
                             "--target-safe", "0.9", "--target-identical", "0.9", "--identity-margin-span", "2"], capsys)
    assert code == 0, err
    assert "8 prompts, 8 pictures" in stdout and "end to end" in stdout
    cfg = SeerConfig.load(out)
    record = cfg.calibration
    assert record["n_images"] == 8 and record["n_calibration"] + record["n_validation"] == 8
    assert set(record["detectors"]) == {"eos", "sparsity", "fused"} and record["gen_length"] == 12
    assert cfg.margin == record["identity_margin"]["margin"] and cfg.trends[0].gen_length == 12


def test_one_image_table_serves_every_prompt_as_its_own_picture_would(tmp_path: Path) -> None:
    """The calibration model holds every picture of the set; each prompt's answer is the one its picture alone gives."""
    prompts = read_prompts_file(write_prompts(tmp_path, 4))
    prepared = prepare_prompts("demo-vl", prompts, CONFIG, batch_size=3)  # the tower encodes 3, then 1
    assert prepared.n_images == 4 and isinstance(prepared.model, ImageConditionedModel)
    together = full_generation(prepared.model, prepared.ids, CONFIG, batch_size=4)

    loaded = load_multimodal("demo-vl")
    vcfg, cfg = loaded.vision_config, loaded.config
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    for i, (prompt, ex) in enumerate(zip(prompts, heldout_examples(4), strict=True)):
        ids = expand_placeholders([tok.encode_prompt(prompt.prompt)], [1], vcfg.tokens_per_image,
                                  vcfg.image_token_index, cfg.n_embed_rows)
        with torch.no_grad():
            table = loaded.vision(torch.from_numpy(pixel_batch([ex.image()], vcfg.image))).reshape(-1, cfg.d_model)
        alone = full_generation(ImageConditionedModel(loaded.lm.model, table), ids, CONFIG)
        np.testing.assert_array_equal(together[i], alone[0])


def test_a_llada_v_directory_takes_a_list_of_pictures_per_prompt(tmp_path: Path, capsys) -> None:
    ckpt, _, _ = write_tiny_vl(tmp_path / "tiny-vl")
    pictures = [ex.image() for ex in heldout_examples(3)]
    for i, picture in enumerate(pictures):
        picture.save(tmp_path / f"{i}.png")
    lines = [{"prompt": "<image> <image> colors", "image": ["0.png", str(tmp_path / "1.png")]},
             {"prompt": "<image> count", "image": "2.png"}, {"prompt": "shapes"}, {"prompt": "<image> describe",
             "image": ["1.png"]}]
    file = tmp_path / "prompts.jsonl"
    file.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    prompts = read_prompts_file(file)
    assert [len(p.images) for p in prompts] == [2, 1, 0, 1] and prompts[0].images[0] == tmp_path / "0.png"
    out = tmp_path / "seer.json"
    code, stdout, err = run(["calibrate", str(ckpt), "--prompts", str(file), "--out", str(out), "--gen-length", "8",
                             "--target-safe", "0.9", "--batch-size", "2"], capsys)
    assert code == 0, err
    assert SeerConfig.load(out).calibration["n_images"] == 4 and "4 prompts, 4 pictures" in stdout

    # The same pictures given in memory (as scripts/train_demo_vl.py gives them) make the same ids and image table.
    in_memory = [Prompt(p.prompt, tuple(pictures[int(Path(s).stem)] for s in p.images)) for p in prompts]
    from_files, from_memory = (prepare_prompts(str(ckpt), given, CONFIG) for given in (prompts, in_memory))
    assert from_files.ids == from_memory.ids
    assert isinstance(from_files.model, ImageConditionedModel) and isinstance(from_memory.model, ImageConditionedModel)
    torch.testing.assert_close(from_files.model.image_table, from_memory.model.image_table)
    assert from_files.model.image_table.shape[0] == 4 * load_multimodal(ckpt).vision_config.tokens_per_image


@pytest.mark.parametrize("target, line, message", [
    ("demo", {"prompt": "sort 31", "image": "pictures/0.png"}, "is a text model"),
    ("demo-vl", {"prompt": "<image> colors", "image": "pictures/missing.png"}, "missing.png' does not exist"),
    ("demo-vl", {"prompt": "<image> colors"}, "1 <image> placeholder(s) but 0 image(s)"),
    ("demo-vl", {"prompt": "<image> colors", "image": ["pictures/0.png", "pictures/1.png"]},
     "1 <image> placeholder(s) but 2 image(s)"),
    ("demo-vl", {"prompt": "colors", "image": 3}, "'image' must be a path or a list of paths"),
    ("demo-vl", {"image": "pictures/0.png"}, "expected {\"prompt\""),
    ("demo-vl", {"prompt": "<|mdm_mask|> colors"}, "special-token text cannot be typed"),
])
def test_bad_image_prompts_fail_in_one_line_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, target: str, line: dict[str, object], message: str
) -> None:
    from seer_deploy.calibration import prompt_set

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(prompt_set, "load_multimodal", no_model)
    monkeypatch.setattr(prompt_set, "load_checkpoint", no_model)
    file = write_prompts(tmp_path, 4)
    file.write_text(json.dumps(line) + "\n" + file.read_text())  # the bad prompt first, then 4 good ones
    code, _, err = run(["calibrate", target, "--prompts", str(file), "--out", str(tmp_path / "seer.json")], capsys)
    assert code == 2 and message in err and "prompts.jsonl:1" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "seer.json").exists()


def test_image_prompts_are_checked_against_the_model_length() -> None:
    prompts = [Prompt("<image> colors", (heldout_examples(1)[0].image(),))]
    with pytest.raises(ConfigError, match="exceeds"):
        prepare_prompts("demo-vl", prompts, GenerationConfig(gen_length=90, steps=90))
