"""`build_engines`: export dir -> engine dir (engine.json + the backend's files), for ONNX Runtime or TensorRT.

ONNX Runtime "engines" are the sessions' settings (provider, threads, graph optimisation level), checked by
opening the sessions once, and optionally ORT-optimised copies of the graphs. TensorRT engines are one serialized
plan per graph with one optimization profile per bucket. An export with the KV cache graphs (export --kv-cache) gives
an engine dir that runs them too: ONNX Runtime checks their sessions like the step graph's; TensorRT builds the window
graph's engine with one profile per (bucket, window length) pair (`profiles.WindowLayout`, window lengths from
`--window-lengths`). Everything is checked before any work starts
(`prepare_build`: the flags, the export, the profile layout, the destination), then built (`BuildRun.start`). Either
way the engine dir is written in a temp dir next to the destination and renamed into place, so a failed build leaves
nothing half-written; a copy of the export's manifest travels with it (`export.json`) so the engine dir says what it
was built from, and it carries this tool's ownership marker (core.atomic.claim): a rebuild replaces only an engine
dir of ours (of another model only with `force`), never a directory holding anything else.

TensorRT builds every graph the export's manifest lists, and a multimodal export's vision graph, each planned from the
axes its manifest records (`profiles.plan_profiles`; the image axes from its vision config, `image_plan`), all planned
and checked before the first progress line. Either flavour (`tensorrt_library`): TensorRT-RTX builds without a GPU.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import seer_deploy
from seer_deploy.contracts.export_manifest import MANIFEST_FILE as EXPORT_MANIFEST_FILE
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import VISION, Axis
from seer_deploy.contracts.manifest_sections import GraphRecord, TensorSpec
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.core.atomic import check_replaceable, claim, install_dir, staging_dir
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import confined, file_sha256, regular_file
from seer_deploy.engines.buckets import default_window_lengths, plan_buckets
from seer_deploy.engines.external_data import check_external_data
from seer_deploy.engines.image_plan import plan_image_axes
from seer_deploy.engines.manifest import BackendName, EngineManifest, TensorRTFacts
from seer_deploy.engines.ort import OrtSessionOptions, open_session
from seer_deploy.engines.ort_multimodal import backend_class
from seer_deploy.engines.profiles import Profile, ProfileLayout, WindowLayout, plan_profiles

if TYPE_CHECKING:
    from seer_deploy.engines.tensorrt_build import TensorRTBuildOptions

Progress = Callable[[str], None]
EXPORT_COPY = "export.json"
ARTIFACT_KIND = "engine"  # the ownership marker's kind (core.atomic.claim)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'4G', '512M', '1.5G', '1048576' -> bytes (binary units; a trailing 'B'/'iB' is allowed)."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1] if raw and raw[-1] in _UNITS else ""
    number = raw.removesuffix(unit) if unit else raw
    try:
        value = float(number) if number.isascii() else math.nan  # float() also reads other scripts' digits
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # not a number, or NaN / inf (which int() below could not convert)
        raise ConfigError(f"size '{text}' is not a number (finite, digits 0-9) with an optional K/M/G/T unit, e.g. 4G")
    size = int(value * _UNITS[unit])
    if size < 1:
        raise ConfigError(f"size '{text}' must be at least one byte, e.g. 4G")
    return size


@dataclass(frozen=True)
class BuildOptions:
    """Everything `seer-deploy build` takes. Unset sizes are derived from the export's max_seq_len."""

    backend: BackendName = "ort"
    buckets: tuple[int, ...] | None = None  # None: plan_buckets(max_gen_length)
    max_gen_length: int | None = None  # None: the last bucket, or max_seq_len - max_prompt
    max_prompt: int | None = None  # None: max_seq_len - the last bucket, or max_seq_len // 2
    min_prompt: int = 1
    max_batch: int = 8
    kept_lengths: Mapping[int, float] | Sequence[int] | None = None  # calibration histogram for plan_buckets
    max_buckets: int | None = None
    timing_cache: Path | None = None
    workspace_bytes: int | None = None
    window_lengths: tuple[int, ...] | None = None  # TensorRT window_step profiles; None: default_window_lengths
    trt_library: str | None = None  # "tensorrt" or "tensorrt_rtx"; None: the one installed, standard first
    compute_capabilities: tuple[str, ...] = ()  # TensorRT-RTX targets ("8.9"); (): its portable set
    max_pictures: int | None = None  # multimodal TensorRT: pictures per batch; None: what the prompts can hold
    ort_session: OrtSessionOptions = field(default_factory=OrtSessionOptions)
    ort_save_optimized: bool = False
    force: bool = False  # replace our engine dir of another model (never a directory seer-deploy did not write)

    def check(self) -> None:
        """The settings that need no export: the backend, its library, the flags that belong to it."""
        if self.backend == "tensorrt":
            from seer_deploy.engines.tensorrt_library import load_library

            load_library(self.trt_library)  # before any work: the user learns at once
            if self.timing_cache is not None and self.timing_cache.exists():
                regular_file(self.timing_cache, "--timing-cache")
        elif self.backend != "ort":
            raise ConfigError(f"backend '{self.backend}' is unknown; use ort or tensorrt")
        elif (self.workspace_bytes is not None or self.timing_cache is not None or self.trt_library is not None
              or self.compute_capabilities or self.max_pictures is not None):
            raise ConfigError("--workspace, --timing-cache, --trt-library, --compute-capability and --max-pictures "
                              "apply to --backend tensorrt only; drop them for ort")
        elif self.window_lengths is not None:
            raise ConfigError("--window-lengths applies to --backend tensorrt only (ONNX Runtime runs any window); "
                              "drop it for ort")
        else:
            self.ort_session.check()

    def layout(self, max_seq_len: int, vision_config: dict[str, Any] | None = None) -> ProfileLayout:
        """The profile layout for an export with `max_seq_len` positions (and, for a multimodal export's TensorRT
        engines, its vision config: the image axes); ConfigError if it cannot fit."""
        if self.buckets is not None:
            if self.max_gen_length is not None and self.max_gen_length != self.buckets[-1]:
                raise ConfigError(
                    f"--max-gen-length {self.max_gen_length} differs from the last bucket {self.buckets[-1]}; "
                    f"give one of them (the last bucket is the longest response the engine runs)"
                )
            gen = self.buckets[-1]
            max_prompt = self.max_prompt if self.max_prompt is not None else max_seq_len - gen
        else:
            max_prompt = self.max_prompt if self.max_prompt is not None else max_seq_len // 2
            gen = self.max_gen_length if self.max_gen_length is not None else max_seq_len - max_prompt
        if gen < 1 or max_prompt < 1:
            raise ConfigError(
                f"the export has {max_seq_len} positions: --max-prompt {max_prompt} leaves no room for a response "
                f"of {gen}; lower --max-prompt or the buckets"
            )
        buckets = self.buckets or tuple(
            plan_buckets(gen, histogram=self.kept_lengths, max_buckets=self.max_buckets)
        )
        layout = ProfileLayout(tuple(buckets), self.max_batch, max_prompt, self.min_prompt)
        layout.validate(max_seq_len)
        if vision_config is None:
            return layout
        return replace(layout, images=plan_image_axes(vision_config, self.max_batch, max_prompt, self.max_pictures))

    def window_layout(self, layout: ProfileLayout) -> WindowLayout:
        """The TensorRT window_step engine's profiles over `layout`; ConfigError for window lengths it cannot use."""
        windows = WindowLayout(layout, self.window_lengths or default_window_lengths(layout.buckets))
        windows.validate()
        return windows


@dataclass(frozen=True)
class BuildResult:
    out: Path
    manifest: EngineManifest
    seconds: float


def engine_graphs(export: ExportManifest) -> dict[str, GraphRecord]:
    """Every graph an engine dir may be built from: the ones the export's manifest lists, and a multimodal export's
    vision graph (its record sits in extra.multimodal, checked when the manifest was loaded)."""
    graphs = dict(export.graphs)
    section = export.extra.get(MULTIMODAL_KEY)
    if isinstance(section, dict):
        raw = section[VISION.name]
        tensors = {kind: {name: TensorSpec(str(t["dtype"]), list(t["shape"])) for name, t in raw[kind].items()}
                   for kind in ("inputs", "outputs")}
        graphs[VISION.name] = GraphRecord(str(raw["file"]), str(raw["sha256"]), tensors["inputs"], tensors["outputs"])
    return graphs


def _check_export(export_dir: Path, export: ExportManifest) -> None:
    """The graph files (every graph of `engine_graphs`) exist and still hash to what the export manifest says (the
    engine will record it)."""
    for name, graph in engine_graphs(export).items():
        path = confined(export_dir, graph.file, f"the {name} graph", error=ArtifactError)
        if not path.is_file():
            raise ArtifactError(f"{path} ({name} graph) is missing; the export is incomplete, re-run `seer-deploy export`")
        if file_sha256(path) != graph.sha256:
            raise ArtifactError(
                f"{path} does not match the sha256 in {export_dir / EXPORT_MANIFEST_FILE}: it was modified after "
                f"export; re-run `seer-deploy export`"
            )
        check_external_data(path)  # ONNX Runtime and TensorRT's parser open whatever the graph names


def _versions(backend: BackendName, trt_title: str | None) -> dict[str, str]:
    import onnx
    import onnxruntime

    versions = {"seer_deploy": seer_deploy.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__}
    if trt_title is not None:
        versions["tensorrt"] = trt_title
    return versions


def _build_ort(export_dir: Path, export: ExportManifest, options: BuildOptions, tmp: Path,
               progress: Progress) -> tuple[dict[str, str], dict[str, Any]]:
    """Open the sessions once (provider availability, graph/manifest agreement; the cache graphs' too where the
    export has them), optionally save optimised graphs."""
    progress("opening ONNX Runtime sessions" + (" (with the KV cache graphs)" if export.has_cache else ""))
    backend = backend_class(export)(export_dir, options.ort_session, manifest=export)
    backend.open_sessions()  # a run opens them on first use; the build checks every one now
    files = dict.fromkeys(export.graphs, "")  # the step graphs, and the cache graphs where the export has them
    if options.ort_save_optimized:
        for name in files:
            progress(f"saving the optimised {name} graph")
            so = options.ort_session.session_options()
            files[name] = f"{name}.opt.onnx"
            so.optimized_model_filepath = str(tmp / files[name])
            # Weights go to a side file: an inline >2 GB model cannot be serialized.
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                        f"{files[name]}.data")
            open_session(export_dir / export.graphs[name].file, so, backend.providers, backend.disabled_optimizers())
    session = {
        "providers": list(backend.providers),
        "intra_op_threads": options.ort_session.intra_op_threads,
        "inter_op_threads": options.ort_session.inter_op_threads,
        "graph_optimization": options.ort_session.graph_optimization,
    }
    return files, session


def tensorrt_plans(export: ExportManifest, layout: ProfileLayout, windows: WindowLayout | None
                   ) -> dict[str, list[Profile]]:
    """Every TensorRT engine's optimization profiles, by graph (`profiles.plan_profiles` on its recorded inputs)."""
    return {name: plan_profiles(name, {k: v.shape for k, v in graph.inputs.items()}, layout, windows)
            for name, graph in engine_graphs(export).items()}


def _trt_options(options: BuildOptions) -> TensorRTBuildOptions:
    from seer_deploy.engines.tensorrt_build import TensorRTBuildOptions

    return TensorRTBuildOptions(workspace_bytes=options.workspace_bytes, timing_cache=options.timing_cache,
                                compute_capabilities=options.compute_capabilities)


def _check_tensorrt(options: BuildOptions, export: ExportManifest) -> None:
    """What needs the library but no work: the options it cannot honour, and standard TensorRT's GPU."""
    from seer_deploy.engines.tensorrt_build import check_build_options
    from seer_deploy.engines.tensorrt_library import gpu_facts, load_library

    lib = load_library(options.trt_library)
    check_build_options(lib, _trt_options(options), export.dtype, export.weights.quantization)
    if not lib.is_rtx:
        gpu_facts()


def _build_tensorrt(run: BuildRun, tmp: Path, progress: Progress) -> tuple[dict[str, str], TensorRTFacts]:
    """One engine per planned graph into `tmp`, and the facts engine.json records about them."""
    from seer_deploy.engines import tensorrt_build as tb
    from seer_deploy.engines.tensorrt_library import gpu_facts, load_library

    options, graphs = run.options, engine_graphs(run.export)
    lib = load_library(options.trt_library)
    trt_options = _trt_options(options)
    notes = tb.check_build_options(lib, trt_options, run.export.dtype, run.export.weights.quantization)
    gpu_name, capability = ("", "") if lib.is_rtx else gpu_facts()  # only standard TensorRT builds on its GPU
    targets = ", ".join(options.compute_capabilities) or "the portable set (Ampere and later)"
    progress(f"{lib.title}, " + (f"targets {targets}, no GPU needed" if lib.is_rtx
                                 else f"on {gpu_name} (compute capability {capability})"))
    for note in notes:
        progress(note)
    files = {}
    for name, profiles in run.plans.items():
        progress(f"building the {name} engine ({len(profiles)} profile{'s' if len(profiles) != 1 else ''})")
        plan = tb.build_serialized_engine(lib, run.export_dir / graphs[name].file, name, profiles, trt_options,
                                          progress)
        files[name] = f"{name}.engine"
        (tmp / files[name]).write_bytes(plan)  # inside the temp dir: the rename below makes it visible
    facts = TensorRTFacts(
        version=lib.version,
        gpu_name=gpu_name,
        compute_capability=capability,
        profile_index={bucket: i for i, bucket in enumerate(run.layout.buckets)},
        workspace_bytes=options.workspace_bytes,
        window_lengths=run.windows.windows if run.windows is not None else (),
        library=lib.name,
        compute_capabilities=options.compute_capabilities if lib.is_rtx else (),
        images=run.layout.images,
        profiles={name: [p.to_dict() for p in profiles] for name, profiles in run.plans.items()},
    )
    return files, facts


@dataclass(frozen=True)
class BuildRun:
    """A build whose input passed every check that needs no heavy work (prepare_build); `start` builds it."""

    export_dir: Path
    out: Path
    export: ExportManifest
    layout: ProfileLayout
    options: BuildOptions
    windows: WindowLayout | None = None  # TensorRT from an export with the KV cache graphs: window_step's profiles
    plans: dict[str, list[Profile]] = field(default_factory=dict)  # TensorRT: each graph's profiles

    def start(self, progress: Progress = lambda _: None) -> BuildResult:
        """Build into a temp dir beside `out`, then install it there; on any failure nothing is left behind."""
        started = time.perf_counter()
        export_dir, out, export, layout, options = self.export_dir, self.out, self.export, self.layout, self.options
        progress(f"buckets {list(layout.buckets)}, batch 1..{layout.max_batch}, "
                 f"prompt {layout.min_prompt}..{layout.max_prompt}"
                 + (f", windows {list(self.windows.windows)}" if self.windows is not None else ""))
        with staging_dir(out, "build") as tmp:
            trt_facts: TensorRTFacts | None = None
            ort_session: dict[str, Any] | None = None
            if options.backend == "tensorrt":
                files, trt_facts = _build_tensorrt(self, tmp, progress)
            else:
                files, ort_session = _build_ort(export_dir, export, options, tmp, progress)
            manifest = EngineManifest(
                backend=options.backend,
                buckets=layout.buckets,
                max_batch=layout.max_batch,
                min_prompt=layout.min_prompt,
                max_prompt=layout.max_prompt,
                model_fingerprint=export.model.fingerprint,
                graph_hashes={name: engine_graphs(export)[name].sha256 for name in files},
                files=files,
                versions=_versions(options.backend, trt_facts.title if trt_facts is not None else None),
                tensorrt=trt_facts,
                ort_session=ort_session,
                extra={"export_dir": str(export_dir.resolve()), "max_seq_len": export.max_seq_len},
            )
            manifest.validate()
            shutil.copyfile(export_dir / EXPORT_MANIFEST_FILE, tmp / EXPORT_COPY)
            manifest.save(tmp)
            progress(f"installing {out}")
            check_replaceable(out, ARTIFACT_KIND, export.model.fingerprint, options.force)  # again: another process
            claim(tmp, ARTIFACT_KIND, export.model.fingerprint)
            install_dir(tmp, out)
        return BuildResult(out=out, manifest=manifest, seconds=time.perf_counter() - started)


def prepare_build(export_dir: Path, out: Path, options: BuildOptions) -> BuildRun:
    """Check a build of `export_dir` into `out` before any work: the options, the export (manifest, graph hashes,
    external-data paths), the profile layout it allows, the destination's ownership. ConfigError / ArtifactError
    name the first problem."""
    export_dir, out = Path(export_dir), Path(out).expanduser().absolute()
    options.check()
    export = ExportManifest.load(export_dir)
    section = export.extra.get(MULTIMODAL_KEY)
    vision = section["vision_config"] if options.backend == "tensorrt" and isinstance(section, dict) else None
    if options.max_pictures is not None and vision is None:
        raise ConfigError(f"--max-pictures sizes a multimodal engine's image axes; {export_dir} is a text export: "
                          "drop it")
    layout = options.layout(export.max_seq_len, vision)
    windowed = any(Axis.WINDOW.value in t.shape for g in export.graphs.values() for t in g.inputs.values())
    windows = None
    if options.backend == "tensorrt" and windowed:
        windows = options.window_layout(layout)
    elif options.window_lengths is not None:
        raise ConfigError(f"--window-lengths plans the window_step engine of the KV cache, which {export_dir} does not "
                          "have; re-export with `seer-deploy export --kv-cache`, or drop --window-lengths")
    plans: dict[str, list[Profile]] = {}
    if options.backend == "tensorrt":
        _check_tensorrt(options, export)
        plans = tensorrt_plans(export, layout, windows)
    _check_export(export_dir, export)
    check_replaceable(out, ARTIFACT_KIND, export.model.fingerprint, options.force)
    return BuildRun(export_dir, out, export, layout, options, windows, plans)


def build_engines(export_dir: Path, out: Path, options: BuildOptions, progress: Progress = lambda _: None
                  ) -> BuildResult:
    """Build the engine dir `out` from `export_dir`; ConfigError/ArtifactError name what is wrong."""
    return prepare_build(export_dir, out, options).start(progress)
