"""Every TensorRT call in seer-deploy: building an engine with one optimization profile per length bucket, and
running it (`TensorRTBackend`).

Type-checked against tensorrt-stubs by .ci/mypy-tensorrt.sh; TensorRT itself is only on GPU machines, so this
module imports without it and `require_tensorrt()` turns its absence into one clear error.

Device buffers are torch CUDA tensors (torch is already a dependency; cuda-python would add one), allocated once
when an engine loads, as TensorRT's own demos do, never per step: one buffer per input and output, sized for the
largest shape any profile takes (`buckets.buffer_shapes`, from the graph's declaration in spec.graphs). Every
profile's context gets their addresses once; a call copies its feeds into views of the input buffers, sets the
input shapes and reads the outputs from views of the output buffers. Execution is enqueued on torch's current
stream so torch's own ordering stays correct. All of an engine's profiles share these buffers and one
execution-memory buffer (sized for the largest profile): calls run one at a time on one stream and end by copying
the outputs to the host, so the per-profile contexts never use them concurrently.

With `cuda_graph` (`generate --cuda-graph`), the step engine's calls are padded to fixed shapes inside their profile
(`engines.fixed_shapes`) and each (profile, shape) is captured once as a CUDA graph (torch.cuda.CUDAGraph around
`execute_async_v3`, after one ordinary call) and replayed after: the buffers' addresses never change, so a replay
reads the new inputs. Unrun here (no TensorRT, no GPU): type-checked against the stubs.

An engine dir built from an export with the KV cache graphs also holds refresh.engine (the step graph's profiles, one
per bucket; its kv output sized like the sequence) and window_step.engine (one profile per (bucket, window length)
pair of `buckets.WindowLayout`, its buffers at the largest batch, sequence and window): `TensorRTBackend.refresh` and
`window_step` run them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from seer_deploy.core.atomic import write_bytes_atomic
from seer_deploy.core.backend import RefreshOutput, Step0Output, StepInput, StepOutput, WindowInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import regular_file
from seer_deploy.core.sparsity import SparsityRow
from seer_deploy.engines.buckets import Profile, ProfileLayout, WindowLayout, buffer_shapes, choose_profile_for_seq
from seer_deploy.engines.fixed_shapes import FixedShapes, pad_feed, unpad_outputs
from seer_deploy.engines.manifest import EngineManifest, RuntimeFacts, check_engine_compatible
from seer_deploy.spec.graph_calls import (
    graph_feed,
    refresh_output,
    step0_output,
    step_output,
    window_feed,
    window_output,
)
from seer_deploy.spec.graphs import GraphIO, cache_graphs, step_graphs

try:
    import tensorrt as trt
except (ImportError, OSError):  # no TensorRT (or no driver for it) on this machine
    if not TYPE_CHECKING:
        trt = None

Progress = Callable[[str], None]

INSTALL_HINT = (
    "TensorRT is not installed (it needs an NVIDIA GPU); install it with `pip install tensorrt` on a GPU machine, "
    "or build for ONNX Runtime with --backend ort"
)


def tensorrt_available() -> bool:
    """True when the real TensorRT bindings import (the stubs alone install an empty `tensorrt` package)."""
    return trt is not None and hasattr(trt, "Builder")


def require_tensorrt() -> None:
    if not tensorrt_available():
        raise ConfigError(INSTALL_HINT)


def _logger() -> trt.Logger:
    """TensorRT's log on stderr: errors only, warnings too when debugging (SEER_DEPLOY_DEBUG=1)."""
    return trt.Logger(trt.Logger.WARNING if os.environ.get("SEER_DEPLOY_DEBUG") else trt.Logger.ERROR)


def tensorrt_version() -> str:
    require_tensorrt()
    return str(trt.__version__)


def gpu_facts(device: int = 0) -> tuple[str, str]:
    """(name, "major.minor" compute capability) of the CUDA device engines are built for and run on."""
    if not torch.cuda.is_available():
        raise ConfigError("TensorRT needs a CUDA GPU and none is visible (check the driver and CUDA_VISIBLE_DEVICES)")
    major, minor = torch.cuda.get_device_capability(device)
    return torch.cuda.get_device_name(device), f"{major}.{minor}"


def runtime_facts(device: int = 0) -> RuntimeFacts:
    """This machine's TensorRT version and GPU, for `check_engine_compatible`."""
    name, capability = gpu_facts(device)
    return RuntimeFacts(backend="tensorrt", tensorrt_version=tensorrt_version(), gpu_name=name,
                        compute_capability=capability)


@dataclass(frozen=True)
class TensorRTBuildOptions:
    """Builder settings; the engine's precision is whatever the ONNX carries (strongly typed network)."""

    workspace_bytes: int | None = None  # None: TensorRT's default (the device's memory)
    timing_cache: Path | None = None  # loaded when it exists, saved (atomically) after each build
    optimization_level: int | None = None  # builder_optimization_level 0..5; None: TensorRT's default (3)


def _progress_monitor(progress: Progress) -> trt.IProgressMonitor:
    """A TensorRT progress monitor that forwards top-level build phases to `progress` (defined here, not at
    module level, because its base class exists only where TensorRT is installed)."""

    class Monitor(trt.IProgressMonitor):
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


def _parse_onnx(builder: trt.Builder, logger: trt.ILogger, onnx_path: Path) -> trt.INetworkDefinition:
    """A strongly typed network from the ONNX file (parse_from_file resolves external weight files)."""
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ArtifactError(f"TensorRT cannot parse {onnx_path}: {errors}; re-export it or check the opset")
    return network


def _check_inputs(network: trt.INetworkDefinition, profiles: Sequence[Profile], onnx_path: Path) -> None:
    names = {network.get_input(i).name: len(network.get_input(i).shape) for i in range(network.num_inputs)}
    wanted = profiles[0].shapes
    if set(names) != set(wanted):
        raise ArtifactError(
            f"{onnx_path} has inputs {sorted(names)}, the profiles were planned for {sorted(wanted)}; "
            f"the export manifest and the graph disagree: re-export"
        )
    for name, rank in names.items():
        if rank != len(wanted[name].min):
            raise ArtifactError(f"{onnx_path}: input {name} has rank {rank}, expected {len(wanted[name].min)}")


def build_serialized_engine(
    onnx_path: Path, profiles: Sequence[Profile], options: TensorRTBuildOptions, progress: Progress
) -> bytes:
    """Parse, add the optimization profiles in order (profile i = bucket i; for window_step, pair i of its
    WindowLayout), build, return the plan bytes."""
    require_tensorrt()
    logger = _logger()
    builder = trt.Builder(logger)
    network = _parse_onnx(builder, logger, onnx_path)
    _check_inputs(network, profiles, onnx_path)
    config = builder.create_builder_config()
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    cache_bytes = b""
    if options.timing_cache is not None and options.timing_cache.is_file():
        cache_bytes = options.timing_cache.read_bytes()
        progress(f"  timing cache: {options.timing_cache} ({len(cache_bytes)} bytes)")
    cache = config.create_timing_cache(cache_bytes)
    if not config.set_timing_cache(cache, False):
        raise ArtifactError(f"timing cache {options.timing_cache} does not fit this TensorRT/GPU; delete it")
    for profile in profiles:
        trt_profile = builder.create_optimization_profile()
        for name, shape in profile.shapes.items():
            trt_profile.set_shape(name, trt.Dims(list(shape.min)), trt.Dims(list(shape.opt)), trt.Dims(list(shape.max)))
        index = config.add_optimization_profile(trt_profile)
        if index != profile.index:
            window = f", windows {profile.window_lo}..{profile.window}" if profile.window else ""
            raise ArtifactError(f"TensorRT rejected the optimization profile for bucket {profile.bucket}{window}")
    monitor = _progress_monitor(progress)  # held here: the config does not keep the Python object alive
    config.progress_monitor = monitor
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ArtifactError(
            f"TensorRT could not build an engine from {onnx_path} (see its log above); a larger --workspace or "
            f"fewer/smaller buckets may help"
        )
    if options.timing_cache is not None:
        write_bytes_atomic(options.timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(plan)


def _dims(dims: trt.Dims) -> tuple[int, ...]:
    return tuple(dims[i] for i in range(len(dims)))


def _torch_dtype(dtype: trt.DataType) -> torch.dtype:
    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.BF16: torch.bfloat16,
        trt.DataType.INT32: torch.int32,
        trt.DataType.INT64: torch.int64,
        trt.DataType.INT8: torch.int8,
        trt.DataType.UINT8: torch.uint8,
        trt.DataType.BOOL: torch.bool,
    }
    if dtype not in table:
        raise ArtifactError(f"engine tensor type {dtype} has no torch equivalent; re-export with standard types")
    return table[dtype]


class IOBuffers:
    """One device buffer per engine input and output, allocated once at its largest shape; calls get views of them.

    A view of shape s is the first prod(s) elements of the flat buffer: the dense, row-major layout TensorRT reads
    and writes at a tensor's address, so the address is the same for every call whatever its shape.
    """

    def __init__(self, capacity: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype],
                 device: torch.device) -> None:
        self.capacity = dict(capacity)
        self._flat = {name: torch.empty(max(math.prod(shape), 1), dtype=dtypes[name], device=device)
                      for name, shape in capacity.items()}

    def address(self, name: str) -> int:
        return int(self._flat[name].data_ptr())

    def view(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """The buffer of `name` as a tensor of `shape`; ConfigError past its capacity."""
        limit = self.capacity[name]
        if len(shape) != len(limit) or any(d < 0 or d > m for d, m in zip(shape, limit, strict=True)):
            raise ConfigError(f"{name} of shape {tuple(shape)} exceeds the engine's largest profile {limit}; "
                              "check --max-batch/--max-prompt of the build")
        return self._flat[name][: math.prod(shape)].view(tuple(shape))


class _Engine:
    """One deserialized engine, an execution context per profile, and the device memory they share."""

    def __init__(self, runtime: trt.Runtime, plan: bytes, graph: GraphIO, layout: ProfileLayout | WindowLayout,
                 device: torch.device, path: Path) -> None:
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise ArtifactError(f"TensorRT cannot load {path}; rebuild it with this TensorRT version on this GPU")
        n_profiles = layout.profile_count  # one per bucket, or per (bucket, window length) pair for window_step
        if engine.num_optimization_profiles != n_profiles:
            raise ArtifactError(
                f"{path} has {engine.num_optimization_profiles} optimization profiles, the manifest plans "
                f"{n_profiles}; rebuild the engine"
            )
        self.engine = engine
        self.device = device
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        # TensorRT drops graph inputs nothing uses: feed only what the engine has.
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        dtypes = {n: _torch_dtype(engine.get_tensor_dtype(n)) for n in names}
        capacity = buffer_shapes(graph, layout, {n: _dims(engine.get_tensor_shape(n)) for n in names})
        self.buffers = IOBuffers(capacity, dtypes, device)
        size = max(engine.get_device_memory_size_for_profile_v2(i) for i in range(n_profiles))
        self._memory = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        config = engine.create_runtime_config()
        config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        self.contexts = []
        for i in range(n_profiles):
            context = engine.create_execution_context(config)
            context.set_device_memory(self._memory.data_ptr(), self._memory.numel())
            if not context.set_optimization_profile_async(i, stream):
                raise ArtifactError(f"{path}: cannot select optimization profile {i}; rebuild the engine")
            for name in names:
                if not context.set_tensor_address(name, self.buffers.address(name)):
                    raise ArtifactError(f"{path}: TensorRT refused the buffer of {name}; rebuild the engine")
            self.contexts.append(context)
        self._graphs: dict[tuple[int, tuple[tuple[int, ...], ...]], torch.cuda.CUDAGraph] = {}

    def run(self, profile: int, feeds: Mapping[str, np.ndarray], capture: bool = False) -> dict[str, np.ndarray]:
        """Copy feeds into the input buffers, run on torch's current stream, return every output on the host. With
        `capture`, the call is a CUDA graph kept per (profile, input shapes): captured the first time, replayed after."""
        missing = sorted(set(self.inputs) - set(feeds))
        if missing:
            raise ConfigError(f"the engine needs inputs {missing} that the call did not give")
        context = self.contexts[profile]
        for name in self.inputs:
            host = torch.from_numpy(np.ascontiguousarray(feeds[name]))
            if not context.set_input_shape(name, tuple(host.shape)):
                raise ConfigError(f"input {name} of shape {tuple(host.shape)} is outside optimization profile "
                                  f"{profile}; check --max-batch/--max-prompt of the build")
            self.buffers.view(name, host.shape).copy_(host)  # converts the dtype where the engine's differs
        outputs = {name: self.buffers.view(name, _dims(context.get_tensor_shape(name))) for name in self.outputs}
        key = (profile, tuple(tuple(feeds[name].shape) for name in self.inputs))
        graph = self._graphs.get(key) if capture else None
        if graph is not None:
            graph.replay()  # the captured call: same buffers, same shapes, new contents
        else:
            self._execute(context, profile, torch.cuda.current_stream(self.device))
            if capture:
                self._graphs[key] = self._capture(context, profile)
        return {name: t.cpu().numpy() for name, t in outputs.items()}  # .cpu() waits for the stream

    def _execute(self, context: trt.IExecutionContext, profile: int, stream: torch.cuda.Stream) -> None:
        if not context.execute_async_v3(stream.cuda_stream):
            raise ArtifactError(f"TensorRT failed to run profile {profile} (see its log above)")

    def _capture(self, context: trt.IExecutionContext, profile: int) -> torch.cuda.CUDAGraph:
        """A CUDA graph of one call of `context` at its current shapes, captured after an ordinary call (TensorRT
        finishes its shape-dependent setup in the first enqueue); replays read and write the same buffers."""
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.graph(graph, stream=stream):
            self._execute(context, profile, stream)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return graph


class TensorRTBackend:
    """`seer_deploy.core.backend.Backend` over TensorRT: step0.engine and step.engine, context per profile; with the
    KV cache (`supports_cache`) also refresh.engine and window_step.engine (`core.backend.CacheBackend`).

    The profile is chosen from the call's sequence length (the Backend interface passes only input_ids [B, S]):
    the smallest bucket whose profile covers S, which always exists for S <= max_prompt + largest bucket; a
    window_step call also picks, in that bucket, the smallest window length >= its window (`WindowLayout.choose`).
    """

    name = "tensorrt"

    def __init__(self, engine_dir: Path, manifest: EngineManifest, *, sparsity_rows: list[SparsityRow],
                 max_seq_len: int, device: int = 0, cuda_graph: bool = False, prefix_dlm: bool = False) -> None:
        require_tensorrt()
        trt_facts = manifest.tensorrt
        if manifest.backend != "tensorrt" or trt_facts is None:
            raise ArtifactError(f"{engine_dir} holds a {manifest.backend} engine, not a TensorRT one")
        if trt_facts.profile_index != {b: i for i, b in enumerate(manifest.buckets)}:
            raise ArtifactError(f"{engine_dir}: profiles are not in bucket order ({trt_facts.profile_index}); rebuild")
        self.layout: ProfileLayout = manifest.layout
        self.sparsity_rows = sparsity_rows
        self.max_seq_len = min(max_seq_len, self.layout.max_prompt + self.layout.buckets[-1])
        self._device = torch.device("cuda", device)
        # CUDA graphs for the step engine (the one run every denoising step): calls padded to fixed shapes inside
        # their profile, one graph per (profile, padded shape).
        self.fixed_shapes = FixedShapes(max_batch=self.layout.max_batch) if cuda_graph else None
        self._logger = _logger()
        self._runtime = trt.Runtime(self._logger)  # kept: the runtime must outlive the engines it deserialized
        # Engines are built from text exports only (engines.build); a prefix-DLM model's take prompt_width too.
        self._step0_io, self._step_io = step_graphs(prefix_dlm=prefix_dlm)
        self._refresh_io, self._window_io = cache_graphs(prefix_dlm=prefix_dlm)
        self.windows: WindowLayout | None = manifest.window_layout
        self.supports_cache = self.windows is not None
        self.engine_dir = engine_dir
        graphs: list[tuple[GraphIO, ProfileLayout | WindowLayout]] = [
            (self._step0_io, self.layout), (self._step_io, self.layout)]
        if self.windows is not None:
            graphs += [(self._refresh_io, self.layout), (self._window_io, self.windows)]
        self._engines: dict[str, _Engine] = {}
        for graph, layout in graphs:
            path = regular_file(manifest.file(engine_dir, graph.name), "TensorRT engine", error=ArtifactError)
            self._engines[graph.name] = _Engine(self._runtime, path.read_bytes(), graph, layout, self._device, path)

    @classmethod
    def open(cls, engine_dir: Path, export_facts: RuntimeFacts, *, sparsity_rows: list[SparsityRow],
             max_seq_len: int, device: int = 0, cuda_graph: bool = False, prefix_dlm: bool = False
             ) -> TensorRTBackend:
        """Load an engine dir after checking it against the export (fingerprint, graph hashes) and this machine."""
        require_tensorrt()
        manifest = EngineManifest.load(engine_dir)
        here = runtime_facts(device)
        facts = RuntimeFacts(
            model_fingerprint=export_facts.model_fingerprint,
            graph_hashes=export_facts.graph_hashes,
            backend="tensorrt",
            tensorrt_version=here.tensorrt_version,
            gpu_name=here.gpu_name,
            compute_capability=here.compute_capability,
        )
        check_engine_compatible(manifest, facts)
        return cls(engine_dir, manifest, sparsity_rows=sparsity_rows, max_seq_len=max_seq_len, device=device,
                   cuda_graph=cuda_graph, prefix_dlm=prefix_dlm)

    def _run(self, graph: GraphIO, inputs: StepInput) -> dict[str, np.ndarray]:
        checked = inputs.checked(self.max_seq_len)
        batch, seq = checked.input_ids.shape
        profile = choose_profile_for_seq(seq, self.layout, batch=batch)
        return self._engines[graph.name].run(profile, graph_feed(graph, checked))

    def step0(self, inputs: StepInput) -> Step0Output:
        return step0_output(self._run(self._step0_io, inputs))

    def step(self, inputs: StepInput) -> StepOutput:
        """temperature > 0 samples from softmax(logits / T) with uniforms drawn from `seed` (see spec.sampling)."""
        if self.fixed_shapes is None:
            return step_output(self._run(self._step_io, inputs))
        checked = inputs.checked(self.max_seq_len)
        batch, seq = checked.input_ids.shape
        profile = choose_profile_for_seq(seq, self.layout, batch=batch)
        padded_seq = min(self.fixed_shapes.seq(seq), self.layout.seq_range(profile)[1])  # stays in the profile
        io = self._step_io
        feed = pad_feed(io, graph_feed(io, checked), self.fixed_shapes.batch(batch), padded_seq)
        outputs = self._engines[io.name].run(profile, feed, capture=True)
        return step_output(unpad_outputs(io, outputs, batch, seq))

    def refresh(self, inputs: StepInput) -> RefreshOutput:
        """A step that also returns every layer's keys and values (an engine built from an export --kv-cache)."""
        self._need_cache()
        return refresh_output(self._run(self._refresh_io, inputs))

    def window_step(self, inputs: WindowInput) -> StepOutput:
        """A step over the window's columns only, against a refresh's keys and values: the profile of the sequence
        length's bucket and the smallest window length that holds the window."""
        windows = self._need_cache()
        checked = inputs.checked()
        batch, width = checked.window_ids.shape
        seq = checked.attention_mask.shape[1]
        if seq > self.max_seq_len:
            raise ConfigError(f"sequence length {seq} exceeds this engine's {self.max_seq_len} positions; shorten "
                              "the prompt or --gen-length")
        profile = windows.choose(seq, width, batch=batch)
        io = self._window_io
        return window_output(self._engines[io.name].run(profile, window_feed(io, checked)))

    def _need_cache(self) -> WindowLayout:
        if self.windows is None:
            raise ConfigError(f"{self.engine_dir} has no KV cache engines; re-export with `seer-deploy export "
                              "--kv-cache` and rebuild, or run without --kv-cache")
        return self.windows
