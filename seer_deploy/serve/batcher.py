"""Batching: a bounded queue of rows and the one worker thread that owns the model (`Batcher`), and the per-call
worker (`CallBatcher`, `serve --batching call`); the step-level worker is serve/stepper.py.

HTTP handlers (on the event loop) submit rows and await their futures. The per-call worker takes the oldest row,
waits up to `max_wait_ms` (or until `max_batch` rows of its kind are queued), and runs every queued row of that kind
together, in arrival order: one kind = one generation setting = one `Service.generate` call, where the hybrid
scheduler batches their different kept lengths. The Service is not thread-safe, so nothing but the worker calls it.
A full queue refuses at once (429); a row past its deadline is dropped before it runs (504); a cancelled row
(its client went away) leaves the queue, or if it is running its result is discarded (per call) or it leaves at
the next pass (step-level); `close()` stops taking rows and drains the ones already taken.

Every admitted row settles exactly once, with one outcome: answered (run to a result), refused (the engine answered
it with an error), expired (its deadline passed) or cancelled (its client went away). `balance()` reads the counts
under the queue's lock, so admitted = settled + in flight holds in every reading.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

Row = TypeVar("Row")
OUTCOMES = ("answered", "refused", "expired", "cancelled")
GIVEN_UP = {"cancelled": "cancelled", "deadline": "expired"}  # cancel()'s reason -> the row's outcome


class QueueFull(Exception):
    """The queue cannot take these rows now; retry after a while (HTTP 429)."""


class Closed(Exception):
    """The batcher is shutting down and takes no new rows (HTTP 503)."""


class DeadlineExceeded(Exception):
    """The row waited past its deadline and was not run (HTTP 504)."""


class Observer(Protocol):
    """What the batcher reports (metrics)."""

    def queue_depth(self, rows: int) -> None: ...
    def batch(self, rows: int, seconds: float, waited: Sequence[float]) -> None: ...
    def dropped(self, reason: str, rows: int) -> None: ...
    def round(self, report: RoundReport) -> None: ...


@dataclass(frozen=True)
class RoundReport:
    """One round of the step-level worker: every live row's next pass (serve/stepper.py)."""

    live: int  # rows live in the round
    admitted: int  # rows that joined since the last round
    passes: Sequence[tuple[int, float, bool, bool]]  # per forward pass: rows, seconds, mixes steps, mixes settings
    first_pass_waits: Sequence[float]  # for the rows admitted: seconds from arrival to their first pass


@dataclass(eq=False)
class Job(Generic[Row]):
    """One row in the queue, and the future its handler awaits (set from the worker thread)."""

    row: Row
    key: Hashable
    deadline: float  # time.monotonic() past which the row is not run
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    queued_at: float = field(default_factory=time.monotonic)
    state: str = "queued"  # queued -> running -> done, or -> cancelled / expired
    given_up: str | None = None  # set while running: its handler left (cancel()'s reason); the result is discarded

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        """Resolve the handler's future from any thread (a no-op if the handler already gave up)."""

        def resolve() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)

        try:
            self.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # the handler's loop is closed: nobody is waiting
            pass


Runner = Callable[[list[Row]], Sequence[Any]]  # rows of one kind -> a result (or an Exception) per row


class Batcher(Generic[Row]):
    """The queue and its worker thread (`_work`, a subclass's); the model is called only from the worker."""

    def __init__(self, *, max_batch: int, max_wait_ms: float, max_queue: int,
                 observer: Observer | None = None) -> None:
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self._observer = observer
        self._queue: list[Job[Row]] = []
        self._cond = threading.Condition()
        self._closing = False
        self.admitted = 0  # rows taken into the queue
        self.outcomes = dict.fromkeys(OUTCOMES, 0)  # how the admitted rows settled
        self._thread = threading.Thread(target=self._work, name="seer-serve-worker", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def accepting(self) -> bool:
        return not self._closing and self.alive

    @property
    def settled(self) -> int:
        return sum(self.outcomes.values())

    def balance(self) -> tuple[int, Mapping[str, int]]:
        """Rows admitted and how many settled with each outcome, read together (one consistent reading)."""
        with self._cond:
            return self.admitted, dict(self.outcomes)

    def submit(self, rows: Sequence[tuple[Row, Hashable]], deadline: float) -> list[Job[Row]]:
        """Queue rows (all or none) on the calling event loop; QueueFull or Closed refuses them."""
        loop = asyncio.get_running_loop()
        jobs = [Job(row, key, deadline, loop, loop.create_future()) for row, key in rows]
        with self._cond:
            if not self.accepting:
                raise Closed("the server is shutting down")
            if len(self._queue) + len(jobs) > self.max_queue:
                self._report("dropped", "queue_full", len(jobs))
                raise QueueFull(f"the queue is full ({len(self._queue)} of {self.max_queue} rows waiting)")
            self._queue.extend(jobs)
            self.admitted += len(jobs)
            self._report("queue_depth", len(self._queue))
            self._cond.notify_all()
        return jobs

    def cancel(self, jobs: Sequence[Job[Row]], reason: str = "cancelled") -> int:
        """Take queued rows out (reason: their client went away, "cancelled", or their deadline passed, "deadline");
        rows already running finish and their results are dropped (they settle then). Returns how many rows left
        the queue."""
        outcome = GIVEN_UP[reason]
        with self._cond:
            taken = [j for j in jobs if j.state == "queued"]
            for job in taken:
                job.state = outcome
                self._queue.remove(job)
            for job in jobs:
                if job.state == "running" and job.given_up is None:
                    job.given_up = reason
            self.outcomes[outcome] += len(taken)
            if taken:
                self._report("dropped", reason, len(taken))
                self._report("queue_depth", len(self._queue))
        return len(taken)

    def close(self, timeout: float | None = None) -> None:
        """Stop taking rows, run the ones already queued, and stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _report(self, what: str, *args: Any) -> None:
        if self._observer is not None:
            getattr(self._observer, what)(*args)

    def _work(self) -> None:
        raise NotImplementedError

    def _expire(self, now: float) -> None:
        """Settle the queued rows past their deadline (504), under the lock."""
        expired = [j for j in self._queue if j.deadline <= now]
        for job in expired:
            job.state = "expired"
            self._queue.remove(job)
            job.settle(error=DeadlineExceeded("the request waited past its deadline"))
        if expired:
            self.outcomes["expired"] += len(expired)
            self._report("dropped", "deadline", len(expired))

    def _take(self, jobs: Sequence[Job[Row]]) -> None:
        """Move jobs from the queue to running, under the lock."""
        for job in jobs:
            job.state = "running"
            self._queue.remove(job)
        self._report("queue_depth", len(self._queue))

    def _finish(self, done: Sequence[tuple[Job[Row], Any]]) -> None:
        """Settle running rows with their results (an Exception: refused): counted before any handler hears, so a
        handler that has its answer sees it settled; a row whose handler gave up counts as that."""
        with self._cond:
            given_up: dict[str, int] = {}
            for job, result in done:
                job.state = "done"
                if job.given_up is not None:
                    given_up[job.given_up] = given_up.get(job.given_up, 0) + 1
                    self.outcomes[GIVEN_UP[job.given_up]] += 1
                else:
                    self.outcomes["refused" if isinstance(result, BaseException) else "answered"] += 1
        for reason, rows in given_up.items():
            self._report("dropped", reason, rows)
        for job, result in done:
            if isinstance(result, BaseException):
                job.settle(error=result)
            else:
                job.settle(result)

    def _start(self) -> None:
        self._thread.start()


class CallBatcher(Batcher[Row]):
    """`serve --batching call`: rows of one kind run together in one call, to its end."""

    def __init__(self, runner: Runner[Row], *, max_batch: int, max_wait_ms: float, max_queue: int,
                 observer: Observer | None = None) -> None:
        super().__init__(max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, observer=observer)
        self._runner = runner
        self._start()

    def _next_batch(self) -> list[Job[Row]] | None:
        """The next rows to run (waiting for them as the rules say); None when closed and drained."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                first = self._queue[0]
                fill_by = first.queued_at + self.max_wait
                same = sum(1 for j in self._queue if j.key == first.key)
                now = time.monotonic()
                if same < self.max_batch and now < fill_by and not self._closing:
                    self._cond.wait(fill_by - now)
                    continue
                self._expire(now)
                if not self._queue:
                    continue
                key = self._queue[0].key
                batch = [j for j in self._queue if j.key == key][: self.max_batch]
                self._take(batch)
                return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            start = time.monotonic()
            results = run_rows(self._runner, [j.row for j in batch])
            seconds = time.monotonic() - start
            self._finish(list(zip(batch, results, strict=True)))
            self._report("batch", len(batch), seconds, [start - j.queued_at for j in batch])


def run_rows(runner: Runner[Row], rows: list[Row]) -> Sequence[Any]:
    """A runner's results for rows; on a bug or a broken engine each row is told the exception."""
    try:
        results: Sequence[Any] = runner(rows)
        if len(results) != len(rows):
            raise RuntimeError(f"the runner answered {len(results)} of {len(rows)} rows")
    except Exception as exc:  # noqa: BLE001  # each row of the batch is told
        results = [exc] * len(rows)
    return results
