"""`build_engines`: export dir -> engine dir (engine.json + the backend's files), for ONNX Runtime or TensorRT.

ONNX Runtime "engines" are the sessions' settings (provider, threads, graph optimisation level), checked by
opening the sessions once, and optionally ORT-optimised copies of the graphs. TensorRT engines are one serialized
plan per graph with one optimization profile per bucket. An export with the KV cache graphs (export --kv-cache) gives
an engine dir that runs them too: ONNX Runtime checks their sessions like the step graphs'; TensorRT builds a refresh
engine with the step graphs' profiles and a window_step engine with one profile per (bucket, window length) pair
(`buckets.WindowLayout`, window lengths from `--window-lengths`). Everything is checked before any work starts
(`prepare_build`: the flags, the export, the profile layout, the destination), then built (`BuildRun.start`). Either
way the engine dir is written in a temp dir next to the destination and renamed into place, so a failed build leaves
nothing half-written; a copy of the export's manifest travels with it (`export.json`) so the engine dir says what it
was built from, and it carries this tool's ownership marker (core.atomic.claim): a rebuild replaces only an engine
dir of ours (of another model only with `force`), never a directory holding anything else.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import seer_deploy
from seer_deploy.core.atomic import check_replaceable, claim, install_dir, staging_dir
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import confined, file_sha256, regular_file
from seer_deploy.engines.buckets import (
    Profile,
    ProfileLayout,
    WindowLayout,
    default_window_lengths,
    input_axes,
    plan_buckets,
    profile_shapes,
    window_profile_shapes,
)
from seer_deploy.engines.manifest import BackendName, EngineManifest, TensorRTFacts
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions, check_external_data, open_session
from seer_deploy.spec.export_manifest import MANIFEST_FILE as EXPORT_MANIFEST_FILE
from seer_deploy.spec.export_manifest import ExportManifest, GraphRecord
from seer_deploy.spec.graphs import ATTENTION_MASK, WINDOW_IDS, GraphIO, cache_graphs, step_graphs
from seer_deploy.spec.multimodal import MULTIMODAL_KEY

Progress = Callable[[str], None]
EXPORT_COPY = "export.json"
ARTIFACT_KIND = "engine"  # the ownership marker's kind (core.atomic.claim)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'4G', '512M', '1.5G', '1048576' -> bytes (binary units; a trailing 'B'/'iB' is allowed)."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1] if raw and raw[-1] in _UNITS else ""
    try:
        value = float(raw.removesuffix(unit) if unit else raw)
    except ValueError as exc:
        raise ConfigError(f"size '{text}' is not a number with an optional K/M/G/T unit, e.g. 4G") from exc
    if value <= 0:
        raise ConfigError(f"size '{text}' must be positive, e.g. 4G")
    return int(value * _UNITS[unit])


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
    ort_session: OrtSessionOptions = field(default_factory=OrtSessionOptions)
    ort_save_optimized: bool = False
    force: bool = False  # replace our engine dir of another model (never a directory seer-deploy did not write)

    def check(self) -> None:
        """The settings that need no export: the backend, its library, the flags that belong to it."""
        if self.backend == "tensorrt":
            from seer_deploy.engines import tensorrt_engine

            tensorrt_engine.require_tensorrt()  # before any work: the user learns at once
            if self.timing_cache is not None and self.timing_cache.exists():
                regular_file(self.timing_cache, "--timing-cache")
        elif self.backend != "ort":
            raise ConfigError(f"backend '{self.backend}' is unknown; use ort or tensorrt")
        elif self.workspace_bytes is not None or self.timing_cache is not None:
            raise ConfigError("--workspace and --timing-cache apply to --backend tensorrt only; drop them for ort")
        elif self.window_lengths is not None:
            raise ConfigError("--window-lengths applies to --backend tensorrt only (ONNX Runtime runs any window); "
                              "drop it for ort")
        else:
            self.ort_session.check()

    def layout(self, max_seq_len: int) -> ProfileLayout:
        """The profile layout for an export with `max_seq_len` positions; ConfigError if it cannot fit."""
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
        return layout

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


def _check_export(export_dir: Path, export: ExportManifest) -> None:
    """The graph files (step graphs, and the cache graphs where the export has them) exist and still hash to what the
    export manifest says (the engine will record it)."""
    for name in export.graphs:
        path = confined(export_dir, export.graphs[name].file, f"the {name} graph", error=ArtifactError)
        if not path.is_file():
            raise ArtifactError(f"{path} ({name} graph) is missing; the export is incomplete, re-run `seer-deploy export`")
        if file_sha256(path) != export.graphs[name].sha256:
            raise ArtifactError(
                f"{path} does not match the sha256 in {export_dir / EXPORT_MANIFEST_FILE}: it was modified after "
                f"export; re-run `seer-deploy export`"
            )
        check_external_data(path)  # ONNX Runtime and TensorRT's parser open whatever the graph names


def _versions(backend: BackendName) -> dict[str, str]:
    import onnx
    import onnxruntime

    versions = {"seer_deploy": seer_deploy.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__}
    if backend == "tensorrt":
        from seer_deploy.engines import tensorrt_engine

        versions["tensorrt"] = tensorrt_engine.tensorrt_version()
    return versions


def _build_ort(export_dir: Path, export: ExportManifest, options: BuildOptions, tmp: Path,
               progress: Progress) -> tuple[dict[str, str], dict[str, Any]]:
    """Open the sessions once (provider availability, graph/manifest agreement; the cache graphs' too where the
    export has them), optionally save optimised graphs."""
    progress("opening ONNX Runtime sessions" + (" (with the KV cache graphs)" if export.has_cache else ""))
    backend = OrtBackend(export_dir, options.ort_session)
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
            open_session(export_dir / export.graphs[name].file, so, backend.providers)
    session = {
        "providers": list(backend.providers),
        "intra_op_threads": options.ort_session.intra_op_threads,
        "inter_op_threads": options.ort_session.inter_op_threads,
        "graph_optimization": options.ort_session.graph_optimization,
    }
    return files, session


def _declared_inputs(io: GraphIO, graph: GraphRecord) -> dict[str, list[int | str]]:
    """The recorded shapes of the graph's inputs, which must be the declared ones (spec.graphs), in their order."""
    if list(graph.inputs) != io.input_names:
        raise ArtifactError(
            f"{graph.file} takes inputs {list(graph.inputs)}, the {io.name} graph is declared with {io.input_names}; "
            "re-export the model with this seer-deploy"
        )
    return {name: graph.inputs[name].shape for name in io.input_names}


def tensorrt_profiles(io: GraphIO, graph: GraphRecord, layout: ProfileLayout, windows: WindowLayout | None
                      ) -> list[Profile]:
    """The optimization profiles of `io`'s TensorRT engine: one per bucket, or for window_step one per
    (bucket, window length) pair of `windows`."""
    inputs = _declared_inputs(io, graph)
    if io.takes(WINDOW_IDS):
        if windows is None:
            raise ConfigError(f"the {io.name} graph needs window lengths to plan its profiles")
        return window_profile_shapes(windows, input_axes(inputs, ATTENTION_MASK.name, WINDOW_IDS.name))
    return profile_shapes(layout, input_axes(inputs))


def _build_tensorrt(export_dir: Path, export: ExportManifest, layout: ProfileLayout, windows: WindowLayout | None,
                    options: BuildOptions, tmp: Path, progress: Progress) -> tuple[dict[str, str], TensorRTFacts]:
    from seer_deploy.engines import tensorrt_engine as te

    gpu_name, capability = te.gpu_facts()
    progress(f"TensorRT {te.tensorrt_version()} on {gpu_name} (compute capability {capability})")
    trt_options = te.TensorRTBuildOptions(workspace_bytes=options.workspace_bytes, timing_cache=options.timing_cache)
    files = {}
    prefix = export.model_config().prefix_dlm  # a prefix-DLM model's graphs also take prompt_width [batch]
    for io in step_graphs(prefix_dlm=prefix) + (cache_graphs(prefix_dlm=prefix) if windows is not None else ()):
        graph = export.graphs[io.name]
        profiles = tensorrt_profiles(io, graph, layout, windows)
        progress(f"building the {io.name} engine ({len(profiles)} profiles)")
        plan = te.build_serialized_engine(export_dir / graph.file, profiles, trt_options, progress)
        files[io.name] = f"{io.name}.engine"
        (tmp / files[io.name]).write_bytes(plan)  # inside the temp dir: the rename below makes it visible
    facts = TensorRTFacts(
        version=te.tensorrt_version(),
        gpu_name=gpu_name,
        compute_capability=capability,
        profile_index={bucket: i for i, bucket in enumerate(layout.buckets)},
        workspace_bytes=options.workspace_bytes,
        window_lengths=windows.windows if windows is not None else (),
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
                files, trt_facts = _build_tensorrt(export_dir, export, layout, self.windows, options, tmp, progress)
            else:
                files, ort_session = _build_ort(export_dir, export, options, tmp, progress)
            manifest = EngineManifest(
                backend=options.backend,
                buckets=layout.buckets,
                max_batch=layout.max_batch,
                min_prompt=layout.min_prompt,
                max_prompt=layout.max_prompt,
                model_fingerprint=export.model.fingerprint,
                graph_hashes={name: export.graphs[name].sha256 for name in files},
                files=files,
                versions=_versions(options.backend),
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
    if options.backend == "tensorrt" and MULTIMODAL_KEY in export.extra:
        raise ConfigError(
            f"{export_dir} is a multimodal export: TensorRT engines are built from text exports only (no profile plan "
            "covers the step graphs' image-table input yet); use --backend ort, or run the export directory itself"
        )
    layout = options.layout(export.max_seq_len)
    windows = None
    if options.backend == "tensorrt" and export.has_cache:
        windows = options.window_layout(layout)
    elif options.window_lengths is not None:
        raise ConfigError(f"--window-lengths plans the window_step engine of the KV cache, which {export_dir} does not "
                          "have; re-export with `seer-deploy export --kv-cache`, or drop --window-lengths")
    _check_export(export_dir, export)
    check_replaceable(out, ARTIFACT_KIND, export.model.fingerprint, options.force)
    return BuildRun(export_dir, out, export, layout, options, windows)


def build_engines(export_dir: Path, out: Path, options: BuildOptions, progress: Progress = lambda _: None
                  ) -> BuildResult:
    """Build the engine dir `out` from `export_dir`; ConfigError/ArtifactError name what is wrong."""
    return prepare_build(export_dir, out, options).start(progress)
