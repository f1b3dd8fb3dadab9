"""TensorRT: a clear refusal where it is missing; on a GPU machine, build per-bucket engines and match ONNX Runtime.

The GPU tests skip with a reason where TensorRT or CUDA is missing. Note that `import tensorrt` succeeds wherever
tensorrt-stubs is installed (its .pyi files make an empty namespace package), so the fixture also checks for the
real bindings.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from test_build import cpu_options, make_export

from seer_deploy.core.backend import StepInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines import tensorrt_engine
from seer_deploy.engines.build import BuildOptions, build_engines
from seer_deploy.engines.manifest import MANIFEST_FILE, EngineManifest, RuntimeFacts
from seer_deploy.engines.ort import OrtBackend
from seer_deploy.engines.tensorrt_engine import TensorRTBackend
from seer_deploy.spec.export_manifest import ExportManifest


def test_availability_needs_the_real_bindings() -> None:
    try:
        import tensorrt
    except ImportError:
        assert not tensorrt_engine.tensorrt_available()
        return
    assert tensorrt_engine.tensorrt_available() == hasattr(tensorrt, "Builder")


@pytest.mark.skipif(tensorrt_engine.tensorrt_available(), reason="TensorRT is installed here")
def test_without_tensorrt_every_entry_point_is_a_config_error(tmp_path: Path) -> None:
    export_dir = make_export(tmp_path / "export")
    for call in (tensorrt_engine.require_tensorrt, tensorrt_engine.tensorrt_version):
        with pytest.raises(ConfigError, match="TensorRT is not installed"):
            call()
    with pytest.raises(ConfigError, match="--backend ort"):
        build_engines(export_dir, tmp_path / "engine", BuildOptions(backend="tensorrt"))
    assert not (tmp_path / "engine").exists()
    manifest = build_engines(export_dir, tmp_path / "ort-engine", cpu_options(buckets=(32,))).manifest
    with pytest.raises(ConfigError, match="TensorRT is not installed"):
        TensorRTBackend(tmp_path / "ort-engine", manifest, sparsity_rows=[], max_seq_len=96)


def test_io_buffers_are_allocated_once_and_handed_out_as_views() -> None:
    """The buffer logic runs without TensorRT (here on the CPU): one allocation per tensor, views of any smaller shape
    at the same address, in the dense row-major layout TensorRT reads and writes."""
    buffers = tensorrt_engine.IOBuffers({"input_ids": (4, 84), "sparsity": (4, 8, 84)},
                                        {"input_ids": torch.int64, "sparsity": torch.float32}, torch.device("cpu"))
    address = buffers.address("input_ids")
    for shape in ((1, 3), (4, 84), (2, 40)):
        view = buffers.view("input_ids", shape)
        assert tuple(view.shape) == shape and view.is_contiguous() and view.data_ptr() == address
        view.copy_(torch.arange(view.numel()).reshape(shape))
        assert buffers.view("input_ids", shape).flatten().tolist() == list(range(view.numel()))
    assert buffers.view("sparsity", (2, 8, 5)).dtype == torch.float32
    assert buffers.address("input_ids") == address  # nothing was reallocated
    for bad in ((5, 3), (1, 85), (4,)):
        with pytest.raises(ConfigError, match="exceeds the engine's largest profile"):
            buffers.view("input_ids", bad)


@pytest.fixture(scope="module")
def trt() -> ModuleType:
    module = pytest.importorskip("tensorrt", reason="TensorRT is not installed (it needs an NVIDIA GPU machine)")
    if not hasattr(module, "Builder"):
        pytest.skip("only tensorrt-stubs is installed, not the TensorRT bindings")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT is installed but no CUDA GPU is visible")
    return module


def export_facts(export_dir: Path) -> RuntimeFacts:
    m = ExportManifest.load(export_dir)
    return RuntimeFacts(model_fingerprint=m.model.fingerprint, graph_hashes={k: g.sha256 for k, g in m.graphs.items()})


def test_tensorrt_engines_match_onnx_runtime(trt: ModuleType, tmp_path: Path) -> None:
    export_dir = make_export(tmp_path / "export")
    cache = tmp_path / "timing.cache"
    options = BuildOptions(backend="tensorrt", buckets=(16, 32, 48), max_batch=4, max_prompt=40, min_prompt=2,
                           timing_cache=cache, workspace_bytes=1 << 28)
    manifest = build_engines(export_dir, tmp_path / "engine", options).manifest
    assert cache.is_file() and cache.stat().st_size > 0
    assert manifest.tensorrt is not None and manifest.tensorrt.profile_index == {16: 0, 32: 1, 48: 2}
    assert manifest.tensorrt.version == trt.__version__
    assert manifest.tensorrt.gpu_name == torch.cuda.get_device_name(0)
    raw = json.loads((tmp_path / "engine" / MANIFEST_FILE).read_text())
    assert raw["tensorrt"]["compute_capability"] == "{}.{}".format(*torch.cuda.get_device_capability(0))

    export = ExportManifest.load(export_dir)
    backend = TensorRTBackend.open(tmp_path / "engine", export_facts(export_dir),
                                   sparsity_rows=list(export.seer.sparsity_rows), max_seq_len=export.max_seq_len)
    reference = OrtBackend(export_dir)
    rng = np.random.default_rng(0)
    # Sequence lengths at and around every profile boundary (max_prompt 40 + bucket), batches 1 and 4.
    for seq in (3, 40 + 16, 40 + 17, 40 + 32, 40 + 33, 40 + 48):
        for batch in (1, 4):
            ids = rng.integers(0, 17, size=(batch, seq), dtype=np.int64)
            mask = np.ones_like(ids)
            mask[:, : rng.integers(0, 2)] = 0
            got0, want0 = backend.step0(StepInput(ids, mask)), reference.step0(StepInput(ids, mask))
            for a, b in zip(got0, want0, strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
            for temperature, seed in ((0.0, None), (0.7, 123)):
                got, want = backend.step(StepInput(ids, mask, temperature, seed)), reference.step(StepInput(ids, mask, temperature, seed))
                np.testing.assert_array_equal(got.token_ids, want.token_ids)
                np.testing.assert_allclose(got.confidence, want.confidence, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="largest profile"):
        backend.step0(StepInput(np.zeros((1, 40 + 49), dtype=np.int64), None))
    with pytest.raises(ConfigError, match="batch 5"):
        backend.step0(StepInput(np.zeros((5, 20), dtype=np.int64), None))

    # A second build reads the timing cache it left; an engine is refused for another export.
    build_engines(export_dir, tmp_path / "engine2", options)
    other = make_export(tmp_path / "other", fingerprint="2" * 64)
    with pytest.raises(ArtifactError, match="built for model"):
        TensorRTBackend.open(tmp_path / "engine", export_facts(other), sparsity_rows=[], max_seq_len=96)


def test_engine_from_another_gpu_or_version_is_refused(trt: ModuleType, tmp_path: Path) -> None:
    export_dir = make_export(tmp_path / "export")
    build_engines(export_dir, tmp_path / "engine", BuildOptions(backend="tensorrt", buckets=(32,), max_batch=1))
    manifest = EngineManifest.load(tmp_path / "engine")
    assert manifest.tensorrt is not None
    for field, value in (("version", "0.0.0"), ("gpu_name", "another GPU"), ("compute_capability", "1.0")):
        data = manifest.to_dict()
        data["tensorrt"][field] = value
        (tmp_path / "engine" / MANIFEST_FILE).write_text(json.dumps(data))
        with pytest.raises(ArtifactError):
            TensorRTBackend.open(tmp_path / "engine", export_facts(export_dir), sparsity_rows=[], max_seq_len=96)
