"""The bundled demo, exported and built into an ONNX Runtime engine dir: on 200 held-out prompts its tokens equal
the torch reference loop's, Seer on and off, in batches of 8 (rows of mixed kept lengths, hybrid scheduling with the
default cost model and with every row merged) and, on the first 100, one prompt at a time.

The reference is `reference.generate` on left-padded batches of 25 prompts, itself checked against each of the first
24 prompts run alone; ONNX Runtime runs them in 1s and 8s, so a row's tokens do not depend on the rows it shares a
batch with. (tests/test_ort_backend.py checks whole batches of 50 without Seer.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_demo

from seer_deploy.cli.demo import export_options
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.backend import Backend, StepInput
from seer_deploy.core.generation import GenerationConfig, SpecialIds, left_pad
from seer_deploy.engines.build import BuildOptions, build_engines
from seer_deploy.engines.ort import OrtSessionOptions
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.runtime.loop import LoopOptions, run_generation
from seer_deploy.runtime.openers import open_target
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.scheduler import StepCost
from seer_deploy.runtime.targets import TargetInfo, find_seer_config
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

pytestmark = [pytest.mark.slow, requires_demo]
CONFIG = GenerationConfig(gen_length=64, steps=32)
N = 200


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, shared_demo_export: Callable[[str], Path]
           ) -> tuple[Backend, TargetInfo]:
    """The demo exported with the export's defaults (the run's shared export) and built into an engine dir (ONNX
    Runtime, CPU), opened as a target."""
    assert export_options() == ExportOptions()  # what the shared export was made with
    engine = tmp_path_factory.mktemp("demo-parity") / "engine"
    session = OrtSessionOptions(providers=("CPUExecutionProvider",))
    build_engines(shared_demo_export("demo"), engine, BuildOptions(backend="ort", ort_session=session))
    return open_target(str(engine))


@pytest.fixture(scope="module")
def prompts(engine: tuple[Backend, TargetInfo]) -> list[list[int]]:
    tok = engine[1].tokenizer()
    return [tok.encode_prompt(ex.prompt) for ex in heldout_examples(N)]


@pytest.fixture(scope="module")
def seer(engine: tuple[Backend, TargetInfo]) -> SeerConfig:
    """The shipped config with the paper's cut (tail context 0): rows of a batch keep different widths, which is what
    the scheduler must get right. The shipped tail context ('all') is checked on its own below."""
    return (find_seer_config(engine[1].path) or SeerConfig()).with_(tail_context=0)


REFERENCE_BATCH = 25  # the torch reference runs left-padded batches of this many prompts
SOLO = 24  # prompts also run alone: their batched reference rows must equal them
ONE_AT_A_TIME = 100  # ONNX Runtime at batch 1 runs the first this many (a call per prompt and step); batch 8 all N


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]], seer: SeerConfig) -> dict[str, tuple[np.ndarray, list[int]]]:
    """The torch reference loop's tokens [N, 64] and kept lengths, Seer off and on: left-padded batches of 25 (a
    row's tokens do not depend on its batch mates: checked against solo runs of the first 24 prompts, and the
    ORT runs below batch them in 1s and 8s, Seer's groups differently again)."""
    model = load_checkpoint("demo").model
    out = {}
    for name, config in (("off", None), ("on", seer)):
        rows, kept = [], []
        for lo in range(0, len(prompts), REFERENCE_BATCH):
            result = generate(model, prompts[lo : lo + REFERENCE_BATCH], CONFIG, seer=config)
            rows.append(result.tokens.numpy())
            n = result.tokens.shape[0]
            kept.extend([r.kept for r in result.seer] if result.seer else [CONFIG.gen_length] * n)
        out[name] = (np.concatenate(rows), kept)
    return out


@pytest.mark.parametrize("use_seer", [False, True], ids=["seer-off", "seer-on"])
def test_the_batched_reference_is_the_solo_reference(
    prompts: list[list[int]], seer: SeerConfig, reference: dict[str, tuple[np.ndarray, list[int]]], use_seer: bool
) -> None:
    model = load_checkpoint("demo").model
    want, want_kept = reference["on" if use_seer else "off"]
    for i, p in enumerate(prompts[:SOLO]):
        alone = generate(model, [p], CONFIG, seer=seer if use_seer else None)
        assert np.array_equal(alone.tokens[0].numpy(), want[i]), i
        assert (alone.seer[0].kept if alone.seer else CONFIG.gen_length) == want_kept[i]


def run_all(backend: Backend, info: TargetInfo, prompts: list[list[int]], batch: int, seer: SeerConfig | None,
            cost: StepCost | None = None) -> tuple[np.ndarray, list[int]]:
    rows, kept = [], []
    for lo in range(0, len(prompts), batch):
        out = run_generation(backend, prompts[lo : lo + batch], CONFIG, ids=SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id), seer=seer, options=LoopOptions(cost=cost))
        rows.append(out.tokens)
        kept.extend([r.kept for r in out.seer] if out.seer else [CONFIG.gen_length] * out.tokens.shape[0])
    return np.concatenate(rows), kept


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("use_seer", [False, True], ids=["seer-off", "seer-on"])
def test_onnx_runtime_tokens_equal_the_torch_reference(
    engine: tuple[Backend, TargetInfo], prompts: list[list[int]], seer: SeerConfig,
    reference: dict[str, tuple[np.ndarray, list[int]]], batch: int, use_seer: bool,
) -> None:
    backend, info = engine
    assert backend.name == "onnxruntime-cpu"
    want, want_kept = reference["on" if use_seer else "off"]
    n = ONE_AT_A_TIME if batch == 1 else N
    start = time.perf_counter()
    got, kept = run_all(backend, info, prompts[:n], batch, seer if use_seer else None)
    bad = [i for i in range(n) if not np.array_equal(got[i], want[i])]
    assert not bad, f"{len(bad)} of {n} prompts differ, first {bad[:5]}"
    assert kept == want_kept[:n]
    if use_seer:
        assert min(kept) < CONFIG.gen_length  # Seer cut the answers
        if batch > 1:  # batches really mixed kept lengths
            assert max(len(set(kept[lo : lo + batch])) for lo in range(0, n, batch)) >= 3
    print(f"batch {batch}, seer {use_seer}: {time.perf_counter() - start:.1f}s")


def test_the_shipped_tail_context_gives_the_torch_reference_tokens(
    engine: tuple[Backend, TargetInfo], prompts: list[list[int]]
) -> None:
    """The shipped config as the engine reads it (the cut tail in view as committed EOS): batches of 8 through ONNX
    Runtime give each prompt's solo torch tokens, on the first 64 prompts."""
    backend, info = engine
    shipped = find_seer_config(info.path)
    assert shipped is not None and shipped.tail_context == "all"
    model = load_checkpoint("demo").model
    n = 64
    want = np.stack([generate(model, [p], CONFIG, seer=shipped).tokens[0].numpy() for p in prompts[:n]])
    got, kept = run_all(backend, info, prompts[:n], 8, shipped)
    bad = [i for i in range(n) if not np.array_equal(got[i], want[i])]
    assert not bad, f"{len(bad)} of {n} prompts differ, first {bad[:5]}"
    assert min(kept) < CONFIG.gen_length  # answers were cut, and their tails ran as context


def test_step_zero_statistics_agree_with_torch(engine: tuple[Backend, TargetInfo], prompts: list[list[int]]) -> None:
    """Step zero on all 200 prompts, batches of 8: ORT's sparsity rows within 1e-4 of torch's except entries where a
    unit sits exactly at a threshold (a whole 1/hidden step, fewer than 0.1% of entries); EOS probability and the
    commit score within 1e-4; the same tokens."""
    backend, info = engine
    model = load_checkpoint("demo").model
    torch_backend = TorchBackend(model, ExportManifest.load(info.export_dir).seer)  # the statistics the export carries
    assert torch_backend.sparsity_rows == backend.sparsity_rows
    bad = total = 0
    for lo in range(0, N, 8):
        ids, mask = left_pad(prompts[lo : lo + 8], info.pad_id)
        x = np.concatenate([ids, np.full((ids.shape[0], CONFIG.gen_length), info.mask_id)], axis=1)
        m = np.concatenate([mask, np.ones((ids.shape[0], CONFIG.gen_length), np.int64)], 1)
        got, want = backend.step0(StepInput(x, m)), torch_backend.step0(StepInput(x, m))
        real = m.astype(bool)
        assert np.array_equal(got.token_ids[real], want.token_ids[real])
        np.testing.assert_allclose(got.eos_prob[real], want.eos_prob[real], atol=1e-4)
        np.testing.assert_allclose(got.confidence[real], want.confidence[real], atol=1e-4)
        diff = np.abs(got.sparsity - want.sparsity).transpose(0, 2, 1)[real]  # [real positions, K]
        off = diff > 1e-4
        # What differs is a unit flipping across a threshold: a multiple of 1/hidden, not drift.
        steps = diff[off] * model.cfg.mlp_hidden
        assert np.allclose(steps, np.round(steps), atol=1e-2), diff[off][:5]
        bad += int(off.sum())
        total += off.size
    assert bad < 1e-3 * total, f"{bad} of {total} entries differ by more than 1e-4"


def test_merging_every_row_keeps_the_tokens(
    engine: tuple[Backend, TargetInfo], prompts: list[list[int]], seer: SeerConfig,
    reference: dict[str, tuple[np.ndarray, list[int]]],
) -> None:
    """The cost model forced to merge: each batch of 8 runs as one group, padded to its longest kept length."""
    backend, info = engine
    got, kept = run_all(backend, info, prompts, 8, seer, cost=StepCost(a=1.0, b=1e-9))
    want, want_kept = reference["on"]
    bad = [i for i in range(N) if not np.array_equal(got[i], want[i])]
    assert not bad, f"{len(bad)} of {N} prompts differ, first {bad[:5]}"
    assert kept == want_kept


def test_demo_command_runs_the_whole_path(tmp_path_factory: pytest.TempPathFactory,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`seer-deploy demo`: export, build, Seer and full-length runs through the engine, answers and the comparison."""
    from seer_deploy.cli import main
    from seer_deploy.cli.demo import DEMO_PROMPTS

    work = tmp_path_factory.mktemp("demo-cli")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--repeats", "1", "--work-dir", str(work)])
    out = capsys.readouterr()
    assert exit_info.value.code in (0, None), out.err
    lines = out.out.splitlines()
    for prompt in DEMO_PROMPTS:
        assert any(line.strip().startswith(prompt) and "->" in line and "kept" in line for line in lines), prompt
    table = {line.split()[0]: line.split()[1:] for line in lines if line.split()[:1] in (["full"], ["seer"])}
    full_tokens, seer_tokens = int(table["full"][2]), int(table["seer"][2])
    assert seer_tokens < full_tokens
    assert any(line.startswith("speedup") for line in lines)
    for stage in ("export:", "build:", "load:", "generate 1/1"):
        assert stage in out.err
    assert (work / "export" / "engine" / "engine.json").is_file()
