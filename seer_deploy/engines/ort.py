"""The ONNX Runtime backend: runs an export directory's step graph (and window graph) behind the runtime's `Backend`
interface (its sessions made as engines.ort_sessions says).

contracts.graphs declares what each graph takes and returns, the manifest what the sparsity rows are; this module checks
the artifacts against both (graph hashes, weight file size, the sessions' inputs and outputs), feeds the graphs
(contracts.graph_calls) and returns the compact outputs. A graph is opened only after every external-data file it names
was found inside its own directory (engines.external_data); ONNX Runtime would open any path a damaged graph names.
On the CPU the sessions share one copy of the weights (engines.ort_weights).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graph_calls import (
    graph_feed,
    prefill_output,
    prompt_feed,
    refresh_output,
    step0_output,
    step_output,
    window_feed,
    window_output,
)
from seer_deploy.contracts.graphs import (
    CONFIDENCE,
    EOS_PROB,
    KV,
    PROMPT_STEP,
    SCORE,
    SPARSITY,
    STEP,
    TOKEN_IDS,
    WINDOW_STEP,
    GraphIO,
    prompt_graph,
    step_graph,
    window_graph,
)
from seer_deploy.core.backend import (
    PromptInput,
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
from seer_deploy.engines.ort_binding import BoundSession, run_with_device_tensors
from seer_deploy.engines.ort_sessions import CPU, CUDA, OrtSessionOptions, open_session
from seer_deploy.engines.ort_weights import SharedWeights

FP16_WEIGHT_FUSION = "FuseFp16InitializerToFp32NodeTransformer"  # ONNX Runtime's name for it
# The graphs a denoising step runs (the others run once a batch or a block): the ones CUDA graphs pay off for.
EVERY_STEP: frozenset[str] = frozenset({STEP.name, WINDOW_STEP.name, PROMPT_STEP.name})
# What each kind of call asks the step graph for (ONNX Runtime computes the graph either way, but copies only these).
STEP_OUTPUTS: tuple[str, ...] = (TOKEN_IDS.name, CONFIDENCE.name, SCORE.name)
STEP0_OUTPUTS: tuple[str, ...] = (*STEP_OUTPUTS, EOS_PROB.name, SPARSITY.name)
REFRESH_OUTPUTS: tuple[str, ...] = (*STEP_OUTPUTS, KV.name)
PREFILL_OUTPUTS: tuple[str, ...] = (*STEP0_OUTPUTS, KV.name)


class OrtBackend:
    """`Backend` over an export directory (step.onnx, weights.bin, manifest.json), and its KV cache graph
    (window_step.onnx; the step graph returns the keys and values) where it has it and `kv_cache` is on.

    One step graph serves step zero, every later step and the cache refresh, so a text export opens one session
    (two with the cache); each is opened on its first call, so a mode that never runs a graph never pays for it. On
    the CPU the sessions read the weights from one memory map (OrtSessionOptions.share_weights)."""

    samples_per_row = True  # the step graph takes a temperature and uniforms per row (StepInput.uniform)
    takes_pictures = False  # a multimodal export's backend is its own class (engines.ort_multimodal)

    def __init__(self, export_dir: str | os.PathLike[str], options: OrtSessionOptions | None = None, *,
                 kv_cache: bool = True, manifest: ExportManifest | None = None) -> None:
        """`manifest`: the export's, when the caller has already loaded it (the opener), so it is read once."""
        self.export_dir = Path(export_dir)
        self.options = options or OrtSessionOptions()
        self.manifest = manifest if manifest is not None else ExportManifest.load(self.export_dir)
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
        config = self.manifest.model_config()
        positions = self.takes_pictures and config.mrope_section is not None  # the cached graphs' position shift
        self._window_io = window_graph(config.prefix_dlm, positions)
        self._prompt_io = prompt_graph(positions)
        self.window_lead = int(config.shift_logits)  # core.backend.window_lead
        self.supports_cache = self.manifest.has_cache and kv_cache
        self.supports_prompt_cache = self.manifest.has_prompt_cache and kv_cache
        self._graphs = {io.name: io for io in (self._step_io, *((self._window_io,) if self.supports_cache else ()),
                                               *((self._prompt_io,) if self.supports_prompt_cache else ()))}
        wanted, on_cuda = self.options.device_cache, providers[0] == CUDA
        self.device_cache = (self.options.io_binding or self.options.cuda_graph) and on_cuda if wanted is None else wanted
        # The graphs captured as CUDA graphs (with --cuda-graph): the step graph, and the cache graphs (window,
        # prompt) unless their cache is device-resident (a fresh binding per call: addresses a captured graph would
        # not follow).
        self.captured_graphs = EVERY_STEP - ({WINDOW_STEP.name, PROMPT_STEP.name} if self.device_cache else set())
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
        cfg = self.manifest.model_config()
        return step_graph(multimodal=self.takes_pictures, prefix_dlm=cfg.prefix_dlm,
                          kv_cache=self.manifest.has_cache,
                          positions=self.takes_pictures and cfg.mrope_section is not None)

    def _session(self, io: GraphIO) -> ort.InferenceSession:
        graph = self.manifest.graphs[io.name]
        providers = self.options.provider_entries(cuda_graph=io.name in self.captured_graphs)
        so = self.options.session_options()
        casts = self.casts_weights()
        if casts:
            so.enable_cpu_mem_arena = False
            so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        prepack = self.prepacks()
        if self.options.shares_weights():
            check_external_data(self.export_dir / graph.file)
            self.weights.add_to(so, self.export_dir / graph.file, arena=not casts, prepack=prepack)
        elif not prepack:
            so.add_session_config_entry("session.disable_prepacking", "1")
        session = open_session(self.export_dir / graph.file, so, providers, self.disabled_optimizers())
        if prepack and self.options.shares_weights():
            self.weights.release_pages()  # what prepacking read is in ONNX Runtime's packed copy now
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

    def prepacks(self) -> bool:
        """Whether ONNX Runtime may prepack the MatMul weights (a private copy per session). Not where the sessions
        read one memory map of the weights (share_weights), except a quantized export's MatMulNBits, which without
        its packed layout dequantizes every block on every call (2.0-2.4x slower per step on a 1024-wide model), and
        never a quantized float16 export on the CPU: ONNX Runtime 1.32's prepacked float16 MatMulNBits there gives
        wrong tokens (measured on the demo: 0 of 40 answers right at int8 and int4, 40 unpacked; the export's own
        check caught it at 63% token agreement)."""
        quantized = self.manifest.weights.quantization is not None
        if quantized and self.casts_weights():
            return False
        return quantized or not self.options.shares_weights()

    def disabled_optimizers(self) -> tuple[str, ...]:
        """The graph optimizations the sessions run without (casts_weights)."""
        return (FP16_WEIGHT_FUSION,) if self.casts_weights() else ()

    def _run(self, io: GraphIO, inputs: StepInput, outputs: Sequence[str], with_stats: bool = False
             ) -> dict[str, np.ndarray]:
        checked = inputs.checked(self.max_seq_len)
        return self._call(io, graph_feed(io, checked, self._image_inputs(checked), with_stats=with_stats), outputs)

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

    def _image_inputs(self, checked: StepInput) -> dict[str, np.ndarray]:
        """The multimodal graphs' image table (and an M-RoPE model's positions) for this call, as graph_feed's
        keywords; a text export has none."""
        return {}

    def step0(self, inputs: StepInput) -> Step0Output:
        """The step graph with step zero's statistics."""
        return step0_output(self._run(self._step_io, inputs, STEP0_OUTPUTS, with_stats=True))

    def step(self, inputs: StepInput) -> StepOutput:
        """temperature > 0 samples from softmax(logits / T) with uniforms drawn from `seed` (see contracts.sampling)."""
        return step_output(self._run(self._step_io, inputs, STEP_OUTPUTS))

    def refresh(self, inputs: StepInput) -> RefreshOutput:
        """A step that also returns every layer's keys and values (export --kv-cache); with `device_cache` they
        stay on the session's device, as a torch tensor."""
        if not self.supports_prompt_cache:  # the prompt cache's step zero refreshes too
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
                                         graph_feed(io, checked, self._image_inputs(checked)),
                                         device=kind, device_id=index, device_outputs={KV.name: kv})
        picked = step_output(values)
        return RefreshOutput(picked.token_ids, picked.confidence, kv, picked.score)

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

    def prefill(self, inputs: StepInput) -> Step0Output:
        """Step zero (the step graph with its statistics) that also returns the keys and values (export --kv-cache):
        what the prompt cache is cut from. The cache comes back to the host."""
        self._need_prompt_cache()
        return prefill_output(self._run(self._step_io, inputs, PREFILL_OUTPUTS, with_stats=True))

    def prompt_step(self, inputs: PromptInput) -> StepOutput:
        """A pass over the last prompt token and the response against the prompt cache (export --kv-cache)."""
        self._need_prompt_cache()
        checked = inputs.checked()
        io = self._prompt_io
        if is_device_array(checked.prompt_kv):
            kind, index = self._device
            return step_output(run_with_device_tensors(self._session_of(io), io, prompt_feed(io, checked),
                                                       device=kind, device_id=index, device_outputs={}))
        return step_output(self._call(io, prompt_feed(io, checked), io.host_outputs))

    def _need_prompt_cache(self) -> None:
        if not self.supports_prompt_cache:
            raise ConfigError(f"{self.export_dir} has no prompt-cache graph (prompt_step.onnx); re-export with "
                              "`seer-deploy export --kv-cache` (and rebuild), or run without --prompt-cache")

    def _need_cache(self) -> None:
        if not self.supports_cache and self.manifest.has_cache:
            raise ConfigError(f"the KV cache graph of {self.export_dir} was not opened (an engine dir built before "
                              "the export had it); rebuild it with `seer-deploy build`, or run without --kv-cache")
        if not self.supports_cache:
            raise ConfigError(f"{self.export_dir} has no KV cache graph; re-export with `seer-deploy export "
                              "--kv-cache`, or run without --kv-cache")
