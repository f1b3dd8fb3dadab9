"""The Dream family's decoding rules (core.decoding) give the tokens of the authors' published loops
(tests/rule_transcriptions.py) on tiny checkpoints of each family, in every loop: the runtime loop over torch with the
C core and the numpy twin, the torch reference loop, and ONNX Runtime (tests/test_decoding_rules_graphs.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rule_transcriptions as authors
import torch
from test_families_text import family_checkpoint

from seer_deploy.core.decoding import step_ratio, timesteps
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime import loopcore
from seer_deploy.runtime.loop import LoopOptions, run_generation
from seer_deploy.runtime.loopcore import LoopCore, c_core
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend

CORES = [pytest.param(loopcore, id="numpy")] + (
    [pytest.param(c_core(), id="c")] if c_core() is not None else [])
PROMPTS = [[10, 3, 5, 2, 17], [10, 8, 17, 4], [16, 12, 1, 2, 3, 4, 5, 6, 17]]
SCORES = ("maskgit_plus", "topk_margin", "entropy")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MaskPredictor]:
    root = tmp_path_factory.mktemp("rules")
    return {family: family_checkpoint(root / family, family, seed=seed)[0]
            for family, seed in (("dream", 0), ("dimple", 3))}


def run(model: MaskPredictor, prompt: list[int], config: GenerationConfig, core: LoopCore, seed: int = 0
        ) -> tuple[list[int], int]:
    cfg = model.cfg
    result = run_generation(TorchBackend(model), [prompt], config, SpecialIds(cfg.mask_id, cfg.pad_id), seed=seed,
                            options=LoopOptions(core=core))
    return result.tokens[0].tolist(), result.passes


def test_timesteps_are_torch_linspace_and_counts_the_authors_expression() -> None:
    for eps in (1e-3, 0.05, 0.5):
        for steps in (1, 2, 7, 8, 16, 64, 255, 512):
            expected = torch.linspace(1, eps, steps + 1)
            assert np.array_equal(timesteps(steps, eps), expected.numpy()), (steps, eps)
            for i in range(steps):
                for n in (0, 1, 7, 16, 100, 511):
                    authors_count = int(torch.tensor(float(n)) * (1 - expected[i + 1] / expected[i])) if (
                        i < steps - 1) else n
                    ratio = np.array([step_ratio(steps, eps, i)], np.float32)
                    assert loopcore.timestep_transfer(np.array([n]), ratio)[0] == authors_count


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("alg", SCORES)
@pytest.mark.parametrize("family", ["dream", "dimple"])
def test_dream_sampler_gives_the_authors_tokens(models: dict[str, MaskPredictor], family: str, alg: str,
                                                core: LoopCore) -> None:
    """Dream's diffusion_generate at temperature 0 (Dimple's evaluation runs it too: decoding_pipeline="dream"):
    steps = gen_length (the first step commits none), fewer steps, eps other than the default; the loop skips the
    passes that commit nothing, the authors run them."""
    model = models[family]
    for prompt, (gen_length, steps, eps) in zip(PROMPTS, [(16, 16, 1e-3), (16, 5, 1e-3), (12, 7, 0.2)], strict=True):
        expected, committed = authors.dream(model, prompt, gen_length, steps, alg, eps=eps)
        config = GenerationConfig(gen_length=gen_length, steps=steps, decode="timesteps", remasking=alg, eps=eps)
        tokens, passes = run(model, prompt, config, core)
        assert tokens == expected
        assert passes == 1 + sum(1 for n in committed[1:] if n > 0)  # step zero always runs (Seer reads it)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("alg", ["origin", "maskgit_plus", "entropy"])
def test_dream_random_rules_draw_as_the_authors(models: dict[str, MaskPredictor], alg: str, core: LoopCore) -> None:
    """origin's per-mask coin and alg_temp's draws, from the same generator as the transcription."""
    model = models["dream"]
    alg_temp = 0.0 if alg == "origin" else 0.5
    for seed, prompt in enumerate(PROMPTS):
        expected, _ = authors.dream(model, prompt, 16, 8, alg, alg_temp=alg_temp, seed=seed)
        config = GenerationConfig(gen_length=16, steps=8, decode="timesteps", remasking=alg, alg_temp=alg_temp)
        assert run(model, prompt, config, core, seed=seed)[0] == expected


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("alg", [*SCORES, "origin"])
def test_dimple_confident_decoding_gives_the_authors_tokens_and_passes(models: dict[str, MaskPredictor], alg: str,
                                                                        core: LoopCore) -> None:
    """Every mask above the threshold, else the re-anchored schedule (at least one), all at the last step; the
    loop stops when no mask is left. Thresholds that commit in some passes and fall back in others."""
    model = models["dimple"]
    threshold = {"maskgit_plus": 0.9, "origin": 0.9, "topk_margin": 0.8, "entropy": 0.5}[alg]
    if alg == "entropy":
        threshold = 0.05  # negative entropy is <= 0: nothing passes, every pass falls back
    for seed, prompt in enumerate(PROMPTS):
        for steps in (16, 6):
            expected, passes = authors.dimple(model, prompt, 16, steps, alg, threshold, seed=seed)
            config = GenerationConfig(gen_length=16, steps=steps, decode="confident", remasking=alg,
                                      threshold=threshold)
            assert run(model, prompt, config, core, seed=seed) == (expected, passes)


def test_dimple_confident_decoding_stops_early_on_a_confident_model(models: dict[str, MaskPredictor]) -> None:
    """On demo-style prompts (digits and a task word) the confident rule commits several tokens a pass, so it runs
    far fewer passes than the schedule's steps, and every mask is filled when it stops."""
    model = models["dimple"]
    schedule = GenerationConfig(gen_length=32, steps=32, decode="timesteps", remasking="maskgit_plus")
    confident = GenerationConfig(gen_length=32, steps=32, decode="confident", remasking="maskgit_plus",
                                 threshold=0.95)
    for prompt in PROMPTS:
        tokens, passes = run(model, prompt, confident, loopcore)
        assert model.cfg.mask_id not in tokens
        assert passes < run(model, prompt, schedule, loopcore)[1] == 32
        assert (tokens, passes) == authors.dimple(model, prompt, 32, 32, "maskgit_plus", 0.95)


@pytest.mark.parametrize("decode", ["timesteps", "confident"])
def test_reference_loop_gives_the_runtime_loops_tokens(models: dict[str, MaskPredictor], decode: str) -> None:
    """The torch reference loop (the oracle every backend is held to) runs the rules too, batched and left-padded."""
    model = models["dimple"]
    for alg in SCORES:
        config = GenerationConfig(gen_length=16, steps=10, decode=decode, remasking=alg, threshold=0.6)
        cfg = model.cfg
        ref = generate(model, PROMPTS, config)
        loop = run_generation(TorchBackend(model), PROMPTS, config, SpecialIds(cfg.mask_id, cfg.pad_id))
        np.testing.assert_array_equal(ref.tokens.numpy(), loop.tokens)
        for b, prompt in enumerate(PROMPTS):  # each row as its solo run
            assert loop.tokens[b].tolist() == run(model, prompt, config, loopcore)[0]


@pytest.mark.parametrize("bad, match", [
    ({"eps": 0.0}, "eps is 0.0; it must be a number in \\(0, 1\\)"),
    ({"eps": 1.0}, "eps is 1.0"),
    ({"alg_temp": -0.1}, "alg_temp is -0.1"),
    ({"top_p": 0.0}, "top_p is 0.0"),
    ({"top_p": 1.5}, "top_p is 1.5"),
    ({"threshold": 0.0}, "threshold is 0.0"),
    ({"threshold": 1.01}, "threshold is 1.01"),
    ({"remasking": "low_confidence"}, "--remasking low_confidence is LLaDA's"),
    ({"block_length": 8}, "has no blocks"),
    ({"kv_cache": True}, "use it instead of --kv-cache"),
    ({"cfg_scale": 1.0}, "without --cfg-scale"),
])
def test_bad_settings_are_refused_in_one_line(bad: dict[str, object], match: str) -> None:
    settings: dict[str, object] = {"gen_length": 16, "steps": 16, "decode": "timesteps", "remasking": "entropy"}
    with pytest.raises(ConfigError, match=match) as error:
        GenerationConfig(**{**settings, **bad})  # type: ignore[arg-type]
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="is a rule of the Dream family's sampler"):
        GenerationConfig(remasking="entropy")
    with pytest.raises(ConfigError, match="belong to the Dream family's sampler"):
        GenerationConfig(top_k=5)


def test_llada_rules_are_untouched(models: dict[str, MaskPredictor], tmp_path: Path) -> None:
    """LLaDA's settings build no scoring and run the blockwise loop: the reference and the runtime loop agree."""
    model, _ = family_checkpoint(tmp_path, "llada", seed=1)
    config = GenerationConfig(gen_length=16, steps=8, block_length=8)
    assert config.scoring() is None and not config.dream_sampler
    cfg = model.cfg
    loop = run_generation(TorchBackend(model), PROMPTS, config, SpecialIds(cfg.mask_id, cfg.pad_id))
    np.testing.assert_array_equal(generate(model, PROMPTS, config).tokens.numpy(), loop.tokens)


@pytest.mark.parametrize("core", CORES)
def test_lavida_dream_writes_its_first_token_from_the_prompt_pass(tmp_path: Path, core: LoopCore) -> None:
    """LaViDa-Dream (Dream with prefix-DLM attention): the prompt pass commits the first answer token greedily, then
    min(steps, answer length) passes of Dream's loop: its tokens, in the runtime loop and the reference loop."""
    model, _ = family_checkpoint(tmp_path, "dream", seed=5, prefix_dlm=True)
    cfg = model.cfg
    for alg in ("topk_margin", "entropy"):
        for prompt, steps in zip(PROMPTS, (16, 6, 20), strict=True):
            config = GenerationConfig(gen_length=16, steps=steps, decode="timesteps", remasking=alg,
                                      first_from_prompt=True)
            expected = authors.lavida_dream(model, prompt, 16, steps, alg)
            assert run(model, prompt, config, core)[0] == expected
        config = GenerationConfig(gen_length=16, steps=10, decode="timesteps", remasking=alg, first_from_prompt=True)
        loop = run_generation(TorchBackend(model), PROMPTS, config, SpecialIds(cfg.mask_id, cfg.pad_id),
                              options=LoopOptions(core=core))
        np.testing.assert_array_equal(generate(model, PROMPTS, config).tokens.numpy(), loop.tokens)
