"""The Dream family's rules through the exported step graph: its `score` output (the row's rule over the candidate
columns) and ONNX Runtime give torch's tokens and the authors' (tests/rule_transcriptions.py), with Seer off and on;
what the graphs cannot run (top-p / top-k over the vocabulary) is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rule_transcriptions as authors
from test_families_text import family_checkpoint

from seer_deploy.core.backend import StepInput
from seer_deploy.core.decoding import ScoreRule, Scoring
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort import OrtBackend
from seer_deploy.engines.ort_sessions import OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.loop import check_supported, run_generation
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CPU = OrtSessionOptions(providers=("CPUExecutionProvider",))
PROMPTS = [[10, 3, 5, 2, 17], [10, 8, 17, 4], [16, 12, 1, 2, 3, 4, 5, 6, 17]]


@pytest.fixture(scope="module")
def dimple(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, OrtBackend]:
    root = tmp_path_factory.mktemp("dimple-graphs")
    model, ckpt = family_checkpoint(root, "dimple", seed=3)
    return model, OrtBackend(export_checkpoint(ckpt, root / "export").out, CPU)


def test_score_output_is_the_rule_over_the_candidates(dimple: tuple[MaskPredictor, OrtBackend]) -> None:
    """Per row its own rule and temperature; -inf off the candidates; rule 0 at temperature 1 is the confidence."""
    model, ort = dimple
    x = np.array([PROMPTS[0] + [model.cfg.mask_id] * 6] * 2, np.int64)
    candidates = np.array([[5, 6, 7, 8, 9, 10]] * 2, np.int64)
    torch_backend = TorchBackend(model)
    for rule in ScoreRule:
        for temperature in (1.0, 0.7):
            inputs = StepInput(x, candidates=candidates, scoring=Scoring(rule, temperature))
            got, want = ort.step(inputs), torch_backend.step(inputs)
            assert got.score is not None and want.score is not None
            np.testing.assert_allclose(got.score[:, 5:], want.score[:, 5:], atol=2e-5)
            assert np.isneginf(got.score[:, :5]).all()
            np.testing.assert_array_equal(got.token_ids[:, 5:], want.token_ids[:, 5:])
    plain = ort.step(StepInput(x, candidates=candidates))
    assert plain.score is not None
    np.testing.assert_array_equal(plain.score, plain.confidence)
    margin = ort.step(StepInput(x, candidates=candidates, scoring=Scoring(ScoreRule.MARGIN)))
    assert margin.score is not None and not np.allclose(margin.score[:, 5:], plain.confidence[:, 5:])


@pytest.mark.parametrize("decode", ["timesteps", "confident"])
@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_onnx_runtime_gives_torchs_and_the_authors_tokens(dimple: tuple[MaskPredictor, OrtBackend], decode: str,
                                                          alg: str) -> None:
    model, ort = dimple
    cfg = model.cfg
    common = {"ids": SpecialIds(cfg.mask_id, cfg.pad_id, cfg.eos_id)}
    threshold = 0.05 if alg == "entropy" else 0.8
    config = GenerationConfig(gen_length=16, steps=10, decode=decode, remasking=alg, threshold=threshold)  # type: ignore[arg-type]
    solo = run_generation(ort, PROMPTS[:1], config, **common).tokens[0].tolist()  # type: ignore[arg-type]
    if decode == "timesteps":
        assert solo == authors.dream(model, PROMPTS[0], 16, 10, alg)[0]
    else:
        assert solo == authors.dimple(model, PROMPTS[0], 16, 10, alg, threshold)[0]
    for extra in ({}, {"seer": SeerConfig(detector="eos", eos_floor=0.0)}, {"kept_lengths": [5, 16, 9]}):
        runs = [run_generation(b, PROMPTS, config, **common, **extra)  # type: ignore[arg-type]
                for b in (TorchBackend(model), ort)]
        np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
        assert runs[0].row_passes == runs[1].row_passes


def test_graphs_refuse_top_p_and_top_k_in_one_line(dimple: tuple[MaskPredictor, OrtBackend], tmp_path: Path) -> None:
    model, ort = dimple
    cfg = model.cfg
    for extra in ({"top_p": 0.9}, {"top_k": 3}):
        config = GenerationConfig(gen_length=8, steps=8, decode="timesteps", remasking="entropy", **extra)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="only the torch backend") as error:
            check_supported(config, ort)
        assert "\n" not in str(error.value)
        check_supported(config, TorchBackend(model))
        run_generation(TorchBackend(model), PROMPTS[:1], config, SpecialIds(cfg.mask_id, cfg.pad_id))
