"""The bench's measurements as data: one `RowResult` per (gen_length, batch size, row), the whole run as a
`BenchResult`, written as JSON (the record the markdown and the plot are rendered from) next to them.

Every file is written to a temp file in the output directory and renamed into place.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seer_deploy.bench.machine import Machine
from seer_deploy.bench.scaling import ScalingResult
from seer_deploy.core.atomic import write_atomic
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import read_json

SCHEMA_VERSION = 1
JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "bench.json", "bench.md", "bench.png"


@dataclass(frozen=True)
class RowResult:
    gen_length: int
    batch_size: int
    row: str
    seconds: float  # median over timed passes of the wall seconds to answer all prompts
    seconds_runs: list[float]
    latency_p50_s: float  # over requests, of each request's median latency (its batch call's wall time)
    latency_p95_s: float
    answer_tokens: int  # tokens before the first EOS, summed over the row's own answers
    tokens_per_s: float  # answer_tokens / seconds
    forward_passes: int
    tokens_processed: int  # real (non-padding) tokens through the model, over all forward passes
    speedup: float  # reference seconds / seconds, same setting
    seer_over_oracle: float | None  # Seer rows: speedup / the same engine's oracle speedup
    exact_match: float  # share of decoded answers equal to the task's answer
    identical_to_full: float  # share of decoded answers equal to the reference's (full length)
    mean_kept: float | None  # Seer and oracle rows: mean response slots the later steps ran on
    safe: float | None  # Seer and oracle rows: share kept at or past the full-length answer's end
    tokens_per_answer_token: float | None = None  # tokens_processed / answer_tokens: the work behind each answer token
    step_zero_share: float | None = None  # share of the row's time spent in step zero (rows of the runtime loop)
    # Time to first step (service rows): its engine's load time (opened once per bench) + the row's first call (the
    # warm-up batch) up to the end of its step zero, what a user's first request waits on a fresh service.
    first_step_s: float | None = None


@dataclass
class BenchResult:
    command: str
    started: str  # UTC, ISO 8601
    seconds: float  # wall seconds of the measurements
    machine: Machine
    settings: dict[str, Any]
    model: dict[str, Any]
    seer: dict[str, Any]
    rows: list[RowResult]
    row_descriptions: dict[str, str]
    skipped: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scaling: ScalingResult | None = None
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_json(data: dict[str, Any], path: Path) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1) + "\n"))


def load_json(path: Path) -> dict[str, Any]:
    """A bench JSON written by this version; ConfigError naming the problem otherwise."""
    data = read_json(path, "bench result", fix="run `seer-deploy bench --out DIR` first")
    if data.get("schema") != SCHEMA_VERSION:
        raise ConfigError(f"{path} is not a bench result of schema {SCHEMA_VERSION}; rerun `seer-deploy bench`")
    return data
