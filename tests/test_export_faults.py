"""Fault injection for every export check: float16, and int8 / int4 in both quantized forms (MatMulNBits and
DequantizeLinear), on a model whose outputs are flat (the issue's: random, std 0.02, vocabulary 32,768) and on its
peaked twin (tests/faults.py). The honest export passes its check; the same export with one projection, every
projection, the LM head or the embedding replaced by unrelated noise of the same spread is refused.

Each (model, form) is exported once; each fault then rewrites the bytes of its weights in a copy of that export
(a quantized weight's codes become uniform random codes under its own scales: noise of the block's spread) and the
export's own check (the closure the exporter runs, with the torch references it computed) runs on the copy. The path
from a refused check to a kept, unverified export and exit 1 runs in full for the issue's reproduction (every
projection and the LM head replaced before quantizing): flat at int8 through the CLI, peaked at int4 (DequantizeLinear).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from faults import FAULTS, inject, random_checkpoint

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.manifest_sections import ModelSpec
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.errors import UnverifiedExport
from seer_deploy.export.exporter import prepare_export, quiet
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.validate import ExportValidationError
from seer_deploy.models.checkpoints.checkpoint import checkpoint_fingerprint, checkpoint_weights
from seer_deploy.models.checkpoints.weight_sources import weight_sources

FORMS: dict[str, Callable[..., ExportOptions]] = {
    "fp16": lambda **kw: ExportOptions(dtype="fp16", **kw),
    "int8": lambda **kw: ExportOptions(quantization=Quantization("int8"), **kw),
    "int4": lambda **kw: ExportOptions(quantization=Quantization("int4"), **kw),
    "int8-qdq": lambda **kw: ExportOptions(opset=21, quantization=Quantization("int8", format="qdq"), **kw),
    "int4-qdq": lambda **kw: ExportOptions(opset=21, quantization=Quantization("int4", format="qdq"), **kw),
}
SHAPES = ("flat", "peaked")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults")
    return {shape: random_checkpoint(root / shape, peaked=shape == "peaked") for shape in SHAPES}


def _corrupt(export: Path, weights: list[str], seed: int) -> None:
    """In place: the bytes of every initializer of the step graph that holds one of `weights` (parameter names) made
    noise: float tensors normal with their own std, quantized codes uniform (the scales kept)."""
    model = onnx.load(str(export / "step.onnx"), load_external_data=False)
    rng = np.random.default_rng(seed)
    data = np.memmap(export / "weights.bin", dtype=np.uint8, mode="r+")
    for init in model.graph.initializer:
        name, _, part = init.name.removeprefix("model.").partition(".T")
        if name not in weights or part == ".scales":
            continue
        where = {e.key: e.value for e in init.external_data}
        begin, length = int(where["offset"]), int(where["length"])
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            dtype = np.float32 if init.data_type == onnx.TensorProto.FLOAT else np.float16
            values = data[begin:begin + length].view(dtype)
            values[:] = rng.standard_normal(values.size).astype(np.float32) * values.astype(np.float32).std()
        else:  # int4 / int8 / packed uint8 codes
            data[begin:begin + length] = rng.integers(0, 256, length, dtype=np.uint8)
    data.flush()
    del data


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("shape", SHAPES)
def test_each_fault_is_refused_and_the_honest_export_passes(checkpoints: dict[str, Path], tmp_path: Path,
                                                            shape: str, form: str) -> None:
    checkpoint = checkpoints[shape]
    run = prepare_export(checkpoint, tmp_path / "honest", FORMS[form]())
    loaded = run.load(run, quiet)
    model = ModelSpec(run.source, loaded.layout, checkpoint_fingerprint(checkpoint), run.config.to_dict())
    honest = run.write(model, loaded.plan, quiet, 0.0).out  # verified, or UnverifiedExport
    assert ExportManifest.load(honest).verified
    check = loaded.plan.validate  # the export's own check, with the references it computed
    parameters = list(weight_sources(checkpoint_weights(checkpoint)))
    for k, fault in enumerate(FAULTS):
        broken = tmp_path / fault.replace(" ", "-")
        shutil.copytree(honest, broken)
        _corrupt(broken, [name for name in parameters if FAULTS[fault](name)], seed=k)
        with pytest.raises(ExportValidationError) as refused:
            check(broken)
        assert refused.value.max_diff, (fault, "refused without figures")


def test_the_issue_noise_graph_is_kept_unverified_and_exits_1(checkpoints: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               cli_exit: Callable[[list[str]], tuple[int, str, str]]
                                                               ) -> None:
    """Every projection and the LM head replaced by unrelated noise before quantizing (what the old absolute
    agreement rule verified on the flat model, int8): the CLI exits 1, the export is kept, marked unverified, with
    the figures that refused it; the peaked twin at int4 in the DequantizeLinear form likewise."""
    inject(monkeypatch, checkpoints["flat"], "every projection and the LM head")
    code, _, err = cli_exit(["export", str(checkpoints["flat"]), "--out", str(tmp_path / "flat"), "--quantize", "int8"])
    assert code == 1 and "UNVERIFIED" in err and "other distributions than torch" in err, err
    inject(monkeypatch, checkpoints["peaked"], "every projection and the LM head")
    with pytest.raises(UnverifiedExport, match="UNVERIFIED.*other distributions than torch"):
        prepare_export(checkpoints["peaked"], tmp_path / "peaked", FORMS["int4-qdq"]()).start()
    for shape in SHAPES:
        validation = ExportManifest.load(tmp_path / shape).extra["validation"]
        figures = validation["max_diff"]
        assert validation["verified"] is False
        assert figures["kl share (mean)"] > 1.0 and figures["top-10 overlap (mean)"] < 0.05, (shape, figures)
