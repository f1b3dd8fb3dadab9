"""`seer-deploy eval`: every task once per mode on the same documents, through one opened service.

The target is opened once (`Service`); each mode is an lm-eval model (`ServiceLM`) over it with that mode's
settings, and each (task, mode) is one `lm_eval.simple_evaluate` with the per-document samples logged, so every mode
is scored by the harness itself on the same documents and compared with full length document by document.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ConfigError
from seer_deploy.evaluation.modes import BASELINE, Mode, ModeSettings, mode_generation, mode_seer
from seer_deploy.runtime.loop import check_supported
from seer_deploy.service import Service, ServiceOptions, resolve_seer

Say = Callable[[str], None]


@dataclass(frozen=True)
class EvalSettings:
    target: str
    tasks: tuple[str, ...]
    modes: tuple[Mode, ...]  # the baseline first (`parse_modes`)
    service: ServiceOptions = field(default_factory=ServiceOptions)  # the target's options, as `generate` takes them
    mode_settings: ModeSettings = field(default_factory=ModeSettings)
    limit: int | None = None  # documents per task (the first ones)
    num_fewshot: int | None = None  # None: each task's own
    include_paths: tuple[Path, ...] = ()
    confidence: float = 0.95

    def validate(self) -> None:
        if not self.tasks:
            raise ConfigError("--tasks is empty; name at least one task, e.g. --tasks demo")
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
    options = replace(settings.service, seer=False, tail_context=None, first_canvas=None)
    if any(m.seer for m in settings.modes):
        seer = resolve_seer(settings.target, replace(settings.service, seer=True, tail_context=None,
                                                     first_canvas=None), say)
        options = replace(options, seer=True, seer_config=seer)
    return Service(settings.target, options, warn=say)


def run_eval(settings: EvalSettings, say: Say = lambda _: None) -> list[Cell]:
    """Every (task, mode) cell, tasks in the order given, modes in order (the baseline first)."""
    from seer_deploy.evaluation.tasks import generation_tasks, go_offline, require_harness, task_manager

    settings.validate()
    go_offline()
    require_harness()
    manager = task_manager(settings.include_paths)
    tasks = generation_tasks(manager, settings.tasks)
    service = open_service(settings, say)
    for mode in settings.modes:  # a mode the target cannot run (--kv-cache on an export without it) fails first
        check_supported(mode_generation(mode, settings.service.generation, settings.mode_settings), service.backend)
    cells = []
    for task in tasks:
        for mode in settings.modes:
            say(f"{task}: {mode.name}")
            cells.append(run_cell(service, manager, task, mode, settings))
    return cells


def run_cell(service: Service, manager: Any, task: str, mode: Mode, settings: EvalSettings) -> Cell:
    """One task under one mode, scored by the harness, with the service's runs' costs."""
    from lm_eval import simple_evaluate

    from seer_deploy.evaluation.lm import ServiceLM

    generation = mode_generation(mode, settings.service.generation, settings.mode_settings)
    seer = mode_seer(mode, service.seer, generation.gen_length, settings.mode_settings)
    lm = ServiceLM(service, generation, seer)
    results = simple_evaluate(model=lm, tasks=[task], num_fewshot=settings.num_fewshot, limit=settings.limit,
                              task_manager=manager, log_samples=True, bootstrap_iters=0, random_seed=None,
                              numpy_random_seed=None, torch_random_seed=None, fewshot_random_seed=1234)
    metrics = {k: float(v) for k, v in results["results"][task].items()
               if "," in k and isinstance(v, int | float) and "_stderr" not in k}
    if not metrics:
        raise ConfigError(f"task '{task}' reported no metric; give its YAML a metric_list")
    key = next(iter(metrics))
    scores, answers = per_document(results["samples"][task], key)
    kept = [a.seer.kept for r in lm.runs for a in r.answers if a.seer is not None]
    return Cell(task, mode.name, key, metrics[key], scores, answers, metrics,
                tokens_processed=sum(r.tokens_processed for r in lm.runs), passes=sum(r.steps_run for r in lm.runs),
                seconds=sum(r.seconds for r in lm.runs), mean_kept=sum(kept) / len(kept) if kept else None,
                gen_length=generation.gen_length)


def per_document(samples: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[str]]:
    """The per-document scores of metric `key` ('metric,filter') and the raw answers, in document order."""
    metric, _, filter_name = key.partition(",")
    chosen = sorted((s for s in samples if s.get("filter", "none") == (filter_name or "none")),
                    key=lambda s: s["doc_id"])
    return [float(s[metric]) for s in chosen], [str(s["resps"][0][0]) for s in chosen]
