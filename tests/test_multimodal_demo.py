"""The bundled demo-vl checkpoint: held-out accuracy, Seer's safe / identical rates, ONNX Runtime parity, the demo.

Skipped until scripts/train_demo_vl.py has written seer_deploy/models/demos/demo_vl/.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from seer_deploy.cli.demo import run_multimodal_demo
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
from seer_deploy.models.checkpoints.multimodal import LoadedMultimodal, load_multimodal
from seer_deploy.models.checkpoints.multimodal_files import DEMO_VL_DIR
from seer_deploy.models.demos.demo_vl_tasks import PictureExample, heldout_examples
from seer_deploy.models.networks.image_prompts import ImageConditionedModel, image_table
from seer_deploy.models.pictures.image import pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.targets import checkpoint_seer
from seer_deploy.seer.metrics import true_lengths

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (DEMO_VL_DIR / "model.safetensors").is_file(), reason="demo-vl has not been trained yet"),
]
GEN = GenerationConfig(gen_length=64, steps=64)


@pytest.fixture(scope="module")
def demo() -> LoadedMultimodal:
    return load_multimodal("demo-vl")


def _inputs(demo: LoadedMultimodal, examples: list[PictureExample]) -> tuple[list[list[int]], np.ndarray]:
    vcfg, cfg = demo.vision_config, demo.config
    tok = MultimodalTokenizer.for_checkpoint(demo)
    prompts = expand_placeholders([tok.encode_prompt(e.prompt) for e in examples], [1] * len(examples),
                                  vcfg.tokens_per_image, vcfg.image_token_index, cfg.n_embed_rows)
    return prompts, pixel_batch([e.image() for e in examples], vcfg.image)


def _answers(demo: LoadedMultimodal, tokens: np.ndarray) -> list[str]:
    tok = MultimodalTokenizer.for_checkpoint(demo)
    return [tok.decode_answer(row.tolist()) for row in tokens]


def test_demo_vl_is_small_and_in_the_llada_v_layout() -> None:
    size = sum(p.stat().st_size for p in DEMO_VL_DIR.iterdir())
    assert size <= 20 * 2**20
    assert (DEMO_VL_DIR / "seer.json").is_file() and checkpoint_seer("demo-vl") is not None


HELD_OUT = 200  # measured on 400 and on these 200 (2026-12-07): exact match, Seer's safe cut and identity all 1.0


def test_held_out_exact_match_and_seer_rates(demo: LoadedMultimodal) -> None:
    examples = heldout_examples(HELD_OUT)
    prompts, px = _inputs(demo, examples)
    with torch.no_grad():
        table = demo.vision(torch.from_numpy(px)).reshape(-1, demo.config.d_model)
    model = ImageConditionedModel(demo.lm.model, table)
    full = generate(model, prompts, GEN)
    exact = np.mean([a == e.answer for a, e in zip(_answers(demo, full.tokens.numpy()), examples, strict=True)])
    assert exact >= 0.95
    seer = checkpoint_seer("demo-vl")
    assert seer is not None
    cut = generate(model, prompts, GEN, seer=seer)
    full_tokens, cut_tokens = full.tokens.numpy(), cut.tokens.numpy()
    true_len = true_lengths(full_tokens, {demo.config.eos_id})
    kept = np.array([r.kept for r in cut.seer or []])
    safe = float(np.mean(kept >= true_len))
    upto = np.minimum(true_len + 1, GEN.gen_length)
    identical = np.mean([np.array_equal(cut_tokens[i, : upto[i]], full_tokens[i, : upto[i]])
                         for i in range(HELD_OUT)])
    assert safe >= 0.995 and identical >= 0.99
    assert cut.tokens_processed < 0.6 * full.tokens_processed  # the cut is real, not a no-op


def test_onnx_runtime_equals_torch_on_100_pictures_seer_on_and_off(demo: LoadedMultimodal,
                                                                    shared_demo_export: Callable[[str], Path]) -> None:
    out = shared_demo_export("demo-vl")
    examples = heldout_examples(100)
    prompts, px = _inputs(demo, examples)
    backend = MultimodalOrtBackend(out)
    embeds = backend.encode_images(px)
    backend.set_image_table([embeds])
    with torch.no_grad():  # end to end: torch's own image embeddings on the torch side
        model = ImageConditionedModel(demo.lm.model, image_table([demo.vision(torch.from_numpy(px))], demo.config.d_model))
    cfg = demo.config
    pad = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    seer = checkpoint_seer("demo-vl")
    for use in (None, seer):
        ort = run_generation(backend, prompts, GEN, ids=SpecialIds(mask=cfg.mask_id, pad=pad, eos=cfg.eos_id), seer=use)
        ref = generate(model, prompts, GEN, seer=use)
        same = [np.array_equal(a, b) for a, b in zip(ort.tokens, ref.tokens.numpy(), strict=True)]
        assert all(same), f"seer={use is not None}: {same.count(False)} of 100 differ"


def test_demo_command_function_answers_the_builtin_pictures(tmp_path: Path) -> None:
    lines: list[str] = []
    run = run_multimodal_demo(tmp_path, 64, 8, lines.append, lambda message: None)
    assert len(run.answers) == 8 and lines[0].startswith("demo-vl checkpoint:")
    assert sum("[ok]" in line for line in lines) >= 7
