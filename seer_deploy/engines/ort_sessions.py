"""How ONNX Runtime sessions are made: the providers (CUDA when installed, else CPU) and their options, threads,
graph optimization, IO binding and CUDA graphs (`OrtSessionOptions`), and one guarded way to open a graph
(`open_session`), used by the backends and by the engine build."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnxruntime as ort

from seer_deploy.contracts.graphs import GraphIO
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines.external_data import check_external_data
from seer_deploy.engines.fixed_shapes import DEFAULT_SEQ_MULTIPLE, FixedShapes
from seer_deploy.engines.ort_binding import BoundSession

GraphOptimization = Literal["disable", "basic", "extended", "all"]
_OPT_LEVELS: dict[str, ort.GraphOptimizationLevel] = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
ProviderEntry = str | tuple[str, dict[str, str]]  # a provider, or a provider with its options
CUDA_GRAPH_OPTION = "enable_cuda_graph"  # the CUDA provider's option for CUDA graph capture
PARALLEL_PREPACK = "session.prepack.enable_parallel"  # ONNX Runtime: prepack weights on the intra-op threads
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
        # Prepacking (the quantized MatMulNBits weights into their kernel's layout) runs on the intra-op threads
        # instead of one: the three sessions of a 362M int4 --kv-cache export open in 0.98 s instead of 1.12 s on two
        # cores (benchmarks/results-llama/first_step.json as committed at 47aa94b and at 83d8a3e), with the same tokens.
        so.add_session_config_entry(PARALLEL_PREPACK, "1")
        if self.resolved_providers()[0] == CPU:
            # No memory pattern: ONNX Runtime plans one block per input shape from a call and allocates it at that
            # shape's next call, while the arena keeps what the first call freed, so a shape's activations are held
            # twice (the head's vocabulary-wide buffers at step zero most of all). Without it the arena reuses the
            # freed chunks: two batches of a 362M int4 export peak at 0.79 GiB instead of 1.24, with the same tokens
            # in the same time (benchmarks/results-footprint/memory_pattern.json). CUDA sessions keep ONNX
            # Runtime's default: not measured there (no GPU where this was measured).
            so.enable_mem_pattern = False
        if not library_logs_wanted():
            so.log_severity_level = QUIET_LOG_LEVEL
            ort.set_default_logger_severity(QUIET_LOG_LEVEL)  # the environment's log, outside any session
        return so
