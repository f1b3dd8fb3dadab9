"""Seer in the runtime loop (any Backend, C core or numpy twin): the same plans and tokens as the reference loop."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model

from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.loopcore import c_core, core_name, python_core
from seer_deploy.runtime.reference import GenerationConfig, generate
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CORES = [python_core()] + ([c_core()] if c_core() is not None else [])
PROMPTS = [[10, 14, 1, 2, 3, 13], [10, 15, 4, 13], [10, 16, 5, 6, 7, 8, 9, 1, 2, 13]]


@pytest.mark.parametrize("core", CORES, ids=lambda c: core_name(c))
@pytest.mark.parametrize(
    "config", [GenerationConfig(gen_length=24, steps=24), GenerationConfig(gen_length=24, steps=12, block_length=8)]
)
def test_runtime_loop_applies_the_same_seer_plans_as_the_reference(core: object, config: GenerationConfig) -> None:
    model = tiny_model(seed=1)
    seer = SeerConfig(detector="fused", floor=2.0, margin=1, abs_threshold=0.1)  # low floor: the random model is cut
    backend = TorchBackend(model, seer.stats_spec(model.cfg.n_layers))
    ids = {"mask_id": model.cfg.mask_id, "pad_id": model.cfg.eos_id}
    loop = run_generation(backend, PROMPTS, config, core=core, seer=seer, **ids)  # type: ignore[arg-type]
    ref = generate(model, PROMPTS, config, seer=seer)
    assert loop.seer is not None and ref.seer is not None
    assert [r.kept for r in loop.seer] == [r.kept for r in ref.seer] and any(r.kept < 24 for r in ref.seer)
    assert loop.seer == ref.seer
    np.testing.assert_array_equal(loop.tokens, ref.tokens.numpy())
    assert loop.tokens_processed <= ref.tokens_processed  # the loop skips steps that cannot commit anything


def test_runtime_loop_with_forced_kept_lengths() -> None:
    model = tiny_model(seed=2)
    config = GenerationConfig(gen_length=16, steps=16)
    backend = TorchBackend(model)
    out = run_generation(backend, PROMPTS, config, mask_id=12, pad_id=11, kept_lengths=[3, 16, 9])
    ref = generate(model, PROMPTS, config, kept_lengths=[3, 16, 9])
    np.testing.assert_array_equal(out.tokens, ref.tokens.numpy())
    assert out.seer is not None and [r.kept for r in out.seer] == [3, 16, 9]
    assert (out.tokens[0, 3:] == 11).all() and (out.tokens[2, 9:] == 11).all()
