"""The block-wise KV cache: the model's window pass, the cache graphs of an export, and whole generations of the
cached loop on ONNX Runtime against the cached loop on torch, token for token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config, tiny_model
from test_cli import run
from test_multimodal import pictures, write_tiny_vl

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.backend import StepInput, WindowInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import Prompt, SeerOptions, Service, ServiceOptions

CPU = OrtSessionOptions(providers=("CPUExecutionProvider",))
CACHE = ExportOptions(kv_cache=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path, Path]:
    """A tiny random checkpoint with grouped-query attention, exported with the cache graphs."""
    root = tmp_path_factory.mktemp("kv")
    write_tokenizer(root / "tokenizer.json")
    model = MaskPredictor(tiny_config(n_kv_heads=1))
    torch.manual_seed(2)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ckpt = save_checkpoint(model, root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    return load_checkpoint(ckpt).model, ckpt, export_checkpoint(ckpt, root / "export", CACHE).out


@pytest.mark.parametrize("gqa", [False, True])
def test_a_window_against_a_fresh_cache_is_the_full_pass(gqa: bool) -> None:
    model = MaskPredictor(tiny_config(n_kv_heads=1)) if gqa else tiny_model(1)
    ids = torch.randint(0, 15, (3, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, 11:] = 0  # right padding, as a group of rows with different kept lengths has
    with torch.no_grad():
        full = model(ids, mask, return_kv=True)
        assert full.kv is not None and full.kv.shape == (2, 2, 3, model.cfg.n_kv_heads, 14, model.cfg.head_dim)
        start = torch.tensor([6, 9, 4])
        columns = start[:, None] + torch.arange(5)
        window = model.forward_window(ids.gather(1, columns), mask, start, full.kv)
    want = full.logits.gather(1, columns[..., None].expand(-1, -1, full.logits.shape[-1]))
    real = mask.gather(1, columns).bool()
    assert torch.allclose(window[real], want[real], atol=1e-5)


def test_the_window_uses_the_cache_for_the_rest_of_the_sequence() -> None:
    """Changing a token outside the window changes nothing unless the cache is refreshed: the window reads kv."""
    model = tiny_model(2)
    ids = torch.randint(0, 15, (1, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 10, dtype=torch.long)
    start = torch.tensor([6])
    with torch.no_grad():
        kv = model(ids, mask, return_kv=True).kv
        assert kv is not None
        changed = ids.clone()
        changed[0, 1] = (changed[0, 1] + 1) % 15
        stale = model.forward_window(changed[:, 6:], mask, start, kv)
        fresh_kv = model(changed, mask, return_kv=True).kv
        assert fresh_kv is not None
        fresh = model.forward_window(changed[:, 6:], mask, start, fresh_kv)
        same = model.forward_window(ids[:, 6:], mask, start, kv)
    assert torch.equal(stale, same)
    assert not torch.allclose(stale, fresh)


def test_export_with_the_cache_graphs(exported: tuple[MaskPredictor, Path, Path]) -> None:
    _, _, out = exported
    manifest = ExportManifest.load(out)
    assert manifest.has_cache and manifest.has_prompt_cache  # the step graph refreshes and prefills
    assert set(manifest.graphs) == {"step", "window_step", "prompt_step"}
    assert (out / "step.onnx").is_file() and (out / "window_step.onnx").is_file()
    assert manifest.verified and {"refresh kv (relative)", "prompt_step confidence"} <= set(
        manifest.extra["validation"]["max_diff"])
    kv = manifest.graphs["step"].outputs["kv"]
    cfg = manifest.model_config()
    assert kv.shape == [cfg.n_layers, 2, "batch", cfg.n_kv_heads, "seq", cfg.head_dim]


def test_ort_cache_graphs_equal_torch(exported: tuple[MaskPredictor, Path, Path]) -> None:
    model, _, out = exported
    ort, ref = OrtBackend(out, CPU), TorchBackend(model)
    ids = np.random.default_rng(0).integers(0, 15, (2, 12))
    mask = np.ones((2, 12), dtype=np.int64)
    mask[1, :3] = 0
    got, want = ort.refresh(StepInput(ids, mask)), ref.refresh(StepInput(ids, mask))
    assert np.array_equal(got.token_ids, want.token_ids)
    assert np.allclose(got.kv, want.kv, atol=1e-5)
    window = WindowInput(ids[:, 8:], mask, np.array([8, 8]), want.kv)
    a, b = ort.window_step(window), ref.window_step(window)
    assert np.array_equal(a.token_ids, b.token_ids) and np.allclose(a.confidence, b.confidence, atol=1e-5)
    with pytest.raises(ConfigError, match="window_start"):
        ort.window_step(window._replace(window_start=np.array([8, 9])))


PROMPTS = [[10, 3, 5, 2, 17], [10, 8, 17], [10, 1, 2, 3, 4, 5, 6, 17], [10, 9, 9, 17]]


@pytest.mark.parametrize(
    "config",
    [
        GenerationConfig(24, 24, block_length=8, kv_cache=True),
        GenerationConfig(24, 24, block_length=8, kv_cache=True, decode="threshold", threshold=0.3),
        GenerationConfig(24, 12, block_length=8, kv_cache=True, temperature=0.0, decode="factor", factor=2.0),
    ],
    ids=["fixed", "threshold", "factor"],
)
@pytest.mark.parametrize("truncation", ["full", "seer", "mixed-kept"])
def test_cached_loop_on_ort_equals_torch(exported: tuple[MaskPredictor, Path, Path], config: GenerationConfig,
                                         truncation: str) -> None:
    model, _, out = exported
    cfg = model.cfg
    seer = SeerConfig(detector="eos", eos_floor=0.0) if truncation == "seer" else None
    kept = [5, 24, 11, 17] if truncation == "mixed-kept" else None
    runs = [
        run_generation(backend, PROMPTS, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id),
                       seer=seer, kept_lengths=kept)
        for backend in (TorchBackend(model), OrtBackend(out, CPU))
    ]
    assert np.array_equal(runs[0].tokens, runs[1].tokens)
    assert not np.any(runs[0].tokens == cfg.mask_id)
    if kept is not None:
        assert np.all(runs[0].tokens[0, 5:] == cfg.eos_id)


def test_the_cache_is_used(exported: tuple[MaskPredictor, Path, Path]) -> None:
    """With the cache, a block's later steps run only the block: far fewer positions than the uncached loop."""
    model, _, _ = exported
    cfg = model.cfg
    backend = TorchBackend(model)
    plain = GenerationConfig(32, 32, block_length=8)
    runs = [run_generation(backend, PROMPTS, c, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id))
            for c in (plain, GenerationConfig(32, 32, block_length=8, kv_cache=True))]
    assert runs[0].passes == runs[1].passes == 32
    assert runs[1].positions_computed < runs[0].positions_computed / 2


def test_cache_requests_are_refused_with_the_fix(tmp_path: Path, exported: tuple[MaskPredictor, Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    model, _, out = exported
    cfg = model.cfg
    # The same export as one made without --kv-cache: no window graph, none in its manifest.
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    (plain / manifest["graphs"].pop("window_step")["file"]).unlink()
    (plain / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="--kv-cache"):
        run_generation(OrtBackend(plain, CPU), PROMPTS, GenerationConfig(8, 8, kv_cache=True), ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id))
    with pytest.raises(ConfigError, match="cfg-scale"):
        run_generation(TorchBackend(model), PROMPTS, GenerationConfig(8, 8, kv_cache=True, cfg_scale=1.0),
                       ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id))
    code, _, err = run(["generate", str(plain), "-p", "reverse 12", "--gen-length", "8", "--kv-cache"], capsys)
    assert code != 0 and "export --kv-cache" in err and len(err.strip().splitlines()) == 1
    # A manifest with the window graph but a step graph that returns no keys and values is refused when it is read.
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["graphs"]["step"]["outputs"]["kv"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="returns no 'kv'"):
        ExportManifest.load(broken)


def test_generate_json_records_the_decoding(exported: tuple[MaskPredictor, Path, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, _, out = exported
    args = ["generate", str(out), "-p", "reverse 12", "-p", "sort 31", "--gen-length", "16", "--block-length", "8",
            "--decode", "threshold", "--threshold", "0.5", "--kv-cache", "--json", "--no-seer"]
    code, out_text, err = run(args, capsys)
    assert code == 0, err
    records = [json.loads(line) for line in out_text.splitlines()]
    assert [r["decode"] for r in records] == [{"rule": "threshold", "kv_cache": True, "prompt_cache": False,
                                               "threshold": 0.5, "block_length": 8}] * 2
    assert all(2 <= r["passes"] <= 16 for r in records)


def test_multimodal_cache_on_ort_equals_torch(tmp_path: Path) -> None:
    """The image tokens sit in the cached prefix: the cached loop over pictures, ORT against torch."""
    ckpt, _, _ = write_tiny_vl(tmp_path / "vl", seed=3)
    out = export_multimodal(ckpt, tmp_path / "export", ExportOptions(kv_cache=True, verify=False)).out
    assert ExportManifest.load(out).has_cache
    for i, picture in enumerate(pictures(2)):
        picture.save(tmp_path / f"pic{i}.png")
    requests = [Prompt("<image> colors", (str(tmp_path / "pic0.png"),)),
                Prompt("<image> count", (str(tmp_path / "pic1.png"),))]
    config = GenerationConfig(16, 16, block_length=8, kv_cache=True, decode="threshold", threshold=0.3)
    tokens = []
    for target in (ckpt, out):
        run = Service(target, ServiceOptions(generation=config, seer=SeerOptions(on=False))).generate(requests)
        tokens.append([a.tokens for a in run.answers])
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("config", [GenerationConfig(24, 24), GenerationConfig(24, 24, block_length=8, kv_cache=True,
                                                                                decode="threshold", threshold=0.3)],
                         ids=["fixed", "fast"])
def test_progressive_step_zero_on_ort_equals_torch(exported: tuple[MaskPredictor, Path, Path],
                                                   config: GenerationConfig) -> None:
    """A short first canvas: ONNX Runtime and torch agree token for token; where the canvas finds no end, the run is
    the one without it plus the canvas pass."""
    model, _, out = exported
    cfg = model.cfg
    for seer in (SeerConfig(detector="eos", eos_floor=0.0, margin=0), SeerConfig(detector="eos", eos_floor=2.0)):
        canvas = seer.with_(first_canvas=12)
        runs = [run_generation(backend, PROMPTS, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id),
                               seer=canvas) for backend in (TorchBackend(model), OrtBackend(out, CPU))]
        assert np.array_equal(runs[0].tokens, runs[1].tokens)
        if seer.eos_floor > 1:  # this detector never cuts: every row falls back to step zero at full length
            full = run_generation(TorchBackend(model), PROMPTS, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id), seer=seer)
            assert np.array_equal(runs[0].tokens, full.tokens)
            assert runs[0].passes == full.passes + 1


@pytest.mark.slow
def test_progressive_step_zero_plans_from_the_canvas_on_the_demo() -> None:
    """The demo's answers end well inside 32 slots: no row runs step zero at full length, and the run costs fewer
    tokens than with step zero at 256."""
    ckpt = load_checkpoint("demo")
    cfg = ckpt.config
    seer = SeerConfig.load(ckpt.path / "seer.json")
    from seer_deploy.models.demos.demo_tasks import heldout_examples
    from seer_deploy.models.text.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(ckpt.path, cfg.eos_id)
    prompts = [tok.encode_prompt(e.prompt) for e in heldout_examples(6)]
    config = GenerationConfig(256, 256, block_length=32, kv_cache=True, decode="threshold")
    backend = TorchBackend(ckpt.model, seer.stats_spec(cfg.n_layers))
    runs = [run_generation(backend, prompts, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id),
                           seer=seer.with_(first_canvas=canvas)) for canvas in (0, 32)]
    assert runs[1].seer is not None and all(r.kept < 32 for r in runs[1].seer)
    assert runs[1].batch_sizes[0] == len(prompts) and runs[1].passes == runs[0].passes
    assert runs[1].tokens_processed < runs[0].tokens_processed / 2


def test_first_canvas_option(exported: tuple[MaskPredictor, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, ckpt, _ = exported
    with pytest.raises(ConfigError, match="--first-canvas"):
        Service(ckpt, ServiceOptions(generation=GenerationConfig(8, 8), seer=SeerOptions(on=False, first_canvas=4)))
    with pytest.raises(ConfigError, match="--first-canvas 9"):
        Service(ckpt, ServiceOptions(generation=GenerationConfig(8, 8), seer=SeerOptions(on=True, first_canvas=9)))
    code, out_text, _ = run(["generate", str(ckpt), "-p", "reverse 12", "--gen-length", "16", "--seer",
                             "--first-canvas", "8", "--json"], capsys)
    assert code == 0 and json.loads(out_text.splitlines()[0])["seer"]["gen_length"] == 16
