"""Step-level continuous batching (`serve --batching step`, the default): one loop over live rows.

The worker keeps a set of live rows (`Responder.live`, `runtime.live.LiveRows`) and between any two rounds (a
round: every live row's next forward pass) it settles the rows that finished, drops the rows whose client left or
whose deadline passed (they make no further pass: 499 / 504), expires queued rows past their deadline, and admits
queued rows, oldest first, up to `max_batch` live rows; their step zero runs in the next round beside the others'
later steps. A request arriving while a long answer runs waits for one round, not for that answer.

Rows that cannot live (a row with pictures, progressive step zero: `Responder.takes_live`) run per call: when one is
the oldest queued row, its call (with the queued rows of its kind, up to `max_batch`) runs between two rounds. So
the queue is served in arrival order, and no row waits behind rows that came after it; a live row waits at most
one round for any other row's pass (every lane makes its calls in every round, `runtime.live`).
"""

from __future__ import annotations

import time
from typing import Any

from seer_deploy.serve.batcher import Batcher, Job, Observer, RoundReport, run_rows
from seer_deploy.serve.responder import Responder, Row


class StepBatcher(Batcher[Row]):
    """The queue and the worker that runs live rows pass by pass."""

    def __init__(self, responder: Responder, *, max_batch: int, max_wait_ms: float, max_queue: int,
                 observer: Observer | None = None) -> None:
        super().__init__(max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, observer=observer)
        self._responder = responder
        self._live: dict[int, Job[Row]] = {}  # handle -> job, touched by the worker only
        self._start()

    def _work(self) -> None:
        while True:
            taken = self._between_rounds()
            if taken is None:
                return
            admitted, per_call = taken
            if per_call:
                start = time.monotonic()
                results = run_rows(self._responder.run, [j.row for j in per_call])
                self._finish(list(zip(per_call, results, strict=True)))
                self._report("batch", len(per_call), time.monotonic() - start,
                             [start - j.queued_at for j in per_call])
            if self._live:
                self._round(admitted)

    def _between_rounds(self) -> tuple[list[Job[Row]], list[Job[Row]]] | None:
        """Rows leave and join: (the rows admitted, the rows of a call to run now); None when closed and drained."""
        with self._cond:
            while not self._queue and not self._live:
                if self._closing:
                    return None
                self._cond.wait()
            self._expire(time.monotonic())
            left = [(h, j) for h, j in self._live.items() if j.given_up is not None]
            admitted: list[Job[Row]] = []
            per_call: list[Job[Row]] = []
            for job in self._queue:
                if not self._responder.takes_live(job.row):
                    if not admitted:  # the oldest waiting row runs per call now, with the queued rows of its kind
                        per_call = [j for j in self._queue if j.key == job.key][: self.max_batch]
                    break
                if len(self._live) - len(left) + len(admitted) >= self.max_batch:
                    break
                admitted.append(job)
            self._take(admitted + per_call)
        for handle, job in left:  # its handler answered already (499 / 504): the row makes no further pass
            self._responder.drop(handle)
            del self._live[handle]
        if left:
            self._finish([(job, None) for _, job in left])
        refused: list[tuple[Job[Row], Any]] = []
        for job in admitted:
            try:
                self._live[self._responder.admit(job.row)] = job
            except Exception as exc:  # noqa: BLE001  # this row alone is told
                refused.append((job, exc))
        if refused:
            self._finish(refused)
        return [j for j in admitted if all(j is not r for r, _ in refused)], per_call

    def _round(self, admitted: list[Job[Row]]) -> None:
        start = time.monotonic()
        live = len(self._live)
        try:
            done, results = self._responder.round()
        except Exception as exc:  # noqa: BLE001  # a bug or a broken engine: every live row is told
            failed = list(self._live.items())
            for handle, _ in failed:
                self._responder.drop(handle)
            self._live.clear()
            self._finish([(job, exc) for _, job in failed])
            return
        finished = [(self._live.pop(handle), result) for handle, result in results.items()]
        if finished:
            self._finish(finished)
        passes = [(c.rows, c.seconds, 0 < c.at_step_zero < c.rows, c.settings > 1) for c in done.calls]
        self._report("round", RoundReport(live, len(admitted), passes, [start - j.queued_at for j in admitted]))

