"""The engine manifest (`engine.json`) and the checks that keep an engine from running where it would be wrong.

An engine is only valid for the exact export it was built from (model fingerprint and graph hashes) and, for
TensorRT, for the library and version that built it and the GPUs it targets: standard TensorRT builds for the one GPU
it ran on (name and compute capability recorded); TensorRT-RTX builds without a GPU for a set of compute capabilities
(`compute_capabilities`; none = its portable default, Ampere and later) and specialises kernels on the user's GPU.
Those facts are recorded at build time and compared on load: a mismatch is an ArtifactError naming what differs and
how to rebuild, never a silently wrong answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from seer_deploy.contracts.graphs import CACHE_GRAPH_NAMES, PROMPT_CACHE_GRAPH_NAMES, STEP_GRAPH_NAMES, VISION
from seer_deploy.core.atomic import write_bytes_atomic
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.fields import FieldReader
from seer_deploy.core.files import confined, read_json
from seer_deploy.engines.buckets import check_buckets
from seer_deploy.engines.profiles import ImageAxes, ProfileLayout, WindowLayout

ENGINE_FORMAT = "seer-deploy-engine"
ENGINE_FORMAT_VERSION = 2  # 2: built from exports whose confidence is a log-probability (export format 2)
MANIFEST_FILE = "engine.json"

BackendName = Literal["ort", "tensorrt"]
BACKENDS: tuple[BackendName, ...] = ("ort", "tensorrt")
TensorRTLibraryName = Literal["tensorrt", "tensorrt_rtx"]  # the Python module of each flavour
TENSORRT_LIBRARIES: tuple[TensorRTLibraryName, ...] = ("tensorrt", "tensorrt_rtx")
LIBRARY_TITLES: dict[str, str] = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT-RTX"}
# TensorRT-RTX 1.7's targets (its ComputeCapability enum) and, with none set, what its engines run on.
RTX_TARGETS: tuple[str, ...] = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")
RTX_PORTABLE_TARGETS: tuple[str, ...] = ("8.0", "8.6", "8.9", "12.0", "12.1")
ARCHITECTURES: dict[str, str] = {"7.0": "Volta", "7.2": "Volta (Xavier)", "7.5": "Turing", "8.0": "Ampere",
                                 "8.6": "Ampere", "8.7": "Ampere (Orin)", "8.9": "Ada", "9.0": "Hopper",
                                 "10.0": "Blackwell (data centre)", "10.3": "Blackwell (data centre)",
                                 "11.0": "Blackwell (Thor)", "12.0": "Blackwell (RTX)", "12.1": "Blackwell (GB10)"}


def architecture(capability: str) -> str:
    """'9.0' -> 'Hopper'; an unknown capability is named by its number."""
    return ARCHITECTURES.get(capability, f"compute capability {capability}")


@dataclass(frozen=True)
class TensorRTFacts:
    """What a TensorRT engine is tied to, plus which profile serves which bucket."""

    version: str
    gpu_name: str  # standard TensorRT: the GPU that built it; TensorRT-RTX: "" (built for targets, not a GPU)
    compute_capability: str  # standard: "major.minor", e.g. "9.0"; TensorRT-RTX: ""
    profile_index: dict[int, int]  # bucket -> optimization profile index (the same in every graph with a sequence)
    workspace_bytes: int | None = None
    # The window_step engine's window lengths (an export with the KV cache graphs): its profiles are
    # `WindowLayout(layout, window_lengths).pairs()`, in that order. () without the cache graphs.
    window_lengths: tuple[int, ...] = ()
    library: TensorRTLibraryName = "tensorrt"
    compute_capabilities: tuple[str, ...] = ()  # TensorRT-RTX's targets; () = its portable default (Ampere and later)
    images: ImageAxes | None = None  # a multimodal engine's image axes (image-table rows, pictures per vision call)
    # What the build set, per graph: each profile's bucket (and windows) and every input's min/opt/max. Recorded for
    # people and tools; the runtime re-plans the same profiles from the layout above.
    profiles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return f"{LIBRARY_TITLES[self.library]} {self.version}"


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
        images = self.tensorrt.images if self.tensorrt is not None else None
        return ProfileLayout(self.buckets, self.max_batch, self.max_prompt, self.min_prompt, images)

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
            data["tensorrt"]["compute_capabilities"] = list(self.tensorrt.compute_capabilities)
        return {"format": ENGINE_FORMAT, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "engine manifest") -> EngineManifest:
        """Parse and validate; ArtifactError names the first problem (a missing key, a value of the wrong type)."""
        if not isinstance(data, Mapping):
            raise ArtifactError(f"{source}: expected a JSON object at the top level; rebuild the engine")
        if data.get("format") != ENGINE_FORMAT:
            raise ArtifactError(f"{source} is not a seer-deploy engine manifest (format {data.get('format')!r})")
        version = data.get("format_version")
        if version != ENGINE_FORMAT_VERSION:
            raise ArtifactError(
                f"{source} has format_version {version}, this seer-deploy reads {ENGINE_FORMAT_VERSION}; "
                f"rebuild the engine with this version (seer-deploy build EXPORT_DIR --out ENGINE_DIR)"
            )
        r = FieldReader(source, "rebuild the engine (seer-deploy build EXPORT_DIR --out ENGINE_DIR)")
        raw = dict(data)
        backend = r.string(raw, "backend")
        if backend not in BACKENDS:
            raise ArtifactError(f"{source}: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        trt = raw.get("tensorrt")
        extra = raw.get("extra") or {}
        if not isinstance(extra, dict):
            raise r.refuse(f"'extra' must be an object, got {extra!r}")
        manifest = cls(
            backend=backend,
            buckets=r.integers(raw, "buckets"),
            max_batch=r.integer(raw, "max_batch"),
            min_prompt=r.integer(raw, "min_prompt"),
            max_prompt=r.integer(raw, "max_prompt"),
            model_fingerprint=r.string(raw, "model_fingerprint"),
            graph_hashes=r.strings(raw, "graph_hashes"),
            files=r.strings(raw, "files"),
            versions=r.strings(raw, "versions"),
            tensorrt=None if trt is None else _tensorrt_facts(r, raw),
            ort_session=None if raw.get("ort_session") is None else _ort_session(r, raw),
            format_version=int(version),
            extra=dict(extra),
        )
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
        allowed = set(STEP_GRAPH_NAMES) | set(CACHE_GRAPH_NAMES) | set(PROMPT_CACHE_GRAPH_NAMES) | {VISION.name}
        cache = [name for name in CACHE_GRAPH_NAMES if name in self.graph_hashes]
        if (not set(STEP_GRAPH_NAMES) <= set(self.graph_hashes) or not set(self.graph_hashes) <= allowed
                or len(cache) not in (0, len(CACHE_GRAPH_NAMES))):
            raise ArtifactError(
                f"{source}: the engine's graphs are {sorted(self.graph_hashes)}; an engine has "
                f"{', '.join(STEP_GRAPH_NAMES)}, with the KV cache both of {', '.join(CACHE_GRAPH_NAMES)} (and "
                f"{', '.join(PROMPT_CACHE_GRAPH_NAMES)}), and a "
                f"multimodal TensorRT engine {VISION.name}: rebuild the engine"
            )
        if self.backend == "tensorrt":
            if self.tensorrt is None:
                raise ArtifactError(f"{source}: a TensorRT engine manifest needs its 'tensorrt' section")
            if self.tensorrt.library not in TENSORRT_LIBRARIES:
                raise ArtifactError(f"{source}: tensorrt.library {self.tensorrt.library!r} is not one of "
                                    f"{', '.join(TENSORRT_LIBRARIES)}; rebuild the engine")
            if (VISION.name in self.files) != (self.tensorrt.images is not None):
                raise ArtifactError(f"{source}: a multimodal TensorRT engine has both a vision engine and its image "
                                    "axes (tensorrt.images), a text one neither; rebuild the engine")
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


def _tensorrt_facts(r: FieldReader, raw: dict[str, Any]) -> TensorRTFacts:
    """engine.json's tensorrt section, every field of its type."""
    trt = r.obj(raw, "tensorrt")
    library = r.string(trt, "library", "tensorrt.library") if "library" in trt else "tensorrt"
    if library not in TENSORRT_LIBRARIES:
        raise r.refuse(f"tensorrt.library {library!r} is not one of {', '.join(TENSORRT_LIBRARIES)}")
    profiles = trt.get("profiles") or {}
    if not isinstance(profiles, dict) or not all(isinstance(v, list) and all(isinstance(p, dict) for p in v)
                                                 for v in profiles.values()):
        raise r.refuse("tensorrt.profiles must map each graph to a list of profiles")
    index = r.obj(trt, "profile_index", "tensorrt.profile_index")
    optional = {key: trt[key] for key in ("window_lengths", "compute_capabilities") if trt.get(key) is not None}
    images = None
    if trt.get("images") is not None:
        axes = r.obj(trt, "images", "tensorrt.images")
        images = ImageAxes(r.integer(axes, "image_tokens", "tensorrt.images.image_tokens"),
                           r.integer(axes, "images", "tensorrt.images.images"))
    compute_capabilities = r.array(optional, "compute_capabilities", "tensorrt.compute_capabilities") \
        if "compute_capabilities" in optional else []
    if not all(isinstance(c, str) for c in compute_capabilities):
        raise r.refuse(f"tensorrt.compute_capabilities must be a list of strings, got {compute_capabilities!r}")
    return TensorRTFacts(
        version=r.string(trt, "version", "tensorrt.version"),
        gpu_name=r.string(trt, "gpu_name", "tensorrt.gpu_name"),
        compute_capability=r.string(trt, "compute_capability", "tensorrt.compute_capability"),
        profile_index={r.index(b, "tensorrt.profile_index"): r.integer(index, b, f"tensorrt.profile_index.{b}", lo=0)
                       for b in index},
        workspace_bytes=None if trt.get("workspace_bytes") is None else
        r.integer(trt, "workspace_bytes", "tensorrt.workspace_bytes", lo=0),
        window_lengths=r.integers(optional, "window_lengths", "tensorrt.window_lengths")
        if "window_lengths" in optional else (),
        library=library,  # type: ignore[arg-type]  # checked above
        compute_capabilities=tuple(compute_capabilities),
        images=images,
        profiles={str(k): list(v) for k, v in profiles.items()},
    )


def _ort_session(r: FieldReader, raw: dict[str, Any]) -> dict[str, Any]:
    """engine.json's ort_session section: the settings a run reads from it, each of its type (the rest kept)."""
    session = r.obj(raw, "ort_session")
    for key in ("intra_op_threads", "inter_op_threads"):
        if key in session:
            r.integer(session, key, f"ort_session.{key}", lo=0, hi=1 << 16)
    if "graph_optimization" in session:
        r.string(session, "graph_optimization", "ort_session.graph_optimization")
    providers = session.get("providers")
    if providers is not None and not (isinstance(providers, list) and all(isinstance(p, str) for p in providers)):
        raise r.refuse(f"'ort_session.providers' must be a list of provider names, got {providers!r}")
    return dict(session)


@dataclass(frozen=True)
class RuntimeFacts:
    """What the loader sees now: the export it was pointed at and, for TensorRT, the library and the GPU.

    None means "not known / not applicable" and skips that comparison (e.g. no GPU facts for an ORT engine).
    """

    model_fingerprint: str | None = None
    graph_hashes: Mapping[str, str] | None = None
    backend: BackendName | None = None
    tensorrt_version: str | None = None
    tensorrt_library: TensorRTLibraryName | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None
    onnxruntime_version: str | None = None


_REBUILD = "rebuild it here: seer-deploy build EXPORT_DIR --out ENGINE_DIR --backend {backend}"


def check_engine_compatible(engine: EngineManifest, facts: RuntimeFacts) -> None:
    """ArtifactError on the first mismatch between an engine and where it is about to run.

    Checked: backend, model fingerprint, every graph hash, and for TensorRT the library and its exact version
    (serialized engines are not portable across versions), then the GPU: standard TensorRT's name and compute
    capability (kernels are chosen per device), TensorRT-RTX's compute capability against the engine's targets. An
    ORT engine dir that saved optimised models is also tied to its ONNX Runtime version.
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
        fix = f"{fix} --trt-library {trt.library}"
        _same(facts.tensorrt_library, trt.library, "the engine was built with {built}, this machine loads {here}; "
              f"install {LIBRARY_TITLES[trt.library]} or {{fix}}", fix)
        _same(facts.tensorrt_version, trt.version, f"the engine was built with {LIBRARY_TITLES[trt.library]} "
              "{built}, this machine has {here}; install that version or {fix}", fix)
        if trt.library == "tensorrt_rtx":
            check_rtx_target(facts.compute_capability, trt.compute_capabilities, fix)
        else:
            _same(facts.gpu_name, trt.gpu_name, "the engine was built on a {built}, this GPU is a {here}; {fix}", fix)
            _same(facts.compute_capability, trt.compute_capability,
                  "the engine was built for compute capability {built}, this GPU has {here}; {fix}", fix)
    if engine.backend == "ort" and any(engine.files.values()):
        built = engine.versions.get("onnxruntime")
        if built is not None:
            _same(facts.onnxruntime_version, built, "the engine dir's optimised models were saved by ONNX Runtime "
                  "{built}, this is {here}; {fix}", fix)


def check_rtx_target(capability: str | None, targets: tuple[str, ...], fix: str) -> None:
    """ArtifactError unless a GPU of `capability` (None: not known) runs a TensorRT-RTX engine built for `targets`
    (() = the portable default)."""
    if capability is None:
        return
    if capability not in RTX_TARGETS:
        raise ArtifactError(
            f"TensorRT-RTX has no {architecture(capability)} target (this GPU is compute capability {capability}; "
            f"its targets are {', '.join(RTX_TARGETS)}): run the engine on an RTX-class GPU, or build one for this GPU "
            "with standard TensorRT (seer-deploy build EXPORT_DIR --out ENGINE_DIR --backend tensorrt --trt-library "
            "tensorrt)"
        )
    allowed = targets or RTX_PORTABLE_TARGETS
    if capability not in allowed:
        what = f"compute capabilities {', '.join(targets)}" if targets else "the portable set (Ampere and later)"
        raise ArtifactError(f"the engine was built for {what}, this GPU is {architecture(capability)} "
                            f"({capability}); {fix} --compute-capability {capability}")


def _same(here: str | None, built: str, message: str, fix: str) -> None:
    """ArtifactError(message) when a fact known here (None: not known, not compared) differs from the build's."""
    if here is not None and here != built:
        raise ArtifactError(message.format(here=here, built=built, fix=fix))
