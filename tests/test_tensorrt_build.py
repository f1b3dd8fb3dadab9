"""TensorRT-RTX engines built here, without a GPU, from every kind of export the project makes, with the project's
own profile plans: the defaults of `build --backend tensorrt` for the demo (with the KV cache), demo-vl and the family
checkpoints; fewer buckets for the fp16 demo and LaViDa, to keep CI short.

What is checked without a GPU (deserializing an engine needs one): every graph parses and its inputs are the ones
the export records (names and ONNX dimension names); the optimization profiles TensorRT was handed, read back from
the IOptimizationProfile objects the build created (count, and min/opt/max per input), equal the plan
(`build.tensorrt_plans`) and what engine.json records; engine.json names the library, its version and the targets;
polygraphy's `inspect capability` (driving TensorRT-RTX) finds every node of every graph supported; the install is
atomic (a failed build leaves nothing at --out); a wrong plan fails with a message naming the profile, input and
min/opt/max; TensorRT's own refusal is reported as such; loading refuses in one line where no GPU
is visible. TensorRT-RTX is a test dependency, so nothing here skips for want of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tensorrt_rtx
from test_build import run_main
from test_families_lavida import write_lavida_llada
from test_families_text import family_checkpoint

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines import build as build_module
from seer_deploy.engines import tensorrt_build
from seer_deploy.engines.build import BuildOptions, engine_graphs, prepare_build, tensorrt_plans
from seer_deploy.engines.manifest import RTX_TARGETS, EngineManifest, RuntimeFacts
from seer_deploy.engines.profiles import Profile, ShapeRange
from seer_deploy.engines.tensorrt_engine import StepModel, TensorRTBackend
from seer_deploy.engines.tensorrt_library import load_library, parse_compute_capabilities
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions

RTX = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx")


@dataclass
class Handed:
    """What a build gave TensorRT-RTX: its networks and optimization profiles, in order (TensorRT has no getter for a
    config's profiles, so the Builder is wrapped to keep the ones it hands out; read back with get_shape)."""

    networks: list[Any] = field(default_factory=list)
    profiles: list[Any] = field(default_factory=list)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Handed:
    handed = Handed()

    class RecordingBuilder(tensorrt_rtx.Builder):  # type: ignore[misc]
        def create_network(self, flags: int) -> Any:
            handed.networks.append(super().create_network(flags))
            return handed.networks[-1]

        def create_optimization_profile(self) -> Any:
            handed.profiles.append(super().create_optimization_profile())
            return handed.profiles[-1]

    monkeypatch.setattr(tensorrt_rtx, "Builder", RecordingBuilder)
    return handed


def check_engine_dir(export_dir: Path, engine_dir: Path, options: BuildOptions, built: Handed
                     ) -> EngineManifest:
    """Every graph of the export parsed and got the planned profiles, as engine.json records them."""
    export = ExportManifest.load(export_dir)
    manifest = EngineManifest.load(engine_dir)
    run = prepare_build(export_dir, engine_dir.parent / "replan", options)  # the plan, made again
    graphs = engine_graphs(export)
    trt = manifest.tensorrt
    assert trt is not None and trt.library == "tensorrt_rtx" and trt.version == tensorrt_rtx.__version__
    assert trt.gpu_name == "" and trt.compute_capability == ""  # built for targets, not for a GPU
    assert trt.compute_capabilities == options.compute_capabilities
    assert manifest.versions["tensorrt"] == f"TensorRT-RTX {tensorrt_rtx.__version__}"
    assert sorted(manifest.files) == sorted(graphs) == sorted(run.plans)
    assert manifest.graph_hashes == {name: g.sha256 for name, g in graphs.items()}
    assert trt.profile_index == {b: i for i, b in enumerate(manifest.buckets)}
    assert trt.profiles == {name: [p.to_dict() for p in plan] for name, plan in run.plans.items()}
    for name in graphs:
        assert (engine_dir / manifest.files[name]).stat().st_size > 1 << 20
    # What TensorRT was given, graph by graph in build order: the parsed inputs and the profiles' shapes.
    assert len(built.networks) == len(run.plans)
    handed = iter(built.profiles)
    for network, (name, plan) in zip(built.networks, run.plans.items(), strict=True):
        parsed = tensorrt_build.network_inputs(network)
        assert parsed == {k: v.shape for k, v in graphs[name].inputs.items()}, name
        for profile in plan:
            trt_profile = next(handed)
            for tensor, shape in profile.shapes.items():
                got = [tuple(d) for d in trt_profile.get_shape(tensor)]
                assert got == [shape.min, shape.opt, shape.max], (name, profile.index, tensor)
    assert next(handed, None) is None  # no profile more than planned
    for graph in graphs.values():  # polygraphy's own view: TensorRT-RTX supports every node
        assert polygraphy_capability(export_dir / graph.file) == "Graph is fully supported by TensorRT", graph.file
    return manifest


def polygraphy_capability(onnx_path: Path) -> str:
    """The verdict of `polygraphy inspect capability` driving TensorRT-RTX (its last log line)."""
    tool = Path(sys.executable).parent / "polygraphy"  # the test extras' console script, beside this interpreter
    done = subprocess.run([str(tool), "inspect", "capability", str(onnx_path)], capture_output=True, text=True,
                          env={**os.environ, "POLYGRAPHY_USE_TENSORRT_RTX": "1"}, cwd=onnx_path.parent, timeout=300,
                          check=False)
    verdict = [line for line in (done.stdout + done.stderr).splitlines() if "supported by TensorRT" in line]
    return verdict[-1].split("] ", 1)[-1].split(";")[0] if verdict else done.stdout + done.stderr


# ---------------------------------------------------------------- the demo: text graphs, fp32 with the KV cache, fp16


@pytest.fixture(scope="module")
def demo_export(shared_demo_export: Callable[[str], Path]) -> Path:
    return shared_demo_export("demo-kv")


def test_demo_with_the_kv_cache_builds_without_a_gpu(demo_export: Path, tmp_path: Path,
                                                     recording: Handed) -> None:
    options = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx", timing_cache=tmp_path / "timing.cache")
    lines: list[str] = []
    result = prepare_build(demo_export, tmp_path / "engine", options).start(lines.append)
    manifest = check_engine_dir(demo_export, result.out, options, recording)
    assert manifest.buckets == (16, 32, 64, 128, 160) and manifest.has_cache  # the real plan: 320 positions
    profiles = {name: len(p) for name, p in manifest.tensorrt.profiles.items()}  # type: ignore[union-attr]
    assert profiles == {"step": 5, "prompt_step": 5, "window_step": 10}  # a bucket each; windows of two widths
    assert tensorrt_build.TIMING_CACHE_NOTE in lines and not (tmp_path / "timing.cache").exists()
    assert any("no GPU needed" in line for line in lines)


def test_demo_fp16_builds(tmp_path: Path, recording: Handed) -> None:
    export = export_checkpoint("demo", tmp_path / "export", ExportOptions(dtype="fp16")).out  # passes its own check
    options = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx", compute_capabilities=("7.5", "8.9"),
                           buckets=(32, 64), max_batch=4)
    prepare_build(export, tmp_path / "engine", options).start()
    check_engine_dir(export, tmp_path / "engine", options, recording)


def test_a_wrong_plan_fails_naming_the_input_and_leaves_nothing(demo_export: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile whose attention_mask is one position short of input_ids: refused before TensorRT builds, naming the
    graph, profile, input and ranges; TensorRT's own refusal of the same plan is reported as a profile problem."""
    real = build_module.tensorrt_plans

    def off_by_one(*args: Any) -> dict[str, list[Profile]]:
        plans = real(*args)
        first = plans["step"][0]
        mask = first.shapes["attention_mask"]
        short = ShapeRange(mask.min, (mask.opt[0], mask.opt[1] - 1), (mask.max[0], mask.max[1] - 1))
        plans["step"][0] = Profile(first.index, first.bucket, first.lo, {**first.shapes, "attention_mask": short})
        return plans

    monkeypatch.setattr(build_module, "tensorrt_plans", off_by_one)
    out = tmp_path / "engine"
    run = prepare_build(demo_export, out, RTX)
    with pytest.raises(ArtifactError, match=r"the step graph's optimization profile 0 \(bucket 16\): input "
                       r"attention_mask dim 1 \(seq\) has min/opt/max 2/175/175, input input_ids has 2/176/176"):
        run.start()
    assert not out.exists() and list(tmp_path.iterdir()) == []  # the staging dir went too
    monkeypatch.setattr(tensorrt_build, "check_profiles", lambda *args: None)
    with pytest.raises(ArtifactError, match="TensorRT-RTX 1.7.1.116 refused the step engine's optimization "
                       r"profiles: .*; the step graph's optimization profile 0 \(bucket 16\): input attention_mask "
                       "dim 1 \\(seq\\) has min/opt/max 2/175/175") as caught:
        prepare_build(demo_export, out, RTX).start()
    assert "\n" not in str(caught.value) and not out.exists()


def test_loading_refuses_in_one_line_without_a_gpu(demo_export: Path, tmp_path: Path) -> None:
    engine = prepare_build(demo_export, tmp_path / "engine", BuildOptions(backend="tensorrt", buckets=(32,),
                                                                         max_batch=1)).start().out
    export = ExportManifest.load(demo_export)
    facts = RuntimeFacts(model_fingerprint=export.model.fingerprint,
                         graph_hashes={k: g.sha256 for k, g in export.graphs.items()})
    with pytest.raises(ConfigError, match="TensorRT engines run on a CUDA GPU and none is visible") as caught:
        TensorRTBackend.open(engine, facts, StepModel([], export.max_seq_len))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("flags", "message"), [
    (["--compute-capability", "9.0"], "'9.0' is not a TensorRT-RTX target \\(Hopper\\)"),
    (["--compute-capability", "7.5"], "7.5 \\(Turing\\): TensorRT-RTX has no FP32 GEMMs there"),
    (["--compute-capability", ","], "names no target"),
    (["--trt-library", "tensorrt"], "TensorRT is not installed: pip install tensorrt"),
    (["--max-pictures", "2"], "--max-pictures sizes a multimodal engine's image axes"),
    (["--backend", "ort", "--compute-capability", "8.9"], "apply to --backend tensorrt only"),
])
def test_bad_tensorrt_flags_exit_2_before_any_work(demo_export: Path, tmp_path: Path, flags: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["build", str(demo_export), "--out", str(tmp_path / "e"), *(["--backend", "tensorrt"]
                                                                       if "--backend" not in flags else []), *flags]
    code, _, err = run_main(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert re.search(message, err), err
    assert not (tmp_path / "e").exists()


# ---------------------------------------------------------------- multimodal: demo-vl and LaViDa, vision graphs too


def test_demo_vl_builds_with_its_vision_graph(tmp_path: Path, recording: Handed, capsys: pytest.CaptureFixture[str],
                                              shared_demo_export: Callable[[str], Path]) -> None:
    """`seer-deploy build EXPORT --backend tensorrt` of `seer-deploy export demo-vl`, as a user runs it."""
    export = shared_demo_export("demo-vl")
    code, out, err = run_main(["build", str(export), "--out", str(tmp_path / "engine"), "--backend", "tensorrt"], capsys)
    assert code == 0 and "engine dir:" in out and "building the vision engine (1 profile)" in err, err
    manifest = check_engine_dir(export, tmp_path / "engine", RTX, recording)
    trt = manifest.tensorrt
    assert trt is not None and "vision" in manifest.files
    vision = ExportManifest.load(export).extra["multimodal"]["vision_config"]
    per_picture = vision["tokens_per_image"]
    pictures = manifest.max_batch * (manifest.max_prompt // per_picture)  # as many as the widest prompts hold
    assert trt.images is not None and trt.images.images == pictures
    assert trt.images.image_tokens == min(pictures * per_picture, manifest.max_batch * manifest.max_prompt)
    (vision_profile,) = trt.profiles["vision"]
    assert vision_profile["shapes"]["pixel_values"]["max"][0] == pictures
    assert all(p["shapes"]["image_table"]["max"][0] == trt.images.image_tokens for p in trt.profiles["step"])
    with pytest.raises(ConfigError, match="multimodal TensorRT engine dir; running one is not implemented"):
        TensorRTBackend.open(tmp_path / "engine", RuntimeFacts(), StepModel([], 96))


def test_lavida_anyres_builds_with_the_largest_picture(tmp_path: Path, recording: Handed) -> None:
    """LaViDa (prefix-DLM attention, anyres): a picture is a base view and up to the largest pinpoint's crops."""
    from test_families_lavida import ANYRES, SEED, edit_config

    ckpt = write_lavida_llada(tmp_path / "ck", seed=SEED)
    edit_config(ckpt, image_aspect_ratio="anyres", image_grid_pinpoints=[list(p) for p in ANYRES.pinpoints])
    export = export_multimodal(ckpt, tmp_path / "export").out
    options = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx", buckets=(16,), max_batch=2,
                           max_pictures=1)
    manifest = check_engine_dir(export, prepare_build(export, tmp_path / "engine", options).start().out, options,
                                recording)
    crops = max((w // ANYRES.crop) * (h // ANYRES.crop) for w, h in ANYRES.pinpoints)
    assert manifest.tensorrt is not None and manifest.tensorrt.images is not None
    assert manifest.tensorrt.images.images == 1 + crops  # one picture's views per vision call
    assert "prompt_width" in manifest.tensorrt.profiles["step"][0]["shapes"]


# ---------------------------------------------------------------- one tiny checkpoint per family


@pytest.mark.parametrize("family", ["dream", "llada_moe", "mmada"])
def test_each_family_builds(family: str, tmp_path: Path, recording: Handed) -> None:
    _, ckpt = family_checkpoint(tmp_path, family)
    export = export_checkpoint(ckpt, tmp_path / "export").out
    options = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx", compute_capabilities=("8.9",))
    check_engine_dir(export, prepare_build(export, tmp_path / "engine", options).start().out, options, recording)


def test_the_rtx_targets_are_the_librarys_compute_capabilities() -> None:
    """--compute-capability is checked against RTX_TARGETS before the library loads; they must be its enum's."""
    members = {name for name in tensorrt_rtx.ComputeCapability.__members__ if name.startswith("SM")}
    assert members == {"SM" + target.replace(".", "") for target in RTX_TARGETS}
    assert parse_compute_capabilities("sm89, 8.6,8.9") == ("8.6", "8.9")


def test_build_failure_messages_drop_source_locations_and_cuda_noise() -> None:
    lib = load_library("tensorrt_rtx")
    cuda = ("[checkMacros.cpp::catchCudaError::250] Error Code 1: Cuda Runtime (CUDA driver version is insufficient "
            "for CUDA runtime version)")
    myelin = ("IBuilder::buildSerializedNetwork: Error Code 1: Myelin ([ir_graph_builder.cpp:300: myelinGraphSetInput"
              "ShapeProfile] Called with invalid shape profile, expect min <= common <= max on input 5). In "
              "processShapeTensors at /_src/optimizer/myelin/codeGenerator.cpp:3056)")
    errors = [cuda, myelin]
    message = str(tensorrt_build.build_failure(lib, "window_step", errors))
    assert "refused the window_step engine's optimization profiles: an input (in its own numbering)" in message
    assert "/_src" not in message and "Cuda Runtime" not in message
    assert "could not build the step engine: out of memory" in str(
        tensorrt_build.build_failure(lib, "step", ["out of memory"]))


def test_the_demo_builds_hand_computed_profiles_that_survive_json(demo_export: Path) -> None:
    """The default build of the demo (buckets 16..160, batch 8, prompts 1..160; 4 layers, 4 kv heads of 32) plans
    what the geometry says, written out by hand: a bucket's sequences run from the shortest prompt plus the bucket
    below plus one to the longest prompt plus the bucket; a window profile's windows from the window below plus one."""
    export = ExportManifest.load(demo_export)
    run = prepare_build(demo_export, demo_export.parent / "unused", RTX)
    plans = {name: [json.loads(json.dumps(p.to_dict())) for p in plan]
             for name, plan in tensorrt_plans(export, run.layout, run.windows).items()}
    assert [p["bucket"] for p in plans["step"]] == [16, 32, 64, 128, 160]
    tokens = {"min": [1, 1 + 128 + 1], "opt": [8, 160 + 160], "max": [8, 160 + 160]}
    per_row = {"min": [1], "opt": [8], "max": [8]}
    assert plans["step"][-1] == {"bucket": 160, "shapes": {
        "input_ids": tokens, "attention_mask": tokens, "temperature": per_row, "sample_uniform": tokens,
        "candidates": {"min": [1, 1], "opt": [8, 320], "max": [8, 320]}, "with_stats": per_row,
        "score_rule": per_row, "score_temperature": per_row}}
    assert plans["step"][0]["shapes"]["input_ids"] == {"min": [1, 2], "opt": [8, 176], "max": [8, 176]}
    window = {"min": [1, 33], "opt": [8, 160], "max": [8, 160]}
    assert plans["window_step"][-1] == {"bucket": 160, "windows": [33, 160], "shapes": {
        "window_ids": window, "attention_mask": tokens, "window_start": per_row,
        "kv": {"min": [4, 2, 1, 4, 130, 32], "opt": [4, 2, 8, 4, 320, 32], "max": [4, 2, 8, 4, 320, 32]},
        "temperature": per_row, "sample_uniform": window}}
    assert len(plans["window_step"]) == 2 * len(plans["step"])  # windows of up to 32 and of 33..160 per bucket
