"""Export-time checks: each traced graph's inputs and outputs against its declaration (contracts.graphs), the ONNX checker
on each file, then ONNX Runtime against the torch model on probe prompts.

The torch side is the float32 model, so a float16 export is measured against the truth, not against itself. The
reference logits are taken before the model is cast and traced, and compared in float64:
  * a token passes if its reference probability is within the probability tolerance of the best (a near-tie may
    flip under rounding), and a sampled token passes if its reference CDF interval holds the uniform number;
  * confidence / EOS probability: absolute difference to the reference probability of the token ORT chose;
  * sparsity fractions may move by whole units that sit exactly at a threshold (`frac_units` per entry, one even in
    float32: a unit within rounding of the threshold flips either way); beyond that, fewer than `max_bad_share`
    entries may exceed the tolerance.
What a lower-precision export may add is measured, not guessed: the same torch model cast to the export's dtype
runs the probes too, and its own deviation from float32, entry by entry (the largest, for probabilities), times
NOISE_FACTOR is added to each tolerance. ONNX Runtime rounds in other places than torch, so it may stray as far
again; a graph that computes something else strays much further. The float32 tolerances are the base.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import torch

from seer_deploy.contracts.graphs import GraphIO, RecordedShape, Size
from seer_deploy.contracts.manifest_sections import GraphRecord
from seer_deploy.contracts.sampling import draw_uniform
from seer_deploy.core.backend import (
    Backend,
    CacheBackend,
    KVCache,
    PromptCacheBackend,
    PromptInput,
    StepInput,
    StepOutput,
    WindowInput,
    position_shift,
    supports_cache,
    supports_prompt_cache,
    window_lead,
)
from seer_deploy.core.errors import ArtifactError
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.export.distributions import Distances, ProbeLogits, rows
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor


class ExportValidationError(ArtifactError):
    """ONNX Runtime's results differ from torch's beyond the tolerance of the export dtype (max_diff: the measured
    figures per output; noise: the export dtype's own deviation the tolerances allowed for)."""

    def __init__(self, message: str, max_diff: Mapping[str, float] | None = None,
                 noise: Mapping[str, float] | None = None) -> None:
        super().__init__(message)
        self.max_diff = dict(max_diff or {})
        self.noise = dict(noise or {})


@dataclass(frozen=True)
class Tolerances:
    prob_atol: float  # probabilities (confidence, EOS, token near-ties, sampling CDF edges)
    frac_atol: float  # sparsity fractions
    frac_units: int  # plus this many hidden units crossing a threshold (float16 moves values near it)
    mean_rtol: float  # mean |h| rows, relative
    logit_rtol: float  # the LM head's logits: centred error relative to their spread (export.distributions)
    max_bad_share: float = 1e-3  # share of sparsity entries allowed past the tolerance (units exactly at a threshold)


TOLERANCES: dict[str, Tolerances] = {
    "fp32": Tolerances(prob_atol=1e-4, frac_atol=1e-6, frac_units=1, mean_rtol=1e-4, logit_rtol=1e-3),
    "fp16": Tolerances(prob_atol=1e-4, frac_atol=1e-6, frac_units=3, mean_rtol=1e-4, logit_rtol=1e-3),
}
NOISE_FACTOR = 3.0  # ONNX Runtime may round where torch does not (measured on the demo in fp16: 1.7x torch's own deviation)


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
    kv: np.ndarray  # float32 [layers, 2, B, kv_heads, S, head_dim]: what the step graph's kv output returns
    # The same from the torch model cast to the export's dtype (None for a float32 export): how far that dtype alone
    # moves each output, the basis of its tolerances.
    cast: ProbeReference | None = None


def _is_mean_row(rows: int) -> np.ndarray:
    """Which of the K sparsity rows hold mean |h| (compared relatively); the others are fractions of units."""
    is_mean = np.zeros(rows, dtype=bool)
    is_mean[STAT_NAMES.index("mean_abs_h") :: len(STAT_NAMES)] = True
    return is_mean


@dataclass(frozen=True)
class DtypeNoise:
    """How far torch in the export's dtype strays from float32 on the probes, output by output (each the largest over
    every probe): the allowance a graph in that dtype gets on top of the float32 tolerances (times NOISE_FACTOR)."""

    prob: float = 0.0  # |p_cast - p| over every position and token
    kv: float = 0.0  # |kv_cast - kv| relative to the largest |kv|
    fraction: float = 0.0  # |stats_cast - stats| over the fraction rows
    mean: float = 0.0  # |stats_cast - stats| / |stats| over the mean |h| rows
    logits: float = 0.0  # the cast logits' error relative to their spread (export.distributions), the worst position

    @classmethod
    def of(cls, refs: list[ProbeReference]) -> DtypeNoise:
        noise = cls()
        for ref in refs:
            if ref.cast is None:
                continue
            is_mean = _is_mean_row(ref.stats.shape[1])[None, :, None]
            stats_diff = np.abs(ref.cast.stats.astype(np.float64) - ref.stats)
            relative = stats_diff / (np.abs(ref.stats) + 1e-6)
            noise = DtypeNoise(
                max(noise.prob, float(np.abs(_softmax(ref.cast.logits) - _softmax(ref.logits)).max(initial=0.0))),
                max(noise.kv, float(np.abs(ref.cast.kv.astype(np.float64) - ref.kv).max(initial=0.0))
                    / float(np.abs(ref.kv).max(initial=1.0))),
                max(noise.fraction, float(np.where(is_mean, 0.0, stats_diff).max(initial=0.0))),
                max(noise.mean, float(np.where(is_mean, relative, 0.0).max(initial=0.0))),
                max(noise.logits, _logit_error(ref.logits, ref.cast.logits, ref.probe.attention_mask)),
            )
        return noise

    def summary(self) -> dict[str, float]:
        return {"probability": self.prob, "kv (relative)": self.kv, "sparsity fraction": self.fraction,
                "sparsity mean |h| (relative)": self.mean, "logits (relative to their spread)": self.logits}


def _logit_error(reference: np.ndarray, got: np.ndarray, real: np.ndarray) -> float:
    """The worst real position's logit error relative to the reference's spread (export.distributions)."""
    return float(Distances.between(rows(reference, real), rows(got, real)).logit_error.max(initial=0.0))


def window_columns(seq: int) -> int:
    """The width of the window the checks run at the end of a probe: a third of it, at least one column."""
    return max(1, seq // 3)


def probe_window(p: Probe, kv: KVCache, backend: Backend) -> WindowInput:
    """The window the checks run: the probe's last window_columns(S) columns against the cache `kv`, started
    window_lead(backend) columns earlier (shifted logits read a column's token from the column before it), so its
    outputs after the first lead are the checked columns'; an M-RoPE model's with the rows' position shift."""
    B, S = p.input_ids.shape
    start = S - window_columns(S) - window_lead(backend)
    return WindowInput(p.input_ids[:, start:], p.attention_mask, np.full(B, start, dtype=np.int64), kv,
                       prompt_width=p.prompt_width,
                       position_shift=position_shift(backend, p.input_ids, p.attention_mask))


def probe_prompt_run(p: Probe, kv: KVCache, backend: Backend, candidates: np.ndarray | None = None) -> PromptInput:
    """The prompt-cache pass the checks run: the probe's last prompt token and response against `kv`'s columns before
    them (a reference's, or the step graph's), an M-RoPE model's with the rows' position shift."""
    P = p.prompt_width
    return PromptInput(p.input_ids[:, P - 1 :], p.attention_mask, np.ascontiguousarray(kv[:, :, :, :, : P - 1]),
                       candidates=candidates, prompt_width=P,
                       position_shift=position_shift(backend, p.input_ids, p.attention_mask))


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
def with_cast_references(refs: list[ProbeReference], cast_model: MaskPredictor, spec: StatsSpec) -> list[ProbeReference]:
    """`refs` with the outputs of the model cast to the export's dtype beside them (ProbeReference.cast)."""
    cast = torch_references(cast_model, spec, [ref.probe for ref in refs])
    return [replace(ref, cast=c) for ref, c in zip(refs, cast, strict=True)]


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
                                   out.kv.float().numpy()))
    return refs


def check_interface(graph: GraphIO, record: GraphRecord, sizes: Mapping[Size, int]) -> None:
    """The traced graph's inputs and outputs (names, order, dtypes, dynamic axes, sizes) are the declared ones."""
    traced = [("input", name, t.dtype, list(t.shape)) for name, t in record.inputs.items()] + [
        ("output", name, t.dtype, list(t.shape)) for name, t in record.outputs.items()
    ]
    declared = graph.interface(sizes)
    if traced != declared:
        raise ExportValidationError(
            f"{record.file} does not have the inputs and outputs contracts.graphs declares for the {graph.name} graph "
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
    def __init__(self, dtype: str, tol: Tolerances, noise: DtypeNoise) -> None:
        self.dtype, self.tol, self.noise = dtype, tol, noise
        self.prob_atol = tol.prob_atol + NOISE_FACTOR * noise.prob
        self.kv_rtol = tol.mean_rtol + NOISE_FACTOR * noise.kv
        self.problems: list[str] = []
        self.max_diff: dict[str, float] = {}
        self._sparsity_bad = self._sparsity_total = 0

    def close(self, name: str, got: np.ndarray, want: np.ndarray, atol: float) -> None:
        diff = np.abs(got.astype(np.float64) - want)
        worst = float(diff.max(initial=0.0))
        self.max_diff[name] = max(self.max_diff.get(name, 0.0), worst)
        if worst > atol:
            self.problems.append(f"{name}: max |diff| {worst:.3g} > {atol:.3g} ({self.dtype} tolerance) at "
                                 f"{_where(diff == worst)}")

    def relative(self, name: str, error: float) -> None:
        """A logit error relative to the reference's spread, against the dtype's tolerance plus its own noise."""
        allowed = self.tol.logit_rtol + NOISE_FACTOR * self.noise.logits
        self.max_diff[name] = max(self.max_diff.get(name, 0.0), error)
        if error > allowed:
            self.problems.append(f"{name}: {error:.3g} > {allowed:.3g} ({self.dtype} tolerance)")

    def tokens(self, name: str, ok: np.ndarray, detail: str) -> None:
        if not ok.all():
            self.problems.append(f"{name}: {int((~ok).sum())} of {ok.size} tokens differ from torch ({detail}) first at {_where(~ok)}")

    def sparsity(self, got: np.ndarray, want: np.ndarray, hidden: int) -> None:
        is_mean = _is_mean_row(got.shape[1])
        diff = np.abs(got.astype(np.float64) - want)
        frac_allowed = self.tol.frac_atol + self.tol.frac_units / hidden + NOISE_FACTOR * self.noise.fraction
        mean_rtol = self.tol.mean_rtol + NOISE_FACTOR * self.noise.mean
        allowed = np.where(is_mean[None, :, None], mean_rtol * np.abs(want) + 1e-6, frac_allowed)
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


def _step_at_row_temperatures(backend: Backend, p: Probe, candidates: np.ndarray) -> StepOutput:
    """A step in which row b samples at p.temperature[b]. StepInput has one temperature, so the whole batch runs once
    per distinct value and each row keeps its own; every run draws the same uniforms from the probe's seed, and a
    row's result depends only on its own temperature and uniforms, so this is what one per-row call would give."""
    token_ids = np.zeros(p.input_ids.shape, dtype=np.int64)
    confidence = np.zeros(p.input_ids.shape, dtype=np.float32)
    for temperature in np.unique(p.temperature):
        out = backend.step(StepInput(p.input_ids, p.attention_mask, temperature=float(temperature), seed=p.seed,
                                     prompt_width=p.prompt_width, candidates=candidates))
        rows = p.temperature == temperature
        token_ids[rows], confidence[rows] = out.token_ids[rows], out.confidence[rows]
    return StepOutput(token_ids, confidence)


def response_candidates(p: Probe) -> np.ndarray:
    """The probe's response columns as a step's candidates (what a pass after step zero computes)."""
    B, S = p.input_ids.shape
    return np.ascontiguousarray(np.broadcast_to(np.arange(p.prompt_width, S, dtype=np.int64), (B, S - p.prompt_width)))


def _check_skipped(name: str, out: StepOutput, p: Probe, candidates: np.ndarray, report: _Report) -> None:
    """Columns outside the candidates come back as their input ids with confidence -inf: nothing was computed."""
    skipped = np.ones(p.input_ids.shape, dtype=bool)
    np.put_along_axis(skipped, candidates, False, axis=1)
    if not (np.array_equal(out.token_ids[skipped], p.input_ids[skipped])
            and bool(np.all(np.isneginf(out.confidence[skipped])))):
        report.problems.append(f"{name}: columns outside the candidates do not return their input ids with "
                               "confidence -inf")


def _compare_cache(backend: CacheBackend, ref: ProbeReference, probs: np.ndarray, best: np.ndarray,
                   report: _Report) -> None:
    """The cache: the step graph's keys and values (a refresh over the response candidates), and a window step over
    the probe's response columns against them (with a fresh cache it computes what a full step computes there)."""
    p = ref.probe
    cols = response_candidates(p)
    refreshed = backend.refresh(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width, candidates=cols))
    got, want = _cols(refreshed.token_ids, cols), _cols(best, cols)
    report.tokens("refresh token_ids", _pick(_pick3(probs, cols), got) >= want - report.prob_atol, "not a near-tie")
    report.close("refresh confidence", np.exp(_cols(refreshed.confidence, cols)), _pick(_pick3(probs, cols), got),
                 report.prob_atol)
    scale = float(np.abs(ref.kv).max(initial=1.0))
    report.close("refresh kv (relative)", refreshed.kv / scale, ref.kv / scale, report.kv_rtol)
    S = p.input_ids.shape[1]
    lead = window_lead(backend)
    window = backend.window_step(probe_window(p, refreshed.kv, backend))
    ids = window.token_ids[:, lead:]
    W = ids.shape[1]
    report.tokens("window_step token_ids", _pick(probs[:, S - W :], ids) >= best[:, S - W :] - report.prob_atol,
                  "not a near-tie")
    report.close("window_step confidence", np.exp(window.confidence[:, lead:]), _pick(probs[:, S - W :], ids),
                 report.prob_atol)


def _compare_prompt_cache(backend: PromptCacheBackend, ref: ProbeReference, probs: np.ndarray, best: np.ndarray,
                          report: _Report) -> None:
    """The prompt cache: the last prompt token and the response against the reference's keys and values of the
    columns before them compute what the full pass computes at the response columns."""
    p = ref.probe
    P = p.prompt_width
    run = p.input_ids[:, P - 1 :]
    candidates = np.ascontiguousarray(np.broadcast_to(np.arange(1, run.shape[1]), (run.shape[0], run.shape[1] - 1)))
    out = backend.prompt_step(probe_prompt_run(p, ref.kv, backend, candidates))
    ids = out.token_ids[:, 1:]
    report.tokens("prompt_step token_ids", _pick(probs[:, P:], ids) >= best[:, P:] - report.prob_atol, "not a near-tie")
    report.close("prompt_step confidence", np.exp(out.confidence[:, 1:]), _pick(probs[:, P:], ids), report.prob_atol)


def _cols(values: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """values [B, S] at columns cols [B, C] -> [B, C]."""
    return np.take_along_axis(values, cols, axis=1)


def _pick3(probs: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """probs [B, S, V] at columns cols [B, C] -> [B, C, V]."""
    return np.take_along_axis(probs, cols[..., None], axis=1)


def compare_with_torch(backend: Backend, refs: list[ProbeReference], cfg: ModelConfig, dtype: str,
                       logits: list[ProbeLogits]) -> dict[str, float]:
    """Run every graph on every probe; raise ExportValidationError listing each measured disagreement. Step zero
    computes every column; the steps after it (and the refresh) the response columns only, as the loop calls them.
    `logits`: the export's own (export.validation_twin), whose error relative to the reference's spread is bounded:
    on a flat distribution every probability is below the probability tolerance, and only the logits tell."""
    noise = DtypeNoise.of(refs)
    report = _Report(dtype, TOLERANCES[dtype], noise)
    atol = report.prob_atol
    for ref, got in zip(refs, logits, strict=True):
        p = ref.probe
        report.relative("step0 logits (relative to their spread)",
                        _logit_error(ref.logits, got.step0, p.attention_mask))
        if got.window is not None:
            W = window_columns(p.input_ids.shape[1])
            report.relative("window_step logits (relative to their spread)",
                            _logit_error(ref.logits[:, -W:], got.window, p.attention_mask[:, -W:]))
        probs = _softmax(ref.logits)
        best = probs.max(-1)
        s0 = backend.step0(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width))
        report.tokens("step0 token_ids", _pick(probs, s0.token_ids) >= best - atol, "not a near-tie")
        report.close("step0 confidence", np.exp(s0.confidence), _pick(probs, s0.token_ids), atol)
        report.close("step0 eos_prob", s0.eos_prob, probs[..., cfg.eos_id], atol)
        report.sparsity(s0.sparsity, ref.stats, cfg.mlp_hidden)

        cols = response_candidates(p)
        st = _step_at_row_temperatures(backend, p, cols)
        _check_skipped("step", st, p, cols, report)
        ids, cprobs, cbest = _cols(st.token_ids, cols), _pick3(probs, cols), _cols(best, cols)
        report.close("step confidence", np.exp(_cols(st.confidence, cols)), _pick(cprobs, ids), atol)
        greedy = p.temperature == 0
        if greedy.any():
            ok = _pick(cprobs[greedy], ids[greedy]) >= cbest[greedy] - atol
            report.tokens("step token_ids (greedy rows)", ok, "not a near-tie")
        if (~greedy).any():
            u = _cols(draw_uniform(p.seed, p.input_ids.shape), cols)[~greedy].astype(np.float64)
            q = _softmax(_pick3(ref.logits, cols)[~greedy] / p.temperature[~greedy][:, None, None].astype(np.float64))
            hi = _pick(np.cumsum(q, axis=-1), ids[~greedy])
            lo = hi - _pick(q, ids[~greedy])
            ok = (lo - atol <= u) & (u <= hi + atol)
            report.tokens("step token_ids (sampling rows)", ok, "the uniform lies outside the token's CDF interval")
        if supports_cache(backend):
            _compare_cache(cast(CacheBackend, backend), ref, probs, best, report)
        if supports_prompt_cache(backend):
            _compare_prompt_cache(cast(PromptCacheBackend, backend), ref, probs, best, report)
    report.finish_sparsity(cfg.mlp_hidden)
    if report.problems:
        raise ExportValidationError("ONNX Runtime disagrees with torch: " + "; ".join(report.problems),
                                    report.max_diff, noise.summary())
    if any(ref.cast is not None for ref in refs):  # what the export's dtype alone moved, for the record
        return report.max_diff | {f"{dtype} torch itself: {name}": value for name, value in noise.summary().items()}
    return report.max_diff
