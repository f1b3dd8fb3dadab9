"""The ONNX Runtime backend against the torch model: step outputs, sampling, whole generations, bad artifacts."""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import requires_demo, tiny_model

from seer_deploy.contracts.sampling import draw_uniform
from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.engines.ort_sessions import PARALLEL_PREPACK
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples, write_tokenizer
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CPU = OrtSessionOptions(providers=("CPUExecutionProvider",))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path]:
    """A tiny random llada-layout checkpoint, exported (fp32), and its model as loaded from disk."""
    root = tmp_path_factory.mktemp("ort")
    write_tokenizer(root / "tokenizer.json")
    ckpt = save_checkpoint(tiny_model(1), root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    result = export_checkpoint(ckpt, root / "export")
    return load_checkpoint(ckpt).model, result.out


@pytest.fixture(scope="module")
def backends(exported: tuple[MaskPredictor, Path]) -> tuple[OrtBackend, TorchBackend]:
    model, out = exported
    return OrtBackend(out, CPU), TorchBackend(model)


def batch(vocab: int, mask_id: int, B: int, S: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded rows of random prompt tokens followed by masks (the shape of a denoising step)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (B, S))
    ids[:, S - S // 2 :] = mask_id
    mask = np.ones((B, S), dtype=np.int64)
    for b in range(1, B):
        mask[b, : (b * S) // (3 * B)] = 0
    return ids, mask


def test_backend_reports_the_manifest(backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path]) -> None:
    ort_backend, torch_backend = backends
    assert ort_backend.name == "onnxruntime-cpu" and ort_backend.providers[0] == "CPUExecutionProvider"
    assert ort_backend.max_seq_len == exported[0].cfg.max_seq_len
    assert ort_backend.sparsity_rows == torch_backend.sparsity_rows  # the same layer-major rows


def test_step0_matches_torch(backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path]) -> None:
    ort_backend, torch_backend = backends
    cfg = exported[0].cfg
    for B, S, seed in ((2, 1, 3), (1, 5, 0), (3, 40, 1), (8, 128, 2)):
        ids, mask = batch(cfg.vocab_size, cfg.mask_id, B, S, seed)
        got, want = ort_backend.step0(StepInput(ids, mask)), torch_backend.step0(StepInput(ids, mask))
        assert got.token_ids.dtype == np.int64 and got.sparsity.dtype == np.float32
        assert np.array_equal(got.token_ids, want.token_ids)
        np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-5)
        np.testing.assert_allclose(got.eos_prob, want.eos_prob, atol=1e-5)
        assert got.sparsity.shape == want.sparsity.shape == (B, 4 * cfg.n_layers, S)
        # Entries exactly at a threshold may flip one unit: fewer than 0.1% may differ.
        off = np.abs(got.sparsity - want.sparsity) > 1e-5
        assert off.mean() < 1e-3


def test_greedy_step_matches_torch(backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path]) -> None:
    ort_backend, torch_backend = backends
    cfg = exported[0].cfg
    ids, mask = batch(cfg.vocab_size, cfg.mask_id, 4, 33, 5)
    got, want = ort_backend.step(StepInput(ids, mask)), torch_backend.step(StepInput(ids, mask))
    assert np.array_equal(got.token_ids, want.token_ids)
    np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-5)
    # Without an attention mask every position is real: the same as an all-ones mask.
    assert np.array_equal(ort_backend.step(StepInput(ids, None)).token_ids, ort_backend.step(StepInput(ids, np.ones_like(ids))).token_ids)


def _exact_distribution(model: MaskPredictor, ids: np.ndarray, temperature: float) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)).logits.double()[0]
    return torch.softmax(logits / temperature, dim=-1).numpy()  # [S, V]


def _chi_square_z(counts: np.ndarray, expected: np.ndarray) -> float:
    """Wilson-Hilferty z of Pearson's statistic (bins with expected < 5 pooled); z > 3.7 means p < 1e-4."""
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat, dof = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1
    if dof == 0:  # one token takes all the mass
        return 0.0 if stat == 0 else math.inf
    return ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_sampling_draws_from_softmax_over_temperature(
    backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path], temperature: float
) -> None:
    """Fixed seeds: ORT's samples pass a chi-square test against softmax(l / T), as torch's Gumbel-max samples do."""
    ort_backend, torch_backend = backends
    model = exported[0]
    ids = np.array([[10, 15, 3, 1, 4, 1, 5, 13, 12, 12, 12, 12]])
    n = 3000
    exact = _exact_distribution(model, ids, temperature)
    rows = np.repeat(ids, n, axis=0)
    got = ort_backend.step(StepInput(rows, None, temperature=temperature, seed=1234)).token_ids
    ref = torch_backend.step(StepInput(rows, None, temperature=temperature, seed=1234)).token_ids
    V = exact.shape[-1]
    for s in range(ids.shape[1]):
        ort_counts = np.bincount(got[:, s], minlength=V)
        ref_counts = np.bincount(ref[:, s], minlength=V)
        assert _chi_square_z(ort_counts, n * exact[s]) < 3.7, f"position {s}"
        assert _chi_square_z(ref_counts, n * exact[s]) < 3.7, f"position {s} (torch reference)"
        # Same distribution as LLaDA's Gumbel-max: total variation between the two samples is small.
        assert 0.5 * np.abs(ort_counts - ref_counts).sum() / n < 0.08
    # Different seeds give different samples; the same seed gives the same ones.
    again = ort_backend.step(StepInput(rows[:50], None, temperature=temperature, seed=1234)).token_ids
    other = ort_backend.step(StepInput(rows[:50], None, temperature=temperature, seed=99)).token_ids
    assert np.array_equal(again, ort_backend.step(StepInput(rows[:50], None, temperature=temperature, seed=1234)).token_ids)
    assert not np.array_equal(again, other)


def test_sampled_tokens_are_the_inverse_cdf_of_the_uniforms(
    backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path]
) -> None:
    """Exact values: token = #{v : cdf[v] < u} with u from draw_uniform(seed), up to float32 rounding at a CDF edge."""
    ort_backend, _ = backends
    model = exported[0]
    ids, _ = batch(model.cfg.vocab_size, model.cfg.mask_id, 64, 20, 9)
    temps = np.linspace(0.3, 2.0, 64).astype(np.float32)
    out = ort_backend.step(StepInput(ids, None, temperature=temps, seed=77))  # type: ignore[arg-type]
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)).logits.double().numpy()
    cdf = np.cumsum(torch.softmax(torch.from_numpy(logits / temps[:, None, None].astype(np.float64)), -1).numpy(), -1)
    u = draw_uniform(77, ids.shape).astype(np.float64)
    want = np.minimum((cdf < u[..., None]).sum(-1), logits.shape[-1] - 1)
    near_edge = (np.abs(cdf - u[..., None]) < 1e-5).any(-1)
    assert np.array_equal(out.token_ids[~near_edge], want[~near_edge])
    assert near_edge.mean() < 1e-2
    # The confidence is the temperature-free log-probability of the sampled token.
    log_probs = torch.log_softmax(torch.from_numpy(logits).double(), -1).numpy()
    want_conf = np.take_along_axis(log_probs, out.token_ids[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.confidence, want_conf, atol=1e-5, rtol=1e-5)


def test_temperature_zero_rows_stay_greedy_in_a_sampling_batch(
    backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path]
) -> None:
    ort_backend, torch_backend = backends
    cfg = exported[0].cfg
    ids, mask = batch(cfg.vocab_size, cfg.mask_id, 6, 16, 3)
    temps = np.array([0.0, 1.0, 0.0, 2.0, 0.0, 1.0], dtype=np.float32)
    out = ort_backend.step(StepInput(ids, mask, temperature=temps, seed=5))  # type: ignore[arg-type]
    greedy = torch_backend.step(StepInput(ids, mask)).token_ids
    assert np.array_equal(out.token_ids[temps == 0], greedy[temps == 0])
    assert not np.array_equal(out.token_ids[temps > 0], greedy[temps > 0])


def test_whole_generations_equal_the_torch_reference(exported: tuple[MaskPredictor, Path], backends: tuple[OrtBackend, TorchBackend]) -> None:
    model, _ = exported
    ort_backend, torch_backend = backends
    cfg = model.cfg
    prompts = [[10, 15, 3, 1, 4, 13], [10, 16, 2, 7, 1, 8, 2, 8, 1, 8, 13], [10, 17, 5, 13]]
    for config in (GenerationConfig(gen_length=24, steps=24), GenerationConfig(gen_length=32, steps=16, block_length=8)):
        want = generate(model, prompts, config).tokens.numpy()
        got = run_generation(ort_backend, prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id))
        assert np.array_equal(got.tokens, want)
    # Seer's cut with the tail kept in view as committed EOS (tail_context): ONNX Runtime's tokens are torch's too.
    config, kept = GenerationConfig(gen_length=24, steps=24), [5, 9, 24]
    for context in (3, "all"):
        seer = SeerConfig(tail_context=context)
        want = generate(model, prompts, config, kept_lengths=kept, seer=seer).tokens.numpy()
        got = run_generation(ort_backend, prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id), kept_lengths=kept,
                             seer=seer)
        assert np.array_equal(got.tokens, want) and got.seer is not None
        assert [r.context for r in got.seer] == ([3, 3, 0] if context == 3 else [19, 15, 0])
    # random remasking: the host draws the scores, so ORT and torch agree for the same loop seed.
    config = GenerationConfig(gen_length=16, steps=8, remasking="random")
    a = run_generation(ort_backend, prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id), seed=3)
    b = run_generation(torch_backend, prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id), seed=3)
    assert np.array_equal(a.tokens, b.tokens)


def test_too_long_or_malformed_inputs_are_config_errors(backends: tuple[OrtBackend, TorchBackend]) -> None:
    ort_backend, _ = backends
    too_long = np.zeros((1, ort_backend.max_seq_len + 1), dtype=np.int64)
    with pytest.raises(ConfigError, match="max_seq_len 128.*--max-seq-len"):
        ort_backend.step0(StepInput(too_long, None))
    with pytest.raises(ConfigError, match="max_seq_len"):
        ort_backend.step(StepInput(too_long, None))
    with pytest.raises(ConfigError, match="2-D integer"):
        ort_backend.step(StepInput(np.zeros((4,), dtype=np.int64), None))
    with pytest.raises(ConfigError, match="attention_mask has shape"):
        ort_backend.step(StepInput(np.zeros((2, 4), dtype=np.int64), np.ones((2, 5))))
    with pytest.raises(ConfigError, match="temperature"):
        ort_backend.step(StepInput(np.zeros((1, 4), dtype=np.int64), None, temperature=-1.0))


def test_damaged_exports_are_refused(exported: tuple[MaskPredictor, Path], tmp_path: Path) -> None:
    _, out = exported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "step.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ArtifactError, match="modified after export"):
        OrtBackend(copy, CPU)
    shutil.copyfile(out / "step.onnx", copy / "step.onnx")
    with open(copy / "weights.bin", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(ArtifactError, match="truncated"):
        OrtBackend(copy, CPU)
    (copy / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="not a seer-deploy export"):
        OrtBackend(copy, CPU)
    with pytest.raises(ArtifactError, match="does not exist"):
        OrtBackend(tmp_path / "nowhere", CPU)


def test_shared_weights_give_the_same_outputs_from_one_copy(
    backends: tuple[OrtBackend, TorchBackend], exported: tuple[MaskPredictor, Path]
) -> None:
    import onnx

    ort_backend, _ = backends
    model, out = exported
    assert ort_backend.options.shares_weights()  # the default on the CPU
    own_copy = OrtBackend(out, OrtSessionOptions(providers=("CPUExecutionProvider",), share_weights=False))
    ids, mask = batch(model.cfg.vocab_size, model.cfg.mask_id, 3, 30, 4)
    for a, b in zip(own_copy.step0(StepInput(ids, mask)), ort_backend.step0(StepInput(ids, mask)), strict=True):
        if a is None or b is None:  # what a pass without the prompt cache does not return (kv)
            assert a is b
            continue
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(own_copy.step(StepInput(ids, mask, 1.0, 3)).token_ids,
                                  ort_backend.step(StepInput(ids, mask, 1.0, 3)).token_ids)
    # One OrtValue per distinct tensor of weights.bin, each a view of the one memory map.
    step_refs = {
        (e.value for e in init.external_data if e.key == "offset").__next__()
        for init in onnx.load(str(out / "step.onnx"), load_external_data=False).graph.initializer
        if init.data_location == onnx.TensorProto.EXTERNAL
    }
    assert len(ort_backend.weights.values) == len(step_refs) > 0 and not own_copy.weights.values
    with pytest.raises(ConfigError, match="share_weights needs the CPU provider"):
        OrtBackend(out, OrtSessionOptions(providers=("AzureExecutionProvider", "CPUExecutionProvider"), share_weights=True))


def test_session_options(tmp_path: Path) -> None:
    import onnxruntime as ort

    default = OrtSessionOptions().resolved_providers()
    assert default[-1] == "CPUExecutionProvider"
    assert ("CUDAExecutionProvider" in default) == ("CUDAExecutionProvider" in ort.get_available_providers())
    with pytest.raises(ConfigError, match="not available"):
        OrtSessionOptions(providers=("NoSuchExecutionProvider",)).resolved_providers()
    with pytest.raises(ConfigError, match="graph_optimization"):
        OrtSessionOptions(graph_optimization="max").session_options()  # type: ignore[arg-type]
    so = OrtSessionOptions(intra_op_threads=2, graph_optimization="basic").session_options()
    assert so.intra_op_num_threads == 2 and so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.get_session_config_entry(PARALLEL_PREPACK) == "1"  # quantized weights prepacked on every thread
    # On the CPU no memory pattern (it held a repeated shape's activations twice: tests/test_footprint.py).
    assert not OrtSessionOptions(providers=("CPUExecutionProvider",)).session_options().enable_mem_pattern


@pytest.mark.slow
@requires_demo
def test_demo_generations_match_torch_on_a_batch_of_50_prompts(shared_demo_export: Callable[[str], Path]) -> None:
    """The bundled demo, exported: a batch of 50 held-out prompts, four tokens committed per step, through ORT gives
    the torch reference's tokens exactly (test_demo_parity runs 200 prompts in batches of 1 and 8, Seer on and off,
    two tokens per step)."""
    start = time.perf_counter()
    export = shared_demo_export("demo")
    ckpt = load_checkpoint("demo")
    cfg = ckpt.config
    tok = Tokenizer.from_checkpoint(ckpt.path, cfg.eos_id, cfg.eot_id)
    prompts = [tok.encode_prompt(ex.prompt) for ex in heldout_examples(50)]
    config = GenerationConfig(gen_length=64, steps=16)
    backend = OrtBackend(export, CPU)
    pad = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    for lo in range(0, len(prompts), 50):
        chunk = prompts[lo : lo + 50]
        want = generate(ckpt.model, chunk, config).tokens.numpy()
        got = run_generation(backend, chunk, config, ids=SpecialIds(mask=cfg.mask_id, pad=pad)).tokens
        assert np.array_equal(got, want), f"prompts {lo}..{lo + len(chunk) - 1}"
    assert json.loads((export / "manifest.json").read_text())["model"]["source"] == "demo"
    print(f"demo parity: {len(prompts)} prompts in {time.perf_counter() - start:.1f}s")
