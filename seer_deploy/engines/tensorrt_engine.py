"""Running TensorRT engines (`TensorRTBackend`), built by `engines.tensorrt_build` with either flavour
(`engines.tensorrt_library`: standard TensorRT or TensorRT-RTX; the engine dir's engine.json says which).

Type-checked against tensorrt-stubs by .ci/mypy-tensorrt.sh. Deserializing needs a GPU: loading an engine dir checks,
in this order and each in one line, that the library that built it is installed, that this backend runs it (text
engines; a multimodal engine dir is refused), that a GPU is visible, and that the GPU is one the engine targets
(`manifest.check_engine_compatible`: TensorRT-RTX has no Hopper target, for one).

Device buffers are torch CUDA tensors (`engines.device_buffers`; cuda-python would add a dependency), allocated once
when an engine loads, never per step, sized for the largest shape any profile takes (`profiles.buffer_shapes`). Every
profile's context gets their addresses once; a call copies its feeds into views of the input buffers, sets the input
shapes and reads the outputs from views of the output buffers, on torch's current stream. All of an engine's profiles
share these buffers and one execution-memory buffer: calls run one at a time on one stream and end by copying the
outputs to the host, so the per-profile contexts never use them concurrently.

With `cuda_graph` (`generate --cuda-graph`), the step engine's calls are padded to fixed shapes inside their profile
(`engines.fixed_shapes`) and each (profile, shape) is captured once as a CUDA graph (after one ordinary call) and
replayed after: the buffers' addresses never change. On TensorRT-RTX its built-in CUDA graphs do this instead
(`RtxRunOptions`), its runtime cache keeps its JIT-compiled kernels. Unrun here (no GPU runs either flavour): typed.

An engine dir built from an export --kv-cache has the step engine's kv output (sized like the sequence) and
window_step.engine (one profile per (bucket, window length) pair of `profiles.WindowLayout`, its buffers at the largest
batch, sequence and window): `TensorRTBackend.refresh` and `window_step` run them; and prompt_step.engine (one
profile per bucket, `TensorRTBackend.prefill` and `prompt_step`: the prompt cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from seer_deploy.contracts import graph_calls
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import PROMPT_STEP, VISION, GraphIO, step_graph, window_graph
from seer_deploy.core.atomic import write_bytes_atomic
from seer_deploy.core.backend import PromptInput, RefreshOutput, Step0Output, StepInput, StepOutput, WindowInput
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import regular_file
from seer_deploy.core.sparsity import SparsityRow
from seer_deploy.engines.device_buffers import IOBuffers
from seer_deploy.engines.fixed_shapes import FixedShapes, pad_feed, unpad_outputs
from seer_deploy.engines.manifest import EngineManifest, RuntimeFacts, check_engine_compatible
from seer_deploy.engines.profiles import (
    ProfileLayout,
    WindowLayout,
    buffer_shapes,
    choose_profile_for_seq,
    choose_prompt_cache_profile,
)
from seer_deploy.engines.tensorrt_library import (
    INSTALL_HINT,
    RtxRuntimeCache,
    RtxRuntimeConfig,
    TensorRTLibrary,
    gpu_facts,
    load_library,
    require_tensorrt,
    tensorrt_available,
    tensorrt_version,
)

if TYPE_CHECKING:
    import tensorrt as trt_types  # tensorrt-stubs: the API both flavours share (engines.tensorrt_library)

# What callers outside engines/ import from here (the availability checks live in engines.tensorrt_library).
__all__ = ["INSTALL_HINT", "RtxRunOptions", "TensorRTBackend", "require_tensorrt", "runtime_facts",
           "tensorrt_available", "tensorrt_version"]


def runtime_facts(lib: TensorRTLibrary, device: int = 0) -> RuntimeFacts:
    """This machine's TensorRT flavour, version and GPU, for `check_engine_compatible`; ConfigError without a GPU."""
    name, capability = gpu_facts(device)
    return RuntimeFacts(backend="tensorrt", tensorrt_version=lib.version, tensorrt_library=lib.name, gpu_name=name,
                        compute_capability=capability)


@dataclass(frozen=True)
class StepModel:
    """What the engines run that the export says, not the engine dir: the statistics rows step zero reports, the
    positions, and how the model reads its sequence (prefix-DLM attention; `core.backend.window_lead`: 1 where a
    token's logits come from the column before it)."""

    sparsity_rows: list[SparsityRow]
    max_seq_len: int
    prefix_dlm: bool = False
    window_lead: int = 0

    @classmethod
    def of(cls, export: ExportManifest) -> StepModel:
        config = export.model_config()
        return cls(list(export.seer.sparsity_rows), export.max_seq_len, config.prefix_dlm, int(config.shift_logits))


@dataclass(frozen=True)
class RtxRunOptions:
    """TensorRT-RTX's own run-time features, which replace ours there (unrun here: no RTX GPU was lent).

    builtin_cuda_graph: with --cuda-graph, RTX captures and replays each shape's call itself
    (CudaGraphStrategy.WHOLE_GRAPH_CAPTURE) instead of our torch.cuda.CUDAGraph capture; a call that is itself being
    captured must not use it, so with it off RTX's strategy is DISABLED and ours captures. runtime_cache: a file
    holding the kernels RTX compiled just in time on this GPU, loaded when it exists and fits (library version, GPU,
    driver), written by `TensorRTBackend.close`.
    """

    builtin_cuda_graph: bool = True
    runtime_cache: Path | None = None


def _dims(dims: trt_types.Dims) -> tuple[int, ...]:
    return tuple(dims[i] for i in range(len(dims)))


def _torch_dtype(lib: TensorRTLibrary, dtype: trt_types.DataType) -> torch.dtype:
    if TYPE_CHECKING:
        trt = trt_types
    else:
        trt = lib.module
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


class _RtxRuntimeCache:
    """TensorRT-RTX's runtime cache, one for all of a backend's engines: created from the first engine's runtime
    config (loaded from `path` where it exists and fits this library, GPU and driver), set on every engine's config,
    written back by `save`."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._cache: RtxRuntimeCache | None = None
        self.loaded = False

    def attach(self, config: RtxRuntimeConfig) -> None:
        if self.path is None:
            return
        if self._cache is None:
            self._cache = config.create_runtime_cache()
            if self.path.is_file():  # a stale or foreign cache is rejected by deserialize and starts empty
                self.loaded = self._cache.deserialize(self.path.read_bytes())
        if not config.set_runtime_cache(self._cache):
            raise ArtifactError(f"TensorRT-RTX refused the runtime cache {self.path}; delete it")

    def save(self) -> None:
        if self.path is not None and self._cache is not None:
            write_bytes_atomic(self.path, bytes(self._cache.serialize()))


class _GraphEngine:
    """One graph's deserialized TensorRT engine, an execution context per profile, and the device memory they share."""

    def __init__(self, lib: TensorRTLibrary, runtime: trt_types.Runtime, plan: bytes, graph: GraphIO,
                 layout: ProfileLayout | WindowLayout, device: torch.device, path: Path,
                 rtx: tuple[RtxRunOptions, _RtxRuntimeCache, bool] | None = None) -> None:
        """`rtx`: TensorRT-RTX's run options, the backend's runtime cache, and whether --cuda-graph asked for graphs."""
        if TYPE_CHECKING:
            trt = trt_types
        else:
            trt = lib.module
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise ArtifactError(f"{lib.title} cannot load {path}; rebuild it with this version for this GPU")
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
        dtypes = {n: _torch_dtype(lib, engine.get_tensor_dtype(n)) for n in names}
        capacity = buffer_shapes(graph, layout, {n: _dims(engine.get_tensor_shape(n)) for n in names})
        self.buffers = IOBuffers(capacity, dtypes, device)
        size = max(engine.get_device_memory_size_for_profile_v2(i) for i in range(n_profiles))
        self._memory = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        config = engine.create_runtime_config()
        config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        # With TensorRT-RTX's built-in CUDA graphs it captures each shape's call itself: ours must not capture too.
        self.builtin_graphs = False
        if rtx is not None:
            options, cache, cuda_graph = rtx
            rtx_config = cast(RtxRuntimeConfig, config)
            self.builtin_graphs = cuda_graph and options.builtin_cuda_graph
            strategies = lib.module.CudaGraphStrategy  # RTX only: not in the stubs, so typed Any
            rtx_config.cuda_graph_strategy = (strategies.WHOLE_GRAPH_CAPTURE if self.builtin_graphs
                                              else strategies.DISABLED)
            cache.attach(rtx_config)
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
        capture = capture and not self.builtin_graphs  # TensorRT-RTX replays its own graph per shape
        graph = self._graphs.get(key) if capture else None
        if graph is not None:
            graph.replay()  # the captured call: same buffers, same shapes, new contents
        else:
            self._execute(context, profile, torch.cuda.current_stream(self.device))
            if capture:
                self._graphs[key] = self._capture(context, profile)
        return {name: t.cpu().numpy() for name, t in outputs.items()}  # .cpu() waits for the stream

    def _execute(self, context: trt_types.IExecutionContext, profile: int, stream: torch.cuda.Stream) -> None:
        if not context.execute_async_v3(stream.cuda_stream):
            raise ArtifactError(f"TensorRT failed to run profile {profile} (see its log above)")

    def _capture(self, context: trt_types.IExecutionContext, profile: int) -> torch.cuda.CUDAGraph:
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
    """`seer_deploy.core.backend.Backend` over TensorRT (either flavour: the one engine.json names): step.engine (step
    zero, every later step and, from an export --kv-cache, the refresh), an execution context per profile; with the
    KV cache (`supports_cache`) also window_step.engine (`core.backend.CacheBackend`).

    The profile is chosen from the call's sequence length (the Backend interface passes only input_ids [B, S]):
    the smallest bucket whose profile covers S, which always exists for S <= max_prompt + largest bucket; a
    window_step call also picks, in that bucket, the smallest window length >= its window (`WindowLayout.choose`).
    """

    name = "tensorrt"
    samples_per_row = True  # the step graph takes a temperature and uniforms per row (StepInput.uniform)

    def __init__(self, engine_dir: Path, manifest: EngineManifest, model: StepModel, *, device: int = 0,
                 cuda_graph: bool = False, rtx: RtxRunOptions | None = None) -> None:
        trt_facts = manifest.tensorrt
        if manifest.backend != "tensorrt" or trt_facts is None:
            raise ArtifactError(f"{engine_dir} holds a {manifest.backend} engine, not a TensorRT one")
        lib = load_library(trt_facts.library)  # the flavour that built it
        if TYPE_CHECKING:
            trt = trt_types
        else:
            trt = lib.module
        if trt_facts.profile_index != {b: i for i, b in enumerate(manifest.buckets)}:
            raise ArtifactError(f"{engine_dir}: profiles are not in bucket order ({trt_facts.profile_index}); rebuild")
        self.layout: ProfileLayout = manifest.layout
        self.sparsity_rows = model.sparsity_rows
        self.max_seq_len = min(model.max_seq_len, self.layout.max_prompt + self.layout.buckets[-1])
        self._device = torch.device("cuda", device)
        # CUDA graphs for the step engine (the one run every denoising step): calls padded to fixed shapes inside
        # their profile, one graph per (profile, padded shape).
        self.fixed_shapes = FixedShapes(max_batch=self.layout.max_batch) if cuda_graph else None
        self._logger = lib.logger()
        self._runtime = trt.Runtime(self._logger)  # kept: the runtime must outlive the engines it deserialized
        self._runtime_cache = _RtxRuntimeCache((rtx or RtxRunOptions()).runtime_cache if lib.is_rtx else None)
        run_rtx = (rtx or RtxRunOptions(), self._runtime_cache, cuda_graph) if lib.is_rtx else None
        # The graphs of the engine dir (engine.json's files): the step graph (step zero with its statistics, every
        # later step and, built from an export --kv-cache, the refresh with its kv output) and the window graph. Text
        # engines only; a prefix-DLM model's take prompt_width too.
        step_io = step_graph(prefix_dlm=model.prefix_dlm, kv_cache=manifest.has_cache)
        self._step_io = step_io
        self._window_io = window_graph(model.prefix_dlm)
        self.window_lead = model.window_lead  # core.backend.window_lead
        self.windows: WindowLayout | None = manifest.window_layout
        self.supports_cache = self.windows is not None
        self._prompt_io = PROMPT_STEP
        self.supports_prompt_cache = PROMPT_STEP.name in manifest.graph_hashes
        self.engine_dir = engine_dir
        graphs: list[tuple[GraphIO, ProfileLayout | WindowLayout]] = [(step_io, self.layout)]
        if self.windows is not None:
            graphs.append((self._window_io, self.windows))
        if self.supports_prompt_cache:
            graphs.append((self._prompt_io, self.layout))
        self._engines: dict[str, _GraphEngine] = {}
        for graph, layout in graphs:
            path = regular_file(manifest.file(engine_dir, graph.name), "TensorRT engine", error=ArtifactError)
            self._engines[graph.name] = _GraphEngine(lib, self._runtime, path.read_bytes(), graph, layout, self._device,
                                                path, run_rtx)

    @classmethod
    def open(cls, engine_dir: Path, export_facts: RuntimeFacts, model: StepModel, *, device: int = 0,
             cuda_graph: bool = False, rtx: RtxRunOptions | None = None) -> TensorRTBackend:
        """Load an engine dir after checking it against the export (fingerprint, graph hashes) and this machine: the
        library that built it must be installed, the engine must be one this backend runs, and a GPU it targets must
        be visible (each a one-line error)."""
        manifest = EngineManifest.load(engine_dir)
        if manifest.tensorrt is None:
            raise ArtifactError(f"{engine_dir} holds a {manifest.backend} engine, not a TensorRT one")
        lib = load_library(manifest.tensorrt.library)
        if VISION.name in manifest.files:
            raise ConfigError(f"{engine_dir} is a multimodal TensorRT engine dir; running one is not implemented yet "
                              "(its image table): run its export on ONNX Runtime")
        here = runtime_facts(lib, device)
        facts = replace(here, model_fingerprint=export_facts.model_fingerprint, graph_hashes=export_facts.graph_hashes)
        check_engine_compatible(manifest, facts)
        return cls(engine_dir, manifest, model, device=device, cuda_graph=cuda_graph, rtx=rtx)

    def close(self) -> None:
        """Write TensorRT-RTX's runtime cache (the kernels compiled on this GPU so far), where one was asked for."""
        self._runtime_cache.save()

    def _run(self, graph: GraphIO, inputs: StepInput, with_stats: bool = False) -> dict[str, np.ndarray]:
        checked = inputs.checked(self.max_seq_len)
        batch, seq = checked.input_ids.shape
        profile = choose_profile_for_seq(seq, self.layout, batch=batch)
        return self._engines[graph.name].run(profile, graph_calls.graph_feed(graph, checked, with_stats=with_stats))

    def step0(self, inputs: StepInput) -> Step0Output:
        """The step engine with step zero's statistics on."""
        return graph_calls.step0_output(self._run(self._step_io, inputs, with_stats=True))

    def step(self, inputs: StepInput) -> StepOutput:
        """temperature > 0 samples from softmax(logits / T) with uniforms drawn from `seed` (see contracts.sampling)."""
        if self.fixed_shapes is None:
            return graph_calls.step_output(self._run(self._step_io, inputs))
        checked = inputs.checked(self.max_seq_len)
        batch, seq = checked.input_ids.shape
        profile = choose_profile_for_seq(seq, self.layout, batch=batch)
        padded_seq = min(self.fixed_shapes.seq(seq), self.layout.seq_range(profile)[1])  # stays in the profile
        io = self._step_io
        feed = pad_feed(io, graph_calls.graph_feed(io, checked), self.fixed_shapes.batch(batch), padded_seq)
        outputs = self._engines[io.name].run(profile, feed, capture=True)
        return graph_calls.step_output(unpad_outputs(io, outputs, batch, seq))

    def refresh(self, inputs: StepInput) -> RefreshOutput:
        """A step that also returns every layer's keys and values (an engine built from an export --kv-cache)."""
        if not self.supports_prompt_cache:  # the prompt cache's step zero refreshes too
            self._need_cache()
        return graph_calls.refresh_output(self._run(self._step_io, inputs))

    def prefill(self, inputs: StepInput) -> Step0Output:
        """Step zero with its statistics and the keys and values the prompt cache is cut from."""
        self._need_prompt_cache()
        return graph_calls.prefill_output(self._run(self._step_io, inputs, with_stats=True))

    def prompt_step(self, inputs: PromptInput) -> StepOutput:
        """A pass against the prompt cache, in the profile of its responses' bucket."""
        self._need_prompt_cache()
        checked = inputs.checked()
        batch, run = checked.run_ids.shape
        profile = choose_prompt_cache_profile(checked.prompt_kv.shape[4], run, self.layout, batch=batch)
        io = self._prompt_io
        return graph_calls.step_output(self._engines[io.name].run(profile, graph_calls.prompt_feed(io, checked)))

    def _need_prompt_cache(self) -> None:
        if not self.supports_prompt_cache:
            raise ConfigError(f"{self.engine_dir} has no prompt-cache engine; re-export with --kv-cache and rebuild")

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
        return graph_calls.window_output(self._engines[io.name].run(profile, graph_calls.window_feed(io, checked)))

    def _need_cache(self) -> WindowLayout:
        if self.windows is None:
            raise ConfigError(f"{self.engine_dir} has no KV cache engines; re-export with `seer-deploy export "
                              "--kv-cache` and rebuild, or run without --kv-cache")
        return self.windows
