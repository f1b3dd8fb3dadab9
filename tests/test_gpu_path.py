"""The GPU path's parts that run on a CPU: IO binding (same tokens as `session.run`), fixed call shapes (padding
keeps every real position's result), the CUDA-graph switch and the --device flag. The CUDA runs themselves are in
the tests at the end, which skip without a GPU, and in scripts/gpu_check.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run
from test_multimodal import pictures, write_tiny_vl

from seer_deploy.contracts.graph_calls import scoring_feed
from seer_deploy.contracts.graphs import PROMPT_STEP, STEP, WINDOW_STEP
from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines import ort as ort_engine
from seer_deploy.engines.fixed_shapes import FixedShapes, pad_feed, unpad_outputs
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.engines.ort_sessions import CUDA_GRAPH_OPTION
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.targets import parse_device
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import Prompt, SeerOptions, Service, ServiceOptions, TargetOptions

CPU = "CPUExecutionProvider"
PLAIN = OrtSessionOptions(providers=(CPU,))
BOUND = OrtSessionOptions(providers=(CPU,), io_binding=True)
PADDED = OrtSessionOptions(providers=(CPU,), io_binding=True, seq_multiple=16)
PROMPTS = [[10, 3, 5, 2, 17], [10, 8, 17], [10, 1, 2, 3, 4, 5, 6, 17]]
CUDA_ORT = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path]:
    """A tiny random model (grouped-query attention, weights large enough that tokens differ by position), exported
    with the KV cache graphs."""
    root = tmp_path_factory.mktemp("gpu-path")
    write_tokenizer(root / "tokenizer.json")
    model = MaskPredictor(tiny_config(n_kv_heads=1))
    torch.manual_seed(5)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ckpt = save_checkpoint(model, root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    out = export_checkpoint(ckpt, root / "export", ExportOptions(kv_cache=True, verify=False)).out
    return load_checkpoint(ckpt).model, out


@pytest.mark.parametrize(
    "config",
    [GenerationConfig(24, 24), GenerationConfig(24, 24, block_length=8, kv_cache=True, decode="threshold",
                                                threshold=0.3)],
    ids=["fixed", "threshold-cached"],
)
@pytest.mark.parametrize("truncation", ["full", "seer", "mixed-kept"])
def test_io_binding_gives_the_tokens_of_session_run(exported: tuple[MaskPredictor, Path], config: GenerationConfig,
                                                    truncation: str) -> None:
    """IO binding, with and without padded call shapes, against plain `session.run`: token for token, and the
    padded runner binds fewer shapes than there were calls."""
    model, out = exported
    cfg = model.cfg
    seer = SeerConfig(detector="eos", eos_floor=0.0) if truncation == "seer" else None
    kept = [5, 24, 11] if truncation == "mixed-kept" else None
    backends = [OrtBackend(out, options) for options in (PLAIN, BOUND, PADDED)]
    runs = [run_generation(b, PROMPTS, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id), seer=seer,
                           kept_lengths=kept) for b in backends]
    assert np.array_equal(runs[0].tokens, runs[1].tokens)
    assert np.array_equal(runs[0].tokens, runs[2].tokens)
    assert backends[0].bound_shapes == {}
    assert sum(backends[1].bound_shapes.values()) > 0
    # Padded shapes: every sequence of these calls rounds to 16 or 32 columns, at most two batch sizes.
    assert all(n <= 6 for n in backends[2].bound_shapes.values()), backends[2].bound_shapes


@pytest.mark.parametrize("truncation", ["full", "mixed-kept"])
def test_device_resident_kv_cache_gives_the_host_cache_tokens(exported: tuple[MaskPredictor, Path],
                                                               truncation: str) -> None:
    """The KV cache kept as torch tensors where the engine runs (a GPU there; the CPU here): the runtime gathers and
    updates its rows without a host copy, and the tokens are the host cache's, on torch and on ONNX Runtime."""
    model, out = exported
    cfg = model.cfg
    config = GenerationConfig(24, 24, block_length=8, kv_cache=True, decode="threshold", threshold=0.3)
    kept = [5, 24, 11] if truncation == "mixed-kept" else None
    device = OrtSessionOptions(providers=(CPU,), io_binding=True, device_cache=True)
    backends = [OrtBackend(out, PLAIN), OrtBackend(out, device), TorchBackend(model, device_cache=False),
                TorchBackend(model, device_cache=True)]
    ids = np.array([PROMPTS[0] + [cfg.mask_id] * 8])
    kinds = [type(b.refresh(StepInput(ids)).kv) for b in backends]
    assert kinds == [np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]
    runs = [run_generation(b, PROMPTS, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id),
                           kept_lengths=kept) for b in backends]
    for other in runs[1:]:
        assert np.array_equal(runs[0].tokens, other.tokens)


def test_padding_keeps_step_zero_outputs(exported: tuple[MaskPredictor, Path]) -> None:
    """Step zero through padded shapes: the same tokens, statistics and probabilities for the real positions."""
    model, out = exported
    ids = np.array([[10, 3, 5, 2, 17] + [model.cfg.mask_id] * 9, [1, 1, 10, 8, 17] + [model.cfg.mask_id] * 9])
    mask = np.ones_like(ids)
    mask[1, :2] = 0
    plain, padded = (OrtBackend(out, o).step0(StepInput(ids, mask)) for o in (PLAIN, PADDED))
    assert np.array_equal(plain.token_ids, padded.token_ids)
    for field in ("confidence", "eos_prob", "sparsity", "score"):
        a, b = getattr(plain, field), getattr(padded, field)
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_io_binding_on_a_multimodal_export(tmp_path: Path) -> None:
    """Pictures too: the image table is one more bound input."""
    ckpt, _, _ = write_tiny_vl(tmp_path / "vl", seed=3)
    out = export_multimodal(ckpt, tmp_path / "export", ExportOptions(verify=False)).out
    for i, picture in enumerate(pictures(2)):
        picture.save(tmp_path / f"pic{i}.png")
    requests = [Prompt("<image> colors", (str(tmp_path / "pic0.png"),)),
                Prompt("<image> count", (str(tmp_path / "pic1.png"),))]
    answers = []
    for binding in (False, True):
        options = ServiceOptions(generation=GenerationConfig(16, 16), target=TargetOptions(io_binding=binding),
                                 seer=SeerOptions(on=False))
        answers.append([a.tokens for a in Service(out, options).generate(requests).answers])
    assert answers[0] == answers[1]


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 5), seq=st.integers(1, 40), multiple=st.integers(1, 16), max_batch=st.integers(1, 8))
def test_fixed_shapes_pad_and_cut_back(batch: int, seq: int, multiple: int, max_batch: int) -> None:
    shapes = FixedShapes(multiple, max_seq=40, max_batch=max_batch)
    to_batch, to_seq = shapes.batch(batch), shapes.seq(seq)
    assert to_batch >= batch and to_seq >= seq and to_seq <= 40
    assert to_seq % multiple == 0 or to_seq == 40
    # A power of two, capped at the engine's max batch (never below the call's own batch).
    assert to_batch == max(batch, min(1 << (batch - 1).bit_length(), max_batch))
    rng = np.random.default_rng(batch * 100 + seq)
    feed = {"input_ids": rng.integers(0, 50, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64),
            "temperature": rng.random(batch).astype(np.float32),
            "sample_uniform": rng.random((batch, seq)).astype(np.float32),
            "candidates": np.sort(rng.integers(0, seq, (batch, max(1, seq // 2))), axis=1),
            "with_stats": np.ones(batch, np.int64), **scoring_feed(batch, None)}
    padded = pad_feed(STEP, feed, to_batch, to_seq)
    assert padded["input_ids"].shape == (to_batch, to_seq) and padded["temperature"].shape == (to_batch,)
    # Candidates grow to the padded length by repeating each row's last one: real columns only, computed twice.
    cands = padded["candidates"]
    assert cands.shape == (to_batch, to_seq) and np.array_equal(cands[:batch, : feed["candidates"].shape[1]],
                                                                feed["candidates"])
    assert (cands[:batch, feed["candidates"].shape[1] :] == feed["candidates"][:, -1:]).all()
    assert not padded["attention_mask"][:, seq:].any()  # new columns are out of attention
    assert np.array_equal(padded["input_ids"][batch:, :seq], np.repeat(feed["input_ids"][:1], to_batch - batch, 0))
    outputs = {"token_ids": padded["input_ids"], "confidence": padded["sample_uniform"]}
    cut = unpad_outputs(STEP, outputs, batch, seq)
    assert np.array_equal(cut["token_ids"], feed["input_ids"])
    assert np.array_equal(cut["confidence"], feed["sample_uniform"])


def test_window_graph_padding_leaves_the_window_axis() -> None:
    kv = np.ones((2, 2, 3, 1, 10, 4), np.float32)
    feed = {"window_ids": np.ones((3, 4), np.int64), "attention_mask": np.ones((3, 10), np.int64),
            "window_start": np.zeros(3, np.int64), "kv": kv, "temperature": np.zeros(3, np.float32),
            "sample_uniform": np.ones((3, 4), np.float32)}
    padded = pad_feed(WINDOW_STEP, feed, 4, 16)
    assert padded["window_ids"].shape == (4, 4) and padded["kv"].shape == (2, 2, 4, 1, 16, 4)
    assert not padded["kv"][..., 10:, :].any()


def test_same_shaped_calls_share_one_bound_buffer_set(exported: tuple[MaskPredictor, Path]) -> None:
    """What a CUDA graph per shape relies on: calls that round to one shape reuse one buffer set (one graph id)."""
    model, out = exported
    backend = OrtBackend(out, PADDED)
    for width in (9, 12, 16, 17):
        backend.step(StepInput(np.full((3, width), model.cfg.mask_id)))
    assert backend.bound_shapes[STEP.name] == 2  # 9, 12, 16 -> 16 columns; 17 -> 32; batch 3 -> 4


def test_cuda_graph_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """--cuda-graph: refused without CUDA; with it, only the every-step graphs' sessions ask ONNX Runtime to capture."""
    with pytest.raises(ConfigError, match="--cuda-graph needs the CUDA provider"):
        OrtSessionOptions(providers=(CPU,), cuda_graph=True).check()
    monkeypatch.setattr(ort_engine.ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", CPU])
    options = OrtSessionOptions(cuda_graph=True, device_id=1)
    options.check()
    step = options.provider_entries(cuda_graph=True)
    assert step[0] == ("CUDAExecutionProvider", {"device_id": "1", CUDA_GRAPH_OPTION: "1"}) and step[1] == CPU
    assert options.provider_entries(cuda_graph=False)[0] == ("CUDAExecutionProvider", {"device_id": "1"})
    plain = OrtSessionOptions(device_id=0).provider_entries(cuda_graph=True)
    assert CUDA_GRAPH_OPTION not in plain[0][1]  # the option off: no capture anywhere
    assert {STEP.name, WINDOW_STEP.name, PROMPT_STEP.name} == ort_engine.EVERY_STEP


def test_a_device_resident_cache_keeps_the_window_graph_out_of_capture(exported: tuple[MaskPredictor, Path]) -> None:
    """The window steps of a device-resident cache bind fresh addresses each call, which a captured CUDA graph would
    not follow: only the step graph is captured then."""
    _, out = exported
    kept = OrtBackend(out, OrtSessionOptions(providers=(CPU,), io_binding=True, device_cache=True))
    host = OrtBackend(out, BOUND)
    assert kept.captured_graphs == {STEP.name} and host.captured_graphs == ort_engine.EVERY_STEP
    assert kept.device_cache and not host.device_cache  # on a CPU the cache stays on the host unless asked


def test_parse_device() -> None:
    assert parse_device(None) == ("default", 0)
    assert parse_device("cpu") == ("cpu", 0)
    assert parse_device("cuda") == ("cuda", 0)
    assert parse_device("CUDA:3") == ("cuda", 3)
    for bad in ("gpu", "cuda:x", "cpu:1", ""):
        with pytest.raises(ConfigError, match="is not a device"):
            parse_device(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--device", "tpu"], "--device 'tpu' is not a device"),
        (["demo", "--io-binding"], "--io-binding sets ONNX Runtime sessions"),
        (["demo", "--cuda-graph"], "--cuda-graph sets ONNX Runtime sessions"),
        (["EXPORT", "--cuda-graph", "--provider", CPU], "--cuda-graph needs the CUDA provider"),
        (["EXPORT", "--device", "cpu", "--provider", "CUDAExecutionProvider"], "--device cpu and --provider"),
    ],
)
def test_gpu_flags_are_refused_with_the_fix(exported: tuple[MaskPredictor, Path], capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    _, out = exported
    argv = [str(out) if a == "EXPORT" else a for a in argv]
    code, stdout, err = run(["generate", *argv, "-p", "sort 31415"], capsys)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["generate", "demo", "--device", "cuda", "-p", "sort 31415"], capsys)
    assert code == 2 and "sees no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_device_cpu_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    answers = [run(["generate", "demo", "-p", "sort 31415", "--gen-length", "32", *flag], capsys)[1]
               for flag in ([], ["--device", "cpu"])]
    assert answers[0] == answers[1] and "->" in answers[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.py runs it there)")
def test_torch_on_cuda_gives_the_cpu_tokens() -> None:
    requests = [Prompt(p) for p in ("sort 31415", "reverse 2718281", "add 12 34")]
    answers = [[a.tokens for a in Service("demo", ServiceOptions(generation=GenerationConfig(64, 64),
                                                                 target=TargetOptions(device=d)))
                .generate(requests).answers] for d in ("cpu", "cuda")]
    assert answers[0] == answers[1]


@pytest.mark.skipif(not CUDA_ORT, reason="needs onnxruntime-gpu on a CUDA GPU (scripts/gpu_check.py runs it there)")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_ort_cuda_with_io_binding_gives_the_cpu_tokens(exported: tuple[MaskPredictor, Path], cuda_graph: bool) -> None:
    model, out = exported
    cfg = model.cfg
    config = GenerationConfig(24, 24)
    cuda = OrtSessionOptions(providers=("CUDAExecutionProvider", CPU), io_binding=True, cuda_graph=cuda_graph)
    runs = [run_generation(OrtBackend(out, o), PROMPTS, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id), kept_lengths=[5, 24, 11]) for o in (PLAIN, cuda)]
    assert np.array_equal(runs[0].tokens, runs[1].tokens)
