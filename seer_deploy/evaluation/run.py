"""`seer-deploy eval`: every task once per mode on the same documents, through one opened service.

The target is opened once (`Service`); each mode is a harness model (lm-eval's `ServiceLM` or lmms-eval's
`ServiceLMMS`, both over answering.ServiceAnswers) with that mode's settings, and each (task, mode) is one
`simple_evaluate` of that harness with the per-document samples logged, so every mode is scored by the harness itself
on the same documents and compared with full length document by document.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ConfigError
from seer_deploy.evaluation.answering import ServiceAnswers
from seer_deploy.evaluation.modes import BASELINE, Mode, ModeSettings, mode_generation, mode_seer
from seer_deploy.evaluation.tasks import HARNESSES, Harness, generation_tasks, go_offline
from seer_deploy.runtime.loop import check_supported
from seer_deploy.service import SeerOptions, Service, ServiceOptions, resolve_seer

Say = Callable[[str], None]


@dataclass(frozen=True)
class EvalSettings:
    target: str
    tasks: tuple[str, ...]
    modes: tuple[Mode, ...]  # the baseline first (`parse_modes`)
    harness: str = "lm-eval"  # or "lmms-eval" (tasks.HARNESSES)
    service: ServiceOptions = field(default_factory=ServiceOptions)  # the target's options, as `generate` takes them
    mode_settings: ModeSettings = field(default_factory=ModeSettings)
    limit: int | None = None  # documents per task (the first ones)
    num_fewshot: int | None = None  # None: each task's own
    include_paths: tuple[Path, ...] = ()
    confidence: float = 0.95

    def validate(self) -> None:
        if not self.tasks:
            raise ConfigError("--tasks is empty; name at least one task, e.g. --tasks demo")
        if self.harness not in HARNESSES:
            raise ConfigError(f"--harness: unknown harness '{self.harness}'; choose from {', '.join(HARNESSES)}")
        if not self.modes or self.modes[0].name != BASELINE:
            raise ConfigError(f"the modes must start with '{BASELINE}', the baseline the others are compared with")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1 (documents per task), got {self.limit}")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise ConfigError(f"--num-fewshot must be >= 0, got {self.num_fewshot}")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        self.service.check()
        for mode in self.modes:
            mode_generation(mode, self.service.generation, self.mode_settings)


@dataclass
class Cell:
    """One task under one mode: the harness's score, per document, and what the answers cost."""

    task: str
    mode: str
    metric: str  # the harness's key, e.g. "exact_match,none" (metric,filter)
    value: float
    scores: list[float]  # per document, in document order
    answers: list[str]  # the model's raw answers, in document order
    metrics: dict[str, float]  # every metric the task reports
    tokens_processed: int
    passes: int
    seconds: float  # the service's generation time (the harness's own work left out: the same for every mode)
    mean_kept: float | None  # Seer's kept response length, None at full length
    gen_length: int


def open_service(settings: EvalSettings, say: Say) -> Service:
    """The target opened once; with Seer resolved up front when a mode needs it (the built-in defaults, with a
    warning, when the target has no calibrated config)."""
    options = replace(settings.service, seer=SeerOptions(on=False))
    if any(m.seer for m in settings.modes):
        seer = resolve_seer(settings.target, SeerOptions(on=True, config=settings.service.seer.config), say)
        options = replace(options, seer=SeerOptions(on=True, config=seer))
    return Service(settings.target, options, warn=say)


def run_eval(settings: EvalSettings, say: Say = lambda _: None) -> list[Cell]:
    """Every (task, mode) cell, tasks in the order given, modes in order (the baseline first)."""
    settings.validate()
    go_offline()
    harness = HARNESSES[settings.harness]
    harness.require()
    manager = harness.task_manager(settings.include_paths)
    tasks = generation_tasks(harness, manager, settings.tasks)
    service = open_service(settings, say)
    for mode in settings.modes:  # a mode the target cannot run (--kv-cache on an export without it) fails first
        check_supported(mode_generation(mode, service.options.generation, settings.mode_settings), service.backend)
    cells = []
    for task in tasks:
        for mode in settings.modes:
            say(f"{task}: {mode.name}")
            cells.append(run_cell(service, harness, manager, task, mode, settings))
    return cells


def run_cell(service: Service, harness: Harness, manager: Any, task: str, mode: Mode, settings: EvalSettings) -> Cell:
    """One task under one mode, scored by the harness, with the service's runs' costs."""
    # The service's settings: with the family's own rule where none was named (GenerationConfig.family_rule).
    generation = mode_generation(mode, service.options.generation, settings.mode_settings)
    seer = mode_seer(mode, service.seer, generation.gen_length, settings.mode_settings)
    answers = ServiceAnswers(service, generation, seer)
    results = harness.simple_evaluate()(
        model=harness.model(answers), tasks=[task], num_fewshot=settings.num_fewshot, limit=settings.limit,
        task_manager=manager, log_samples=True, bootstrap_iters=0, random_seed=None, numpy_random_seed=None,
        torch_random_seed=None, fewshot_random_seed=1234)
    metrics = {k: float(v) for k, v in results["results"][task].items()
               if "," in k and isinstance(v, numbers.Real) and "_stderr" not in k}
    if not metrics:
        raise ConfigError(f"task '{task}' reported no metric; give its YAML a metric_list")
    key = next(iter(metrics))
    scores, texts = per_document(results["samples"][task], key)
    runs = answers.runs
    kept = [a.seer.kept for r in runs for a in r.answers if a.seer is not None]
    return Cell(task, mode.name, key, metrics[key], scores, texts, metrics,
                tokens_processed=sum(r.tokens_processed for r in runs), passes=sum(r.passes for r in runs),
                seconds=sum(r.seconds for r in runs), mean_kept=sum(kept) / len(kept) if kept else None,
                gen_length=generation.gen_length)


def per_document(samples: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[str]]:
    """The per-document scores of metric `key` ('metric,filter') and the raw answers, in document order. lmms-eval's
    samples do not name their filter: a task of several filters then logs a document more than once, refused."""
    metric, _, filter_name = key.partition(",")
    chosen = sorted((s for s in samples if s.get("filter", "none") == (filter_name or "none")),
                    key=lambda s: s["doc_id"])
    if len({s["doc_id"] for s in chosen}) != len(chosen):
        raise ConfigError(f"the harness logged documents more than once for metric '{key}' (a task of several "
                          "filters whose samples do not name their filter); give the task one filter")
    return [float(s[metric]) for s in chosen], [str(s["resps"][0][0]) for s in chosen]
