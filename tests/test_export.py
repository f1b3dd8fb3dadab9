"""`seer-deploy export`: tiny checkpoints in both layouts export, validate, are reproducible and fail cleanly."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from conftest import tiny_model

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import STEP, Size, export_graphs
from seer_deploy.contracts.manifest_sections import TensorSpec
from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ArtifactError, ConfigError, UnverifiedExport
from seer_deploy.core.sparsity import STAT_NAMES, StatsError, StatsSpec
from seer_deploy.engines.ort import OrtBackend
from seer_deploy.export import exporter as exporter_module
from seer_deploy.export import validate as validate_module
from seer_deploy.export.destination import destination_fingerprint
from seer_deploy.export.exporter import ExportResult, export_checkpoint
from seer_deploy.export.graphs import StepGraph
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.validate import ExportValidationError, check_interface
from seer_deploy.models.checkpoints.checkpoint import Layout, checkpoint_fingerprint, load_checkpoint, save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer
from seer_deploy.seer.config import SeerConfig

EXPORT_FILES = {"manifest.json", "step.onnx", "weights.bin", "tokenizer.json"}  # the tokenizer as read (issue 36)


def write_checkpoint(root: Path, layout: Layout, seed: int = 0) -> Path:
    """A tiny random checkpoint, written once per (root, layout, seed)."""
    path = root / f"ckpt-{layout}-{seed}"
    if path.exists():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tok = root / "tokenizer.json"
    if not tok.exists():
        write_tokenizer(tok)
    return save_checkpoint(tiny_model(seed), path, layout, tokenizer_file=tok)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(directory.iterdir())}


def leftovers(parent: Path) -> list[str]:
    """Temporary export directories left beside the destination."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def exports(root: Path) -> dict[str, tuple[Path, ExportResult]]:
    """layout -> (checkpoint, export of it), both layouts of the same random model."""
    out = {}
    for layout in ("llada", "llama"):
        ckpt = write_checkpoint(root, layout)  # type: ignore[arg-type]
        out[layout] = (ckpt, export_checkpoint(ckpt, root / "exports" / layout))
    return out


@pytest.mark.parametrize("layout", ["llada", "llama"])
def test_export_writes_graphs_weights_and_a_complete_manifest(exports: dict[str, Any], layout: str) -> None:
    ckpt, result = exports[layout]
    out: Path = result.out
    assert {p.name for p in out.iterdir()} == EXPORT_FILES | {".seer-deploy.json"}
    assert leftovers(out.parent) == []
    marker = json.loads((out / ".seer-deploy.json").read_text())  # ownership: what --out may later replace
    assert marker == {"format": "seer-deploy-owner", "kind": "export", "fingerprint": checkpoint_fingerprint(ckpt),
                      "files": sorted(EXPORT_FILES)}
    m = ExportManifest.load(out)
    cfg = load_checkpoint(ckpt).config
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format"] == "seer-deploy-export" and raw["format_version"] == 3
    assert m.model.layout == layout and m.model.fingerprint == checkpoint_fingerprint(ckpt)
    assert m.model.config == cfg.to_dict() and m.model_config() == cfg
    assert m.special_ids == {"mask": cfg.mask_id, "eos": cfg.eos_id, "pad": cfg.pad_id, "bos": cfg.bos_id, "eot": None}
    assert (m.dtype, m.opset, m.max_seq_len) == ("fp32", 20, cfg.max_seq_len)
    assert set(raw["versions"]) >= {"seer_deploy", "torch", "onnx", "onnxruntime"}
    # Graph interfaces as the manifest records them and as the files really are.
    step = m.graphs["step"]
    assert {k: (v.dtype, v.shape) for k, v in step.inputs.items()} == {
        "input_ids": ("int64", ["batch", "seq"]),
        "attention_mask": ("int64", ["batch", "seq"]),
        "temperature": ("float32", ["batch"]),
        "sample_uniform": ("float32", ["batch", "seq"]),
        "candidates": ("int64", ["batch", "candidates"]),
        "with_stats": ("int64", ["batch"]),
    }
    K = cfg.n_layers * len(STAT_NAMES)
    assert {k: (v.dtype, v.shape) for k, v in step.outputs.items()} == {
        "token_ids": ("int64", ["batch", "seq"]),
        "confidence": ("float32", ["batch", "seq"]),
        "eos_prob": ("float32", ["batch", "seq"]),
        "sparsity": ("float32", ["batch", K, "seq"]),
    }
    for spec in (step,):
        assert sha256(out / spec.file) == spec.sha256
        proto = onnx.load(str(out / spec.file), load_external_data=False)
        assert [i.name for i in proto.graph.input] == list(spec.inputs)
        assert [o.name for o in proto.graph.output] == list(spec.outputs)
    # Sparsity rows: layer-major flatten of [L, F].
    assert m.seer.layers == tuple(range(cfg.n_layers))  # no Seer config anywhere: every layer
    assert m.seer.sparsity_rows == [(layer, s) for layer in range(cfg.n_layers) for s in STAT_NAMES]
    assert m.weights.sha256 == sha256(out / "weights.bin") and m.weights.bytes == (out / "weights.bin").stat().st_size
    assert m.sampling["method"] == "inverse_cdf"
    assert set(result.max_diff) >= {"step0 confidence", "step0 eos_prob", "sparsity", "step confidence"}
    assert m.verified and m.extra["validation"]["max_diff"] == result.max_diff


def onnx_interface(path: Path) -> list[tuple[str, str, str, list[int | str]]]:
    """(kind, name, dtype, shape) of every input, then every output, read from the ONNX file itself."""
    graph = onnx.load(str(path), load_external_data=False).graph

    def entries(kind: str, values: Any) -> list[tuple[str, str, str, list[int | str]]]:
        return [
            (kind, v.name, onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
             [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in values
        ]

    return entries("input", graph.input) + entries("output", graph.output)


def check_export_against_spec(out: Path) -> None:
    """Every step graph of the export at `out` has the inputs, outputs, dtypes and dynamic axes contracts.graphs declares,
    and the manifest records them so."""
    m = ExportManifest.load(out)
    sizes = {Size.STAT_ROWS: len(m.seer.sparsity_rows)}
    for graph in export_graphs(kv_cache=m.has_cache):
        record = m.graphs[graph.name]
        assert record.file == graph.file
        assert onnx_interface(out / record.file) == graph.interface(sizes)
        check_interface(graph, record, sizes)


@pytest.mark.parametrize("layout", ["llada", "llama"])
def test_the_graphs_are_what_spec_graphs_declares(exports: dict[str, Any], layout: str) -> None:
    _, result = exports[layout]
    check_export_against_spec(result.out)


def test_a_graph_that_drifts_from_its_declaration_is_refused(exports: dict[str, Any]) -> None:
    _, result = exports["llada"]
    record = result.manifest.graphs["step"]
    sizes = {Size.STAT_ROWS: len(result.manifest.seer.sparsity_rows)}
    check_interface(STEP, record, sizes)
    renamed = {("probability" if k == "eos_prob" else k): v for k, v in record.outputs.items()}
    retyped = {**record.inputs, "attention_mask": TensorSpec("int32", ["batch", "seq"])}
    fixed_seq = {**record.inputs, "input_ids": TensorSpec("int64", ["batch", 24])}
    for drifted in (replace(record, outputs=renamed), replace(record, inputs=retyped),
                    replace(record, inputs=fixed_seq), replace(record, inputs=dict(reversed(record.inputs.items())))):
        with pytest.raises(ExportValidationError, match="contracts.graphs declares for the step graph"):
            check_interface(STEP, drifted, sizes)
    with pytest.raises(ExportValidationError):  # another stats layout than the model's
        check_interface(STEP, record, {Size.STAT_ROWS: sizes[Size.STAT_ROWS] + 1})


def test_weights_are_external_and_shared_by_every_graph(exports: dict[str, Any], root: Path) -> None:
    ckpt, result = exports["llada"]
    out: Path = result.out
    param_bytes = sum(p.numel() * 4 for p in load_checkpoint(ckpt).model.parameters())
    locations: dict[str, set[tuple[int, int]]] = {}
    cached = export_checkpoint(ckpt, root / "weights-cached", ExportOptions(kv_cache=True, verify=False)).out
    for name, out in (("step", result.out), ("window_step", cached)):
        proto = onnx.load(str(out / f"{name}.onnx"), load_external_data=False)
        refs = set()
        for init in proto.graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                ext = {e.key: e.value for e in init.external_data}
                assert ext["location"] == "weights.bin"
                refs.add((int(ext["offset"]), int(ext["length"])))
            else:  # what stays inline is small: shape constants and scalars
                assert len(init.raw_data) < 1024
        locations[name] = refs
        assert (out / f"{name}.onnx").stat().st_size < param_bytes / 2
    # Every weight the window graph reads is one the step graph reads too: the file holds the model once, not twice.
    assert locations["window_step"] <= locations["step"]
    for export in (result.out, cached):
        assert param_bytes * 0.95 <= (export / "weights.bin").stat().st_size <= param_bytes * 1.3


# polygraphy's error report divides by the reference for its relative-error statistics: 0/0 where both outputs are
# exactly 0 (e.g. a token id 0). The pass/fail decision uses atol/rtol and is unaffected.
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
def test_onnx_runtime_matches_torch_through_polygraphy(exports: dict[str, Any]) -> None:
    """polygraphy's comparator: ORT on step.onnx against the torch StepGraph, per output (step zero's call)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    ckpt, result = exports["llama"]
    model = load_checkpoint(ckpt).model
    cfg = model.cfg
    torch_graph = StepGraph(model, StatsSpec(tuple(range(cfg.n_layers))))
    rng = np.random.default_rng(3)
    feeds = []
    for B, S in ((1, 11), (4, 37)):
        mask = np.ones((B, S), dtype=np.int64)
        mask[1:, : S // 3] = 0
        feeds.append({"input_ids": rng.integers(0, cfg.vocab_size, (B, S)), "attention_mask": mask,
                      "temperature": np.zeros(B, np.float32), "sample_uniform": np.ones((B, S), np.float32),
                      "candidates": np.broadcast_to(np.arange(S), (B, S)).copy(),
                      "with_stats": np.ones(B, np.int64)})
    ort_runner = OnnxrtRunner(SessionFromOnnx(str(result.out / "step.onnx"), providers=["CPUExecutionProvider"]))
    results = Comparator.run([ort_runner], data_loader=feeds)
    # polygraphy's PytRunner moves inputs to CUDA, so the torch side is added as precomputed results.
    names = ["token_ids", "confidence", "eos_prob", "sparsity"]
    with torch.no_grad():
        torch_out = [torch_graph(*(torch.from_numpy(f[name]) for name in STEP.input_names)) for f in feeds]
    results.add([dict(zip(names, (t.numpy() for t in out), strict=True)) for out in torch_out], runner_name="torch")
    atol = {"token_ids": 0.0, "confidence": 1e-5, "eos_prob": 1e-5, "sparsity": 1e-5}
    accuracy = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=atol, rtol=1e-5))
    assert bool(accuracy)
    # The comparison is real: the same comparator fails on a corrupted output.
    results[1][1][0]["confidence"] = results[1][1][0]["confidence"] + 1e-3
    assert not bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=atol, rtol=1e-5)))


def test_exporting_twice_gives_identical_files(exports: dict[str, Any], root: Path) -> None:
    ckpt, first = exports["llada"]
    second = export_checkpoint(ckpt, root / "again")
    assert snapshot(first.out) | {"manifest.json": ""} == snapshot(second.out) | {"manifest.json": ""}
    assert first.manifest.graphs["step"].sha256 == second.manifest.graphs["step"].sha256
    assert first.manifest.weights.sha256 == second.manifest.weights.sha256


def test_fp16_export_halves_the_weights_and_validates(exports: dict[str, Any], root: Path) -> None:
    ckpt, fp32 = exports["llada"]
    result = export_checkpoint(ckpt, root / "fp16", ExportOptions(dtype="fp16"))
    assert result.manifest.dtype == "fp16"
    proto = onnx.load(str(result.out / "step.onnx"), load_external_data=False)
    big = [i for i in proto.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert big and all(i.data_type == onnx.TensorProto.FLOAT16 for i in big)
    assert result.manifest.weights.bytes < 0.6 * fp32.manifest.weights.bytes
    # The outputs stay float32 whatever the weights are.
    assert result.manifest.graphs["step"].outputs["confidence"].dtype == "float32"
    # The tolerance is float32's plus twice what torch's own float16 forward moved the probabilities.
    noise = result.max_diff["fp16 torch itself: probability"]
    allowed = validate_module.TOLERANCES["fp16"].prob_atol + validate_module.NOISE_FACTOR * noise
    assert result.manifest.verified and 0 < noise and 0 < result.max_diff["step0 confidence"] <= allowed
    check_export_against_spec(result.out)  # the interface does not depend on the dtype


def test_large_model_path_puts_every_tensor_outside_the_graph_and_checks_by_path(
    exports: dict[str, Any], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Models over 2 GB: with the inline limit lowered to 0 no weight is embedded, and the checker gets paths."""
    ckpt, _ = exports["llama"]
    checked: list[object] = []
    real_check = onnx.checker.check_model

    def spy(model: object, *args: object, **kwargs: object) -> None:
        checked.append(model)
        real_check(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.checker, "check_model", spy)
    result = export_checkpoint(ckpt, root / "all-external", ExportOptions(inline_limit_bytes=0))
    assert checked and all(isinstance(m, str) for m in checked)  # by path, never a >2 GB in-memory proto
    for name in ("step",):
        proto = onnx.load(str(result.out / f"{name}.onnx"), load_external_data=False)
        for init in proto.graph.initializer:  # every float tensor; shape constants stay for shape inference
            is_float = init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
            assert (init.data_location == onnx.TensorProto.EXTERNAL) == is_float, init.name
    ids = np.array([[1, 2, 3, 4]])
    torch_logits = load_checkpoint(ckpt).model(torch.from_numpy(ids)).logits
    assert np.array_equal(OrtBackend(result.out).step0(StepInput(ids, None)).token_ids, torch_logits.argmax(-1).numpy())


def test_bf16_is_a_config_error_that_names_the_cpu_provider(root: Path) -> None:
    ckpt = write_checkpoint(root, "llada")
    with pytest.raises(ConfigError, match="bf16.*CPU"):
        export_checkpoint(ckpt, root / "bf16", ExportOptions(dtype="bf16"))
    assert not (root / "bf16").exists()


def test_another_models_export_is_refused_without_force(exports: dict[str, Any], root: Path) -> None:
    _, result = exports["llada"]
    other = write_checkpoint(root / "other", "llada", seed=7)
    before = snapshot(result.out)
    with pytest.raises(ArtifactError, match="another model.*--force"):
        export_checkpoint(other, result.out)
    assert snapshot(result.out) == before
    # Forced: replaced by the other model's export, nothing left beside it.
    target = root / "forced"
    export_checkpoint(exports["llama"][0], target, ExportOptions(verify=False))
    replaced = export_checkpoint(other, target, ExportOptions(force=True, verify=False))
    assert ExportManifest.load(target).model.fingerprint == checkpoint_fingerprint(other)
    assert replaced.max_diff == {} and leftovers(root) == []


def test_destination_rules(tmp_path: Path, exports: dict[str, Any]) -> None:
    ckpt, result = exports["llada"]
    other = write_checkpoint(tmp_path, "llada", seed=3)
    assert destination_fingerprint(tmp_path / "new", ckpt, force=False) is None  # absent: fine, nothing hashed
    (tmp_path / "empty").mkdir()
    assert destination_fingerprint(tmp_path / "empty", ckpt, force=False) is None
    same = destination_fingerprint(result.out, ckpt, force=False)  # same model: re-export allowed
    assert same == result.manifest.model.fingerprint
    with pytest.raises(ArtifactError, match="holds the export of another model.*--force"):
        destination_fingerprint(result.out, other, force=False)
    assert destination_fingerprint(result.out, other, force=True) is None  # forced: our export of any model
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    (tmp_path / "notes" / "manifest.json").write_text("{}")  # a look-alike export
    for force in (False, True):  # never delete a directory that seer-deploy did not write
        with pytest.raises(ArtifactError, match=r"did not write \(manifest.json, todo.txt\)"):
            destination_fingerprint(tmp_path / "notes", ckpt, force=force)
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["manifest.json", "todo.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="is a file"):
        destination_fingerprint(tmp_path / "file", ckpt, force=False)


def test_debris_of_a_killed_build_is_removed_only_inside_our_export(exports: dict[str, Any], tmp_path: Path) -> None:
    """A dead writer's temporary (PID past any real one) inside our export goes before the ownership check; the
    same name in a directory seer-deploy did not mark, or under a marker of another kind, stays and is refused."""
    ckpt, _ = exports["llada"]
    dead = ".engine.build-4194305-0123abcd"
    ours = tmp_path / "ours"
    export_checkpoint(ckpt, ours, ExportOptions(verify=False))
    (ours / dead).mkdir()
    assert destination_fingerprint(ours, ckpt, force=False) is not None and not (ours / dead).exists()
    for name, marker in (("foreign", None), ("engine-kind", {"format": "seer-deploy-owner", "kind": "engine",
                                                              "fingerprint": None, "files": []})):
        directory = tmp_path / name
        (directory / dead).mkdir(parents=True)
        if marker is not None:
            (directory / ".seer-deploy.json").write_text(json.dumps(marker))
        with pytest.raises(ArtifactError):
            destination_fingerprint(directory, ckpt, force=True)
        assert (directory / dead).is_dir()


def test_a_user_file_inside_our_export_is_never_deleted(exports: dict[str, Any], tmp_path: Path,
                                                        cli_exit: Any) -> None:
    ckpt, _ = exports["llama"]
    out = tmp_path / "export"
    export_checkpoint(ckpt, out, ExportOptions(verify=False))
    (out / "notes.txt").write_text("mine")
    for force in ([], ["--force"]):
        code, _, err = cli_exit(["export", str(ckpt), "--out", str(out), "--no-verify", *force])
        assert code == 2 and err.count("\n") == 1 and "did not write there (notes.txt)" in err, err
    assert (out / "notes.txt").read_text() == "mine" and ExportManifest.load(out).model.layout == "llama"


def test_cli_force_replaces_our_export_of_another_model(exports: dict[str, Any], tmp_path: Path,
                                                        cli_exit: Any) -> None:
    out = tmp_path / "export"
    export_checkpoint(exports["llada"][0], out, ExportOptions(verify=False))
    other = write_checkpoint(tmp_path, "llada", seed=4)
    code, stdout, err = cli_exit(["export", str(other), "--out", str(out), "--no-verify"])
    assert code == 2 and "another model" in err and stdout == "" and err.count("\n") == 1
    code, _, err = cli_exit(["export", str(other), "--out", str(out), "--no-verify", "--force"])
    assert code == 0, err
    assert ExportManifest.load(out).model.fingerprint == checkpoint_fingerprint(other)
    assert leftovers(tmp_path) == []


def test_failed_validation_keeps_the_export_marked_unverified(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                              cli_exit: Any) -> None:
    """The work is kept (an 8B export is an hour), marked unverified in the manifest, and the run fails with exit 1
    and the figures in one line."""
    ckpt = write_checkpoint(root, "llada")
    parent = root / "failing"
    parent.mkdir()

    def disagree(*args: object, **kwargs: object) -> dict[str, float]:
        raise ExportValidationError("ONNX Runtime disagrees with torch: step0 confidence: max |diff| 0.5 > 1e-4",
                                    {"step0 confidence": 0.5})

    monkeypatch.setattr(exporter_module, "compare_with_torch", disagree)
    with pytest.raises(UnverifiedExport, match="UNVERIFIED.*max \\|diff\\| 0.5"):
        export_checkpoint(ckpt, parent / "out")
    manifest = ExportManifest.load(parent / "out")
    assert manifest.verified is False and manifest.extra["validation"]["max_diff"] == {"step0 confidence": 0.5}
    assert sorted(p.name for p in parent.iterdir()) == ["out"] and leftovers(parent) == []
    code, out, err = cli_exit(["export", str(ckpt), "--out", str(parent / "again")])
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # below the progress bar
    assert code == 1 and out == "" and len(errors) == 1 and "UNVERIFIED" in errors[0] and "0.5" in errors[0]
    assert ExportManifest.load(parent / "again").verified is False


def test_interrupted_export_keeps_the_previous_export_intact(
    exports: dict[str, Any], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, result = exports["llama"]
    before = snapshot(result.out)
    calls: list[int] = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)  # step.onnx is already written in the temporary directory
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter_module, "check_graph_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(ckpt, result.out)
    assert snapshot(result.out) == before
    assert leftovers(result.out.parent) == []


def test_bad_settings_are_config_errors(root: Path, tmp_path: Path) -> None:
    ckpt = write_checkpoint(root, "llada")
    with pytest.raises(ConfigError, match="opset"):
        export_checkpoint(ckpt, tmp_path / "a", ExportOptions(opset=11))
    with pytest.raises(ConfigError, match="exceeds the model's 128"):
        export_checkpoint(ckpt, tmp_path / "b", ExportOptions(max_seq_len=4096))
    with pytest.raises(ConfigError, match="2-layer"):
        export_checkpoint(ckpt, tmp_path / "c", ExportOptions(seer=SeerConfig(stats_layers=(5,))))
    assert list(tmp_path.iterdir()) == []


def test_one_rule_for_statistics_layers(tmp_path: Path) -> None:
    """StatsSpec.resolve is the one rule: None every layer, () the last, negatives from the end; a Seer config file
    (what `export --seer-config` reads) resolves through it."""
    assert StatsSpec.resolve(None, 3) == StatsSpec((0, 1, 2))
    assert StatsSpec.resolve((), 3).layers == (2,)
    assert StatsSpec.resolve((-1, 0), 4).layers == (3, 0)
    with pytest.raises(StatsError, match="twice"):
        StatsSpec.resolve((1, -2), 3)
    with pytest.raises(StatsError, match="3-layer model lacks"):
        StatsSpec.resolve((3,), 3)
    file = tmp_path / "seer.json"
    file.write_text(json.dumps({"stats_layers": [-1], "abs_threshold": 0.1, "detector": "fused", "margin": 4}))
    assert SeerConfig.load(file).stats_spec(4) == StatsSpec((3,), 0.1, 0.05)
    assert StatsSpec.from_config(None, 3) == StatsSpec((0, 1, 2), 0.05, 0.05)  # no config: every layer
    for bad, match in (({"abs_threshold": -1}, "abs_threshold"), ({"stats_layers": [0.5]}, "layer indices"),
                       ([1], "object")):
        file.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=match):
            SeerConfig.load(file)


def test_cli_export_with_a_seer_config(root: Path, tmp_path: Path, cli_exit: Any) -> None:
    ckpt = write_checkpoint(root, "llama")
    seer = tmp_path / "seer.json"
    seer.write_text(json.dumps({"stats_layers": [1], "abs_threshold": 0.02, "rel_threshold": 0.1, "floor": 3.0}))
    code, out, err = cli_exit(["export", str(ckpt), "--out", str(tmp_path / "x"), "--seer-config", str(seer)])
    assert code == 0, err
    assert "exported" in out and "max |diff|" in out
    m = ExportManifest.load(tmp_path / "x")
    assert m.seer.layers == (1,) and (m.seer.abs_threshold, m.seer.rel_threshold) == (0.02, 0.1)
    assert m.seer.sparsity_rows == [(1, s) for s in STAT_NAMES]
    assert m.graphs["step"].outputs["sparsity"].shape == ["batch", len(STAT_NAMES), "seq"]
    # The sparsity rows follow the thresholds of the config, computed in the graph.
    ids = np.array([[10, 15, 3, 1, 4, 13, 12, 12, 12]])
    got = OrtBackend(tmp_path / "x").step0(StepInput(ids, None)).sparsity
    model = load_checkpoint(ckpt).model
    want = model(torch.from_numpy(ids), stats=StatsSpec((1,), 0.02, 0.1)).stats
    assert want is not None and np.allclose(got, want.reshape(1, 4, -1).numpy(), atol=1e-6)
    code, _, err = cli_exit(["export", str(ckpt), "--out", str(tmp_path / "y"), "--dtype", "bf16"])
    assert code == 2 and "bf16" in err and "Traceback" not in err


def test_graph_confidence_ranks_near_certain_predictions_as_float64_does() -> None:
    """The commit score keeps its precision where float32 probabilities saturate just under 1.0.

    The demo's EOS tail sits at p = 0.99999988 or 0.99999976 in float32: dozens of positions tie, and torch and
    ONNX Runtime, whose logits differ by 1e-6, broke those ties differently (1 of 200 prompts, measured). The graphs'
    log-probability must match float64 to a relative 1e-5 of the doubt (1 - p), so the order is the true order.
    """
    from seer_deploy.models.networks.confidence import greedy_head, log_prob_of, token_log_prob

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 64, 126, generator=gen)
    logits[..., 7] += torch.linspace(10.0, 24.0, 64)  # from confident to saturated
    ids, log_conf, top, log_total = greedy_head(logits)
    want = torch.log_softmax(logits.double(), dim=-1)
    want_conf, want_ids = want.max(dim=-1)
    assert torch.equal(ids, want_ids)
    # float32 probabilities tie; the log-probabilities do not, and they order as float64 does.
    p32 = torch.softmax(logits, dim=-1).max(dim=-1).values
    assert len(torch.unique(p32[0, 40:])) < 8
    torch.testing.assert_close(log_conf.double(), want_conf, atol=0.0, rtol=1e-5)
    assert torch.equal(torch.argsort(log_conf[0], stable=True), torch.argsort(want_conf[0], stable=True))
    # Any other token (a sample, EOS) is scored with the same arithmetic.
    other = torch.full_like(ids, 3)
    torch.testing.assert_close(log_prob_of(logits, other, top, log_total).double(), want[..., 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(token_log_prob(logits, ids), log_conf, atol=0.0, rtol=0.0)
