"""open_target: checkpoints, export dirs and engine dirs open as backends that give the same tokens, with the ids,
tokenizer and Seer config of the artifact; stale or foreign engines are refused before anything loads."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_model

from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.build import BuildOptions, build_engines
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.engines.tensorrt_engine import tensorrt_available
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.openers import open_target
from seer_deploy.runtime.targets import TargetOptions, find_seer_config, target_kind
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CPU = TargetOptions(providers=("CPUExecutionProvider",))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny checkpoint, its export, and an ONNX Runtime engine built into export/engine."""
    root = tmp_path_factory.mktemp("targets")
    write_tokenizer(root / "tokenizer.json")
    ckpt = save_checkpoint(tiny_model(5), root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    export = export_checkpoint(ckpt, root / "export").out
    session = OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=1)
    engine = build_engines(export, export / "engine", BuildOptions(backend="ort", ort_session=session)).out
    return {"ckpt": ckpt, "export": export, "engine": engine, "root": root}


def edit_engine_json(engine: Path, dest: Path, **changes: object) -> Path:
    """A copy of the engine dir with engine.json fields replaced."""
    shutil.copytree(engine, dest)
    data = json.loads((dest / "engine.json").read_text())
    data.update(changes)
    (dest / "engine.json").write_text(json.dumps(data))
    return dest


def test_each_kind_opens_its_own_backend_with_the_artifacts_ids(artifacts: dict[str, Path]) -> None:
    torch_backend, ckpt_info = open_target(str(artifacts["ckpt"]))
    ort_backend, export_info = open_target(str(artifacts["export"]), options=CPU)
    engine_backend, engine_info = open_target(str(artifacts["engine"]))
    assert isinstance(torch_backend, TorchBackend) and ckpt_info.kind == "checkpoint" and ckpt_info.backend == "torch"
    assert isinstance(ort_backend, OrtBackend) and export_info.kind == "export" and export_info.backend == "ort"
    assert isinstance(engine_backend, OrtBackend) and engine_info.kind == "engine" and engine_info.backend == "ort"
    assert engine_info.export_dir is not None and engine_info.export_dir.resolve() == artifacts["export"].resolve()
    assert engine_info.buckets and engine_info.max_batch is None
    cfg = ckpt_info.config
    for info in (ckpt_info, export_info, engine_info):
        assert (info.mask_id, info.eos_id, info.pad_id, info.eot_id) == (cfg.mask_id, cfg.eos_id, cfg.pad_id, None)
        assert info.config == cfg
    # The engine dir's recorded session settings are used: CPU, one thread.
    assert engine_backend.providers == ["CPUExecutionProvider"] and engine_backend.options.intra_op_threads == 1
    # Exports carry the checkpoint's tokenizer.json (issue 36); an engine reads its export's.
    assert export_info.tokenizer_dir == artifacts["export"] == engine_info.tokenizer_dir
    assert (artifacts["export"] / "tokenizer.json").read_bytes() == (artifacts["ckpt"] / "tokenizer.json").read_bytes()
    assert export_info.checkpoint == str(artifacts["ckpt"].absolute())
    tok = engine_info.tokenizer()
    assert tok.encode_prompt("reverse 12") == ckpt_info.tokenizer().encode_prompt("reverse 12")


def test_every_target_gives_the_same_tokens(artifacts: dict[str, Path]) -> None:
    config = GenerationConfig(gen_length=16, steps=8)
    prompts = [[10, 14, 1, 2, 3, 13], [10, 15, 4, 13]]
    tokens = []
    for target in ("ckpt", "export", "engine"):
        backend, info = open_target(str(artifacts[target]), options=CPU if target == "export" else None)
        seer = SeerConfig(detector="eos", eos_floor=0.0, margin=2)
        out = run_generation(backend, prompts, config, ids=SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id),
                             seer=seer)
        tokens.append(out.tokens)
    np.testing.assert_array_equal(tokens[0], tokens[1])
    np.testing.assert_array_equal(tokens[0], tokens[2])


def test_asking_for_another_backend_names_the_way_there(artifacts: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"is a checkpoint, which runs on torch.*--build ort"):
        open_target(str(artifacts["ckpt"]), TargetOptions(backend="ort"))
    with pytest.raises(ConfigError, match=r"export directory \(ONNX\); for torch give its checkpoint"):
        open_target(str(artifacts["export"]), TargetOptions(backend="torch"))
    with pytest.raises(ConfigError, match=r"build a TensorRT engine from it first.*--backend tensorrt"):
        open_target(str(artifacts["export"]), TargetOptions(backend="tensorrt"))
    with pytest.raises(ConfigError, match=r"is a ort engine, not tensorrt.*seer-deploy build"):
        open_target(str(artifacts["engine"]), TargetOptions(backend="tensorrt"))
    with pytest.raises(ConfigError, match="backend 'onnx' is unknown"):
        open_target(str(artifacts["engine"]), TargetOptions(backend="onnx"))  # type: ignore[arg-type]


def test_stale_or_foreign_engines_are_refused_before_loading(artifacts: dict[str, Path], tmp_path: Path) -> None:
    engine = artifacts["engine"]
    foreign = edit_engine_json(engine, artifacts["export"] / "foreign", model_fingerprint="f" * 64)
    try:
        with pytest.raises(ArtifactError, match="built for model ffffffffffff"):
            open_target(str(foreign))
    finally:
        shutil.rmtree(foreign)
    stale = json.loads((engine / "engine.json").read_text())["graph_hashes"]
    stale["step"] = "0" * 64
    changed = edit_engine_json(engine, artifacts["export"] / "changed", graph_hashes=stale)
    try:
        with pytest.raises(ArtifactError, match="the export changed since the build"):
            open_target(str(changed))
    finally:
        shutil.rmtree(changed)
    # A TensorRT engine of another model: the mismatch is reported even where TensorRT is missing.
    trt_facts = {"version": "10.0", "gpu_name": "GPU", "compute_capability": "9.0",
                 "profile_index": {str(b): i for i, b in enumerate(json.loads((engine / "engine.json").read_text())["buckets"])}}
    trt_files = {"step": "step.engine"}
    trt = edit_engine_json(engine, artifacts["export"] / "trt", backend="tensorrt", tensorrt=trt_facts,
                           model_fingerprint="e" * 64, files=trt_files)
    fitting = edit_engine_json(engine, artifacts["export"] / "trt-ok", backend="tensorrt", tensorrt=trt_facts,
                               files=trt_files)
    try:
        with pytest.raises(ArtifactError, match="built for model eeeeeeeeeeee"):
            open_target(str(trt))
        if not tensorrt_available():  # the engine fits the export: what is missing is TensorRT itself
            with pytest.raises(ConfigError, match="TensorRT is not installed"):
                open_target(str(fitting))
    finally:
        shutil.rmtree(trt)
        shutil.rmtree(fitting)


def test_engine_dirs_find_their_export(artifacts: dict[str, Path], tmp_path: Path) -> None:
    # The recorded export path is gone but the engine sits in DIR/engine of an export: the parent is used.
    moved = edit_engine_json(artifacts["engine"], artifacts["export"] / "moved",
                             extra={"export_dir": str(tmp_path / "gone")})
    try:
        _, info = open_target(str(moved))
        assert info.export_dir == artifacts["export"]
    finally:
        shutil.rmtree(moved)
    lost = edit_engine_json(artifacts["engine"], tmp_path / "lost", extra={"export_dir": str(tmp_path / "gone")})
    with pytest.raises(ArtifactError, match=r"which is gone.*seer-deploy build"):
        open_target(str(lost))


def test_target_kinds_and_bad_targets(artifacts: dict[str, Path], tmp_path: Path) -> None:
    assert [target_kind(artifacts[k]) for k in ("ckpt", "export", "engine")] == ["checkpoint", "export", "engine"]
    assert target_kind("demo") == "checkpoint"
    with pytest.raises(ConfigError, match="does not exist; give a checkpoint directory"):
        open_target(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        open_target(str(tmp_path / "file"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="holds no engine.json"):
        open_target(str(tmp_path / "empty"))


def test_seer_configs_and_tensorrt_buckets(artifacts: dict[str, Path], tmp_path: Path) -> None:
    assert find_seer_config(artifacts["export"]) is None
    _, info = open_target(str(artifacts["engine"]))
    assert find_seer_config(artifacts["engine"]) is None
    beside_checkpoint = SeerConfig(margin=7)
    beside_checkpoint.save(artifacts["ckpt"] / "seer.json")
    beside_export = SeerConfig(margin=3)
    try:
        # An export or engine without its own seer.json uses the source checkpoint's.
        assert find_seer_config(artifacts["engine"]) == beside_checkpoint
        beside_export.save(artifacts["export"] / "seer.json")
        assert find_seer_config(artifacts["engine"]) == beside_export == find_seer_config(artifacts["export"])
        assert find_seer_config(artifacts["ckpt"]) == beside_checkpoint
    finally:
        (artifacts["ckpt"] / "seer.json").unlink()
        (artifacts["export"] / "seer.json").unlink(missing_ok=True)
    # On TensorRT the kept lengths round up to the engine's buckets, unless the config has its own.
    seer = SeerConfig()
    assert info.seer_for(seer) == seer
    trt_info = replace(info, backend="tensorrt")
    assert trt_info.seer_for(seer) == seer.with_(buckets=info.buckets)
    assert trt_info.seer_for(seer.with_(buckets=(8, 16))) == seer.with_(buckets=(8, 16))
    assert trt_info.seer_for(None) is None
    # torch targets report the layers the Seer config reads.
    backend, _ = open_target(str(artifacts["ckpt"]), seer=SeerConfig(stats_layers=(0,)))
    assert {layer for layer, _ in backend.sparsity_rows} == {0}


# ---------------------------------------------------------------- the command line on every kind of target


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from seer_deploy.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_export_build_then_generate_on_any_target(artifacts: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "onnx"
    code, stdout, err = cli(["export", str(artifacts["ckpt"]), "--out", str(out), "--build", "ort"], capsys)
    assert code == 0, err
    assert (out / "engine" / "engine.json").is_file() and f"engine dir: {out / 'engine'}" in stdout
    args = ["-p", "reverse 12", "-p", "sort 987", "-p", "count 5", "--gen-length", "8", "--json", "--seer",
            "--batch-size", "2"]
    ort = ["--provider", "CPUExecutionProvider"]
    rows = {}
    for name, target in (("ckpt", artifacts["ckpt"]), ("export", out), ("engine", out / "engine")):
        code, stdout, err = cli(["generate", str(target), *args, *(ort if name != "ckpt" else [])], capsys)
        assert code == 0, err
        rows[name] = [json.loads(line) for line in stdout.splitlines()]
        assert "3 prompts on" in err and "tokens processed" in err
    same = {name: [(r["prompt"], r["tokens"], r["seer"]["kept"], r["seer"]["passes"]) for r in v] for name, v in rows.items()}
    assert same["ckpt"] == same["export"] == same["engine"]
    report = rows["engine"][0]["seer"]
    assert {"boundary", "kept", "passes", "tokens_processed", "full_tokens_processed"} <= set(report)
    code, stdout, err = cli(["generate", str(out), "--backend", "tensorrt", "-p", "reverse 1"], capsys)
    assert code == 2 and "build a TensorRT engine from it first" in err
    code, stdout, err = cli(["generate", str(artifacts["ckpt"]), *args, *ort], capsys)
    assert code == 2 and "--provider sets ONNX Runtime sessions" in err and "runs on torch" in err


def test_doctor_reports_the_core_and_the_backends(capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    from seer_deploy.runtime.loopcore import core_name

    for probe in ([], ["--probe"]):  # read from the installed files, then asked of the loaded libraries
        code, stdout, _ = cli(["doctor", "--json", *probe], capsys)
        assert code == 0
        data = json.loads(stdout)
        assert data["loop_core"] == core_name()
        backends = {b["name"]: b for b in data["backends"]}
        assert backends["onnxruntime"]["version"] == onnxruntime.__version__
        assert "CPUExecutionProvider" in backends["onnxruntime"]["detail"]
        assert backends["torch"]["available"] and backends["tensorrt"]["available"] == tensorrt_available()
    code, stdout, _ = cli(["doctor"], capsys)
    assert code == 0 and f"loop core: {core_name()}" in stdout


def test_generate_with_images_takes_the_multimodal_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_multimodal import pictures, write_tiny_vl
    from test_multimodal_cli import torch_reference

    ckpt, _, _ = write_tiny_vl(tmp_path / "vl")
    image = tmp_path / "pic.png"
    pictures(1)[0].save(image)
    code, stdout, err = cli(["generate", str(ckpt), "-p", "<image> colors", "--image", str(image), "--gen-length", "8",
                             "--json", "--no-seer"], capsys)
    assert code == 0, err
    row = json.loads(stdout)
    want = torch_reference(ckpt, ["<image> colors"], [image], GenerationConfig(gen_length=8, steps=8))
    assert row["images"] == [str(image)] and row["tokens"] == want[0]
