"""TensorRT at run time: a clear refusal where it is missing (simulated: TensorRT-RTX is a test dependency), the
device buffers, and which profile each call picks (the engines stood in for by ONNX Runtime sessions of the same
graphs); on a GPU that the installed flavour targets, build engines and match ONNX Runtime.

Building is tested without a GPU in test_tensorrt_build.py. The GPU tests skip where no CUDA GPU is visible, or where
the only flavour installed cannot run on it (TensorRT-RTX has no Hopper target). Note that `import tensorrt`
succeeds wherever tensorrt-stubs is installed (its .pyi files make an empty namespace package), so availability
checks for the real bindings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import ClassVar

import numpy as np
import onnxruntime as ort
import pytest
import torch
from test_build import cpu_options, make_export, window_input

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import GraphIO
from seer_deploy.core.backend import StepInput, supports_cache
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines import tensorrt_engine, tensorrt_library
from seer_deploy.engines.build import BuildOptions, build_engines, tensorrt_plans
from seer_deploy.engines.manifest import RTX_TARGETS, EngineManifest, RuntimeFacts, TensorRTFacts
from seer_deploy.engines.ort import OrtBackend
from seer_deploy.engines.profiles import ProfileLayout, WindowLayout
from seer_deploy.engines.tensorrt_engine import StepModel, TensorRTBackend


def test_availability_needs_the_real_bindings() -> None:
    import tensorrt_rtx

    assert tensorrt_library.tensorrt_available()  # a test dependency
    assert tensorrt_library.load_library("tensorrt_rtx").module is tensorrt_rtx
    try:
        import tensorrt
    except ImportError:
        assert tensorrt_library.import_library("tensorrt") is None
        return
    assert (tensorrt_library.import_library("tensorrt") is not None) == hasattr(tensorrt, "Builder")


def test_without_tensorrt_every_entry_point_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    export_dir = make_export(tmp_path / "export")
    manifest = build_engines(export_dir, tmp_path / "ort-engine", cpu_options(buckets=(32,))).manifest
    rtx = build_engines(export_dir, tmp_path / "rtx-engine", BuildOptions(backend="tensorrt", buckets=(32,),
                                                                          max_batch=1)).out
    monkeypatch.setattr(tensorrt_library, "import_library", lambda name: None)
    for call in (tensorrt_library.require_tensorrt, tensorrt_library.tensorrt_version):
        with pytest.raises(ConfigError, match="TensorRT is not installed"):
            call()
    with pytest.raises(ConfigError, match="--backend ort"):
        build_engines(export_dir, tmp_path / "engine", BuildOptions(backend="tensorrt"))
    assert not (tmp_path / "engine").exists()
    with pytest.raises(ConfigError, match="TensorRT-RTX is not installed: pip install tensorrt-rtx-cu13"):
        TensorRTBackend(tmp_path / "rtx-engine", EngineManifest.load(rtx), StepModel([], 96))
    with pytest.raises(ArtifactError, match="holds a ort engine"):
        TensorRTBackend(tmp_path / "ort-engine", manifest, StepModel([], 96))


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
    """What `seer-deploy build --backend tensorrt` gives each engine of an export --kv-cache: the step graph one
    profile per bucket (its kv output following batch and sequence), window_step one per (bucket, window length)."""
    export = ExportManifest.load(make_export(tmp_path / "export", kv_cache=True))
    windows = WindowLayout(LAYOUT, WINDOWS)
    plans = tensorrt_plans(export, LAYOUT, windows)
    assert list(plans) == ["step", "window_step"] and len(plans["step"]) == 3
    window = plans["window_step"]
    assert [(p.index, p.bucket, p.window_lo, p.window) for p in window] == [
        (0, 16, 1, 8), (1, 16, 9, 32), (2, 32, 1, 8), (3, 32, 9, 32), (4, 48, 1, 8), (5, 48, 9, 32)]
    assert all(list(p.shapes) == list(export.graphs["window_step"].inputs) for p in window)
    assert window[3].shapes["kv"].min == (2, 2, 1, 2, 2 + 16 + 1, 8)  # bucket 32's shortest: min_prompt + 16 + 1
    assert window[3].shapes["kv"].max == (2, 2, 4, 2, 40 + 32, 8)
    assert window[3].shapes["window_ids"].min == (1, 9) and window[3].shapes["window_ids"].max == (4, 32)
    assert plans["step"][1].shapes["candidates"].min == (1, 1)
    assert plans["step"][1].shapes["candidates"].max == plans["step"][1].shapes["input_ids"].max == (4, 40 + 32)
    with pytest.raises(ConfigError, match="needs window lengths"):
        tensorrt_plans(export, LAYOUT, None)


class OrtEngine:
    """Stands in for `tensorrt_engine._GraphEngine`: the graph's ONNX Runtime session, every call's profile recorded."""

    calls: ClassVar[list[tuple[str, int, dict[str, tuple[int, ...]]]]] = []

    def __init__(self, lib: object, runtime: object, plan: bytes, graph: GraphIO,
                 layout: ProfileLayout | WindowLayout, device: torch.device, path: Path, rtx: object = None) -> None:
        assert plan == b"plan of " + graph.name.encode()
        self.graph, self.layout = graph, layout
        export_dir = path.parent.parent / "export"
        self.session = ort.InferenceSession(str(export_dir / graph.file), providers=["CPUExecutionProvider"])

    def run(self, profile: int, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert 0 <= profile < self.layout.profile_count and list(feeds) == self.graph.input_names
        OrtEngine.calls.append((self.graph.name, profile, {k: v.shape for k, v in feeds.items()}))
        names = self.graph.output_names
        return dict(zip(names, self.session.run(names, dict(feeds)), strict=True))


class FakeLogger:
    WARNING = ERROR = 0

    def __init__(self, level: int) -> None:
        self.level = level


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
    fake = tensorrt_library.TensorRTLibrary("tensorrt", SimpleNamespace(  # type: ignore[arg-type]
        Runtime=lambda logger: "runtime", Logger=FakeLogger, __version__="10.13.0.35"))
    monkeypatch.setattr(tensorrt_engine, "load_library", lambda name: fake)
    monkeypatch.setattr(tensorrt_engine, "_GraphEngine", OrtEngine)
    OrtEngine.calls = []
    return TensorRTBackend(engine_dir, manifest, StepModel([], 96))


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
    """The installed flavour, where a CUDA GPU it runs on is visible (standard TensorRT: any; TensorRT-RTX: one of
    its targets, so never the H100/H200 lent for checks)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU is visible: TensorRT engines run on one")
    lib = tensorrt_library.load_library()
    capability = "{}.{}".format(*torch.cuda.get_device_capability(0))
    if lib.is_rtx and capability not in RTX_TARGETS:
        pytest.skip(f"TensorRT-RTX has no target for this GPU (compute capability {capability})")
    return lib.module


def export_facts(export_dir: Path) -> RuntimeFacts:
    m = ExportManifest.load(export_dir)
    return RuntimeFacts(model_fingerprint=m.model.fingerprint, graph_hashes={k: g.sha256 for k, g in m.graphs.items()})


def test_tensorrt_engines_match_onnx_runtime(trt: ModuleType, tmp_path: Path) -> None:
    export_dir = make_export(tmp_path / "export", kv_cache=True)
    options = BuildOptions(backend="tensorrt", buckets=LAYOUT.buckets, max_batch=4, max_prompt=40, min_prompt=2,
                           window_lengths=WINDOWS, workspace_bytes=1 << 28)
    manifest = build_engines(export_dir, tmp_path / "engine", options).manifest
    assert manifest.tensorrt is not None and manifest.tensorrt.version == trt.__version__
    export = ExportManifest.load(export_dir)
    backend = TensorRTBackend.open(tmp_path / "engine", export_facts(export_dir),
                                   StepModel.of(export))
    reference = OrtBackend(export_dir)
    for seq in (12, 40 + 16, 40 + 17, 40 + 48):  # at and around the bucket boundaries
        for batch in (1, 4):
            step, _ = window_input(batch, seq, 0, 1, np.zeros(0))
            got0, want0 = backend.step0(step), reference.step0(step)
            for a, b in zip(got0, want0, strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
            got, want = backend.refresh(step), reference.refresh(step)
            np.testing.assert_allclose(got.kv, want.kv, rtol=0, atol=1e-6)
            for width in (1, 8, 9):
                _, window = window_input(batch, seq, seq - width, width, want.kv, 0.7, 3)
                got_w, want_w = backend.window_step(window), reference.window_step(window)
                np.testing.assert_array_equal(got_w.token_ids, want_w.token_ids)
    with pytest.raises(ConfigError, match="largest profile"):
        backend.step0(StepInput(np.zeros((1, 40 + 49), dtype=np.int64), None))
    backend.close()


class FakeRuntimeCache:
    """Stands in for TensorRT-RTX's IRuntimeCache: deserialize accepts only blobs it could have written."""

    def __init__(self) -> None:
        self.blob = b""

    def serialize(self) -> memoryview:
        return memoryview(self.blob or b"kernels compiled on this GPU")

    def deserialize(self, blob: bytes) -> bool:
        if not blob.startswith(b"kernels"):
            return False  # another GPU, driver or version: rejected, the cache stays empty
        self.blob = blob
        return True


class FakeRuntimeConfig:
    def __init__(self) -> None:
        self.cache: FakeRuntimeCache | None = None
        self.created = 0

    def create_runtime_cache(self) -> FakeRuntimeCache:
        self.created += 1
        return FakeRuntimeCache()

    def set_runtime_cache(self, cache: FakeRuntimeCache) -> bool:
        self.cache = cache
        return True


def test_the_rtx_runtime_cache_is_one_for_all_engines_loaded_if_it_fits_and_saved(tmp_path: Path) -> None:
    path = tmp_path / "runtime.cache"
    cache = tensorrt_engine._RtxRuntimeCache(path)
    configs = [FakeRuntimeConfig(), FakeRuntimeConfig()]
    for config in configs:
        cache.attach(config)  # type: ignore[arg-type]
    assert configs[0].created == 1 and configs[1].created == 0  # one cache, set on every engine's config
    assert configs[0].cache is configs[1].cache and not cache.loaded
    cache.save()
    assert path.read_bytes() == b"kernels compiled on this GPU"
    again = tensorrt_engine._RtxRuntimeCache(path)
    again.attach(FakeRuntimeConfig())  # type: ignore[arg-type]
    assert again.loaded
    path.write_bytes(b"foreign")
    stale = tensorrt_engine._RtxRuntimeCache(path)
    stale.attach(FakeRuntimeConfig())  # type: ignore[arg-type]
    assert not stale.loaded  # rejected by the library: starts empty, no error
    off = tensorrt_engine._RtxRuntimeCache(None)
    config = FakeRuntimeConfig()
    off.attach(config)  # type: ignore[arg-type]
    off.save()
    assert config.created == 0 and config.cache is None
