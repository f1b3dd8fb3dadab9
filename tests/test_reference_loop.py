"""The reference loop follows LLaDA's semantics: schedule, commit-once, block order, determinism, padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.runtime.loopcore import transfer_schedule
from seer_deploy.runtime.reference import generate, select_transfer

MASK = 12


def _record(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every input the model sees, in order (a test-only hook)."""
    seen: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    return seen


@pytest.mark.parametrize("n, steps", [(10, 4), (3, 5), (64, 64), (7, 7), (0, 3)])
def test_transfer_schedule_is_an_even_split(n: int, steps: int) -> None:
    sched = transfer_schedule(np.array([n]), steps)[0].tolist()
    assert len(sched) == steps and sum(sched) == n
    assert max(sched) - min(sched) <= 1 and sched == sorted(sched, reverse=True)


def test_select_transfer_breaks_ties_by_position() -> None:
    conf = torch.tensor([[0.5, 0.9, 0.5, 0.5, -torch.inf]])
    chosen = select_transfer(conf, torch.tensor([3]))
    assert chosen.tolist() == [[True, True, True, False, False]]


def test_commits_follow_schedule_never_change_and_blocks_go_in_order() -> None:
    model = tiny_model()
    seen = _record(model)
    prompt = [10, 14, 3, 1, 4, 13]
    cfg = GenerationConfig(gen_length=12, steps=6, block_length=4)
    out = generate(model, [prompt], cfg)
    P = len(prompt)
    assert out.passes == 6 == len(seen)
    states = [s[0] for s in seen] + [torch.cat([torch.tensor(prompt), out.tokens[0]])]
    for i in range(1, len(states)):
        before, after = states[i - 1], states[i]
        newly = (before == MASK) & (after != MASK)
        assert int(newly.sum()) == 2  # 4 masks per block over 2 steps per block
        assert torch.equal(after[before != MASK], before[before != MASK])  # committed tokens never change
        block = (i - 1) // 2
        committed_at = newly.nonzero().flatten()
        assert all(P + 4 * block <= p < P + 4 * (block + 1) for p in committed_at.tolist())
    assert not (out.tokens == MASK).any()


def test_temperature_zero_is_deterministic_and_sampling_is_seeded() -> None:
    model = tiny_model()
    prompts = [[10, 14, 5, 6, 13]]
    cfg = GenerationConfig(gen_length=8, steps=8)
    assert torch.equal(generate(model, prompts, cfg).tokens, generate(model, prompts, cfg).tokens)
    hot = GenerationConfig(gen_length=8, steps=8, temperature=1.0)
    a = generate(model, prompts, hot, generator=torch.Generator().manual_seed(1)).tokens
    b = generate(model, prompts, hot, generator=torch.Generator().manual_seed(1)).tokens
    c = [generate(model, prompts, hot, generator=torch.Generator().manual_seed(s)).tokens for s in range(2, 8)]
    assert torch.equal(a, b)
    assert any(not torch.equal(a, x) for x in c)


def test_left_padded_batch_rows_equal_solo_runs() -> None:
    model = tiny_model(seed=2)
    prompts = [[10, 14, 1, 2, 13], [10, 15, 9, 8, 7, 6, 5, 4, 13], [10, 16, 3, 13]]
    cfg = GenerationConfig(gen_length=8, steps=4, block_length=4)
    batch = generate(model, prompts, cfg).tokens
    for i, p in enumerate(prompts):
        assert torch.equal(batch[i], generate(model, [p], cfg).tokens[0])


def test_random_remasking_and_cfg_run() -> None:
    model = tiny_model()
    out = generate(model, [[10, 14, 2, 13]], GenerationConfig(gen_length=8, steps=4, remasking="random"),
                   generator=torch.Generator().manual_seed(0))
    assert not (out.tokens == MASK).any()
    guided = generate(model, [[10, 14, 2, 13]], GenerationConfig(gen_length=8, steps=8, cfg_scale=1.0))
    assert guided.tokens_processed == 2 * 8 * 12  # two copies per step


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"gen_length": 10, "steps": 10, "block_length": 4}, "not a multiple of block_length"),
        ({"gen_length": 8, "steps": 3, "block_length": 4}, "cannot be split evenly across 2 blocks"),
        ({"gen_length": 200, "steps": 200}, "exceeds the model's 128 positions"),
        ({"gen_length": 8, "steps": 8, "remasking": "top_p"}, "remasking 'top_p' is unknown"),
    ],
)
def test_bad_settings_are_clear_errors(settings: dict[str, object], message: str) -> None:
    """A setting is refused when the config is made; a length only against a model's positions."""
    with pytest.raises(ConfigError, match=message):
        generate(tiny_model(), [[10, 14, 13]], GenerationConfig(**settings))  # type: ignore[arg-type]
