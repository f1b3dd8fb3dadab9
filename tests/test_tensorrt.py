"""TensorRT: a clear refusal where it is missing; on a GPU machine, build per-bucket engines and match ONNX Runtime.

The KV cache engines' planning (which profiles refresh and window_step get, which one a call picks, the feeds) is
tested here without TensorRT: the engines are stood in for by ONNX Runtime sessions of the same graphs.

The GPU tests skip with a reason where TensorRT or CUDA is missing. Note that `import tensorrt` succeeds wherever
tensorrt-stubs is installed (its .pyi files make an empty namespace package), so the fixture also checks for the
real bindings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import ClassVar

import numpy as np
import onnxruntime as ort
import pytest
import torch
from test_build import cpu_options, make_export, window_input

from seer_deploy.core.backend import StepInput, supports_cache
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines import tensorrt_engine
from seer_deploy.engines.buckets import ProfileLayout, WindowLayout
from seer_deploy.engines.build import BuildOptions, build_engines, tensorrt_profiles
from seer_deploy.engines.manifest import MANIFEST_FILE, EngineManifest, RuntimeFacts, TensorRTFacts
from seer_deploy.engines.ort import OrtBackend
from seer_deploy.engines.tensorrt_engine import TensorRTBackend
from seer_deploy.spec.export_manifest import ExportManifest
from seer_deploy.spec.graphs import GraphIO, cache_graphs, step_graphs


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


# ---------------------------------------------------------------- the KV cache engines, without TensorRT

LAYOUT = ProfileLayout(buckets=(16, 32, 48), max_batch=4, max_prompt=40, min_prompt=2)
WINDOWS = (8, 32)


def test_cache_engines_are_planned_from_the_export(tmp_path: Path) -> None:
    """What `seer-deploy build --backend tensorrt` gives each engine of an export --kv-cache: refresh the step graph's
    profiles (one per bucket), window_step one per (bucket, window length) pair, kv following batch and sequence."""
    export = ExportManifest.load(make_export(tmp_path / "export", kv_cache=True))
    windows = WindowLayout(LAYOUT, WINDOWS)
    step_io, refresh_io, window_io = step_graphs()[1], *cache_graphs()
    step = tensorrt_profiles(step_io, export.graphs["step"], LAYOUT, None)
    refresh = tensorrt_profiles(refresh_io, export.graphs["refresh"], LAYOUT, windows)
    assert refresh == step and len(refresh) == 3
    window = tensorrt_profiles(window_io, export.graphs["window_step"], LAYOUT, windows)
    assert [(p.index, p.bucket, p.window_lo, p.window) for p in window] == [
        (0, 16, 1, 8), (1, 16, 9, 32), (2, 32, 1, 8), (3, 32, 9, 32), (4, 48, 1, 8), (5, 48, 9, 32)]
    assert all(list(p.shapes) == window_io.input_names for p in window)
    assert window[3].shapes["kv"].min == (2, 2, 1, 2, 2 + 16 + 1, 8)  # bucket 32's shortest: min_prompt + 16 + 1
    assert window[3].shapes["kv"].max == (2, 2, 4, 2, 40 + 32, 8)
    assert window[3].shapes["window_ids"].min == (1, 9) and window[3].shapes["window_ids"].max == (4, 32)
    with pytest.raises(ConfigError, match="needs window lengths"):
        tensorrt_profiles(window_io, export.graphs["window_step"], LAYOUT, None)


class OrtEngine:
    """Stands in for `tensorrt_engine._Engine`: the graph's ONNX Runtime session, every call's profile recorded."""

    calls: ClassVar[list[tuple[str, int, dict[str, tuple[int, ...]]]]] = []

    def __init__(self, runtime: object, plan: bytes, graph: GraphIO, layout: ProfileLayout | WindowLayout,
                 device: torch.device, path: Path) -> None:
        assert plan == b"plan of " + graph.name.encode()
        self.graph, self.layout = graph, layout
        export_dir = path.parent.parent / "export"
        self.session = ort.InferenceSession(str(export_dir / graph.file), providers=["CPUExecutionProvider"])

    def run(self, profile: int, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert 0 <= profile < self.layout.profile_count and list(feeds) == self.graph.input_names
        OrtEngine.calls.append((self.graph.name, profile, {k: v.shape for k, v in feeds.items()}))
        names = self.graph.output_names
        return dict(zip(names, self.session.run(names, dict(feeds)), strict=True))


def fake_tensorrt_engine_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kv_cache: bool = True
                             ) -> TensorRTBackend:
    """A TensorRT engine dir of an export (with its cache graphs), opened with `OrtEngine` in place of TensorRT."""
    export_dir = make_export(tmp_path / "export", kv_cache=kv_cache)
    export = ExportManifest.load(export_dir)
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    for name in export.graphs:
        (engine_dir / f"{name}.engine").write_bytes(b"plan of " + name.encode())
    manifest = EngineManifest(
        backend="tensorrt", buckets=LAYOUT.buckets, max_batch=LAYOUT.max_batch, min_prompt=LAYOUT.min_prompt,
        max_prompt=LAYOUT.max_prompt, model_fingerprint=export.model.fingerprint,
        graph_hashes={name: g.sha256 for name, g in export.graphs.items()},
        files={name: f"{name}.engine" for name in export.graphs}, versions={},
        tensorrt=TensorRTFacts("10.13.0.35", "GPU", "9.0", {16: 0, 32: 1, 48: 2},
                               window_lengths=WINDOWS if kv_cache else ()),
    )
    manifest.validate()
    monkeypatch.setattr(tensorrt_engine, "trt", SimpleNamespace(Runtime=lambda logger: "runtime"))
    monkeypatch.setattr(tensorrt_engine, "_logger", lambda: "logger")
    monkeypatch.setattr(tensorrt_engine, "require_tensorrt", lambda: None)
    monkeypatch.setattr(tensorrt_engine, "_Engine", OrtEngine)
    OrtEngine.calls = []
    return TensorRTBackend(engine_dir, manifest, sparsity_rows=[], max_seq_len=96)


def test_cache_calls_pick_their_profiles_and_match_onnx_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    backend = fake_tensorrt_engine_dir(tmp_path, monkeypatch)
    assert supports_cache(backend) and backend.windows == WindowLayout(LAYOUT, WINDOWS)
    reference = OrtBackend(tmp_path / "export")
    pairs = backend.windows.pairs()
    # (batch, sequence, window start, width) -> the profile: the sequence's bucket, the smallest window length.
    cases = [((1, 40 + 16, 40, 8), (0, 0)), ((2, 40 + 16, 40, 9), (0, 1)), ((4, 40 + 17, 40, 8), (1, 0)),
             ((2, 40 + 48, 56, 32), (2, 1)), ((1, 12, 2, 10), (0, 1))]
    for (batch, seq, start, width), pair in cases:
        step, _ = window_input(batch, seq, 0, 1, np.zeros(0))
        got, want = backend.refresh(step), reference.refresh(step)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        _, window = window_input(batch, seq, start, width, want.kv, 0.7, 11)
        got_w, want_w = backend.window_step(window), reference.window_step(window)
        np.testing.assert_array_equal(got_w.token_ids, want_w.token_ids)
        np.testing.assert_array_equal(got_w.confidence, want_w.confidence)
        (_, refresh_profile, _), (_, window_profile, shapes) = OrtEngine.calls[-2:]
        assert refresh_profile == pair[0] and window_profile == pairs.index(pair)
        assert shapes["kv"] == (2, 2, batch, 2, seq, 8) and shapes["sample_uniform"] == (batch, width)
    _, wide = window_input(1, 40 + 48, 48, 33, reference.refresh(window_input(1, 88, 0, 1, np.zeros(0))[0]).kv)
    with pytest.raises(ConfigError, match="window 33 is wider than this engine's widest window 32"):
        backend.window_step(wide)
    long_step, _ = window_input(1, 40 + 49, 0, 1, np.zeros(0))
    with pytest.raises(ConfigError, match="more than the model's max_seq_len 88"):  # max_prompt + last bucket
        backend.refresh(long_step)
    _, long_window = window_input(1, 40 + 49, 48, 8, np.zeros((2, 2, 1, 2, 89, 8), np.float32))
    with pytest.raises(ConfigError, match="sequence length 89 exceeds this engine's 88 positions"):
        backend.window_step(long_window)


def test_an_engine_without_the_cache_engines_refuses_cached_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    backend = fake_tensorrt_engine_dir(tmp_path, monkeypatch, kv_cache=False)
    assert not supports_cache(backend) and backend.windows is None
    step, window = window_input(1, 20, 4, 8, np.zeros((2, 2, 1, 2, 20, 8), np.float32))
    for call in (lambda: backend.refresh(step), lambda: backend.window_step(window)):
        with pytest.raises(ConfigError, match="has no KV cache engines; re-export with `seer-deploy export --kv-cache`"):
            call()
    assert {name for name, _, _ in OrtEngine.calls} == set()


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


def test_tensorrt_cache_engines_match_onnx_runtime(trt: ModuleType, tmp_path: Path) -> None:
    export_dir = make_export(tmp_path / "export", kv_cache=True)
    options = BuildOptions(backend="tensorrt", buckets=LAYOUT.buckets, max_batch=4, max_prompt=40, min_prompt=2,
                           window_lengths=WINDOWS, workspace_bytes=1 << 28)
    manifest = build_engines(export_dir, tmp_path / "engine", options).manifest
    assert manifest.has_cache and manifest.tensorrt is not None and manifest.tensorrt.window_lengths == WINDOWS
    assert sorted(manifest.files) == ["refresh", "step", "step0", "window_step"]
    export = ExportManifest.load(export_dir)
    backend = TensorRTBackend.open(tmp_path / "engine", export_facts(export_dir),
                                   sparsity_rows=list(export.seer.sparsity_rows), max_seq_len=export.max_seq_len)
    assert supports_cache(backend)
    reference = OrtBackend(export_dir)
    # Sequences at and around the bucket boundaries, windows at and around the window lengths, batches 1 and 4.
    for seq in (12, 40 + 16, 40 + 17, 40 + 48):
        for width in (1, 8, 9, 10):
            for batch in (1, 4):
                step, _ = window_input(batch, seq, 0, 1, np.zeros(0))
                got, want = backend.refresh(step), reference.refresh(step)
                np.testing.assert_array_equal(got.token_ids, want.token_ids)
                np.testing.assert_allclose(got.confidence, want.confidence, rtol=0, atol=1e-6)
                np.testing.assert_allclose(got.kv, want.kv, rtol=0, atol=1e-6)
                _, window = window_input(batch, seq, seq - width, width, want.kv, 0.7, 3)
                got_w, want_w = backend.window_step(window), reference.window_step(window)
                np.testing.assert_array_equal(got_w.token_ids, want_w.token_ids)
                np.testing.assert_allclose(got_w.confidence, want_w.confidence, rtol=1e-5, atol=1e-4)
    _, wide = window_input(1, 40 + 48, 48, 33, np.zeros((2, 2, 1, 2, 88, 8), np.float32))
    with pytest.raises(ConfigError, match="widest window 32"):
        backend.window_step(wide)
