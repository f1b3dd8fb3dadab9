"""Seer in the runtime loop (any Backend, C core or numpy twin): the same plans and tokens as the reference loop."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model

from seer_deploy.core.backend import StepInput, StepOutput
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.runtime.loop import LoopOptions, run_generation
from seer_deploy.runtime.loopcore import c_core, core_name, python_core
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CORES = [python_core()] + ([c_core()] if c_core() is not None else [])
PROMPTS = [[10, 14, 1, 2, 3, 13], [10, 15, 4, 13], [10, 16, 5, 6, 7, 8, 9, 1, 2, 13]]


@pytest.mark.parametrize("core", CORES, ids=lambda c: core_name(c))
@pytest.mark.parametrize(
    "config", [GenerationConfig(gen_length=24, steps=24), GenerationConfig(gen_length=24, steps=12, block_length=8)]
)
@pytest.mark.parametrize("tail_context", [0, 3, "all"])
def test_runtime_loop_applies_the_same_seer_plans_as_the_reference(
    core: object, config: GenerationConfig, tail_context: int | str
) -> None:
    model = tiny_model(seed=1)
    # Low floor: the random model is cut. tail_context: the cut slots the later steps still see as committed EOS.
    seer = SeerConfig(detector="fused", floor=2.0, margin=1, abs_threshold=0.1, tail_context=tail_context)  # type: ignore[arg-type]
    backend = TorchBackend(model, seer.stats_spec(model.cfg.n_layers))
    ids = {"ids": SpecialIds(model.cfg.mask_id, model.cfg.eos_id)}
    loop = run_generation(backend, PROMPTS, config, options=LoopOptions(core=core), seer=seer, **ids)  # type: ignore[arg-type]
    ref = generate(model, PROMPTS, config, seer=seer)
    assert loop.seer is not None and ref.seer is not None
    assert [r.kept for r in loop.seer] == [r.kept for r in ref.seer] and any(r.kept < 24 for r in ref.seer)
    assert loop.seer == ref.seer
    np.testing.assert_array_equal(loop.tokens, ref.tokens.numpy())
    assert loop.tokens_processed <= ref.tokens_processed  # the loop skips steps that cannot commit anything
    expected = [0 if tail_context == 0 else 24 - r.kept if tail_context == "all" else min(3, 24 - r.kept)
                for r in ref.seer]
    assert [r.context for r in loop.seer] == expected and any(expected) == (tail_context != 0)


def test_runtime_loop_runs_the_tail_context_as_committed_eos() -> None:
    """With tail_context, every later step's input holds the kept slots then `context` EOS, never a mask."""
    model = tiny_model(seed=2)
    config = GenerationConfig(gen_length=16, steps=16)
    seen: list[np.ndarray] = []

    class Recording(TorchBackend):
        def step(self, inputs: StepInput) -> StepOutput:
            seen.append(inputs.input_ids.copy())
            return super().step(inputs)

    seer = SeerConfig(tail_context=4)
    out = run_generation(Recording(model), [PROMPTS[0]], config, ids=SpecialIds(mask=12, pad=11), kept_lengths=[5], seer=seer)
    assert out.seer is not None and (out.seer[0].kept, out.seer[0].context) == (5, 4)
    assert len(seen) == 4 and all(x.shape == (1, 6 + 5 + 4) and (x[0, 11:] == 11).all() for x in seen)
    assert not (out.tokens == 12).any() and (out.tokens[0, 5:] == 11).all()
    ref = generate(model, [PROMPTS[0]], config, kept_lengths=[5], seer=seer)
    np.testing.assert_array_equal(out.tokens, ref.tokens.numpy())
    assert out.seer == ref.seer


def test_runtime_loop_with_forced_kept_lengths() -> None:
    model = tiny_model(seed=2)
    config = GenerationConfig(gen_length=16, steps=16)
    backend = TorchBackend(model)
    out = run_generation(backend, PROMPTS, config, ids=SpecialIds(mask=12, pad=11), kept_lengths=[3, 16, 9])
    ref = generate(model, PROMPTS, config, kept_lengths=[3, 16, 9])
    np.testing.assert_array_equal(out.tokens, ref.tokens.numpy())
    assert out.seer is not None and [r.kept for r in out.seer] == [3, 16, 9]
    assert (out.tokens[0, 3:] == 11).all() and (out.tokens[2, 9:] == 11).all()
