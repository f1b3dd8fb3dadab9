"""manifest.json of an export: a round trip, and a clear ArtifactError for every way it can be wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_config

from seer_deploy.contracts import sampling
from seer_deploy.contracts.export_manifest import FORMAT_VERSION, MANIFEST_FILE, ExportManifest
from seer_deploy.contracts.manifest_sections import GraphRecord, ModelSpec, TensorSpec, WeightsSpec
from seer_deploy.core.errors import ArtifactError
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec

BS: list[int | str] = ["batch", "seq"]


def manifest() -> ExportManifest:
    cfg = tiny_config()
    ids = {"input_ids": TensorSpec("int64", BS), "attention_mask": TensorSpec("int64", BS)}
    return ExportManifest(
        model=ModelSpec("/ckpt", "llama", "ab" * 32, cfg.to_dict()),
        special_ids={"mask": cfg.mask_id, "eos": cfg.eos_id, "pad": cfg.pad_id, "bos": cfg.bos_id, "eot": None},
        dtype="fp16",
        opset=20,
        max_seq_len=96,
        graphs={
            "step": GraphRecord("step.onnx", "2" * 64, ids, {"token_ids": TensorSpec("int64", BS),
                                                             "sparsity": TensorSpec("float32", ["batch", 4, "seq"])}),
        },
        seer=StatsSpec((1,), 0.05, 0.1),
        sampling=sampling.manifest_entry(),
        versions={"seer_deploy": "0.1.0"},
        weights=WeightsSpec("weights.bin", "3" * 64, 1234),
    )


def test_round_trip(tmp_path: Path) -> None:
    m = manifest()
    path = m.save(tmp_path)
    assert path == tmp_path / MANIFEST_FILE and [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]
    loaded = ExportManifest.load(tmp_path)
    assert loaded == m
    assert loaded.model_config() == tiny_config()
    raw = json.loads(path.read_text())
    assert raw["format"] == "seer-deploy-export" and raw["format_version"] == FORMAT_VERSION
    assert raw["seer"]["sparsity_rows"][0] == [1, STAT_NAMES[0]]


def _edit(raw: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        raw = raw[key]
    if value is _DELETE:
        del raw[last]
    else:
        raw[last] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("format", "something-else", "not a seer-deploy export manifest"),
        ("format_version", FORMAT_VERSION + 1, "newer than this seer-deploy understands.*upgrade"),
        ("format_version", "1", "'format_version' must be an integer"),
        ("format_version", FORMAT_VERSION - 1, "older seer-deploy.*three graphs where this runtime runs one.*re-export"),
        ("format_version", 1, "older seer-deploy.*log-probability.*re-export"),
        ("graphs.step.sha256", _DELETE, "'graphs.step.sha256' is missing"),
        ("graphs.step", _DELETE, "'graphs.step' is missing"),
        ("graphs.step.inputs.input_ids", [1], "must be an object with dtype and shape"),
        ("dtype", "bf16", "dtype 'bf16' is not one of fp32, fp16"),
        ("model.layout", "gpt", "model.layout 'gpt'"),
        ("model.config.n_layers", _DELETE, "not a valid model configuration"),
        ("model.config.d_model", 30, "not a valid model configuration"),
        ("special_ids.eot", _DELETE, "special_ids lacks eot"),
        ("seer.sparsity_rows", [[1]], "sparsity_rows must be"),
        ("seer.abs_threshold", "low", "'seer.abs_threshold' must be a number"),
        ("weights", _DELETE, "'weights' is missing"),
        ("max_seq_len", True, "'max_seq_len' must be an integer"),
        # Values a hostile manifest could use to crash a later step.
        ("special_ids.mask", 1000, r"special_ids.mask is 1000.*0\.\.\d+"),
        ("special_ids.pad", True, "special_ids.pad is True"),
        ("special_ids.eot", -1, "special_ids.eot is -1"),
        ("max_seq_len", -1, "'max_seq_len' is -1; it must lie in 2..128"),
        ("max_seq_len", 129, "'max_seq_len' is 129"),
        ("opset", 0, "'opset' is 0"),
        ("seer.stats_layers", [2], "stats_layers"),
        ("seer.stats_layers", ["1"], "stats_layers"),
        ("seer.sparsity_rows", ["12"], "sparsity_rows must be"),
        ("seer.sparsity_rows", [[1, "no_such_stat"]], "sparsity_rows must be"),
        ("seer.sparsity_rows", [[1, "frac_h_abs"]], "sparsity_rows must be"),
        ("graphs.step.outputs.sparsity.shape", ["batch", 3, "seq"], "reports 3 sparsity rows, seer.sparsity_rows lists 4"),
        ("seer.rel_threshold", 0, "'seer.rel_threshold' is 0"),
        ("weights.bytes", -5, "'weights.bytes' is -5"),
        ("graphs.step.inputs.input_ids.shape", [None, "seq"], "shape"),
        ("extra", "ab", "'extra' must be an object"),
        ("extra", {"multimodal": []}, "'extra.multimodal' must be an object"),
    ],
)
def test_bad_manifests_name_the_problem(tmp_path: Path, path: str, value: Any, message: str) -> None:
    raw = manifest().to_dict()
    _edit(raw, path, value)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=message):
        ExportManifest.load(tmp_path)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "has no manifest.json: it is not a seer-deploy export"),
        (lambda d: (d / MANIFEST_FILE).write_text("{oops"), "is not valid JSON"),
        (lambda d: (d / MANIFEST_FILE).write_text("[1, 2]"), "holds an array, not an object"),
    ],
)
def test_missing_or_unreadable_manifest(tmp_path: Path, setup: Callable[[Path], object], message: str) -> None:
    setup(tmp_path)
    with pytest.raises(ArtifactError, match=message):
        ExportManifest.load(tmp_path)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist.*seer-deploy export"):
        ExportManifest.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("graphs.step.file", "../step.onnx", "graphs.step.file '../step.onnx' resolves to .*, outside"),
        ("graphs.step.file", "/etc/passwd", "graphs.step.file '/etc/passwd' is an absolute path"),
        ("graphs.step.file", "~/step.onnx", "absolute path"),
        ("weights.file", "sub/../../weights.bin", "weights.file .* outside"),
        ("weights.file", "", "not a file name"),
        ("graphs.step.file", "link.onnx", "graphs.step.file 'link.onnx' resolves to .*, outside"),
    ],
)
def test_files_named_by_the_manifest_must_lie_inside_the_export(tmp_path: Path, path: str, value: Any,
                                                                 message: str) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (tmp_path / "elsewhere.onnx").write_bytes(b"graph")
    (export / "link.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    raw = manifest().to_dict()
    _edit(raw, path, value)
    (export / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=message):
        ExportManifest.load(export)


def test_a_link_inside_the_export_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "graphs").mkdir()
    (tmp_path / "step-link.onnx").symlink_to(tmp_path / "graphs" / "step.onnx")
    raw = manifest().to_dict()
    _edit(raw, "graphs.step.file", "step-link.onnx")
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(raw))
    assert ExportManifest.load(tmp_path).graphs["step"].file == "step-link.onnx"
