"""Building one TensorRT engine (either flavour): parse the ONNX graph, add its optimization profiles in order, build,
return the plan bytes.

Before TensorRT sees them, the profiles are checked against the parsed network (`check_profiles`): every input has a
range, min <= opt <= max, fixed dims as the network has them, and the inputs that share a named dimension (the ONNX
graph's dim_param: batch, seq, window, image axes) take one range for it in each profile. A plan that breaks one of
these is named there (graph, profile, input, its min/opt/max); TensorRT's own message for it ("invalid shape profile,
expect min <= common <= max on input 5") counts inputs in its optimizer's numbering, which names no graph input. A
build that still fails gets the library's own error lines, condensed (`build_failure`), never a generic hint.

TensorRT-RTX builds without a GPU, for the target compute capabilities given (none: its portable set, Ampere and
later). Its timing cache does nothing (kernels are compiled on the user's GPU; loading one still "succeeds"), so a
--timing-cache is skipped there with a one-line note.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.atomic import write_bytes_atomic
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines.profiles import Profile
from seer_deploy.engines.tensorrt_library import RtxBuilderConfig, TensorRTLibrary, rtx_target_enums

if TYPE_CHECKING:
    import tensorrt as trt_types

Progress = Callable[[str], None]
TIMING_CACHE_NOTE = "--timing-cache skipped: TensorRT-RTX compiles kernels on the user's GPU and has no timing cache"


@dataclass(frozen=True)
class TensorRTBuildOptions:
    """Builder settings; the engine's precision is whatever the ONNX carries (strongly typed network)."""

    workspace_bytes: int | None = None  # None: TensorRT's default (the device's memory)
    timing_cache: Path | None = None  # standard TensorRT: loaded when it exists, saved (atomically) after each build
    optimization_level: int | None = None  # builder_optimization_level 0..5; None: TensorRT's default (3)
    compute_capabilities: tuple[str, ...] = field(default=())  # TensorRT-RTX targets; (): its portable set


def check_build_options(lib: TensorRTLibrary, options: TensorRTBuildOptions, dtype: str,
                        quantization: Quantization | None = None) -> list[str]:
    """ConfigError for settings this library cannot honour (or an export's quantization it cannot build); the notes to
    print for the ones it skips."""
    if quantization is not None and quantization.format != "qdq":
        raise ConfigError(f"the export's weights are quantized as ONNX Runtime's MatMulNBits ({quantization.describe()}),"
                          f" which {lib.title} cannot parse: re-export with --quantize {quantization.scheme} "
                          "--quant-format qdq")
    if quantization is not None and quantization.bits == 4 and "7.5" in options.compute_capabilities:
        raise ConfigError("--compute-capability 7.5 (Turing): TensorRT-RTX has no int4 weights there (measured: "
                          "'HW-specific datatypes: int4'); drop 7.5 or re-export with --quantize int8")
    if options.compute_capabilities and not lib.is_rtx:
        raise ConfigError(f"--compute-capability targets TensorRT-RTX builds; {lib.title} builds for the GPU it runs "
                          "on: drop it, or build with --trt-library tensorrt_rtx")
    if "7.5" in options.compute_capabilities and dtype == "fp32":
        raise ConfigError("--compute-capability 7.5 (Turing): TensorRT-RTX has no FP32 GEMMs there; export with "
                          "--dtype fp16 or drop 7.5")
    if options.compute_capabilities:
        rtx_target_enums(lib, options.compute_capabilities)  # the library's own enum has each one
    return [TIMING_CACHE_NOTE] if lib.is_rtx and options.timing_cache is not None else []


def _recording_logger(lib: TensorRTLibrary) -> tuple[trt_types.ILogger, list[str]]:
    """A logger that keeps every message of ERROR and above for the failure message, and prints warnings and errors to
    stderr only when debugging (SEER_DEPLOY_DEBUG=1): the library's own log stays off the user's screen."""
    if TYPE_CHECKING:
        trt = trt_types
    else:
        trt = lib.module
    errors: list[str] = []
    debug = bool(os.environ.get("SEER_DEPLOY_DEBUG"))

    # A local base class: without the stubs (plain `mypy seer_deploy`) trt is Any, hence the ignore there only.
    class Recorder(trt.ILogger):  # type: ignore[name-defined,unused-ignore]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt_types.ILogger.Severity, msg: str) -> None:
            if severity <= trt.ILogger.Severity.ERROR:
                errors.append(msg)
            if debug and severity <= trt.ILogger.Severity.WARNING:
                print(f"[{lib.name}] {msg}", file=sys.stderr)

    return Recorder(), errors


def _progress_monitor(lib: TensorRTLibrary, progress: Progress) -> trt_types.IProgressMonitor:
    """A progress monitor that forwards top-level build phases to `progress` (its base class is the library's)."""
    if TYPE_CHECKING:
        trt = trt_types
    else:
        trt = lib.module

    class Monitor(trt.IProgressMonitor):  # type: ignore[name-defined,unused-ignore]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str, num_steps: int) -> None:
            if not parent_phase:
                progress(f"  {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel the build

        def phase_finish(self, phase_name: str) -> None:
            pass

    return Monitor()


def parse_network(lib: TensorRTLibrary, builder: trt_types.Builder, logger: trt_types.ILogger, onnx_path: Path
                  ) -> trt_types.INetworkDefinition:
    """A strongly typed network from the ONNX file (parse_from_file resolves external weight files)."""
    if TYPE_CHECKING:
        trt = trt_types
    else:
        trt = lib.module
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ArtifactError(f"{lib.title} cannot parse {onnx_path}: {errors}; re-export it or check the opset")
    return network


def network_inputs(network: trt_types.INetworkDefinition) -> dict[str, list[int | str]]:
    """Each network input's dims: its ONNX dimension name where it has one, else its fixed size."""
    inputs: dict[str, list[int | str]] = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tensor.shape
        inputs[tensor.name] = [tensor.get_dimension_name(d) or int(shape[d]) for d in range(len(shape))]
    return inputs


def _where(graph: str, profile: Profile) -> str:
    windows = f", windows {profile.window_lo}..{profile.window}" if profile.window else ""
    bucket = f" (bucket {profile.bucket}{windows})" if profile.bucket else ""
    return f"the {graph} graph's optimization profile {profile.index}{bucket}"


def _triple(profile: Profile, name: str, dim: int) -> tuple[int, int, int]:
    shape = profile.shapes[name]
    return shape.min[dim], shape.opt[dim], shape.max[dim]


def profile_problems(graph: str, inputs: dict[str, list[int | str]], profiles: Sequence[Profile]) -> Iterator[str]:
    """Each profile, input and min/opt/max that TensorRT would refuse (module docstring), as one line each."""
    for profile in profiles:
        where = _where(graph, profile)
        if set(profile.shapes) != set(inputs):
            yield (f"{where} covers inputs {sorted(profile.shapes)}, the graph takes {sorted(inputs)}: the export "
                   "manifest and the graph disagree; re-export")
            continue
        shared: dict[str, tuple[str, tuple[int, int, int]]] = {}
        for name, dims in inputs.items():
            shape = profile.shapes[name]
            if len(shape.min) != len(dims):
                yield f"{where}: input {name} has rank {len(dims)}, the plan {len(shape.min)}; re-export"
                continue
            for d, dim in enumerate(dims):
                lo, opt, hi = _triple(profile, name, d)
                label = f"input {name} dim {d} ({dim})"
                if not 0 <= lo <= opt <= hi:
                    yield f"{where}: {label} has min/opt/max {lo}/{opt}/{hi}; it needs 0 <= min <= opt <= max"
                elif isinstance(dim, int) and (lo, opt, hi) != (dim, dim, dim):
                    yield f"{where}: {label} is fixed at {dim} but planned {lo}/{opt}/{hi}; re-export"
                elif isinstance(dim, str):
                    first = shared.setdefault(dim, (name, (lo, opt, hi)))
                    if first[1] != (lo, opt, hi):
                        yield (f"{where}: {label} has min/opt/max {lo}/{opt}/{hi}, input {first[0]} has "
                               f"{'/'.join(map(str, first[1]))} for the same axis; inputs sharing an axis need one "
                               "range")


def check_profiles(graph: str, inputs: dict[str, list[int | str]], profiles: Sequence[Profile]) -> None:
    """ArtifactError naming the first profile, input and min/opt/max that TensorRT would refuse."""
    problem = next(profile_problems(graph, inputs, profiles), None)
    if problem is not None:
        raise ArtifactError(problem)


def build_failure(lib: TensorRTLibrary, graph: str, errors: Sequence[str], problems: Sequence[str] = ()
                  ) -> ArtifactError:
    """The build's failure in one line from the library's error messages (CUDA's complaints on a machine without a GPU
    are noise for an ahead-of-time build and left out); for a refused profile, the first of `problems`
    (`profile_problems`) names the input that TensorRT's message numbers its own way."""
    kept = [m for m in errors if "catchCudaError" not in m and "CUDA driver version is insufficient" not in m]
    profile = next((m for m in kept if "shape profile" in m or "Profile kOPT" in m or "optimization profile" in m),
                   None)
    if profile is not None:
        named = re.search(r"Dimensions with name (\w+)", profile)
        reason = f"the inputs carrying the {named.group(1)} axis" if named else "an input (in its own numbering)"
        found = f"; {problems[0]}" if problems else ""
        return ArtifactError(f"{lib.title} refused the {graph} engine's optimization profiles: {reason} got ranges it "
                             f"cannot combine ({_condense(profile)}){found}")
    detail = _condense(kept[-1]) if kept else "no error message"
    return ArtifactError(f"{lib.title} could not build the {graph} engine: {detail}")


def _condense(message: str) -> str:
    """A library error line without its source locations."""
    text = re.sub(r"\s*In \w+ at /\S+", "", message)
    text = re.sub(r"\[[\w./]+:\d+(: \w+)?\]\s*", "", text)
    return " ".join(text.split())[:300]


def build_serialized_engine(lib: TensorRTLibrary, onnx_path: Path, graph: str, profiles: Sequence[Profile],
                            options: TensorRTBuildOptions, progress: Progress) -> bytes:
    """Parse, check and add the optimization profiles in order (profile i = bucket i; for window_step, pair i of its
    WindowLayout), build, return the plan bytes."""
    if TYPE_CHECKING:
        trt = trt_types
    else:
        trt = lib.module
    logger, errors = _recording_logger(lib)
    builder = trt.Builder(logger)
    network = parse_network(lib, builder, logger, onnx_path)
    inputs = network_inputs(network)
    check_profiles(graph, inputs, profiles)
    config = builder.create_builder_config()
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    if lib.is_rtx:
        _set_targets(lib, cast(RtxBuilderConfig, config), options.compute_capabilities)
    else:
        _use_timing_cache(config, options.timing_cache, progress)
    for profile in profiles:
        trt_profile = builder.create_optimization_profile()
        for name, shape in profile.shapes.items():
            trt_profile.set_shape(name, trt.Dims(list(shape.min)), trt.Dims(list(shape.opt)), trt.Dims(list(shape.max)))
        if config.add_optimization_profile(trt_profile) != profile.index:
            raise build_failure(lib, graph, errors, list(profile_problems(graph, inputs, profiles)))
    monitor = _progress_monitor(lib, progress)  # held here: the config does not keep the Python object alive
    config.progress_monitor = monitor
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise build_failure(lib, graph, errors, list(profile_problems(graph, inputs, profiles)))
    if options.timing_cache is not None and not lib.is_rtx:
        write_bytes_atomic(options.timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(plan)


def _set_targets(lib: TensorRTLibrary, config: RtxBuilderConfig, capabilities: tuple[str, ...]) -> None:
    """TensorRT-RTX's target compute capabilities; none set = its portable default."""
    targets = rtx_target_enums(lib, capabilities)
    if targets:
        config.num_compute_capabilities = len(targets)
        for index, target in enumerate(targets):
            if not config.set_compute_capability(target, index):
                raise ConfigError(f"{lib.title} refused target compute capability {capabilities[index]}")


def _use_timing_cache(config: trt_types.IBuilderConfig, path: Path | None, progress: Progress) -> None:
    """Standard TensorRT's timing cache: read where it exists (kernel timings of this GPU), written after the build."""
    cache_bytes = b""
    if path is not None and path.is_file():
        cache_bytes = path.read_bytes()
        progress(f"  timing cache: {path} ({len(cache_bytes)} bytes)")
    cache = config.create_timing_cache(cache_bytes)
    if not config.set_timing_cache(cache, False):
        raise ArtifactError(f"timing cache {path} does not fit this TensorRT/GPU; delete it")
