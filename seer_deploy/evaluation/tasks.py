"""Where the eval's tasks come from and who scores them: lm-evaluation-harness (text, and pictures by doc_to_image)
or lmms-eval (the multimodal benchmarks: DocVQA, ChartQA, ...), each with its own tasks, our bundled ones and the
user's YAMLs.

Offline first: nothing is downloaded at run time. Both harnesses read a task's data through `datasets`; with
HF_DATASETS_OFFLINE and HF_HUB_OFFLINE set (before `datasets` is imported: it reads them once), a task whose data is
not local fails in one line instead of reaching for the Hub. Real benchmarks read files the user has: a task YAML
with `dataset_path: json` (or parquet) and `dataset_kwargs: {data_files: ...}` in a directory given as --include-path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ConfigError
from seer_deploy.evaluation.answering import LOGLIKELIHOOD_REFUSAL, ServiceAnswers

EVALUATION = Path(__file__).resolve().parent
BUNDLED = EVALUATION / "bundled_tasks"  # lm-eval's demo (held-out prompts) and demo_vl (pictures)
BUNDLED_LMMS = EVALUATION / "bundled_tasks_lmms"  # lmms-eval's demo_vl, on the same documents
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "TRANSFORMERS_OFFLINE")
LMMS_EVAL = "lmms-eval==0.7.3"  # pyproject's eval extra holds what it needs; it is installed without its own list


def go_offline() -> None:
    """The Hugging Face libraries' offline switches, unless the user set them: the eval never downloads."""
    for name in OFFLINE:
        os.environ.setdefault(name, "1")


@dataclass(frozen=True)
class Harness:
    """lm-evaluation-harness; `LmmsEval` below differs in its package, its task loading and its model class."""

    name: str = "lm-eval"
    package: str = "lm_eval"
    bundled: Path = BUNDLED
    install: str = "pip install 'seer-deploy[eval]' (from a clone: pip install -e '.[eval]')"

    def require(self) -> None:
        """ConfigError naming the install when the harness is missing: it is an extra, not a dependency."""
        try:
            importlib.import_module(self.package)
        except ImportError as exc:
            raise ConfigError(f"seer-deploy eval --harness {self.name} needs {self.name}, an optional extra that is "
                              f"not installed ({exc}): {self.install}") from exc

    def task_manager(self, include_paths: Sequence[Path] = ()) -> Any:
        """The harness's TaskManager over its own tasks, our bundled ones and the user's directories."""
        for path in include_paths:
            if not Path(path).is_dir():
                raise ConfigError(f"--include-path {path} is not a directory; give the directory of your task YAMLs")
        manager_class = importlib.import_module(f"{self.package}.tasks").TaskManager
        return manager_class(include_path=[str(self.bundled), *(str(p) for p in include_paths)])

    def load(self, manager: Any, name: str) -> dict[str, Any]:
        """The leaf tasks of `name` by their names (a group expands to its tasks)."""
        return dict(manager.load([name])["tasks"])

    def model(self, answers: ServiceAnswers) -> Any:
        from seer_deploy.evaluation.lm import ServiceLM

        return ServiceLM(answers)

    def simple_evaluate(self) -> Any:
        return importlib.import_module(self.package).simple_evaluate


@dataclass(frozen=True)
class LmmsEval(Harness):
    name: str = "lmms-eval"
    package: str = "lmms_eval"
    bundled: Path = BUNDLED_LMMS
    install: str = (f"pip install 'seer-deploy[eval]' && pip install --no-deps {LMMS_EVAL} (--no-deps: its own "
                    "list would pull a torchvision that replaces or breaks the CPU torch; docs/evaluation.md)")

    def require(self) -> None:
        """As the base's; then lmms-eval's log (loguru, which importing its evaluator points at stdout at WARNING)
        goes to stderr at ERROR, so stdout holds only the table and a failure stays one line."""
        super().require()
        importlib.import_module("lmms_eval.evaluator")
        from loguru import logger

        logger.remove()
        logger.add(sys.stderr, level="ERROR")

    def load(self, manager: Any, name: str) -> dict[str, Any]:
        return _leaves(manager.load_task_or_group([name]))

    def model(self, answers: ServiceAnswers) -> Any:
        from seer_deploy.evaluation.lmms import ServiceLMMS

        return ServiceLMMS(answers)

    def simple_evaluate(self) -> Any:
        return importlib.import_module("lmms_eval.evaluator").simple_evaluate


HARNESSES: dict[str, Harness] = {h.name: h for h in (Harness(), LmmsEval())}


def _leaves(loaded: dict[Any, Any]) -> dict[str, Any]:
    """lmms-eval's {name: task} with groups as {group: {...}}, flattened to the tasks."""
    leaves: dict[str, Any] = {}
    for key, value in loaded.items():
        leaves.update(_leaves(value) if isinstance(value, dict) else {str(key): value})
    return leaves


def _missing_data(exc: BaseException) -> BaseException | None:
    """The download error under a task's failed load (lmms-eval retries it, so it arrives wrapped), if it is one."""
    last = getattr(exc, "last_attempt", None)
    inner = last.exception() if last is not None else exc
    return inner if isinstance(inner, ConnectionError | FileNotFoundError) else None


def generation_tasks(harness: Harness, manager: Any, names: Sequence[str]) -> list[str]:
    """The leaf tasks of `names` (a group expands to its tasks), each checked to be a generation task."""
    leaves: list[str] = []
    for name in names:
        try:
            loaded = harness.load(manager, name)
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"--tasks: '{name}' is neither a task {harness.name} knows nor a task YAML ({exc}); "
                              "check the name (or --harness), or add --include-path DIR for your own tasks") from exc
        except Exception as exc:
            inner = _missing_data(exc)
            if inner is None:
                raise
            raise ConfigError(f"--tasks: '{name}': its data is not on this machine and nothing is downloaded "
                              f"({type(inner).__name__}); give a task YAML over your local copy with --include-path, or "
                              "fill your Hugging Face datasets cache first (docs/evaluation.md)") from exc
        for task_name, task in loaded.items():
            output = task.get_config("output_type")
            if output in ("loglikelihood", "loglikelihood_rolling", "multiple_choice"):
                raise ConfigError(f"task '{task_name}' ({output}) {LOGLIKELIHOOD_REFUSAL}")
            if output != "generate_until":
                raise ConfigError(f"task '{task_name}' ({output}) is not a single-turn generation task; each mode "
                                  "answers one turn per document: choose a task with output_type generate_until")
            leaves.append(task_name)
    return list(dict.fromkeys(leaves))
