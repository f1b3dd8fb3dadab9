"""The denoising loop's host logic in numpy: the twin of the C core `_loopcore`, and the choice between them.

Both compute the same results bit for bit (tests/test_loopcore.py checks it on generated cases), so the loop can
use the C core where the extension was built and this twin anywhere else. `SEER_DEPLOY_PURE_PYTHON=1` forces
the twin. Order of confidences, shared with `reference.select_transfer`: higher first; NaN ranks above every
number (as torch.sort and numpy.sort order it); -0.0 equals +0.0; ties go to the lower position.
"""

from __future__ import annotations

import importlib
import operator
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import numpy as np

from seer_deploy.core.errors import ConfigError

CORE_NAME = "python"
PURE_PYTHON_ENV = "SEER_DEPLOY_PURE_PYTHON"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class LoopCore(Protocol):
    """The functions the runtime loop needs; the C module and this module both provide them."""

    CORE_NAME: str

    def transfer_schedule(self, n_masked: np.ndarray, steps: int) -> np.ndarray: ...

    def commit_step(self, x: np.ndarray, x0: np.ndarray, confidence: np.ndarray, block_lo: np.ndarray,
                    block_hi: np.ndarray, k: np.ndarray, mask_id: int) -> np.ndarray: ...

    def commit_confident(self, x: np.ndarray, x0: np.ndarray, confidence: np.ndarray, block_lo: np.ndarray,
                         block_hi: np.ndarray, thresholds: np.ndarray, mask_id: int) -> np.ndarray: ...

    def masks_left(self, x: np.ndarray, block_lo: np.ndarray, block_hi: np.ndarray, mask_id: int) -> np.ndarray: ...

    def choose_bucket(self, length: int, buckets: Sequence[int]) -> int: ...

    def timestep_transfer(self, n_masked: np.ndarray, ratio: np.ndarray) -> np.ndarray: ...

    def reanchored_transfer(self, n_current: np.ndarray, n_total: np.ndarray, step: np.ndarray,
                            timesteps: np.ndarray, steps: np.ndarray) -> np.ndarray: ...

    def commit_above(self, x: np.ndarray, x0: np.ndarray, score: np.ndarray, block_lo: np.ndarray,
                     block_hi: np.ndarray, threshold: np.ndarray, mask_id: int) -> np.ndarray: ...


def c_core() -> ModuleType | None:
    """The compiled core, or None when the extension was not built (no compiler at install time)."""
    try:
        return importlib.import_module("seer_deploy.runtime._loopcore")
    except ImportError:
        return None


def python_core() -> ModuleType:
    """This module: the numpy twin."""
    return sys.modules[__name__]


def active_core() -> LoopCore:
    """The C core when it imports and SEER_DEPLOY_PURE_PYTHON is not 1, else the numpy twin."""
    compiled = None if os.environ.get(PURE_PYTHON_ENV) == "1" else c_core()
    core: LoopCore = compiled if compiled is not None else python_core()  # type: ignore[assignment]
    return core


def core_name(core: LoopCore | None = None) -> str:
    """'c' or 'python': which core `core` (default: the active one) is."""
    return (core if core is not None else active_core()).CORE_NAME


# ---------------------------------------------------------------- validation (same errors as the C core)


def _array(a: object, name: str, dtype: type[np.generic], ndim: int, writable: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype):
        got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
        raise TypeError(f"{name} must be a numpy array of dtype {np.dtype(dtype).name}, got {got}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got {a.ndim}-D")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; pass numpy.ascontiguousarray({name})")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} must be writable (it is updated in place)")
    return a


def _int64_scalar(value: object) -> int:
    v = operator.index(value)  # type: ignore[arg-type]
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise OverflowError(f"{v} does not fit in int64")
    return v


def _rows(a: np.ndarray, name: str, batch: int) -> None:
    if a.shape[0] != batch:
        raise ValueError(f"{name} has {a.shape[0]} rows but x has {batch}; pass one value per row")


def _block(lo: np.ndarray, hi: np.ndarray, seq: int) -> None:
    bad = np.flatnonzero((lo < 0) | (lo > hi) | (hi > seq))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"row {b}: block [{lo[b]}, {hi[b]}) is not inside [0, {seq}]; need 0 <= block_lo <= block_hi <= S"
        )


# ---------------------------------------------------------------- the functions


def transfer_schedule(n_masked: np.ndarray, steps: int) -> np.ndarray:
    """int64 [B, steps]: how many tokens each step commits; an even split, the remainder to the first steps."""
    steps = operator.index(steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    n = _array(n_masked, "n_masked", np.int64, 1)
    negative = np.flatnonzero(n < 0)
    if negative.size:
        raise ValueError(f"n_masked[{negative[0]}] is {n[negative[0]]}; counts must be >= 0")
    base, rem = np.divmod(n, steps)
    return base[:, None] + (np.arange(steps, dtype=np.int64)[None, :] < rem[:, None])


def _order_keys(confidence: np.ndarray) -> np.ndarray:
    """uint64 [B, S], unique per position, whose order is the commit order: confidence, then the lower position."""
    c = np.where(confidence == 0, np.float32(0), confidence)  # -0.0 ties with +0.0
    bits = c.view(np.uint32)
    key = np.where(bits & np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000)).astype(np.uint64)
    key[np.isnan(confidence)] = 0xFFFFFFFF
    positions = np.arange(confidence.shape[1], dtype=np.uint64)
    return (key << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - positions)


def commit_step(
    x: np.ndarray,
    x0: np.ndarray,
    confidence: np.ndarray,
    block_lo: np.ndarray,
    block_hi: np.ndarray,
    k: np.ndarray,
    mask_id: int,
) -> np.ndarray:
    """Commit, per row, the k[b] most confident masked positions of [block_lo[b], block_hi[b]): x[b, p] = x0[b, p].

    x is updated in place; returns int64 [B], the number committed per row (k larger than the candidates commits
    them all).
    """
    mask_id = _int64_scalar(mask_id)
    _array(x, "x", np.int64, 2, writable=True)
    _array(x0, "x0", np.int64, 2)
    _array(confidence, "confidence", np.float32, 2)
    lo, hi, kk = (_array(a, n, np.int64, 1) for a, n in ((block_lo, "block_lo"), (block_hi, "block_hi"), (k, "k")))
    batch, seq = x.shape
    for a, name in ((x0, "x0"), (confidence, "confidence")):
        if a.shape != x.shape:
            raise ValueError(
                f"{name} has shape [{a.shape[0]}, {a.shape[1]}] but x has [{batch}, {seq}]; they must match"
            )
    for a, name in ((lo, "block_lo"), (hi, "block_hi"), (kk, "k")):
        _rows(a, name, batch)
    _block(lo, hi, seq)
    negative = np.flatnonzero(kk < 0)
    if negative.size:
        raise ValueError(f"k[{negative[0]}] is {kk[negative[0]]}; the number to commit must be >= 0")
    if batch == 0 or seq == 0:
        return np.zeros(batch, dtype=np.int64)
    # Work on the columns some row's block covers.
    start, stop = int(lo.min()), int(hi.max())
    if start >= stop:
        return np.zeros(batch, dtype=np.int64)
    positions = np.arange(start, stop)
    window = x[:, start:stop]
    candidates = (window == mask_id) & (positions >= lo[:, None]) & (positions < hi[:, None])
    keys = np.where(candidates, _order_keys(np.ascontiguousarray(confidence[:, start:stop])), np.uint64(0))
    # Candidate keys are > 2**32, other keys 0: the k-th largest key is the threshold of the top k candidates.
    width = stop - start
    take = np.minimum(kk, width)
    ranked = np.sort(keys, axis=1)
    threshold = ranked[np.arange(batch), (width - take) % width]
    commit = candidates & (keys >= threshold[:, None]) & (take > 0)[:, None]
    window[commit] = x0[:, start:stop][commit]
    return commit.sum(axis=1, dtype=np.int64)


def commit_confident(
    x: np.ndarray,
    x0: np.ndarray,
    confidence: np.ndarray,
    block_lo: np.ndarray,
    block_hi: np.ndarray,
    thresholds: np.ndarray,
    mask_id: int,
) -> np.ndarray:
    """Parallel decoding's commit: per row, rank the masked positions of [block_lo[b], block_hi[b]) (the commit
    order above) and commit ranks 0..n-1 for the largest n such that every rank r in 1..n-1 has
    confidence >= thresholds[r] (rank 0 always: a row with candidates commits at least one).

    thresholds: float32 [T], T >= the widest block (`GenerationConfig.rank_thresholds`). x is updated in place;
    returns int64 [B], the number committed per row.
    """
    mask_id = _int64_scalar(mask_id)
    _array(x, "x", np.int64, 2, writable=True)
    _array(x0, "x0", np.int64, 2)
    _array(confidence, "confidence", np.float32, 2)
    _array(thresholds, "thresholds", np.float32, 1)
    lo, hi = _array(block_lo, "block_lo", np.int64, 1), _array(block_hi, "block_hi", np.int64, 1)
    batch, seq = x.shape
    for a, name in ((x0, "x0"), (confidence, "confidence")):
        if a.shape != x.shape:
            raise ValueError(
                f"{name} has shape [{a.shape[0]}, {a.shape[1]}] but x has [{batch}, {seq}]; they must match"
            )
    _rows(lo, "block_lo", batch)
    _rows(hi, "block_hi", batch)
    _block(lo, hi, seq)
    if batch and int((hi - lo).max()) > thresholds.shape[0]:
        raise ValueError(
            f"thresholds has {thresholds.shape[0]} ranks but a block spans {int((hi - lo).max())} positions; "
            "give one threshold per rank of the widest block"
        )
    committed = np.zeros(batch, dtype=np.int64)
    if batch == 0 or seq == 0:
        return committed
    start, stop = int(lo.min()), int(hi.max())
    if start >= stop:
        return committed
    positions = np.arange(start, stop)
    window = x[:, start:stop]
    conf = confidence[:, start:stop]
    candidates = (window == mask_id) & (positions >= lo[:, None]) & (positions < hi[:, None])
    keys = np.where(candidates, _order_keys(np.ascontiguousarray(conf)), np.uint64(0))
    order = np.argsort(keys, axis=1, kind="stable")[:, ::-1]  # keys are unique among candidates: best first
    n_candidates = candidates.sum(axis=1)
    ranked = np.take_along_axis(conf, order, axis=1)
    ranks = np.arange(stop - start)
    limits = np.full(stop - start, np.inf, dtype=np.float32)
    width = min(stop - start, thresholds.shape[0])
    limits[:width] = thresholds[:width]
    fails = ~(ranked >= limits[None, :]) & (ranks >= 1)[None, :] & (ranks < n_candidates[:, None])
    # n = the first failing rank, or every candidate when none fails.
    n = np.where(fails.any(axis=1), fails.argmax(axis=1), n_candidates)
    take = ranks[None, :] < n[:, None]
    chosen = np.zeros_like(candidates)
    np.put_along_axis(chosen, order, take, axis=1)
    window[chosen] = x0[:, start:stop][chosen]
    committed[:] = chosen.sum(axis=1)
    return committed


def masks_left(x: np.ndarray, block_lo: np.ndarray, block_hi: np.ndarray, mask_id: int) -> np.ndarray:
    """int64 [B]: masked positions left in each row's block [block_lo[b], block_hi[b]) (the stop test)."""
    mask_id = _int64_scalar(mask_id)
    _array(x, "x", np.int64, 2)
    lo, hi = _array(block_lo, "block_lo", np.int64, 1), _array(block_hi, "block_hi", np.int64, 1)
    batch, seq = x.shape
    _rows(lo, "block_lo", batch)
    _rows(hi, "block_hi", batch)
    _block(lo, hi, seq)
    positions = np.arange(seq)
    inside = (positions >= lo[:, None]) & (positions < hi[:, None])
    return ((x == mask_id) & inside).sum(axis=1, dtype=np.int64)


def choose_bucket(length: int, buckets: Sequence[int]) -> int:
    """Index of the smallest bucket >= length (the first such index on equal buckets); ConfigError when none fits."""
    length = operator.index(length)
    if length < 0:
        raise ConfigError(f"length {length} is negative; lengths are >= 0")
    try:
        items = list(buckets)
    except TypeError:
        raise TypeError("buckets must be a sequence of ints") from None
    if not items:
        raise ConfigError("no length buckets given; build the engine with at least one bucket")
    values: list[int] = []
    for i, item in enumerate(items):
        value = operator.index(item)
        if value < 1:
            raise ConfigError(f"bucket {i} is {value}; buckets must be positive lengths")
        values.append(value)
    best = -1
    for i, value in enumerate(values):
        if value >= length and (best < 0 or value < values[best]):
            best = i
    if best < 0:
        raise ConfigError(
            f"length {length} does not fit the largest bucket ({max(values)}); rebuild the engine with a bucket "
            f">= {length} or lower gen_length"
        )
    return best


# ---------------------------------------------------------------- the Dream family's sampler (core.decoding)


def timestep_transfer(n_masked: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """int64 [B]: Dream's count int(float32(n) * ratio[b]) (never more than n), ratio = 1 - s / t in float32."""
    n = _array(n_masked, "n_masked", np.int64, 1)
    r = _array(ratio, "ratio", np.float32, 1)
    _rows(r, "ratio", n.shape[0])
    if n.size and (int(n.min()) < 0 or not bool(np.all((r >= 0) & (r <= 1)))):
        raise ValueError("n_masked must be >= 0 and ratio in [0, 1] (1 - s / t of two timesteps)")
    return np.minimum(n, (n.astype(np.float32) * r).astype(np.int64))


def reanchored_transfer(n_current: np.ndarray, n_total: np.ndarray, step: np.ndarray, timesteps: np.ndarray,
                        steps: np.ndarray) -> np.ndarray:
    """int64 [B]: Dimple's fallback count at step[b] of steps[b] over timesteps[b, :steps[b] + 1]: with r =
    float32(n_current / n_total), the first timestep s at index >= step + 1 with s < r whose int(n * (1 - s / r))
    is >= 1 (every mask at the last timestep, and where r is not above it: Dimple raises there)."""
    n, total = _array(n_current, "n_current", np.int64, 1), _array(n_total, "n_total", np.int64, 1)
    i, count = _array(step, "step", np.int64, 1), _array(steps, "steps", np.int64, 1)
    ts = _array(timesteps, "timesteps", np.float32, 2)
    for a, name in ((total, "n_total"), (i, "step"), (count, "steps"), (ts, "timesteps")):
        _rows(a, name, n.shape[0])
    if n.size and not bool(np.all((count >= 1) & (count < ts.shape[1]) & (i >= 0) & (i < count) & (n >= 0)
                                  & (total >= n) & (total >= 1))):
        raise ValueError("need 0 <= step < steps < timesteps' width and 0 <= n_current <= n_total, n_total >= 1")
    out = n.copy()
    for b in range(n.shape[0]):
        t, last = np.float32(n[b]) / np.float32(total[b]), ts[b, count[b]]
        if n[b] == 0 or not t > last:
            continue
        start = max(int(np.argmax(ts[b, : count[b] + 1] < t)), int(i[b]) + 1)
        for s in ts[b, start : count[b]]:
            k = int(np.float32(n[b]) * (np.float32(1) - s / t)) if s > last else int(n[b])
            if k >= 1:
                out[b] = k
                break
    return out


def commit_above(x: np.ndarray, x0: np.ndarray, score: np.ndarray, block_lo: np.ndarray, block_hi: np.ndarray,
                 threshold: np.ndarray, mask_id: int) -> np.ndarray:
    """Commit, in place, every masked position p of [block_lo[b], block_hi[b]) with score[b, p] > threshold[b]
    (NaN never passes): x[b, p] = x0[b, p]. Returns int64 [B], the number committed per row."""
    mask_id = _int64_scalar(mask_id)
    _array(x, "x", np.int64, 2, writable=True)
    _array(x0, "x0", np.int64, 2)
    _array(score, "score", np.float32, 2)
    thr = _array(threshold, "threshold", np.float32, 1)
    lo, hi = _array(block_lo, "block_lo", np.int64, 1), _array(block_hi, "block_hi", np.int64, 1)
    batch, seq = x.shape
    for a, name in ((x0, "x0"), (score, "score")):
        if a.shape != x.shape:
            raise ValueError(f"{name} has shape [{a.shape[0]}, {a.shape[1]}] but x has [{batch}, {seq}]; they must match")
    for a, name in ((thr, "threshold"), (lo, "block_lo"), (hi, "block_hi")):
        _rows(a, name, batch)
    _block(lo, hi, seq)
    positions = np.arange(seq)
    chosen = (x == mask_id) & (positions >= lo[:, None]) & (positions < hi[:, None]) & (score > thr[:, None])
    x[chosen] = x0[chosen]
    return chosen.sum(axis=1, dtype=np.int64)
