"""`calibrate` on an export directory: the fp32 export calibrates as its checkpoint does, a quantized export on its
own statistics and answers, and the written config runs on it with the cuts and answers of the torch reference loop
on the same quantized numbers (a minute: two demo exports)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_demo
from test_seer_cli import run

from seer_deploy.calibration.detector_fit import CalibrationOptions, calibrate_model
from seer_deploy.calibration.prompt_set import prepare_prompts
from seer_deploy.calibration.sources import BackendSource, TorchSource
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.quantized_reference import dequantized_model, quantized_parameters
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.demos.demo_tasks import HELDOUT_SEED, heldout_examples
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import SeerOptions, Service, ServiceOptions, TargetOptions

pytestmark = requires_demo
CONFIG = GenerationConfig(gen_length=32, steps=32)
PROMPTS = [Prompt(e.prompt) for e in heldout_examples(16, seed=HELDOUT_SEED + 1)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exports")
    # Every layer's statistics at the demo's own thresholds (its seer.json reads layer 3 at 0.01, which an export
    # computes by default): calibration then searches the same rows on the export as on the checkpoint.
    every_layer = SeerConfig(stats_layers=(0, 1, 2, 3), abs_threshold=0.01, rel_threshold=0.01)
    return {name: export_checkpoint("demo", root / name, ExportOptions(verify=False, quantization=quant,
                                                                       seer=every_layer)).out
            for name, quant in (("fp32", None), ("int4", Quantization("int4", block_size=32)))}


def test_the_fp32_export_calibrates_as_its_checkpoint(exports: dict[str, Path]) -> None:
    """Same prompts, same (abs, rel) pair: the same answers, step zero within float noise, the same settings."""
    export = prepare_prompts(str(exports["fp32"]), PROMPTS, CONFIG, batch_size=8, threads=1)
    checkpoint = prepare_prompts("demo", PROMPTS, CONFIG, batch_size=8)
    assert isinstance(export.source, BackendSource) and isinstance(checkpoint.source, TorchSource)
    assert export.ids == checkpoint.ids
    pair = export.source.thresholds
    options = CalibrationOptions(target_safe=0.9, thresholds=(pair,))
    by_export, by_torch = (calibrate_model(p.source, p.ids, CONFIG, options, batch_size=8) for p in (export, checkpoint))

    zero_export = export.source.step_zero(export.ids, CONFIG.gen_length, (), batch_size=8)
    zero_torch = checkpoint.source.step_zero(checkpoint.ids, CONFIG.gen_length, (pair,), batch_size=8)
    np.testing.assert_array_equal(zero_export.token_ids, zero_torch.token_ids)
    np.testing.assert_allclose(zero_export.eos_prob, zero_torch.eos_prob, atol=1e-4)
    rows = [zero_torch.sparsity_rows.index(r) for r in zero_export.sparsity_rows]  # the export's rows of every layer
    np.testing.assert_allclose(zero_export.sparsity[pair], zero_torch.sparsity[pair][:, rows], atol=2e-3)

    a, b = by_export.report, by_torch.report
    assert a["mean_true_length"] == b["mean_true_length"] and a["sparsity_choice"] == b["sparsity_choice"]
    for name in ("eos", "sparsity", "fused"):
        assert a["detectors"][name]["margin"] == b["detectors"][name]["margin"], name
        assert a["detectors"][name]["floor"] == pytest.approx(b["detectors"][name]["floor"], rel=1e-3, abs=1e-4)
    assert not a["statistics"]["swept"] and b["statistics"]["swept"]


def test_a_quantized_export_calibrates_on_its_own_graph_and_runs_the_result(exports: dict[str, Path], tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": r.prompt}) + "\n" for r in PROMPTS))
    out = tmp_path / "seer.json"
    code, stdout, err = run(["calibrate", str(exports["int4"]), "--prompts", str(prompts), "--out", str(out),
                             "--gen-length", "32", "--target-safe", "0.9", "--batch-size", "8", "--threads", "1"],
                            capsys)
    assert code == 0, err
    assert "its graph computes one threshold pair" in stdout
    manifest = ExportManifest.load(exports["int4"])
    assert manifest.weights.quantization is not None and manifest.weights.quantization.scheme == "int4"
    seer = SeerConfig.load(out)
    assert (seer.abs_threshold, seer.rel_threshold) == (manifest.seer.abs_threshold, manifest.seer.rel_threshold)
    assert set(seer.stats_layers) <= set(manifest.seer.layers)

    # The statistics are the quantized graph's: they move against the fp32 export's at the same prompts.
    sources = {name: prepare_prompts(str(path), PROMPTS, CONFIG, batch_size=8, threads=1).source
               for name, path in exports.items()}
    ids = prepare_prompts(str(exports["int4"]), PROMPTS, CONFIG, threads=1).ids
    pair = (manifest.seer.abs_threshold, manifest.seer.rel_threshold)
    fp32, int4 = (sources[n].step_zero(ids, CONFIG.gen_length, ()).sparsity[pair] for n in ("fp32", "int4"))
    assert np.abs(fp32 - int4).max() > 1e-3

    # The written config loads and generates on the export; its cuts and answers are the torch reference loop's on
    # the same quantized numbers (the demo with each projection the export quantized replaced by its int4 values:
    # export.quantized_reference), an independent implementation of the loop, the cut and the model. One prompt a
    # batch on both sides: the packed int4 path also rounds the activations to int8, so a near-tie may resolve the
    # other way; a few such flips are allowed, measured: 16 of 16 cuts and 100% of the tokens equal.
    service = Service(exports["int4"], ServiceOptions(generation=CONFIG, batch_size=1, target=TargetOptions(threads=1),
                                                      seer=SeerOptions(config=out)))
    cut = service.generate(PROMPTS)
    assert all(a.seer is not None for a in cut.answers)
    kept = np.array([a.seer.kept for a in cut.answers if a.seer is not None])
    assert kept.mean() < CONFIG.gen_length
    names = quantized_parameters(exports["int4"] / "step.onnx")
    assert len(names) == 29  # 4 layers x 7 projections and the LM head
    torch_int4 = TorchSource(dequantized_model(load_checkpoint("demo").model, names, Quantization("int4")))
    tokens, kept_by_torch = torch_int4.answers(ids, CONFIG, seer=service.seer, batch_size=1)
    assert (kept_by_torch == kept).mean() >= 0.8, (kept_by_torch, kept)
    assert (tokens == np.array([a.tokens for a in cut.answers])).mean() >= 0.9
