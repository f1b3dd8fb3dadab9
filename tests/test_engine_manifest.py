"""engine.json: round trip, atomic writes, refusal of malformed files, and every compatibility mismatch."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from seer_deploy.core.errors import ArtifactError
from seer_deploy.engines.manifest import (
    ENGINE_FORMAT_VERSION,
    MANIFEST_FILE,
    EngineManifest,
    RuntimeFacts,
    TensorRTFacts,
    check_engine_compatible,
)
from seer_deploy.engines.profiles import WindowLayout

FP = "f" * 64
HASHES = {"step": "b" * 64}
CACHE_HASHES = {**HASHES, "window_step": "d" * 64}


def trt_manifest(**overrides: Any) -> EngineManifest:
    fields: dict[str, Any] = {
        "backend": "tensorrt",
        "buckets": (16, 32, 64),
        "max_batch": 8,
        "min_prompt": 1,
        "max_prompt": 64,
        "model_fingerprint": FP,
        "graph_hashes": dict(HASHES),
        "files": {"step": "step.engine"},
        "versions": {"seer_deploy": "0.1.0", "tensorrt": "10.13.0.35"},
        "tensorrt": TensorRTFacts("10.13.0.35", "NVIDIA H200", "9.0", {16: 0, 32: 1, 64: 2}, 4 << 30),
    }
    fields.update(overrides)
    return EngineManifest(**fields)


def cache_trt_manifest(**overrides: Any) -> EngineManifest:
    """A TensorRT engine built from an export with the KV cache graphs: refresh and window_step engines too."""
    fields: dict[str, Any] = {
        "graph_hashes": dict(CACHE_HASHES),
        "files": {name: f"{name}.engine" for name in CACHE_HASHES},
        "tensorrt": TensorRTFacts("10.13.0.35", "NVIDIA H200", "9.0", {16: 0, 32: 1, 64: 2}, None, (16, 32)),
    }
    fields.update(overrides)
    return trt_manifest(**fields)


def ort_manifest(**overrides: Any) -> EngineManifest:
    fields: dict[str, Any] = {
        "backend": "ort",
        "tensorrt": None,
        "files": {"step": ""},
        "versions": {"seer_deploy": "0.1.0", "onnxruntime": "1.32.0"},
        "ort_session": {"provider": "CPUExecutionProvider", "intra_op_threads": 2},
    }
    fields.update(overrides)
    return trt_manifest(**fields)


def matching_facts(engine: EngineManifest) -> RuntimeFacts:
    trt = engine.tensorrt
    return RuntimeFacts(
        model_fingerprint=engine.model_fingerprint,
        graph_hashes=dict(engine.graph_hashes),
        backend=engine.backend,
        tensorrt_version=trt.version if trt else None,
        tensorrt_library=trt.library if trt else None,
        gpu_name=trt.gpu_name if trt else None,
        compute_capability=trt.compute_capability if trt else None,
        onnxruntime_version=engine.versions.get("onnxruntime"),
    )


# ---------------------------------------------------------------- round trip and files


@pytest.mark.parametrize("make", [trt_manifest, ort_manifest, cache_trt_manifest,
                                  lambda **kw: ort_manifest(graph_hashes=dict(CACHE_HASHES),
                                                            files=dict.fromkeys(CACHE_HASHES, ""), **kw)])
def test_round_trip(tmp_path: Path, make: Any) -> None:
    manifest = make(extra={"export_dir": "/x/export"})
    path = manifest.save(tmp_path)
    assert path == tmp_path / MANIFEST_FILE
    loaded = EngineManifest.load(tmp_path)
    assert loaded == manifest
    assert json.loads(path.read_text())["format"] == "seer-deploy-engine"
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]  # no temp file left behind


def test_profile_index_keys_survive_json(tmp_path: Path) -> None:
    trt_manifest().save(tmp_path)
    raw = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert raw["tensorrt"]["profile_index"] == {"16": 0, "32": 1, "64": 2}
    facts = EngineManifest.load(tmp_path).tensorrt
    assert facts is not None and facts.profile_index == {16: 0, 32: 1, 64: 2}


def test_the_cache_engines_and_their_window_lengths(tmp_path: Path) -> None:
    plain = trt_manifest()
    assert not plain.has_cache and plain.window_layout is None
    raw = plain.to_dict()
    assert raw["tensorrt"]["window_lengths"] == []
    del raw["tensorrt"]["window_lengths"]  # a manifest written before the cache engines: still read
    assert EngineManifest.from_dict(raw) == plain
    cache = cache_trt_manifest()
    cache.save(tmp_path)
    assert json.loads((tmp_path / MANIFEST_FILE).read_text())["tensorrt"]["window_lengths"] == [16, 32]
    loaded = EngineManifest.load(tmp_path)
    assert loaded.has_cache and loaded.window_layout == WindowLayout(loaded.layout, (16, 32))
    # Profiles of window_step: every (bucket, window) pair that a call of the bucket can reach (prompts 1..64).
    assert loaded.window_layout.pairs() == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    ort = ort_manifest(graph_hashes=dict(CACHE_HASHES), files=dict.fromkeys(CACHE_HASHES, ""))
    assert ort.has_cache and ort.window_layout is None  # ONNX Runtime runs any window: no profiles


def test_a_failed_save_keeps_the_old_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trt_manifest().save(tmp_path)
    old = (tmp_path / MANIFEST_FILE).read_bytes()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        trt_manifest(max_batch=16).save(tmp_path)
    assert (tmp_path / MANIFEST_FILE).read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]  # no temp file left behind


def test_save_replaces_the_manifest(tmp_path: Path) -> None:
    trt_manifest().save(tmp_path)
    trt_manifest(max_batch=16).save(tmp_path)
    assert EngineManifest.load(tmp_path).max_batch == 16


# ---------------------------------------------------------------- malformed manifests


def mutate(tmp_path: Path, change: Any) -> Path:
    trt_manifest().save(tmp_path)
    path = tmp_path / MANIFEST_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="other"), "not a seer-deploy engine manifest"),
        (lambda d: d.update(format_version=ENGINE_FORMAT_VERSION + 1), f"format_version {ENGINE_FORMAT_VERSION + 1}"),
        (lambda d: d.update(format_version=1), "format_version 1"),
        (lambda d: d.update(backend="onnx"), "unknown backend"),
        (lambda d: d.pop("buckets"), "'buckets' is missing; rebuild the engine"),
        (lambda d: d.update(buckets=[32, 16]), "ascending"),
        (lambda d: d["tensorrt"]["profile_index"].pop("64"), "profile_index covers"),
        (lambda d: d.update(tensorrt=None), "needs its 'tensorrt' section"),
        (lambda d: d["files"].pop("step"), "files"),
        (lambda d: d.update(max_batch=0), "max-batch"),
    ],
)
def test_malformed_manifest_is_refused(tmp_path: Path, change: Any, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        EngineManifest.load(mutate(tmp_path, change))


def _set(path: str, value: Any) -> Any:
    """A change that sets the dotted field `path` of engine.json to `value`."""
    *parents, last = path.split(".")

    def change(data: dict[str, Any]) -> None:
        for key in parents:
            data = data[key]
        data[last] = value
    return change


# Every field a run reads, given a value of another type (or a number no integer field can hold): one ArtifactError
# naming the field and the fix, never a TypeError / ValueError / OverflowError that the CLI calls an internal error.
WRONG_TYPES = [
    ("max_batch", "8"), ("max_batch", 8.5), ("max_batch", True), ("max_batch", 10**30), ("min_prompt", None),
    ("max_prompt", [64]), ("buckets", "16,32"), ("buckets", [16.0, 32, 64]), ("buckets", {"16": 1}),
    ("model_fingerprint", 7), ("graph_hashes", ["b" * 64]), ("graph_hashes", {"step": 1}), ("files", {"step": None}),
    ("versions", {"tensorrt": 10}), ("versions", "10"), ("extra", [1]), ("backend", 1),
    ("tensorrt", "10.13"), ("tensorrt.version", 10.13), ("tensorrt.gpu_name", None), ("tensorrt.compute_capability", 9.0),
    ("tensorrt.profile_index", [0, 1, 2]), ("tensorrt.profile_index", {"16": "0", "32": 1, "64": 2}),
    ("tensorrt.workspace_bytes", "4G"), ("tensorrt.window_lengths", "16"), ("tensorrt.compute_capabilities", [9.0]),
    ("tensorrt.library", 1), ("tensorrt.images", {"image_tokens": "4", "images": 1}), ("tensorrt.images", 4),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES, ids=[f"{f}={v!r}" for f, v in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_refused_in_one_line(tmp_path: Path, field: str, value: Any) -> None:
    with pytest.raises(ArtifactError, match=rf"{field.split('.')[-1]}.*rebuild the engine") as refused:
        EngineManifest.load(mutate(tmp_path, _set(field, value)))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("key", ["\u00b2", "\u0663", "1\u0660", " 16", "-1"])  # superscript two, Arabic-Indic digits
def test_profile_index_keys_are_ascii_whole_numbers(tmp_path: Path, key: str) -> None:
    """str.isdigit() passes '\u00b2' (int() then raises) and Arabic-Indic digits (int() reads them): both refused."""
    def change(data: dict[str, Any]) -> None:
        data["tensorrt"]["profile_index"] = {key: 0, "32": 1, "64": 2}
    with pytest.raises(ArtifactError, match=r"tensorrt.profile_index' has the key .* ASCII digits"):
        EngineManifest.load(mutate(tmp_path, change))


@pytest.mark.parametrize(("field", "value"), [("intra_op_threads", "2"), ("inter_op_threads", 1.5),
                                              ("intra_op_threads", -1), ("graph_optimization", 99),
                                              ("providers", "CPUExecutionProvider"), ("providers", [1])])
def test_ort_session_settings_of_the_wrong_type_are_refused(tmp_path: Path, field: str, value: Any) -> None:
    ort_manifest().save(tmp_path)
    path = tmp_path / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["ort_session"][field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=rf"ort_session.{field}.*rebuild the engine"):
        EngineManifest.load(tmp_path)


def mutate_cache(tmp_path: Path, change: Any) -> Path:
    cache_trt_manifest().save(tmp_path)
    path = tmp_path / MANIFEST_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return tmp_path


def _drop(data: dict[str, Any], name: str) -> None:
    del data["files"][name], data["graph_hashes"][name]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: _drop(d, "step"), "graphs are"),  # the step graph is every engine's
        (lambda d: (d["files"].update(other="v.engine"), d["graph_hashes"].update(other="e" * 64)), "graphs are"),
        (lambda d: d["tensorrt"].update(library="tensorrt_llm"), "tensorrt.library 'tensorrt_llm'"),
        (lambda d: d["tensorrt"].update(profiles={"step": 3}), "tensorrt.profiles"),
        (lambda d: d["tensorrt"].update(images={"image_tokens": 4, "images": 1}), "both a vision engine and its image"),
        (lambda d: d["tensorrt"].update(window_lengths=[]), "window_step engine's window lengths"),
        (lambda d: d["tensorrt"].update(window_lengths=[32, 16]), "ascending"),
        (lambda d: d["tensorrt"].update(window_lengths=[16, 128]), "exceeds the last bucket 64"),
        (lambda d: d["tensorrt"].update(window_lengths=["x"]), r"'tensorrt.window_lengths' is \['x'\]; it must be a list of"),
        (lambda d: _drop(d, "window_step"), r"window_lengths \[16, 32\] without a window_step"),
    ],
)
def test_malformed_cache_engines_are_refused(tmp_path: Path, change: Any, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        EngineManifest.load(mutate_cache(tmp_path, change))


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no engine.json"):
        EngineManifest.load(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        EngineManifest.load(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="holds an array, not an object"):
        EngineManifest.load(tmp_path)


@pytest.mark.parametrize(
    ("name", "message"),
    [("../step0.engine", "outside"), ("/etc/passwd", "absolute path"), (".", "outside"),
     ("sub/../../x.engine", "outside"), ("link.engine", "outside")],
)
def test_engine_files_must_lie_inside_the_engine_dir(tmp_path: Path, name: str, message: str) -> None:
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    (tmp_path / "elsewhere.engine").write_bytes(b"plan")
    (engine_dir / "link.engine").symlink_to(tmp_path / "elsewhere.engine")
    mutate(engine_dir, lambda d: d["files"].update(step=name))
    with pytest.raises(ArtifactError, match=f"files.step.*{message}"):
        EngineManifest.load(engine_dir)


def test_an_ort_engine_without_saved_graphs_names_no_files(tmp_path: Path) -> None:
    ort_manifest().save(tmp_path)
    assert set(EngineManifest.load(tmp_path).files.values()) == {""}


def test_a_tensorrt_engine_file_is_resolved_inside_its_dir(tmp_path: Path) -> None:
    manifest = trt_manifest()
    assert manifest.file(tmp_path, "step") == (tmp_path / manifest.files["step"]).resolve()
    empty = trt_manifest(files={"step": ""})
    with pytest.raises(ArtifactError, match="files.step '' is not a file name"):
        empty.file(tmp_path, "step")  # what TensorRTBackend opens: an empty name is refused there


# ---------------------------------------------------------------- compatibility


@pytest.mark.parametrize("make", [trt_manifest, ort_manifest])
def test_matching_facts_pass(make: Any) -> None:
    engine = make()
    check_engine_compatible(engine, matching_facts(engine))
    check_engine_compatible(engine, RuntimeFacts())  # nothing known: nothing to refuse


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model_fingerprint", "0" * 64, "built for model ffffffffffff, the export is model 000000000000"),
        ("graph_hashes", {"step0": "a" * 64, "step": "c" * 64}, "step graph was built from ONNX bbbbbbbbbbbb"),
        ("graph_hashes", {"step0": "a" * 64}, "export's step is missing"),
        ("backend", "ort", "holds a tensorrt engine, not ort"),
        ("tensorrt_version", "10.12.0.36", "built with TensorRT 10.13.0.35, this machine has 10.12.0.36"),
        ("gpu_name", "NVIDIA A100-SXM4-80GB", "built on a NVIDIA H200, this GPU is a NVIDIA A100"),
        ("compute_capability", "8.0", "compute capability 9.0, this GPU has 8.0"),
    ],
)
def test_every_tensorrt_mismatch_is_an_artifact_error(field: str, value: Any, message: str) -> None:
    engine = trt_manifest()
    facts = dataclasses.replace(matching_facts(engine), **{field: value})
    with pytest.raises(ArtifactError, match=message) as info:
        check_engine_compatible(engine, facts)
    assert "seer-deploy build" in str(info.value)  # every refusal says how to fix it
    assert info.value.exit_code == 2


@pytest.mark.parametrize("make", [cache_trt_manifest,
                                  lambda: ort_manifest(graph_hashes=dict(CACHE_HASHES),
                                                       files=dict.fromkeys(CACHE_HASHES, ""))])
def test_cache_graphs_are_checked_like_the_step_graphs(make: Any) -> None:
    engine = make()
    check_engine_compatible(engine, matching_facts(engine))
    changed = dataclasses.replace(matching_facts(engine), graph_hashes={**CACHE_HASHES, "window_step": "0" * 64})
    with pytest.raises(ArtifactError, match="window_step graph was built from ONNX dddddddddddd, the export's "
                       "window_step has"):
        check_engine_compatible(engine, changed)
    gone = dataclasses.replace(matching_facts(engine), graph_hashes=dict(HASHES))  # re-exported without --kv-cache
    with pytest.raises(ArtifactError, match="the export's window_step is missing"):
        check_engine_compatible(engine, gone)
    # An engine without the cache graphs is not refused for an export that has them (it just does not run them).
    check_engine_compatible(trt_manifest(), dataclasses.replace(matching_facts(trt_manifest()),
                                                                graph_hashes=dict(CACHE_HASHES)))


def test_ort_mismatches() -> None:
    engine = ort_manifest()
    for field, value in (("model_fingerprint", "0" * 64), ("graph_hashes", {}), ("backend", "tensorrt")):
        with pytest.raises(ArtifactError):
            check_engine_compatible(engine, dataclasses.replace(matching_facts(engine), **{field: value}))
    # GPU facts do not concern an ORT engine.
    check_engine_compatible(engine, dataclasses.replace(matching_facts(engine), gpu_name="x", tensorrt_version="y"))


def test_ort_optimised_models_are_tied_to_the_ort_version() -> None:
    plain = ort_manifest()
    saved = ort_manifest(files={"step0": "step0.opt.onnx", "step": "step.opt.onnx"})
    other = dataclasses.replace(matching_facts(plain), onnxruntime_version="1.20.0")
    check_engine_compatible(plain, other)  # only the settings are recorded: any ORT can run them
    with pytest.raises(ArtifactError, match="saved by ONNX Runtime 1.32.0, this is 1.20.0"):
        check_engine_compatible(saved, other)


def test_written_files_honour_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        trt_manifest().save(tmp_path)
    finally:
        os.umask(old)
    assert (tmp_path / MANIFEST_FILE).stat().st_mode & 0o777 == 0o644  # readable by the users who run engines


# ---------------------------------------------------------------- TensorRT-RTX engines


def rtx_manifest(targets: tuple[str, ...] = ()) -> EngineManifest:
    return trt_manifest(tensorrt=TensorRTFacts("1.7.1.116", "", "", {16: 0, 32: 1, 64: 2}, library="tensorrt_rtx",
                                               compute_capabilities=targets))


@pytest.mark.parametrize(("targets", "gpu", "message"), [
    ((), "9.0", "TensorRT-RTX has no Hopper target"),  # the H100/H200 lent for checks cannot run RTX engines
    (("8.9",), "10.0", "no Blackwell \\(data centre\\) target"),
    ((), "7.5", "built for the portable set \\(Ampere and later\\), this GPU is Turing"),
    (("8.6", "8.9"), "12.0", "built for compute capabilities 8.6, 8.9, this GPU is Blackwell \\(RTX\\)"),
])
def test_rtx_engines_are_refused_on_gpus_they_do_not_target(targets: tuple[str, ...], gpu: str, message: str) -> None:
    engine = rtx_manifest(targets)
    facts = dataclasses.replace(matching_facts(engine), gpu_name="some GPU", compute_capability=gpu)
    with pytest.raises(ArtifactError, match=message) as caught:
        check_engine_compatible(engine, facts)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("targets", "gpu"), [((), "8.6"), ((), "12.1"), (("7.5", "8.9"), "7.5"), (("8.9",), "8.9")])
def test_rtx_engines_run_on_any_gpu_they_target(targets: tuple[str, ...], gpu: str) -> None:
    """No GPU name is compared: an RTX engine is built for targets, not for the one GPU of the build."""
    engine = rtx_manifest(targets)
    check_engine_compatible(engine, dataclasses.replace(matching_facts(engine), gpu_name="any", compute_capability=gpu))


def test_rtx_facts_round_trip_and_the_library_is_checked(tmp_path: Path) -> None:
    engine = rtx_manifest(("8.6", "8.9"))
    engine.save(tmp_path)
    loaded = EngineManifest.load(tmp_path)
    assert loaded == engine and loaded.tensorrt is not None and loaded.tensorrt.title == "TensorRT-RTX 1.7.1.116"
    facts = dataclasses.replace(matching_facts(engine), tensorrt_library="tensorrt", compute_capability="8.9")
    with pytest.raises(ArtifactError, match="built with tensorrt_rtx, this machine loads tensorrt; install TensorRT-RTX"):
        check_engine_compatible(engine, facts)
    old = trt_manifest().to_dict()
    del old["tensorrt"]["library"]  # written before there were two flavours: standard TensorRT
    assert EngineManifest.from_dict(old).tensorrt.library == "tensorrt"  # type: ignore[union-attr]
