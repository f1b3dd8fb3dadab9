"""The engine manifest (`engine.json`) and the checks that keep an engine from running where it would be wrong.

An engine is only valid for the exact export it was built from (model fingerprint and graph hashes) and, for
TensorRT, for the TensorRT version and GPU that built it. Those facts are recorded at build time and compared on
load: a mismatch is an ArtifactError naming what differs and how to rebuild, never a silently wrong answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from seer_deploy.core.atomic import write_bytes_atomic
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import confined, read_json
from seer_deploy.engines.buckets import ProfileLayout, WindowLayout, check_buckets
from seer_deploy.spec.graphs import CACHE_GRAPH_NAMES, STEP_GRAPH_NAMES

ENGINE_FORMAT = "seer-deploy-engine"
ENGINE_FORMAT_VERSION = 2  # 2: built from exports whose confidence is a log-probability (export format 2)
MANIFEST_FILE = "engine.json"

BackendName = Literal["ort", "tensorrt"]
BACKENDS: tuple[BackendName, ...] = ("ort", "tensorrt")


@dataclass(frozen=True)
class TensorRTFacts:
    """What a TensorRT engine is tied to, plus which profile serves which bucket."""

    version: str
    gpu_name: str
    compute_capability: str  # "major.minor", e.g. "9.0"
    profile_index: dict[int, int]  # bucket -> optimization profile index (the same in step0, step and refresh)
    workspace_bytes: int | None = None
    # The window_step engine's window lengths (an export with the KV cache graphs): its profiles are
    # `WindowLayout(layout, window_lengths).pairs()`, in that order. () without the cache graphs.
    window_lengths: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineManifest:
    """Everything needed to load an engine dir and to refuse it where it does not belong."""

    backend: BackendName
    buckets: tuple[int, ...]
    max_batch: int
    min_prompt: int
    max_prompt: int
    model_fingerprint: str
    graph_hashes: dict[str, str]  # graph name (step0, step[, refresh, window_step]) -> sha256 of its ONNX file
    files: dict[str, str]  # graph name -> file in the engine dir ("" for ORT without a saved optimised model)
    versions: dict[str, str]  # seer_deploy, onnx, onnxruntime / tensorrt
    tensorrt: TensorRTFacts | None = None
    ort_session: dict[str, Any] | None = None  # the ORT session settings the engine dir runs with
    format_version: int = ENGINE_FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes (export dir, build options)

    @property
    def layout(self) -> ProfileLayout:
        return ProfileLayout(self.buckets, self.max_batch, self.max_prompt, self.min_prompt)

    @property
    def has_cache(self) -> bool:
        """Whether the engine dir runs the block-wise KV cache graphs (built from an export --kv-cache)."""
        return all(name in self.graph_hashes for name in CACHE_GRAPH_NAMES)

    @property
    def window_layout(self) -> WindowLayout | None:
        """The profiles of a TensorRT window_step engine; None without one."""
        if self.tensorrt is None or not self.has_cache:
            return None
        return WindowLayout(self.layout, self.tensorrt.window_lengths)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["buckets"] = list(self.buckets)
        if self.tensorrt is not None:  # JSON keys are strings
            data["tensorrt"]["profile_index"] = {str(b): i for b, i in self.tensorrt.profile_index.items()}
            data["tensorrt"]["window_lengths"] = list(self.tensorrt.window_lengths)
        return {"format": ENGINE_FORMAT, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "engine manifest") -> EngineManifest:
        """Parse and validate; ArtifactError names the first problem."""
        if data.get("format") != ENGINE_FORMAT:
            raise ArtifactError(f"{source} is not a seer-deploy engine manifest (format {data.get('format')!r})")
        version = data.get("format_version")
        if version != ENGINE_FORMAT_VERSION:
            raise ArtifactError(
                f"{source} has format_version {version}, this seer-deploy reads {ENGINE_FORMAT_VERSION}; "
                f"rebuild the engine with this version (seer-deploy build EXPORT_DIR --out ENGINE_DIR)"
            )
        try:
            backend = data["backend"]
            if backend not in BACKENDS:
                raise ArtifactError(f"{source}: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
            trt = data.get("tensorrt")
            facts = None
            if trt is not None:
                facts = TensorRTFacts(
                    version=str(trt["version"]),
                    gpu_name=str(trt["gpu_name"]),
                    compute_capability=str(trt["compute_capability"]),
                    profile_index={int(b): int(i) for b, i in trt["profile_index"].items()},
                    workspace_bytes=None if trt.get("workspace_bytes") is None else int(trt["workspace_bytes"]),
                    window_lengths=tuple(int(w) for w in trt.get("window_lengths") or ()),
                )
            manifest = cls(
                backend=backend,
                buckets=tuple(int(b) for b in data["buckets"]),
                max_batch=int(data["max_batch"]),
                min_prompt=int(data["min_prompt"]),
                max_prompt=int(data["max_prompt"]),
                model_fingerprint=str(data["model_fingerprint"]),
                graph_hashes={str(k): str(v) for k, v in data["graph_hashes"].items()},
                files={str(k): str(v) for k, v in data["files"].items()},
                versions={str(k): str(v) for k, v in data["versions"].items()},
                tensorrt=facts,
                ort_session=None if data.get("ort_session") is None else dict(data["ort_session"]),
                format_version=int(version),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(f"{source} is malformed ({type(exc).__name__}: {exc}); rebuild the engine") from exc
        manifest.validate(source)
        return manifest

    def validate(self, source: str = "engine manifest") -> None:
        """Internal consistency: buckets, profiles and the backend's own section."""
        try:
            check_buckets(self.buckets)
            self.layout.validate()
        except ConfigError as exc:
            raise ArtifactError(f"{source}: {exc}") from exc
        if set(self.files) != set(self.graph_hashes):
            raise ArtifactError(f"{source}: files {sorted(self.files)} and graphs {sorted(self.graph_hashes)} differ")
        allowed = STEP_GRAPH_NAMES + (CACHE_GRAPH_NAMES if self.has_cache else ())
        if sorted(self.graph_hashes) != sorted(allowed):
            raise ArtifactError(
                f"{source}: the engine's graphs are {sorted(self.graph_hashes)}; an engine has "
                f"{', '.join(STEP_GRAPH_NAMES)} and, with the KV cache, both of {', '.join(CACHE_GRAPH_NAMES)}: "
                "rebuild the engine"
            )
        if self.backend == "tensorrt":
            if self.tensorrt is None:
                raise ArtifactError(f"{source}: a TensorRT engine manifest needs its 'tensorrt' section")
            if sorted(self.tensorrt.profile_index) != list(self.buckets):
                raise ArtifactError(
                    f"{source}: profile_index covers buckets {sorted(self.tensorrt.profile_index)}, "
                    f"the engine has {list(self.buckets)}"
                )
            windows = self.window_layout
            if windows is None and self.tensorrt.window_lengths:
                raise ArtifactError(f"{source}: window_lengths {list(self.tensorrt.window_lengths)} without a "
                                    "window_step engine; rebuild the engine")
            if windows is not None:
                try:
                    windows.validate()
                except ConfigError as exc:
                    raise ArtifactError(f"{source}: the window_step engine's {exc}; rebuild the engine") from exc

    def save(self, engine_dir: Path) -> Path:
        path = Path(engine_dir) / MANIFEST_FILE
        write_bytes_atomic(path, (json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n").encode())
        return path

    @classmethod
    def load(cls, engine_dir: Path) -> EngineManifest:
        """Read and validate DIR/engine.json; the files it names must lie inside DIR (symlinks resolved)."""
        path = Path(engine_dir) / MANIFEST_FILE
        if not path.is_file():
            raise ArtifactError(
                f"{engine_dir} has no {MANIFEST_FILE}; it is not an engine dir "
                f"(make one with: seer-deploy build EXPORT_DIR --out {engine_dir})"
            )
        data = read_json(path, "engine manifest", fix="rebuild the engine", error=ArtifactError)
        manifest = cls.from_dict(data, source=str(path))
        for graph, name in manifest.files.items():
            if name:  # "": no file (an ORT engine dir that saved no optimised graph); refused where one is opened
                manifest.file(engine_dir, graph)
        return manifest

    def file(self, engine_dir: Path, graph: str) -> Path:
        """The resolved path of the engine file built for `graph`; ArtifactError unless it lies inside `engine_dir`."""
        where = f"{Path(engine_dir) / MANIFEST_FILE}: files.{graph}"
        return confined(engine_dir, self.files[graph], where, error=ArtifactError)


@dataclass(frozen=True)
class RuntimeFacts:
    """What the loader sees now: the export it was pointed at and, for TensorRT, the library and the GPU.

    None means "not known / not applicable" and skips that comparison (e.g. no GPU facts for an ORT engine).
    """

    model_fingerprint: str | None = None
    graph_hashes: Mapping[str, str] | None = None
    backend: BackendName | None = None
    tensorrt_version: str | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None
    onnxruntime_version: str | None = None


_REBUILD = "rebuild it here: seer-deploy build EXPORT_DIR --out ENGINE_DIR --backend {backend}"


def check_engine_compatible(engine: EngineManifest, facts: RuntimeFacts) -> None:
    """ArtifactError on the first mismatch between an engine and where it is about to run.

    Checked: backend, model fingerprint, every graph hash, and for TensorRT the exact library version (serialized
    engines are not portable across versions) and the GPU (name and compute capability: kernels are chosen per
    device). An ORT engine dir that saved optimised models is also tied to its ONNX Runtime version.
    """
    fix = _REBUILD.format(backend=engine.backend)
    _same(facts.backend, engine.backend, "the engine dir holds a {built} engine, not {here}; {fix}", fix)
    _same(facts.model_fingerprint, engine.model_fingerprint,
          "the engine was built for model {built:.12}, the export is model {here:.12}; use the export it was built "
          "from, or {fix}", fix)
    if facts.graph_hashes is not None:
        for name, digest in engine.graph_hashes.items():
            have = facts.graph_hashes.get(name)
            if have != digest:
                what = "is missing" if have is None else f"has hash {have[:12]}"
                raise ArtifactError(
                    f"the engine's {name} graph was built from ONNX {digest[:12]}, the export's {name} {what}; "
                    f"the export changed since the build: {fix}"
                )
    if engine.backend == "tensorrt":
        trt = engine.tensorrt
        assert trt is not None  # validate() guarantees it
        _same(facts.tensorrt_version, trt.version, "the engine was built with TensorRT {built}, this machine has "
              "TensorRT {here}; install TensorRT {built} or {fix}", fix)
        _same(facts.gpu_name, trt.gpu_name, "the engine was built on a {built}, this GPU is a {here}; {fix}", fix)
        _same(facts.compute_capability, trt.compute_capability,
              "the engine was built for compute capability {built}, this GPU has {here}; {fix}", fix)
    if engine.backend == "ort" and any(engine.files.values()):
        built = engine.versions.get("onnxruntime")
        if built is not None:
            _same(facts.onnxruntime_version, built, "the engine dir's optimised models were saved by ONNX Runtime "
                  "{built}, this is {here}; {fix}", fix)


def _same(here: str | None, built: str, message: str, fix: str) -> None:
    """ArtifactError(message) when a fact known here (None: not known, not compared) differs from the build's."""
    if here is not None and here != built:
        raise ArtifactError(message.format(here=here, built=built, fix=fix))
