"""The ONNX Runtime backend: runs an export directory's step graph (and window graph) behind the runtime's `Backend`
interface.

spec.graphs declares what each graph takes and returns, the manifest what the sparsity rows are; this module checks
the artifacts against both (graph hashes, weight file size, the sessions' inputs and outputs), feeds the graphs
(spec.graph_calls) and returns the compact outputs. A graph is opened only after every external-data file it names
was found inside its own directory (engines.external_data); ONNX Runtime would open any path a damaged graph names.
On the CPU the sessions share one copy of the weights (engines.ort_weights).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from seer_deploy.core.backend import (
    RefreshOutput,
    Step0Output,
    StepInput,
    StepOutput,
    WindowInput,
    is_device_array,
)
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.files import file_sha256
from seer_deploy.engines.external_data import check_external_data
from seer_deploy.engines.fixed_shapes import DEFAULT_SEQ_MULTIPLE, FixedShapes
from seer_deploy.engines.ort_binding import BoundSession, run_with_device_tensors
from seer_deploy.engines.ort_weights import SharedWeights
from seer_deploy.spec.export_manifest import ExportManifest
from seer_deploy.spec.graph_calls import (
    graph_feed,
    refresh_output,
    step0_output,
    step_output,
    window_feed,
    window_output,
)
from seer_deploy.spec.graphs import (
    CONFIDENCE,
    EOS_PROB,
    KV,
    SPARSITY,
    STEP,
    TOKEN_IDS,
    WINDOW_STEP,
    GraphIO,
    step_graph,
)
from seer_deploy.spec.multimodal import MULTIMODAL_KEY

GraphOptimization = Literal["disable", "basic", "extended", "all"]
FP16_WEIGHT_FUSION = "FuseFp16InitializerToFp32NodeTransformer"  # ONNX Runtime's name for it
_OPT_LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
ProviderEntry = str | tuple[str, dict[str, str]]  # a provider, or a provider with its options
CUDA_GRAPH_OPTION = "enable_cuda_graph"  # the CUDA provider's option for CUDA graph capture
# The graphs a denoising step runs (the others run once a batch or a block): the ones CUDA graphs pay off for.
EVERY_STEP: frozenset[str] = frozenset({STEP.name, WINDOW_STEP.name})
# What each kind of call asks the step graph for (ONNX Runtime computes the graph either way, but copies only these).
STEP_OUTPUTS: tuple[str, ...] = (TOKEN_IDS.name, CONFIDENCE.name)
STEP0_OUTPUTS: tuple[str, ...] = (*STEP_OUTPUTS, EOS_PROB.name, SPARSITY.name)
REFRESH_OUTPUTS: tuple[str, ...] = (*STEP_OUTPUTS, KV.name)
QUIET_LOG_LEVEL = 3  # errors only: ONNX Runtime's own warnings (unused initializers) are not the user's problem


def library_logs_wanted() -> bool:
    """ONNX Runtime's C++ log reaches stderr only when debugging (SEER_DEPLOY_DEBUG=1): a warning line before an
    error line would break the one-line error surface."""
    return bool(os.environ.get("SEER_DEPLOY_DEBUG"))


def open_session(graph_file: Path, options: ort.SessionOptions, providers: Sequence[ProviderEntry],
                 disabled_optimizers: Sequence[str] = ()) -> ort.InferenceSession:
    """An ONNX Runtime session over `graph_file` (by path: external data resolves beside it and protobuf's 2 GB limit
    never applies), after `check_external_data`; ONNX Runtime's refusal is one ArtifactError naming the file."""
    check_external_data(graph_file)
    try:
        return ort.InferenceSession(str(graph_file), sess_options=options, providers=providers,
                                    disabled_optimizers=list(disabled_optimizers))
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if "graph" in detail.lower() and any(isinstance(p, tuple) and p[1].get(CUDA_GRAPH_OPTION) == "1"
                                             for p in providers):
            raise ConfigError(f"ONNX Runtime cannot capture CUDA graphs of {graph_file} ({detail}); run without "
                              "--cuda-graph (IO binding alone still keeps the buffers on the GPU)") from exc
        raise ArtifactError(f"ONNX Runtime cannot open {graph_file} ({detail}); the graph or its weights may be "
                            "damaged or incomplete: re-export it") from exc


@dataclass(frozen=True)
class OrtSessionOptions:
    """How the ONNX Runtime sessions are made. providers None = CUDA when onnxruntime-gpu has it, else CPU."""

    providers: tuple[str, ...] | None = None
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (one per physical core)
    inter_op_threads: int = 0
    graph_optimization: GraphOptimization = "all"
    verify_hashes: bool = True  # compare the .onnx files with the manifest's sha256 on load (they are small)
    # CPU: every session reads one read-only memory map of weights.bin (the page cache's copy, shared with other
    # processes too) instead of each prepacking its own copy of the MatMul weights, and the sessions share one
    # activation arena. None: on with the CPU provider. False trades one more copy of the weights per graph for
    # faster small matmuls (the window graph's, about 1.3x, shared/reference/ort-shared-weights.md).
    share_weights: bool | None = None
    # IO binding: inputs written into buffers kept per call shape on the session's device, outputs kept there, only
    # the compact outputs copied to the host (engines.ort_binding). Worth it on CUDA; on CPU it gives the same tokens.
    io_binding: bool = False
    # Calls padded to fixed shapes (batch to a power of two, sequence to a multiple of this; 0 = off): fewer shapes,
    # fewer buffer sets; what CUDA graphs need.
    seq_multiple: int = 0
    # CUDA only: one captured CUDA graph per call shape (implies io_binding, and seq_multiple 32 unless set).
    cuda_graph: bool = False
    device_id: int = 0  # the CUDA device of the CUDA provider
    # The KV cache (export --kv-cache) kept on the session's device as torch tensors, never copied to the host.
    # None: on with IO binding on CUDA. On a CPU it changes nothing but the array type (what the tests exercise).
    device_cache: bool | None = None

    def resolved_providers(self) -> list[str]:
        available = ort.get_available_providers()
        if self.providers is None:
            return [CUDA, CPU] if CUDA in available else [CPU]
        unknown = [p for p in self.providers if p not in available]
        if unknown:
            raise ConfigError(
                f"ONNX Runtime provider(s) {', '.join(unknown)} are not available in this install "
                f"(available: {', '.join(available)}); install onnxruntime-gpu for CUDA or pick another provider"
            )
        if not self.providers:
            raise ConfigError("OrtSessionOptions.providers is empty; give at least one provider or None for the default")
        return list(self.providers)

    def check(self) -> None:
        """ConfigError naming a bad setting, before any session is made."""
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ConfigError(
                f"ONNX Runtime threads must be 0 (its default) or more, got {self.intra_op_threads} (--threads) and "
                f"{self.inter_op_threads} inter-op"
            )
        if self.graph_optimization not in _OPT_LEVELS:
            raise ConfigError(
                f"graph_optimization '{self.graph_optimization}' is unknown; use one of {', '.join(_OPT_LEVELS)}"
            )
        if self.seq_multiple < 0 or self.device_id < 0:
            raise ConfigError(f"seq_multiple ({self.seq_multiple}) and device_id ({self.device_id}) must be >= 0")
        providers = self.resolved_providers()
        if self.cuda_graph and providers[0] != CUDA:
            raise ConfigError(f"--cuda-graph needs the CUDA provider first, got {providers[0]}; install "
                              "onnxruntime-gpu on an NVIDIA GPU and pass --provider CUDAExecutionProvider, or drop "
                              "--cuda-graph")
        if self.cuda_graph and self.share_weights is True:
            raise ConfigError("share_weights is CPU only and --cuda-graph CUDA only; drop one")

    def provider_entries(self, cuda_graph: bool = False) -> list[ProviderEntry]:
        """The providers with their options, as ONNX Runtime takes them (CUDA: the device; with `cuda_graph` and the
        option on, CUDA graph capture)."""
        entries: list[ProviderEntry] = []
        for provider in self.resolved_providers():
            if provider == CUDA:
                options = {"device_id": str(self.device_id)}
                if self.cuda_graph and cuda_graph:
                    options[CUDA_GRAPH_OPTION] = "1"
                entries.append((provider, options))
            else:
                entries.append(provider)
        return entries

    def bound(self, session: ort.InferenceSession, graph: GraphIO, max_seq: int, cuda_graph: bool = False
              ) -> BoundSession | None:
        """The session's IO-bound runner when IO binding (or CUDA graphs) is on, else None (plain `run`); it
        captures CUDA graphs when the option is on and `cuda_graph` says this graph gets them."""
        if not (self.io_binding or self.cuda_graph):
            return None
        multiple = self.seq_multiple or (DEFAULT_SEQ_MULTIPLE if self.cuda_graph else 0)
        device = "cuda" if session.get_providers()[0] == CUDA else "cpu"
        return BoundSession(session, graph, device=device, device_id=self.device_id,
                            cuda_graph=self.cuda_graph and cuda_graph,
                            fixed_shapes=FixedShapes(multiple, max_seq) if multiple else None)

    def shares_weights(self) -> bool:
        """Whether the sessions read one memory map of the weights (share_weights, resolved for the provider)."""
        on_cpu = self.resolved_providers()[0] == CPU
        return on_cpu if self.share_weights is None else self.share_weights

    def session_options(self) -> ort.SessionOptions:
        self.check()
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.intra_op_threads
        so.inter_op_num_threads = self.inter_op_threads
        so.graph_optimization_level = _OPT_LEVELS[self.graph_optimization]
        if not library_logs_wanted():
            so.log_severity_level = QUIET_LOG_LEVEL
            ort.set_default_logger_severity(QUIET_LOG_LEVEL)  # the environment's log, outside any session
        return so


class OrtBackend:
    """`Backend` over an export directory (step.onnx, weights.bin, manifest.json), and its KV cache graph
    (window_step.onnx; the step graph returns the keys and values) where it has it and `kv_cache` is on.

    One step graph serves step zero, every later step and the cache refresh, so a text export opens one session
    (two with the cache); each is opened on its first call, so a mode that never runs a graph never pays for it. On
    the CPU the sessions read the weights from one memory map (OrtSessionOptions.share_weights)."""

    def __init__(self, export_dir: str | os.PathLike[str], options: OrtSessionOptions | None = None, *,
                 kv_cache: bool = True) -> None:
        self.export_dir = Path(export_dir)
        self.options = options or OrtSessionOptions()
        self.manifest = ExportManifest.load(self.export_dir)
        self._check_files()
        self.options.check()
        providers = self.options.resolved_providers()
        if self.options.share_weights and providers[0] != CPU:
            raise ConfigError(
                f"share_weights needs the CPU provider (sessions on {providers[0]} copy weights to the device each); "
                "turn it off or choose providers=('CPUExecutionProvider',)"
            )
        self.weights = SharedWeights(self.export_dir / self.manifest.weights.file)  # outlives the sessions
        self._step_io = self._declared_step_graph()
        self._window_io = WINDOW_STEP
        self.supports_cache = self.manifest.has_cache and kv_cache
        self._graphs = {io.name: io for io in ((self._step_io, self._window_io) if self.supports_cache
                                                else (self._step_io,))}
        wanted, on_cuda = self.options.device_cache, providers[0] == CUDA
        self.device_cache = (self.options.io_binding or self.options.cuda_graph) and on_cuda if wanted is None else wanted
        # The graphs captured as CUDA graphs (with --cuda-graph): the step graph, and the window graph unless its cache
        # is device-resident (a fresh binding per call: addresses a captured graph would not follow).
        self.captured_graphs = EVERY_STEP - ({WINDOW_STEP.name} if self.device_cache else set())
        self._sessions: dict[str, ort.InferenceSession] = {}
        self._bound: dict[str, BoundSession | None] = {}
        self.providers: list[str] = providers
        self.name = "onnxruntime-cuda" if on_cuda else "onnxruntime-cpu"
        self.max_seq_len: int = self.manifest.max_seq_len
        self._device = ("cuda" if on_cuda else "cpu", self.options.device_id if on_cuda else 0)
        self.sparsity_rows: list[tuple[int, str]] = list(self.manifest.seer.sparsity_rows)

    def open_sessions(self) -> None:
        """Open every graph's session now (what `seer-deploy build` checks), instead of at its first call."""
        for io in self._graphs.values():
            self._session_of(io)

    @property
    def open_graphs(self) -> list[str]:
        """The graphs whose sessions are open so far."""
        return sorted(self._sessions)

    def _session_of(self, io: GraphIO) -> ort.InferenceSession:
        session = self._sessions.get(io.name)
        if session is None:
            session = self._sessions[io.name] = self._session(io)
            self.providers = session.get_providers()
            self._bound[io.name] = self.options.bound(session, io, self.max_seq_len,
                                                      cuda_graph=io.name in self.captured_graphs)
        return session

    def _check_files(self) -> None:
        m = self.manifest
        weights = self.export_dir / m.weights.file
        if not weights.is_file():
            raise ArtifactError(f"{weights} is missing; the export is incomplete, re-run `seer-deploy export`")
        if weights.stat().st_size != m.weights.bytes:
            raise ArtifactError(
                f"{weights} has {weights.stat().st_size} bytes, the manifest says {m.weights.bytes}: the export was "
                "modified or truncated; re-run `seer-deploy export`"
            )
        for name, graph in m.graphs.items():
            path = self.export_dir / graph.file
            if not path.is_file():
                raise ArtifactError(f"{path} ({name} graph) is missing; the export is incomplete, re-run `seer-deploy export`")
            if self.options.verify_hashes and file_sha256(path) != graph.sha256:
                raise ArtifactError(
                    f"{path} does not match the sha256 in {self.export_dir / 'manifest.json'}: the graph was modified "
                    "after export; re-run `seer-deploy export`"
                )

    def _declared_step_graph(self) -> GraphIO:
        """The declaration of the export's step graph: a multimodal export's also takes the image table, a prefix-DLM
        model's the prompt width, a --kv-cache export's returns the keys and values."""
        return step_graph(multimodal=MULTIMODAL_KEY in self.manifest.extra,
                          prefix_dlm=self.manifest.model_config().prefix_dlm, kv_cache=self.manifest.has_cache)

    def _session(self, io: GraphIO) -> ort.InferenceSession:
        graph = self.manifest.graphs[io.name]
        providers = self.options.provider_entries(cuda_graph=io.name in self.captured_graphs)
        so = self.options.session_options()
        casts = self.casts_weights()
        if casts:
            so.enable_mem_pattern = False
            so.enable_cpu_mem_arena = False
            so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        if self.options.shares_weights():
            check_external_data(self.export_dir / graph.file)
            self.weights.add_to(so, self.export_dir / graph.file, arena=not casts)
        session = open_session(self.export_dir / graph.file, so, providers, self.disabled_optimizers())
        got = sorted(i.name for i in session.get_inputs())
        if got != sorted(io.input_names) or got != sorted(graph.inputs):
            raise ArtifactError(
                f"{graph.file} takes inputs {got}, but the manifest lists {sorted(graph.inputs)} and the {io.name} "
                f"graph is declared with {sorted(io.input_names)}; re-run `seer-deploy export`"
            )
        missing = sorted(set(io.host_outputs) - {o.name for o in session.get_outputs()})
        if missing:
            raise ArtifactError(f"{graph.file} lacks the outputs {missing}; re-run `seer-deploy export`")
        return session

    def casts_weights(self) -> bool:
        """Whether this is a float16 export on the CPU, whose weights stay float16 and are cast as each MatMul runs.

        ONNX Runtime's CPU kernels compute in float32. By default it would keep a float32 copy of every weight (its
        float16-initializer fusion: twice the weights file, 32 GB for an 8B model), its memory pattern would keep
        every cast of a run allocated for the next (measured on a 1.5B model: 7.6 GiB resident for 2.7 GiB of weights;
        4.8 GiB without), an arena keeps the casts' memory once freed (0.5 GB on a 250M model; 70 MB without), and its
        default node order casts weights long before their MatMuls run (16 GiB of casts alive at once in a pass of an
        8B model; 2.1 GiB, the LM head's, in priority order, and the pass 27 -> 9.5 s without the paging). So: one
        float16 copy, each weight cast to float32 just before its MatMul; slower than a float32 export, which float16
        on a CPU is anyway."""
        return self.options.resolved_providers()[0] == CPU and self.manifest.dtype == "fp16"

    def disabled_optimizers(self) -> tuple[str, ...]:
        """The graph optimizations the sessions run without (casts_weights)."""
        return (FP16_WEIGHT_FUSION,) if self.casts_weights() else ()

    def _run(self, io: GraphIO, inputs: StepInput, outputs: Sequence[str], with_stats: bool = False
             ) -> dict[str, np.ndarray]:
        checked = inputs.checked(self.max_seq_len)
        return self._call(io, graph_feed(io, checked, self._image_table(checked), with_stats=with_stats), outputs)

    def _call(self, io: GraphIO, feed: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """One call of a graph: through its IO-bound runner when there is one (every output), else `session.run`
        (the outputs asked for)."""
        session = self._session_of(io)
        bound = self._bound[io.name]
        if bound is not None:
            return bound.run(feed)
        return dict(zip(outputs, session.run(list(outputs), feed), strict=True))

    @property
    def bound_shapes(self) -> dict[str, int]:
        """Per graph, the call shapes bound so far (with CUDA graphs: the graphs captured); empty without IO
        binding."""
        return {name: bound.shapes for name, bound in self._bound.items() if bound is not None}

    def _image_table(self, checked: StepInput) -> np.ndarray | None:
        """The multimodal graphs' image table for this call; a text export has none."""
        return None

    def step0(self, inputs: StepInput) -> Step0Output:
        """The step graph with step zero's statistics."""
        return step0_output(self._run(self._step_io, inputs, STEP0_OUTPUTS, with_stats=True))

    def step(self, inputs: StepInput) -> StepOutput:
        """temperature > 0 samples from softmax(logits / T) with uniforms drawn from `seed` (see spec.sampling)."""
        return step_output(self._run(self._step_io, inputs, STEP_OUTPUTS))

    def refresh(self, inputs: StepInput) -> RefreshOutput:
        """A step that also returns every layer's keys and values (export --kv-cache); with `device_cache` they
        stay on the session's device, as a torch tensor."""
        self._need_cache()
        if not self.device_cache:
            return refresh_output(self._run(self._step_io, inputs, REFRESH_OUTPUTS))
        import torch

        checked = inputs.checked(self.max_seq_len)
        batch, seq = checked.input_ids.shape
        cfg = self.manifest.model_config()
        kind, index = self._device
        kv = torch.empty((cfg.n_layers, 2, batch, cfg.n_kv_heads, seq, cfg.head_dim), dtype=torch.float32,
                         device=torch.device(kind, index))
        io = self._step_io
        values = run_with_device_tensors(self._session_of(io), io,
                                         graph_feed(io, checked, self._image_table(checked)),
                                         device=kind, device_id=index, device_outputs={KV.name: kv})
        picked = step_output(values)
        return RefreshOutput(picked.token_ids, picked.confidence, kv)

    def window_step(self, inputs: WindowInput) -> StepOutput:
        """A step over the window's columns only, against a refresh's keys and values (export --kv-cache)."""
        self._need_cache()
        checked = inputs.checked()
        io = self._window_io
        if is_device_array(checked.kv):  # a device-resident cache: bound where it lies
            kind, index = self._device
            return window_output(run_with_device_tensors(self._session_of(io), io, window_feed(io, checked),
                                                         device=kind, device_id=index, device_outputs={}))
        return window_output(self._call(io, window_feed(io, checked), io.host_outputs))

    def _need_cache(self) -> None:
        if not self.supports_cache and self.manifest.has_cache:
            raise ConfigError(f"the KV cache graph of {self.export_dir} was not opened (an engine dir built before "
                              "the export had it); rebuild it with `seer-deploy build`, or run without --kv-cache")
        if not self.supports_cache:
            raise ConfigError(f"{self.export_dir} has no KV cache graph; re-export with `seer-deploy export "
                              "--kv-cache`, or run without --kv-cache")
