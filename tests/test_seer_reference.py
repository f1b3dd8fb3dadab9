"""Seer in the torch reference loop: no-cut runs equal full length, rows equal solo runs, the work is accounted."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import SeerConfig

PROMPTS = [[10, 14, 1, 2, 3, 13], [10, 15, 4, 13], [10, 16, 5, 6, 7, 8, 9, 1, 2, 13]]
EOS, MASK = 11, 12


@pytest.mark.parametrize(
    "config",
    [
        GenerationConfig(gen_length=32, steps=32),
        GenerationConfig(gen_length=32, steps=16, block_length=8),
        GenerationConfig(gen_length=24, steps=8, cfg_scale=1.0),
        GenerationConfig(gen_length=16, steps=16, temperature=0.7, remasking="random"),
    ],
)
def test_keeping_every_slot_reproduces_full_length_exactly(config: GenerationConfig) -> None:
    model = tiny_model()
    full = generate(model, PROMPTS, config, generator=torch.Generator().manual_seed(5))
    kept = generate(model, PROMPTS, config, generator=torch.Generator().manual_seed(5), kept_lengths=[config.gen_length] * 3)
    assert torch.equal(full.tokens, kept.tokens)
    assert (kept.passes, kept.tokens_processed) == (full.passes, full.tokens_processed)
    assert kept.seer is not None and all(r.kept == config.gen_length and r.passes == config.steps for r in kept.seer)


def test_later_steps_run_on_prompt_plus_kept_length_and_the_tail_is_eos() -> None:
    model = tiny_model()
    lengths: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: lengths.append(int(args[0].shape[1])))
    config = GenerationConfig(gen_length=32, steps=32)
    out = generate(model, [PROMPTS[0]], config, kept_lengths=[10])
    assert lengths == [6 + 32] + [6 + 10] * 9  # step zero at full length, then ceil(32 * 10 / 32) - 1 more steps
    assert (out.tokens[0, 10:] == EOS).all() and not (out.tokens[0, :10] == MASK).any()
    report = out.seer[0] if out.seer else None
    assert report is not None and (report.kept, report.passes, report.full_passes) == (10, 10, 32)
    assert report.tokens_processed == 38 + 9 * 16 == out.tokens_processed
    assert report.full_tokens_processed == 32 * 38


def test_tail_context_keeps_committed_eos_slots_after_the_cut() -> None:
    """tail_context: the later steps see kept + context slots, the context EOS and never decoded."""
    model = tiny_model()
    seen: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    config = GenerationConfig(gen_length=32, steps=32)
    out = generate(model, [PROMPTS[0]], config, kept_lengths=[10], seer=SeerConfig(tail_context=4))
    assert [int(x.shape[1]) for x in seen] == [6 + 32] + [6 + 10 + 4] * 9
    assert all((x[0, 16:] == EOS).all() for x in seen[1:])  # the context slots, at every later step
    assert (out.tokens[0, 10:] == EOS).all() and not (out.tokens[0, :10] == MASK).any()
    report = out.seer[0] if out.seer else None
    assert report is not None and (report.kept, report.passes) == (10, 10)
    assert report.tokens_processed == 38 + 9 * (16 + 4) == out.tokens_processed
    # The context never runs past gen_length, and a request kept whole has none.
    wide = generate(model, PROMPTS, config, kept_lengths=[30, 32, 5], seer=SeerConfig(tail_context=8))
    assert wide.seer is not None
    no_context = generate(model, PROMPTS, config, kept_lengths=[30, 32, 5])
    assert no_context.seer is not None
    extra = [a.tokens_processed - b.tokens_processed for a, b in zip(wide.seer, no_context.seer, strict=True)]
    assert extra == [29 * 2, 0, 4 * 8]  # (steps - 1) * min(8, 32 - kept)
    assert wide.tokens_processed == sum(r.tokens_processed for r in wide.seer)
    with pytest.raises(ConfigError, match="tail_context"):
        generate(model, PROMPTS, config, kept_lengths=[5, 5, 5], seer=SeerConfig(tail_context=-1))


def test_rows_with_different_kept_lengths_equal_their_solo_runs() -> None:
    model = tiny_model(seed=3)
    config = GenerationConfig(gen_length=32, steps=16, block_length=16)
    batch = generate(model, PROMPTS, config, kept_lengths=[5, 32, 20])
    assert batch.seer is not None and [r.kept for r in batch.seer] == [5, 32, 20]
    for i, (prompt, kept) in enumerate(zip(PROMPTS, [5, 32, 20], strict=True)):
        solo = generate(model, [prompt], config, kept_lengths=[kept])
        assert torch.equal(batch.tokens[i], solo.tokens[0])
        assert solo.seer is not None and solo.seer[0] == batch.seer[i]
    assert batch.tokens_processed == sum(r.tokens_processed for r in batch.seer)


def test_detected_cuts_in_a_batch_equal_solo_runs() -> None:
    model = tiny_model(seed=1)
    config = GenerationConfig(gen_length=32, steps=32)
    seer = SeerConfig(detector="sparsity", floor=2.0, margin=1)  # low floor: the random model gets cut
    batch = generate(model, PROMPTS, config, seer=seer)
    assert batch.seer is not None
    assert any(r.kept < 32 for r in batch.seer)
    for i, prompt in enumerate(PROMPTS):
        solo = generate(model, [prompt], config, seer=seer)
        assert solo.seer is not None and solo.seer[0].kept == batch.seer[i].kept
        assert torch.equal(batch.tokens[i], solo.tokens[0])
        r = batch.seer[i]
        assert r.detector == "sparsity" and (r.boundary is None or r.kept == min(32, r.boundary + 1))


def test_kept_lengths_are_checked() -> None:
    with pytest.raises(ConfigError, match="one length in"):
        generate(tiny_model(), PROMPTS, GenerationConfig(16, 16), kept_lengths=[4, 40, 4])
