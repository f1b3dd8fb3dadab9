"""The server's Prometheus metrics, in a registry of its own (one per app: two apps in a process never share or
collide, and nothing global is touched)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from seer_deploy.serve.batcher import RoundReport
from seer_deploy.serve.responder import Result

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LENGTH_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Metrics:
    """Queue depth, batch sizes, Seer's kept lengths and tokens against full length, latencies, refusals."""

    def __init__(self, replica: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("seer_serve_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.latency = Histogram("seer_serve_request_seconds", "Request latency, arrival to last byte", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("seer_serve_queue_depth", "Rows waiting for the worker", registry=r)
        self.inflight = Gauge("seer_serve_inflight_requests", "Requests being handled", registry=r)
        self.batch_rows = Histogram("seer_serve_batch_size", "Rows per Service.generate call", buckets=SIZE_BUCKETS,
                                    registry=r)
        self.batch_seconds = Histogram("seer_serve_batch_seconds", "Time of one Service.generate call",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("seer_serve_queue_wait_seconds", "Time a row waited before its batch ran",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.rows = Counter("seer_serve_rows", "Rows answered", registry=r)
        self.dropped_rows = Counter("seer_serve_rows_dropped", "Rows refused or dropped, by reason (queue_full, "
                                    "deadline, cancelled)", ["reason"], registry=r)
        self.kept = Histogram("seer_serve_kept_length", "Response slots Seer kept per row", buckets=LENGTH_BUCKETS,
                              registry=r)
        self.tokens = Counter("seer_serve_tokens_processed", "Tokens run through the model", registry=r)
        self.full_tokens = Counter("seer_serve_full_length_tokens", "Tokens the same rows cost at full length",
                                   registry=r)
        self.passes = Counter("seer_serve_passes", "Forward passes, summed over rows", registry=r)
        # Step-level batching (serve --batching step): the loop over live rows
        self.round_live, self.round_admitted, self.pass_rows, self.pass_seconds, self.first_pass = (
            Histogram(f"seer_serve_{name}", doc, buckets=buckets, registry=r) for name, doc, buckets in (
                ("round_live_rows", "Rows live in one round (each makes one pass)", SIZE_BUCKETS),
                ("round_admitted_rows", "Rows that joined the live rows before a round", (0, *SIZE_BUCKETS)),
                ("pass_rows", "Rows in one forward pass", SIZE_BUCKETS),
                ("pass_seconds", "Time of one forward pass (host work included)", PASS_BUCKETS),
                ("first_pass_seconds", "Time from a row's arrival to its first pass", LATENCY_BUCKETS)))
        self.forward_passes = Counter("seer_serve_forward_passes", "Forward passes the live rows ran", registry=r)
        self.mixed_passes = Counter("seer_serve_mixed_passes", "Forward passes that mixed rows at step zero with rows "
                                    "at later steps (mixes=steps), or rows of different settings (mixes=settings)",
                                    ["mixes"], registry=r)
        if replica is not None:
            Gauge("seer_serve_replica", "This replica (Ray Serve)", ["replica"], registry=r).labels(replica).set(1)

    # The batcher's Observer
    def queue_depth(self, rows: int) -> None:
        self.queue.set(rows)

    def batch(self, rows: int, seconds: float, waited: Sequence[float]) -> None:
        self.batch_rows.observe(rows)
        self.batch_seconds.observe(seconds)
        for w in waited:
            self.queue_wait.observe(w)

    def round(self, report: RoundReport) -> None:
        self.round_live.observe(report.live)
        self.round_admitted.observe(report.admitted)
        for wait in report.first_pass_waits:
            self.first_pass.observe(wait)
        for rows, seconds, mixes_steps, mixes_settings in report.passes:
            self.forward_passes.inc()
            self.pass_rows.observe(rows)
            self.pass_seconds.observe(seconds)
            if mixes_steps:
                self.mixed_passes.labels("steps").inc()
            if mixes_settings:
                self.mixed_passes.labels("settings").inc()

    def dropped(self, reason: str, rows: int) -> None:
        self.dropped_rows.labels(reason).inc(rows)

    def answered(self, result: Result) -> None:
        """A row's Seer report: its kept length and its tokens against full length's."""
        self.rows.inc()
        self.passes.inc(result.passes)
        if result.seer is not None:
            self.kept.observe(result.seer["kept"])
            self.tokens.inc(result.seer["tokens_processed"])
            self.full_tokens.inc(result.seer["full_tokens_processed"])
        else:  # full length: every pass over prompt + gen_length
            tokens = result.passes * (result.prompt_tokens + result.gen_length)
            self.tokens.inc(tokens)
            self.full_tokens.inc(tokens)

    def watch(self, balance: Callable[[], tuple[int, Mapping[str, int]]]) -> None:
        """Expose the batcher's row balance (admitted, settled by outcome, in flight), read at each scrape."""
        self.registry.register(RowBalance(balance))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RowBalance(Collector):
    """Rows admitted, settled (by outcome) and in flight from one reading of the batcher, so that
    admitted = settled + in flight holds in every scrape (separate counters could be read between two updates)."""

    def __init__(self, balance: Callable[[], tuple[int, Mapping[str, int]]]) -> None:
        self.balance = balance

    def collect(self) -> Iterator[Metric]:
        admitted, outcomes = self.balance()
        yield CounterMetricFamily("seer_serve_rows_admitted", "Rows taken into the queue", value=admitted)
        settled = CounterMetricFamily("seer_serve_rows_settled", "Admitted rows settled, by outcome (answered, "
                                      "refused, expired, cancelled)", labels=["outcome"])
        for outcome, rows in outcomes.items():
            settled.add_metric([outcome], rows)
        yield settled
        yield GaugeMetricFamily("seer_serve_rows_in_flight", "Admitted rows not yet settled (queued or running)",
                                value=admitted - sum(outcomes.values()))
