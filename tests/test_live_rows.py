"""Continuous batching's runtime side (`runtime.live.LiveRows`): rows that join between passes, with different
settings, on the demo's ONNX export (with its KV cache graphs), each answer equal to the row's `run_generation` alone.

Rows are admitted two per round while others run, so rows make their step zero beside other rows' later steps;
settings differ in size, steps, blocks, temperature, remasking, decoding rule, Seer on/off and the KV cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.runtime.live import LiveRows, Round
from seer_deploy.runtime.live_row import FinishedRow, RowRequest, takes
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.targets import TargetOptions
from seer_deploy.service import Service, ServiceOptions

PROMPTS = [e.prompt for e in heldout_examples(16)]


@pytest.fixture(scope="module")
def service(shared_demo_export: Callable[[str], Path]) -> Iterator[Service]:
    yield Service(shared_demo_export("demo-kv"), ServiceOptions(generation=GenerationConfig(gen_length=64, steps=64), target=TargetOptions(threads=1)))


def settings(service: Service, kv_cache: bool) -> list[tuple[GenerationConfig, bool, int]]:
    """(config, Seer on, seed): sizes, schedules, blocks, sampling, random remasking, a parallel rule."""
    return [
        (GenerationConfig(gen_length=16, steps=8, kv_cache=kv_cache), True, 0),
        (GenerationConfig(gen_length=64, steps=64, kv_cache=kv_cache), False, 0),
        (GenerationConfig(gen_length=32, steps=16, block_length=8, kv_cache=kv_cache), True, 0),
        (GenerationConfig(gen_length=64, steps=32, block_length=16, kv_cache=kv_cache), False, 0),
        (GenerationConfig(gen_length=16, steps=16, temperature=6.0, kv_cache=kv_cache), True, 5),
        (GenerationConfig(gen_length=32, steps=16, temperature=4.0, kv_cache=kv_cache), False, 7),
        (GenerationConfig(gen_length=16, steps=16, remasking="random", kv_cache=kv_cache), False, 3),
        (GenerationConfig(gen_length=32, steps=32, decode="threshold", threshold=0.7, kv_cache=kv_cache), True, 0),
    ]


def special_ids(service: Service) -> SpecialIds:
    info = service.info
    return SpecialIds(info.mask_id, info.pad_id, info.eos_id)


def live_rows(service: Service) -> LiveRows:
    return LiveRows(service.backend, special_ids(service))


def run_joining(live: LiveRows, requests: list[RowRequest], per_round: int = 2
                ) -> tuple[dict[int, FinishedRow], list[Round]]:
    """Admit `per_round` requests before each round until all are in; run rounds until every row finished."""
    handles: dict[int, int] = {}
    finished: dict[int, FinishedRow] = {}
    rounds = []
    while len(finished) < len(requests):
        for _ in range(per_round):
            if len(handles) < len(requests):
                handles[live.admit(requests[len(handles)])] = len(handles)
        rounds.append(live.round())
        finished.update((handles[f.handle], f) for f in rounds[-1].finished)
    return finished, rounds


@pytest.mark.parametrize("kv_cache", [False, True], ids=["no-cache", "kv-cache"])
def test_rows_that_join_mid_flight_answer_as_alone(service: Service, kv_cache: bool) -> None:
    """Every row's tokens, passes and Seer report equal its run_generation alone (sampled and random-remasking rows
    too: their uniforms and scores come from their own generator), though rows joined while others ran and rows of
    different settings shared calls; calls that mix step zero with later steps, and settings, happened."""
    chosen = settings(service, kv_cache)
    requests, alone = [], []
    for i, prompt in enumerate(PROMPTS[:12]):
        config, seer_on, seed = chosen[i % len(chosen)]
        ids = service.prepare([Prompt(prompt)]).ids[0]
        seer = service.seer if seer_on else None
        requests.append(RowRequest(ids, config, seer, seed))
        alone.append(run_generation(service.backend, [ids], config, special_ids(service), seed=seed,
                                    seer=seer))
    finished, rounds = run_joining(live_rows(service), requests)
    for i, want in enumerate(alone):
        got = finished[i]
        assert got.tokens.tolist() == want.tokens[0].tolist(), f"row {i}: {chosen[i % len(chosen)]}"
        assert got.passes == want.row_passes[0]
        assert got.report == (want.seer[0] if want.seer else None)
    calls = [c for r in rounds for c in r.calls]
    assert any(0 < c.at_step_zero < c.rows for c in calls), "no call mixed step zero with later steps"
    assert any(c.settings > 1 for c in calls), "no call mixed settings"
    assert sum(1 for c in calls if c.kind == ("window_step" if kv_cache else "step")) > 0


def test_a_dropped_row_makes_no_further_pass(service: Service) -> None:
    """drop() between rounds: the row is gone at once (no call carries it again, it never finishes) and the others
    still answer as alone."""
    config = GenerationConfig(gen_length=64, steps=64)
    ids = [service.prepare([Prompt(p)]).ids[0] for p in PROMPTS[:2]]
    live = live_rows(service)
    long, short = live.admit(RowRequest(ids[0], config)), live.admit(RowRequest(ids[1], config))
    first = live.round()
    assert [c.rows for c in first.calls] == [2]
    live.drop(long)
    assert len(live) == 1
    rest = [live.round() for _ in range(63)]
    assert all(c.rows == 1 for r in rest for c in r.calls)
    done = [f for r in rest for f in r.finished]
    assert [f.handle for f in done] == [short] and len(live) == 0
    want = run_generation(service.backend, [ids[1]], config, special_ids(service))
    assert done[0].tokens.tolist() == want.tokens[0].tolist()


def test_rows_whose_passes_a_live_row_cannot_make_run_per_call() -> None:
    """The prompt cache and a shifted model's block-wise cache (its windows start a column early) are not live rows'
    passes: such rows are left to per-call runs; LLaDA's block-wise cache is."""
    assert takes(GenerationConfig(gen_length=8, steps=8, kv_cache=True), None)
    assert not takes(GenerationConfig(gen_length=8, steps=8, kv_cache=True), None, window_lead=1)
    assert not takes(GenerationConfig(gen_length=8, steps=8, prompt_cache=True), None)
    assert not takes(GenerationConfig(gen_length=8, steps=8, decode="timesteps", remasking="entropy"), None)


def test_explicit_uniforms_are_checked() -> None:
    """StepInput.uniform (a row's own sampling uniforms) must match the ids' shape and lie in (0, 1]."""
    ids = np.zeros((2, 5), np.int64)
    StepInput(ids, uniform=np.full((2, 5), 0.5, np.float32)).checked(16)
    for bad in (np.full((2, 4), 0.5), np.zeros((2, 5)), np.full((2, 5), 1.5)):
        with pytest.raises(ConfigError, match="uniform must be float32"):
            StepInput(ids, uniform=bad).checked(16)



def test_a_short_row_gets_its_share_beside_a_long_one(service: Service) -> None:
    """Fair share of the model's work: a short row (16 narrow passes) beside a long one (64 wide passes) makes
    several passes for each of the long row's, so it finishes after fewer than half as many long passes; the long
    row is never starved (it finishes), and both answer as alone."""
    ids = service.prepare([Prompt(PROMPTS[0])]).ids[0]
    long_config, short_config = GenerationConfig(gen_length=64, steps=64), GenerationConfig(gen_length=16, steps=16)
    live = live_rows(service)
    long, short = live.admit(RowRequest(ids, long_config)), live.admit(RowRequest(ids, short_config))
    passes, done = 0, dict[int, FinishedRow]()
    while short not in done:
        made = live.round()
        passes += sum(c.rows for c in made.calls)
        done.update((f.handle, f) for f in made.finished)
    assert done[short].passes == 16 and passes - 16 < 8, passes  # the long row: ~16 * (P + 16) / (P + 64) passes
    while long not in done:
        done.update((f.handle, f) for f in live.round().finished)
    for handle, config in ((long, long_config), (short, short_config)):
        want = run_generation(service.backend, [ids], config, special_ids(service))
        assert done[handle].tokens.tolist() == want.tokens[0].tolist() and done[handle].passes == want.row_passes[0]
