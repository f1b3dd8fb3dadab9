"""The runtime loop over a Backend gives the reference loop's tokens, with either host core."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from seer_deploy.core.backend import Step0Output, StepInput, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.loop import LoopOptions, check_supported, run_generation
from seer_deploy.runtime.loopcore import c_core, core_name, python_core
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend

CORES = [python_core()] + ([c_core()] if c_core() is not None else [])
with_cores = pytest.mark.parametrize("core", CORES, ids=lambda c: core_name(c))


def _ids(model: MaskPredictor) -> dict[str, Any]:
    cfg = model.cfg
    return {"ids": SpecialIds(cfg.mask_id, cfg.pad_id if cfg.pad_id is not None else cfg.eos_id)}


PARITY_CASES = [
    ("one block", [[10, 14, 3, 1, 4, 13]], GenerationConfig(gen_length=8, steps=8)),
    ("blocks", [[10, 14, 3, 1, 4, 13]], GenerationConfig(gen_length=12, steps=6, block_length=4)),
    ("steps < gen_length", [[10, 5, 6, 13]], GenerationConfig(gen_length=16, steps=4)),
    (
        "left-padded batch",
        [[10, 14, 3, 13], [10, 1, 2, 3, 4, 5, 6, 13], [7, 13]],
        GenerationConfig(gen_length=12, steps=6, block_length=6),
    ),
    ("equal-length batch", [[10, 3, 13], [10, 4, 13]], GenerationConfig(gen_length=8, steps=4, block_length=4)),
]


@with_cores
@pytest.mark.parametrize("prompts, config", [c[1:] for c in PARITY_CASES], ids=[c[0] for c in PARITY_CASES])
def test_tokens_match_the_reference_loop(core: Any, prompts: list[list[int]], config: GenerationConfig) -> None:
    model = tiny_model()
    expected = generate(model, prompts, config)
    got = run_generation(TorchBackend(model), prompts, config, options=LoopOptions(core=core), **_ids(model))
    assert got.tokens.dtype == np.int64
    np.testing.assert_array_equal(got.tokens, expected.tokens.numpy())
    assert got.passes == expected.passes  # every step commits something here: none is skipped
    assert got.tokens_processed == expected.tokens_processed


@with_cores
def test_prompt_masks_stay_candidates_as_in_the_reference(core: Any) -> None:
    model = tiny_model(seed=3)
    mask = model.cfg.mask_id
    prompts = [[10, mask, 3, mask, 13], [10, 14, 13]]
    config = GenerationConfig(gen_length=8, steps=4, block_length=4)
    expected = generate(model, prompts, config).tokens.numpy()
    got = run_generation(TorchBackend(model), prompts, config, options=LoopOptions(core=core), **_ids(model))
    np.testing.assert_array_equal(got.tokens, expected)


@with_cores
def test_steps_that_commit_nothing_are_not_run(core: Any) -> None:
    model = tiny_model(seed=1)
    prompts = [[10, 14, 3, 13]]
    config = GenerationConfig(gen_length=6, steps=20, block_length=3)  # 10 steps per block for 3 masks
    expected = generate(model, prompts, config)
    got = run_generation(TorchBackend(model), prompts, config, options=LoopOptions(core=core), **_ids(model))
    np.testing.assert_array_equal(got.tokens, expected.tokens.numpy())
    assert expected.passes == 20 and got.passes == 6  # one pass per committed token
    assert got.tokens_processed == 6 * (4 + 6)


# ---------------------------------------------------------------- a scripted backend for the host semantics


class ScriptedBackend:
    """Token p + 100 at position p, confidence rising with the position; records every call."""

    name = "scripted"
    max_seq_len = 256

    def __init__(self) -> None:
        self.sparsity_rows: list[tuple[int, str]] = []
        self.calls: list[dict[str, Any]] = []

    def _out(self, input_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        B, S = input_ids.shape
        tokens = np.broadcast_to(np.arange(S, dtype=np.int64) + 100, (B, S)).copy()
        return tokens, np.tile(np.linspace(0, 1, S, dtype=np.float32), (B, 1))

    def step0(self, inputs: StepInput) -> Step0Output:
        self.calls.append({"kind": "step0", "x": inputs.input_ids.copy(), "mask": inputs.attention_mask})
        tokens, conf = self._out(inputs.input_ids)
        B, S = inputs.input_ids.shape
        return Step0Output(tokens, conf, np.zeros((B, S), np.float32), np.zeros((B, 0, S), np.float32))

    def step(self, inputs: StepInput) -> StepOutput:
        self.calls.append(
            {"kind": "step", "x": inputs.input_ids.copy(), "temperature": inputs.temperature, "seed": inputs.seed}
        )
        return StepOutput(*self._out(inputs.input_ids))


MASK, PAD = 1, 0


def _commits(calls: list[dict[str, Any]], final: np.ndarray) -> list[np.ndarray]:
    """Bool [B, S] per forward pass: the positions that pass committed."""
    states = [c["x"] for c in calls] + [final]
    return [(before == MASK) & (after != MASK) for before, after in itertools.pairwise(states)]


@with_cores
def test_random_remasking_ranks_by_host_uniforms(core: Any) -> None:
    """Each step commits its quota inside the current block, chosen by numpy uniforms from the seed, not by confidence."""
    prompts = [[5, 6], [7, 8]]
    config = GenerationConfig(gen_length=8, steps=4, block_length=4, remasking="random")
    backend = ScriptedBackend()  # confidence rises with the position: low_confidence would commit right to left
    result = run_generation(backend, prompts, config, ids=SpecialIds(mask=MASK, pad=PAD), options=LoopOptions(core=core), seed=7)
    final = np.concatenate([np.array(prompts), result.tokens], axis=1)
    rng = np.random.default_rng(7)
    expected_x = backend.calls[0]["x"].copy()
    for i, commit in enumerate(_commits(backend.calls, final)):
        hi = 2 + 4 * (i // 2 + 1)
        scores = rng.random(expected_x.shape, dtype=np.float32)
        for b in range(2):
            candidates = [p for p in range(hi) if expected_x[b, p] == MASK]
            chosen = sorted(candidates, key=lambda p: (-scores[b, p], p))[:2]
            assert sorted(np.flatnonzero(commit[b]).tolist()) == sorted(chosen)
            expected_x[b, chosen] = np.array(chosen) + 100
    np.testing.assert_array_equal(final, expected_x)
    assert (result.tokens == np.arange(2, 10) + 100).all()  # every slot got the backend's token for it
    reseeded = ScriptedBackend()
    other = run_generation(reseeded, prompts, config, ids=SpecialIds(mask=MASK, pad=PAD), options=LoopOptions(core=core), seed=8)
    other_final = np.concatenate([np.array(prompts), other.tokens], axis=1)
    orders = [_commits(backend.calls, final), _commits(reseeded.calls, other_final)]
    assert any(not np.array_equal(a, b) for a, b in zip(*orders, strict=True))  # the seed decides the order


@with_cores
def test_low_confidence_commits_the_most_confident_first(core: Any) -> None:
    backend = ScriptedBackend()  # confidence rises with the position
    config = GenerationConfig(gen_length=6, steps=3)
    result = run_generation(backend, [[5, 6]], config, ids=SpecialIds(mask=MASK, pad=PAD), options=LoopOptions(core=core))
    commits = _commits(backend.calls, np.concatenate([[[5, 6]], result.tokens], axis=1))
    assert [np.flatnonzero(c[0]).tolist() for c in commits] == [[6, 7], [4, 5], [2, 3]]


def test_temperature_and_per_step_seeds_reach_the_backend() -> None:
    backend = ScriptedBackend()
    config = GenerationConfig(gen_length=4, steps=4, temperature=0.7)
    result = run_generation(backend, [[5, 6]], config, ids=SpecialIds(mask=MASK, pad=PAD), seed=3)
    kinds = [c["kind"] for c in backend.calls]
    assert kinds == ["step", "step", "step", "step"]  # without Seer nobody reads step zero: its sampled pass alone
    seeds = [c["seed"] for c in backend.calls]
    assert all(c["temperature"] == 0.7 for c in backend.calls) and len(set(seeds)) == 4
    assert result.passes == 4 and result.tokens_processed == 4 * 6
    again = ScriptedBackend()
    run_generation(again, [[5, 6]], config, ids=SpecialIds(mask=MASK, pad=PAD), seed=3)
    assert [c["seed"] for c in again.calls] == seeds
    cut = ScriptedBackend()  # with Seer step zero's statistics are read: the greedy step0, then a sampled pass commits
    run_generation(cut, [[5, 6]], config, ids=SpecialIds(mask=MASK, pad=PAD), seed=3, kept_lengths=[4])
    assert [c["kind"] for c in cut.calls][:2] == ["step0", "step"]
    greedy = ScriptedBackend()
    run_generation(greedy, [[5, 6]], GenerationConfig(gen_length=4, steps=4), ids=SpecialIds(mask=MASK, pad=PAD))
    assert [c["kind"] for c in greedy.calls] == ["step0", "step", "step", "step"]
    assert all(c["seed"] is None and c["temperature"] == 0 for c in greedy.calls[1:])


def test_sampling_is_seeded_with_the_torch_backend() -> None:
    model = tiny_model()
    config = GenerationConfig(gen_length=8, steps=8, temperature=1.0)
    runs = [run_generation(TorchBackend(model), [[10, 3, 13]], config, seed=s, **_ids(model)).tokens for s in (0, 0, 1)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_left_padding_is_masked_out_for_the_backend() -> None:
    backend = ScriptedBackend()
    config = GenerationConfig(gen_length=4, steps=2)
    run_generation(backend, [[5, 6, 7], [8]], config, ids=SpecialIds(mask=MASK, pad=PAD))
    first = backend.calls[0]
    assert first["x"].tolist() == [[5, 6, 7, 1, 1, 1, 1], [0, 0, 8, 1, 1, 1, 1]]
    assert first["mask"].tolist() == [[1] * 7, [0, 0, 1, 1, 1, 1, 1]]


def test_unsupported_settings_are_config_errors() -> None:
    backend = ScriptedBackend()
    with pytest.raises(ConfigError, match="cfg_scale.*only the torch backend.*scripted"):
        check_supported(GenerationConfig(gen_length=4, steps=4, cfg_scale=1.0), backend)
    with pytest.raises(ConfigError, match="pad_id equals mask_id"):
        run_generation(backend, [[5]], GenerationConfig(gen_length=4, steps=4), ids=SpecialIds(mask=MASK, pad=MASK))
    with pytest.raises(ConfigError, match="at least one token"):
        run_generation(backend, [[5], []], GenerationConfig(gen_length=4, steps=4), ids=SpecialIds(mask=MASK, pad=PAD))
    with pytest.raises(ConfigError, match="exceeds"):  # checked once, where prompts are prepared (Service.prepare)
        GenerationConfig(gen_length=8, steps=8).check_fits(backend.max_seq_len, 250)


@pytest.mark.parametrize("kept", [None, [5, 16, 9]], ids=["full-length", "cut"])
def test_guidance_on_the_torch_backend_equals_the_reference(kept: list[int] | None) -> None:
    """Classifier-free guidance runs in the one loop on the torch backend (batched, cut or not): the reference's
    tokens, and every step costs two passes."""
    model = tiny_model(seed=5)
    config = GenerationConfig(gen_length=16, steps=8, cfg_scale=1.5)
    prompts = [[10, 14, 1, 2, 3, 13], [10, 15, 4, 13], [10, 16, 5, 6, 7, 13]]
    out = run_generation(TorchBackend(model), prompts, config, ids=SpecialIds(mask=model.cfg.mask_id, pad=model.cfg.eos_id),
                         kept_lengths=kept)
    ref = generate(model, prompts, config, kept_lengths=kept)
    np.testing.assert_array_equal(out.tokens, ref.tokens.numpy())
    assert out.tokens_processed == ref.tokens_processed
    if kept is not None:
        assert out.seer == ref.seer


def test_remaining_steps_run_on_a_shorter_kept_length() -> None:
    """The seam Seer uses: step zero at full length, then the later steps on prompt + kept length only."""
    backend = ScriptedBackend()
    config = GenerationConfig(gen_length=8, steps=8, block_length=4)
    out = run_generation(backend, [[5, 6]], config, ids=SpecialIds(mask=MASK, pad=PAD), options=LoopOptions(core=python_core()), kept_lengths=[5])
    assert [c["x"].shape[1] for c in backend.calls] == [10, 7, 7, 7, 7]
    assert out.passes == 1 + 4 and out.tokens_processed == 10 + 4 * 7
    assert out.tokens.tolist() == [[102, 103, 104, 105, 106, PAD, PAD, PAD]]


# ---------------------------------------------------------------- the torch backend's outputs


def test_torch_backend_step0_outputs() -> None:
    model = tiny_model()
    x = np.array([[10, 14, 3, 13] + [model.cfg.mask_id] * 4, [0, 0, 10, 13] + [model.cfg.mask_id] * 4], np.int64)
    attn = np.array([[1] * 8, [0, 0] + [1] * 6], np.int64)
    out = TorchBackend(model).step0(StepInput(x, attn))
    with torch.no_grad():
        ref = model(torch.from_numpy(x), torch.from_numpy(attn), stats=StatsSpec(layers=(0, 1)))
    probs = F.softmax(ref.logits.float(), dim=-1)
    np.testing.assert_array_equal(out.token_ids, ref.logits.argmax(-1).numpy())
    log_probs = F.log_softmax(ref.logits.double(), dim=-1)
    np.testing.assert_allclose(out.confidence, log_probs.max(-1).values.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.eos_prob, probs[..., model.cfg.eos_id].numpy(), rtol=1e-5, atol=1e-7)
    assert out.sparsity.shape == (2, 2 * len(STAT_NAMES), 8) and out.sparsity.dtype == np.float32
    backend = TorchBackend(model)
    for row, (layer, stat) in enumerate(backend.sparsity_rows):
        np.testing.assert_array_equal(out.sparsity[:, row], ref.stats[:, layer, STAT_NAMES.index(stat)].numpy())


def test_torch_backend_reports_the_requested_layers() -> None:
    model = tiny_model()
    backend = TorchBackend(model, StatsSpec(layers=(1,)))
    assert backend.sparsity_rows == [(1, s) for s in STAT_NAMES]
    out = backend.step0(StepInput(np.array([[10, 3, 13, model.cfg.mask_id]], np.int64)))
    with torch.no_grad():
        ref = model(torch.tensor([[10, 3, 13, model.cfg.mask_id]]), stats=StatsSpec(layers=(1,))).stats
    np.testing.assert_array_equal(out.sparsity, ref[:, 0].numpy())
    with pytest.raises(ConfigError, match="stats layers"):
        TorchBackend(model, StatsSpec(layers=(2,)))


def test_torch_backend_step_matches_step0_at_temperature_zero() -> None:
    model = tiny_model()
    x = np.array([[10, 3, 13] + [model.cfg.mask_id] * 5], np.int64)
    backend = TorchBackend(model)
    a, b = backend.step(StepInput(x)), backend.step0(StepInput(x))
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.confidence, b.confidence)


def test_sampling_without_seer_runs_one_pass_a_step() -> None:
    """At temperature > 0 without Seer, step zero is the sampled step alone (nobody reads its statistics): as many
    forward passes as the reference loop's steps."""
    model = tiny_model(seed=2)
    config = GenerationConfig(gen_length=8, steps=8, temperature=0.7)
    out = run_generation(TorchBackend(model), [[10, 14, 1, 13]], config, **_ids(model))
    assert out.passes == generate(model, [[10, 14, 1, 13]], config).passes == 8
    assert not (out.tokens == model.cfg.mask_id).any()


@pytest.mark.parametrize("kept", [None, [5, 16, 9]], ids=["full", "cut"])
def test_settled_prefixes_grow_to_the_final_answer(kept: list[int] | None) -> None:
    """`on_settled` (what a server streams): each row's reports grow, each is a prefix of the row's final tokens,
    the last is its whole kept response; with blocks of 4 the prefix reaches every block end on the way."""
    model = tiny_model()
    cfg = model.cfg
    prompts = [[10, 3, 5, 2, 17], [10, 8, 17], [10, 1, 2, 3, 4, 5, 6, 17]]
    config = GenerationConfig(16, 16, block_length=4)
    reports: dict[int, list[list[int]]] = {0: [], 1: [], 2: []}
    out = run_generation(TorchBackend(model), prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id, eos=cfg.eos_id), kept_lengths=kept, options=LoopOptions(on_settled=lambda b, ids: reports[b].append(ids.tolist())))
    plain = run_generation(TorchBackend(model), prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id, eos=cfg.eos_id), kept_lengths=kept)
    assert np.array_equal(out.tokens, plain.tokens)  # listening changes nothing
    for b, seen in reports.items():
        final = out.tokens[b].tolist()
        lengths = [len(r) for r in seen]
        assert lengths == sorted(set(lengths)) and all(r == final[: len(r)] for r in seen)
        k = 16 if kept is None else kept[b]
        assert lengths[-1] == k
        assert all(n in lengths for n in range(4, k, 4) if n >= lengths[0])  # every block end after the first report
