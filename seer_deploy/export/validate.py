"""Export-time checks: each traced graph's inputs and outputs against its declaration (spec.graphs), the ONNX checker
on each file, then ONNX Runtime against the torch model on probe prompts.

The torch side is the float32 model, so a float16 export is measured against the truth, not against itself. The
reference logits are taken before the model is cast and traced, and compared in float64:
  * a token passes if its reference probability is within the probability tolerance of the best (a near-tie may
    flip under rounding), and a sampled token passes if its reference CDF interval holds the uniform number;
  * confidence / EOS probability: absolute difference to the reference probability of the token ORT chose;
  * sparsity fractions may move by whole units that sit exactly at a threshold: fewer than `max_bad_share` entries
    may exceed the tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import torch

from seer_deploy.core.backend import (
    Backend,
    CacheBackend,
    StepInput,
    StepOutput,
    WindowInput,
    supports_cache,
)
from seer_deploy.core.errors import ArtifactError
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.models.config import ModelConfig
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.spec.export_manifest import GraphRecord
from seer_deploy.spec.graphs import GraphIO, RecordedShape, Size
from seer_deploy.spec.sampling import draw_uniform


class ExportValidationError(ArtifactError):
    """ONNX Runtime's results differ from torch's beyond the tolerance of the export dtype."""


@dataclass(frozen=True)
class Tolerances:
    prob_atol: float  # probabilities (confidence, EOS, token near-ties, sampling CDF edges)
    frac_atol: float  # sparsity fractions
    frac_units: int  # plus this many hidden units crossing a threshold (float16 moves values near it)
    mean_rtol: float  # mean |h| rows, relative
    max_bad_share: float = 1e-3  # share of sparsity entries allowed past the tolerance (units exactly at a threshold)


TOLERANCES: dict[str, Tolerances] = {
    "fp32": Tolerances(prob_atol=1e-4, frac_atol=1e-6, frac_units=0, mean_rtol=1e-4),
    "fp16": Tolerances(prob_atol=1e-2, frac_atol=1e-2, frac_units=3, mean_rtol=2e-2),
}


@dataclass(frozen=True)
class Probe:
    input_ids: np.ndarray  # int64 [B, S]
    attention_mask: np.ndarray  # int64 [B, S], left padding
    temperature: np.ndarray  # float32 [B]: rows with 0 check greedy, others check sampling
    seed: int
    prompt_width: int = 0  # columns [0, prompt_width) are the prompt (what prefix-DLM attention keeps apart)


@dataclass(frozen=True)
class ProbeReference:
    probe: Probe
    logits: np.ndarray  # float64 [B, S, V] from the float32 torch model
    stats: np.ndarray  # float32 [B, K, S]
    kv: np.ndarray  # float32 [layers, 2, B, kv_heads, S, head_dim]: what the refresh graph returns


def make_probes(cfg: ModelConfig, max_seq_len: int, seed: int = 0) -> list[Probe]:
    """A left-padded batch of three (one greedy row, two sampling rows) and a single short row."""
    rng = np.random.default_rng(seed)
    pad = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    probes: list[Probe] = []
    for batch, width, temps in ((3, 24, (0.0, 0.8, 1.5)), (1, 7, (0.0,))):
        S = max(1, min(width, max_seq_len))
        response = S // 3
        ids = np.full((batch, S), pad, dtype=np.int64)
        mask = np.zeros((batch, S), dtype=np.int64)
        for b in range(batch):
            n = S - (b * S) // (2 * batch)  # rows get shorter: left padding of 0, S/6, S/3 positions
            ids[b, S - n :] = rng.integers(0, cfg.vocab_size, n)
            ids[b, S - response :] = cfg.mask_id
            mask[b, S - n :] = 1
        probes.append(Probe(ids, mask, np.asarray(temps, dtype=np.float32), seed=int(rng.integers(1 << 31)),
                            prompt_width=S - response))
    return probes


@torch.no_grad()
def torch_references(model: MaskPredictor, spec: StatsSpec, probes: list[Probe]) -> list[ProbeReference]:
    refs = []
    for p in probes:
        width = torch.full((p.input_ids.shape[0],), p.prompt_width, dtype=torch.long)
        out = model(torch.from_numpy(p.input_ids), torch.from_numpy(p.attention_mask), stats=spec, return_kv=True,
                    prompt_width=width)
        assert out.stats is not None and out.kv is not None
        B, L, F, S = out.stats.shape
        refs.append(ProbeReference(p, out.logits.double().numpy(), out.stats.reshape(B, L * F, S).float().numpy(),
                                   out.kv.numpy()))
    return refs


def check_interface(graph: GraphIO, record: GraphRecord, sizes: Mapping[Size, int]) -> None:
    """The traced graph's inputs and outputs (names, order, dtypes, dynamic axes, sizes) are the declared ones."""
    traced = [("input", name, t.dtype, list(t.shape)) for name, t in record.inputs.items()] + [
        ("output", name, t.dtype, list(t.shape)) for name, t in record.outputs.items()
    ]
    declared = graph.interface(sizes)
    if traced != declared:
        raise ExportValidationError(
            f"{record.file} does not have the inputs and outputs spec.graphs declares for the {graph.name} graph "
            f"(traced: {_listing(traced)}; declared: {_listing(declared)}); nothing was written"
        )


def _listing(interface: list[tuple[str, str, str, RecordedShape]]) -> str:
    return "; ".join(f"{kind} {name} {dtype} {shape}" for kind, name, dtype, shape in interface)


def check_graph_files(paths: list[Path]) -> None:
    """The ONNX checker with shape inference, by path (a model over 2 GB cannot be checked as an in-memory proto)."""
    for path in paths:
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            raise ExportValidationError(f"{path.name} fails the ONNX checker: {exc}") from exc


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _pick(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    return np.take_along_axis(values, index[..., None], axis=-1)[..., 0]


def _where(mask: np.ndarray) -> str:
    b, s = (int(v) for v in np.argwhere(mask)[0][:2])
    return f"row {b}, position {s}"


class _Report:
    def __init__(self, dtype: str, tol: Tolerances) -> None:
        self.dtype, self.tol = dtype, tol
        self.problems: list[str] = []
        self.max_diff: dict[str, float] = {}
        self._sparsity_bad = self._sparsity_total = 0

    def close(self, name: str, got: np.ndarray, want: np.ndarray, atol: float) -> None:
        diff = np.abs(got.astype(np.float64) - want)
        worst = float(diff.max(initial=0.0))
        self.max_diff[name] = max(self.max_diff.get(name, 0.0), worst)
        if worst > atol:
            self.problems.append(f"{name}: max |diff| {worst:.3g} > {atol:g} ({self.dtype} tolerance) at {_where(diff == worst)}")

    def tokens(self, name: str, ok: np.ndarray, detail: str) -> None:
        if not ok.all():
            self.problems.append(f"{name}: {int((~ok).sum())} of {ok.size} tokens differ from torch ({detail}) first at {_where(~ok)}")

    def sparsity(self, got: np.ndarray, want: np.ndarray, hidden: int) -> None:
        n_stats = len(STAT_NAMES)
        is_mean = np.zeros(got.shape[1], dtype=bool)
        is_mean[STAT_NAMES.index("mean_abs_h") :: n_stats] = True
        diff = np.abs(got.astype(np.float64) - want)
        frac_allowed = self.tol.frac_atol + self.tol.frac_units / hidden
        allowed = np.where(is_mean[None, :, None], self.tol.mean_rtol * np.abs(want) + 1e-6, frac_allowed)
        self._sparsity_bad += int((diff > allowed).sum())
        self._sparsity_total += diff.size
        self.max_diff["sparsity"] = max(self.max_diff.get("sparsity", 0.0), float(diff.max(initial=0.0)))

    def finish_sparsity(self, hidden: int) -> None:
        """A unit sitting exactly at a threshold flips a fraction by 1/hidden: tolerated in a few entries only."""
        bad, total = self._sparsity_bad, self._sparsity_total
        if bad and bad >= self.tol.max_bad_share * total:
            self.problems.append(
                f"sparsity: {bad} of {total} entries differ beyond tolerance (allowed: fewer than "
                f"{self.tol.max_bad_share:.1%}; one unit = {1 / hidden:.3g}), max |diff| {self.max_diff['sparsity']:.3g}"
            )


def _step_at_row_temperatures(backend: Backend, p: Probe) -> StepOutput:
    """A step in which row b samples at p.temperature[b]. StepInput has one temperature, so the whole batch runs once
    per distinct value and each row keeps its own; every run draws the same uniforms from the probe's seed, and a
    row's result depends only on its own temperature and uniforms, so this is what one per-row call would give."""
    token_ids = np.zeros(p.input_ids.shape, dtype=np.int64)
    confidence = np.zeros(p.input_ids.shape, dtype=np.float32)
    for temperature in np.unique(p.temperature):
        out = backend.step(StepInput(p.input_ids, p.attention_mask, temperature=float(temperature), seed=p.seed,
                                     prompt_width=p.prompt_width))
        rows = p.temperature == temperature
        token_ids[rows], confidence[rows] = out.token_ids[rows], out.confidence[rows]
    return StepOutput(token_ids, confidence)


def _compare_cache(backend: CacheBackend, ref: ProbeReference, probs: np.ndarray, best: np.ndarray,
                   report: _Report) -> None:
    """The cache graphs: refresh's tokens and keys/values, and a window step over the probe's response columns
    against refresh's cache (with a fresh cache it computes what a full step computes there)."""
    p, tol = ref.probe, report.tol
    refreshed = backend.refresh(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width))
    report.tokens("refresh token_ids", _pick(probs, refreshed.token_ids) >= best - tol.prob_atol, "not a near-tie")
    report.close("refresh confidence", np.exp(refreshed.confidence), _pick(probs, refreshed.token_ids), tol.prob_atol)
    scale = float(np.abs(ref.kv).max(initial=1.0))
    report.close("refresh kv (relative)", refreshed.kv / scale, ref.kv / scale, tol.mean_rtol)
    B, S = p.input_ids.shape
    W = max(1, S // 3)
    start = np.full(B, S - W, dtype=np.int64)
    window = backend.window_step(WindowInput(p.input_ids[:, S - W :], p.attention_mask, start, refreshed.kv))
    report.tokens("window_step token_ids", _pick(probs[:, S - W :], window.token_ids) >= best[:, S - W :] - tol.prob_atol,
                  "not a near-tie")
    report.close("window_step confidence", np.exp(window.confidence), _pick(probs[:, S - W :], window.token_ids),
                 tol.prob_atol)


def compare_with_torch(backend: Backend, refs: list[ProbeReference], cfg: ModelConfig, dtype: str) -> dict[str, float]:
    """Run both graphs on every probe; raise ExportValidationError listing each measured disagreement."""
    tol = TOLERANCES[dtype]
    report = _Report(dtype, tol)
    for ref in refs:
        p = ref.probe
        probs = _softmax(ref.logits)
        best = probs.max(-1)
        s0 = backend.step0(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width))
        report.tokens("step0 token_ids", _pick(probs, s0.token_ids) >= best - tol.prob_atol, "not a near-tie")
        report.close("step0 confidence", np.exp(s0.confidence), _pick(probs, s0.token_ids), tol.prob_atol)
        report.close("step0 eos_prob", s0.eos_prob, probs[..., cfg.eos_id], tol.prob_atol)
        report.sparsity(s0.sparsity, ref.stats, cfg.mlp_hidden)

        st = _step_at_row_temperatures(backend, p)
        report.close("step confidence", np.exp(st.confidence), _pick(probs, st.token_ids), tol.prob_atol)
        greedy = p.temperature == 0
        if greedy.any():
            ok = _pick(probs[greedy], st.token_ids[greedy]) >= best[greedy] - tol.prob_atol
            report.tokens("step token_ids (greedy rows)", ok, "not a near-tie")
        if (~greedy).any():
            u = draw_uniform(p.seed, p.input_ids.shape)[~greedy].astype(np.float64)
            q = _softmax(ref.logits[~greedy] / p.temperature[~greedy][:, None, None].astype(np.float64))
            hi = _pick(np.cumsum(q, axis=-1), st.token_ids[~greedy])
            lo = hi - _pick(q, st.token_ids[~greedy])
            ok = (lo - tol.prob_atol <= u) & (u <= hi + tol.prob_atol)
            report.tokens("step token_ids (sampling rows)", ok, "the uniform lies outside the token's CDF interval")
        if supports_cache(backend):
            _compare_cache(cast(CacheBackend, backend), ref, probs, best, report)
    report.finish_sparsity(cfg.mlp_hidden)
    if report.problems:
        raise ExportValidationError(
            "ONNX Runtime disagrees with torch; nothing was written. " + "; ".join(report.problems)
        )
    return report.max_diff
