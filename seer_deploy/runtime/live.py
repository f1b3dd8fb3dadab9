"""Rows that join and leave between passes: the runtime side of step-level continuous batching.

`LiveRows` holds the rows being answered, each with its own prompt, plan, cursor, KV slice and random generator,
and runs them in rounds: in a round every row that is due makes its next forward pass, the one `run_generation`
would make for it alone, in the same order. Rows admitted since the last round make their step zero in the next
round they are due, beside the other rows' later steps; a row leaves as soon as its last pass is made, and `drop`
takes one out between rounds.

Who is due: every live row gets an equal share of the model's work (start-time fair queueing over the positions
its passes compute; a row joins at the least share used). A row is due while its share used is within one pass of
the cheapest live row of the least used: so a short row (narrow passes: Seer's cut) makes several passes for each
of a long row's wide ones instead of waiting for the long row's pace, and the least served row is always due, so
none starves.

A row's pass in a shared call is its pass alone: left-padded to the call's prompt width and right-padded
(attention mask 0) to its widest row, its candidates its own, and where it samples (temperature > 0) or scores at
random (random remasking) its uniforms and scores drawn from its own generator over its own columns. So every
answer at temperature 0 is the row's `run_generation` alone, and a sampled row's too on backends that sample per
row (`samples_per_row`: the exported graphs).

Which rows share a call. Rows of one lane (`lane_of`: the commit rule and guidance, and on a backend that samples
a whole call at one temperature, the temperature) may; the hybrid cost model (`scheduler.split_units`) splits a
lane's rows, ordered by width (Seer's cut: kept slots + tail context; full length before step zero), into groups,
pass by pass. A group makes one call of each kind its rows need: `step0` for rows at step zero whose cut Seer reads
(the step graph computes the statistics for the call), with the group's other uncached steps beside them; `step`
for the uncached steps left (a backend whose step zero is greedy only: the sampled ones); `refresh` for rows
entering a block with the KV cache; `window_step` per window width. Every lane's due rows make their calls in the
round, so rows that cannot share a call still get their share.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from seer_deploy.contracts.sampling import draw_uniform
from seer_deploy.core.backend import (
    Backend,
    CacheBackend,
    KVCache,
    Step0Output,
    StepInput,
    StepOutput,
    WindowInput,
    is_device_array,
    kv_zeros,
    samples_per_row,
    window_lead,
)
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.runtime.executor import LoopContext, mask_columns
from seer_deploy.runtime.live_row import FinishedRow, LiveRow, RowPass, RowRequest, takes
from seer_deploy.runtime.loopcore import LoopCore, active_core
from seer_deploy.runtime.scheduler import StepCost, split_units, step_cost_of

CALL_KINDS = ("step0", "step", "refresh", "window_step")


@dataclass(frozen=True)
class Call:
    """One forward pass of a round, as metrics count it."""

    kind: str  # one of CALL_KINDS
    rows: int
    at_step_zero: int  # rows making their step zero in it
    settings: int  # distinct settings among its rows (size, steps, blocks, temperature, Seer, cache)
    seconds: float


@dataclass(frozen=True)
class Round:
    calls: tuple[Call, ...]
    finished: tuple[FinishedRow, ...]


def lane_of(config: GenerationConfig, backend: Backend) -> Hashable:
    """What rows must share to share a call: the commit rule and guidance (one per call), and the temperature on a
    backend that samples a call at one temperature."""
    temperature = None if samples_per_row(backend) else config.temperature
    return config.decode, config.threshold, config.factor, config.cfg_scale, temperature


class LiveRows:
    """The live rows of one backend: `admit` rows, run `round`s, `drop` rows; nothing here is thread-safe (one
    thread owns the backend)."""

    def __init__(self, backend: Backend, ids: SpecialIds, *, core: LoopCore | None = None,
                 cost: StepCost | None = None, max_call_rows: int | None = None) -> None:
        self.backend, self.mask_id, self.pad_id, self.eos_id = backend, ids.mask, ids.pad, ids.eos
        self.core = core or active_core()
        self.cost = cost or step_cost_of(backend)
        self.max_call_rows = max_call_rows
        self._rows: dict[int, LiveRow] = {}
        self._contexts: dict[Hashable, LoopContext] = {}
        self._handles = 0

    def __len__(self) -> int:
        return len(self._rows)

    def admit(self, request: RowRequest) -> int:
        """Take a row in (its step zero runs in the next round); returns its handle."""
        if not takes(request.config, request.seer, window_lead(self.backend)):
            raise ValueError("this row runs per call, not live (runtime.live_row.takes)")
        handle = self._handles
        self._handles += 1
        row = LiveRow(handle, request, self._context(request.config), handle)
        row.virtual = min((r.virtual for r in self._rows.values()), default=0.0)  # an equal share from now on
        self._rows[handle] = row
        return handle

    def drop(self, handle: int) -> None:
        """Take a row out (its client left, its deadline passed): it makes no further pass."""
        self._rows.pop(handle, None)

    def round(self) -> Round:
        """The next pass of every row due (`due`), in the calls the lanes and the cost model choose; the rows that
        finished."""
        lanes: dict[Hashable, list[LiveRow]] = {}
        due = sorted(self.due(), key=lambda r: r.order)
        for row in due:
            row.virtual += row.cost  # the share this pass uses
            lanes.setdefault(self._lane(row), []).append(row)
        calls: list[Call] = []
        for rows in lanes.values():
            ctx = self._contexts[lane_of(rows[0].config, self.backend)]
            for group in self._groups(rows):
                calls.extend(self._calls(ctx, group))
        finished = []
        for handle, row in list(self._rows.items()):
            if row.pending is None:
                finished.append(row.finished(self._contexts[lane_of(row.config, self.backend)]))
                del self._rows[handle]
        return Round(tuple(calls), tuple(finished))

    def due(self) -> list[LiveRow]:
        """The rows that make a pass this round: an equal share of the model's work for every live row (start-time
        fair queueing over positions computed). A row is due while its share used is within the cheapest live row's
        pass of the least used, so a short row (a few narrow passes) makes several passes for each of a long row's
        wide ones, every row's share grows, and the least served row is always due: none starves. Rows due together
        share calls."""
        if not self._rows:
            return []
        least = min(r.virtual for r in self._rows.values())
        quantum = min(r.cost for r in self._rows.values())
        return [r for r in self._rows.values() if r.virtual < least + quantum]

    def _lane(self, row: LiveRow) -> Hashable:
        """The row's lane; a sampled row on a backend that draws one noise per call is alone in its own (so that its
        seed alone decides it)."""
        alone = row.config.temperature > 0 and not samples_per_row(self.backend)
        return lane_of(row.config, self.backend), row.handle if alone else None

    def _context(self, config: GenerationConfig) -> LoopContext:
        """The lane's context: its commit rule and guidance (the scores of random remasking are each row's own)."""
        lane = lane_of(config, self.backend)
        if lane not in self._contexts:
            rule = GenerationConfig(decode=config.decode, threshold=config.threshold, factor=config.factor,
                                    cfg_scale=config.cfg_scale)
            self._contexts[lane] = LoopContext(self.backend, self.core, rule, self.mask_id, self.pad_id, self.eos_id,
                                               np.random.default_rng(0))
        return self._contexts[lane]

    def _groups(self, rows: list[LiveRow]) -> list[list[LiveRow]]:
        """The lane's rows split by the cost model: units of equal width, merged where it says so."""
        by_width: dict[int, list[LiveRow]] = {}
        for row in sorted(rows, key=lambda r: (r.width, r.order)):
            by_width.setdefault(row.width, []).append(row)
        units = list(by_width.values())
        runs = split_units([[r.work() for r in unit] for unit in units], self.cost)
        return [[r for unit in units[i:j] for r in unit] for i, j in runs]

    def _calls(self, ctx: LoopContext, group: list[LiveRow]) -> list[Call]:
        """A group's calls, one per kind its rows need (a window step per window width)."""
        per_row = samples_per_row(self.backend)
        kinds: dict[tuple[str, int], list[LiveRow]] = {}
        stats = any(r.pending is not None and r.pending.stats for r in group)
        for row in group:
            p = row.pending
            assert p is not None
            kind = p.kind
            if kind == "step" and stats and (per_row or row.config.temperature == 0):
                kind = "step0"  # beside the rows at step zero: the statistics are the call's, the rest is per row
            width = p.hi - p.lo if kind == "window_step" else 0
            kinds.setdefault((kind, width), []).append(row)
        calls = []
        for (kind, _), rows in sorted(kinds.items(), key=lambda item: CALL_KINDS.index(item[0][0])):
            for chunk in self._chunks(rows):
                calls.append(self._call(ctx, kind, chunk))
        return calls

    def _chunks(self, rows: list[LiveRow]) -> list[list[LiveRow]]:
        """Rows in calls the backend takes: at most max_call_rows, prompt + response within its positions."""
        chunks: list[list[LiveRow]] = [[]]
        for row in rows:
            chunk = chunks[-1]
            if chunk and ((self.max_call_rows is not None and len(chunk) >= self.max_call_rows)
                          or max(r.prompt_len for r in (*chunk, row)) + max(r.width for r in (*chunk, row))
                          > self.backend.max_seq_len):
                chunks.append(chunk := [])
            chunk.append(row)
        return chunks

    def _call(self, ctx: LoopContext, kind: str, rows: list[LiveRow]) -> Call:
        start = time.perf_counter()
        at_zero = sum(1 for r in rows if r.plan is None)
        passes = [r.pending for r in rows]
        assert all(p is not None for p in passes)
        if kind == "window_step":
            self._window(ctx, rows, cast(list[RowPass], passes))
        else:
            self._full(ctx, kind, rows, cast(list[RowPass], passes))
        sparsity_rows = list(self.backend.sparsity_rows)
        for row, p in zip(rows, passes, strict=True):
            assert p is not None
            row.after_pass(ctx, p, sparsity_rows)
        return Call(kind, len(rows), at_zero, len({r.settings() for r in rows}), time.perf_counter() - start)

    def _full(self, ctx: LoopContext, kind: str, rows: list[LiveRow], passes: list[RowPass]) -> None:
        """A call over the rows' whole columns (step zero, a step, a refresh)."""
        n = len(rows)
        P = max(r.prompt_len for r in rows)
        S = P + max(r.width for r in rows)
        x = np.full((n, S), self.pad_id, np.int64)
        real = np.zeros((n, S), np.int64)
        offsets = [P - r.prompt_len for r in rows]
        for j, (row, off) in enumerate(zip(rows, offsets, strict=True)):
            x[j, off : off + len(row.seq)] = row.seq
            real[j, off : off + len(row.seq)] = 1
        # Step zero's candidates are every mask of the row; a later step's those before its block's end.
        hi = np.array([off + (len(r.seq) if p.stats else p.hi) for r, p, off in zip(rows, passes, offsets,
                                                                                      strict=True)])
        temperature, uniform, seed = self._sampling(rows, passes, offsets, S)
        inputs = StepInput(x, None if bool(real.all()) else real, temperature, seed, P, ctx.config.cfg_scale,
                           mask_columns(x, hi, self.mask_id), uniform=uniform)
        out: Any
        if kind == "step0":
            out = self.backend.step0(inputs)
        elif kind == "refresh":
            out = cast(CacheBackend, self.backend).refresh(inputs)
        else:
            out = self.backend.step(inputs)
        commit_hi = np.array([off + p.hi if p.commits else 0 for p, off in zip(passes, offsets, strict=True)])
        self._commit(ctx, x, out, rows, passes, offsets, (np.zeros(n, np.int64), commit_hi))
        for j, (row, p, off) in enumerate(zip(rows, passes, offsets, strict=True)):
            own = slice(off, off + len(row.seq))
            row.seq = x[j, own].copy()
            if p.stats:
                assert isinstance(out, Step0Output)
                score = out.score
                row.out0 = Step0Output(out.token_ids[j : j + 1, own], out.confidence[j : j + 1, own],
                                       out.eos_prob[j : j + 1, own], out.sparsity[j : j + 1, :, own],
                                       None if score is None else score[j : j + 1, own])
            if kind == "refresh":
                row.kv = _kv_rows(out.kv, j, own)
                if row.plan is not None:  # (step zero's refresh: block 0's cache, set with the plan)
                    row.block_lo = p.lo

    def _window(self, ctx: LoopContext, rows: list[LiveRow], passes: list[RowPass]) -> None:
        """A cached call: each row's block only, against its keys and values (one window width per call)."""
        n = len(rows)
        P = max(r.prompt_len for r in rows)
        S = P + max(r.width for r in rows)
        W = passes[0].hi - passes[0].lo
        offsets = [P - r.prompt_len for r in rows]
        real = np.zeros((n, S), np.int64)
        first = rows[0].kv
        assert first is not None
        kv = kv_zeros(first, (first.shape[0], 2, n, first.shape[3], S, first.shape[5]))
        window = np.zeros((n, W), np.int64)
        for j, (row, p, off) in enumerate(zip(rows, passes, offsets, strict=True)):
            real[j, off : off + len(row.seq)] = 1
            kv[:, :, j : j + 1, :, off : off + len(row.seq)] = row.kv
            window[j] = row.seq[p.lo : p.hi]
        start = np.array([p.lo + off for p, off in zip(passes, offsets, strict=True)], np.int64)
        temperature, uniform, seed = self._sampling(rows, passes, [0] * n, W, own=W)
        out = cast(CacheBackend, self.backend).window_step(
            WindowInput(window, real, start, kv, temperature, seed, uniform=uniform))
        commit_hi = np.full(n, W, np.int64)
        self._commit(ctx, window, out, rows, passes, [0] * n, (np.zeros(n, np.int64), commit_hi), own=W)
        for j, (row, p) in enumerate(zip(rows, passes, strict=True)):
            row.seq[p.lo : p.hi] = window[j]

    def _sampling(self, rows: list[LiveRow], passes: list[RowPass], offsets: list[int], S: int, own: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray | None, int | None]:
        """Per-row temperatures and, where a row samples, its uniforms drawn from its own generator over its own
        columns, as its pass alone would draw them (or, on a backend that draws for the call, the seed)."""
        temperature = np.array([0.0 if p.greedy else r.config.temperature for r, p in zip(rows, passes,
                                                                                          strict=True)])
        if not (temperature > 0).any():
            return temperature, None, None
        seeds = [int(r.rng.integers(2**63 - 1)) if t > 0 else None for r, t in zip(rows, temperature, strict=True)]
        if not samples_per_row(self.backend):  # a sampled row is alone in its lane here (`_lane`): its seed
            return temperature, None, seeds[0]
        uniform = np.ones((len(rows), S), np.float32)
        for j, (row, seed, off) in enumerate(zip(rows, seeds, offsets, strict=True)):
            if seed is not None:
                width = own if own is not None else len(row.seq)
                uniform[j, off : off + width] = draw_uniform(seed, (1, width))[0]
        return temperature, uniform, None

    def _commit(self, ctx: LoopContext, x: np.ndarray, out: StepOutput | Any, rows: list[LiveRow], passes: list[RowPass],
                offsets: list[int], span: tuple[np.ndarray, np.ndarray], own: int | None = None) -> None:
        """Commit each row's pass in its columns [lo, hi) (`span`); a random-remasking row ranks by scores from its own
        generator (its columns)."""
        lo, hi = span
        confidence = out.confidence
        randoms = [j for j, (r, p) in enumerate(zip(rows, passes, strict=True))
                   if r.config.remasking == "random" and p.commits]
        if randoms:
            confidence = np.array(confidence, dtype=np.float32, copy=True)
            for j in randoms:
                width = own if own is not None else len(rows[j].seq)
                confidence[j, offsets[j] : offsets[j] + width] = rows[j].rng.random((1, width), dtype=np.float32)[0]
        k = np.array([p.k for p in passes], np.int64)
        ctx.commit(x, StepOutput(out.token_ids, confidence), lo, hi, k)


def _kv_rows(kv: KVCache, row: int, columns: slice) -> KVCache:
    """One row's keys and values over its own columns, as a copy (the call's tensor is freed)."""
    part = kv[:, :, row : row + 1, :, columns]
    return part.clone() if is_device_array(part) else np.ascontiguousarray(part)
