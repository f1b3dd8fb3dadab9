"""Where the eval's tasks come from: lm-evaluation-harness's own, the bundled demo tasks, and the user's YAMLs.

Offline first: nothing is downloaded at run time. The harness reads a task's data through `datasets`; with
HF_DATASETS_OFFLINE and HF_HUB_OFFLINE set (before `datasets` is imported: it reads them once), a task whose data is
not local fails in one line instead of reaching for the Hub. Real benchmarks read files the user has: a task YAML
with `dataset_path: json` and `dataset_kwargs: {data_files: ...}` in a directory given as --include-path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ConfigError

BUNDLED = Path(__file__).resolve().parent / "bundled_tasks"  # demo (held-out prompts) and demo_vl (pictures)
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "TRANSFORMERS_OFFLINE")


def go_offline() -> None:
    """The Hugging Face libraries' offline switches, unless the user set them: the eval never downloads."""
    for name in OFFLINE:
        os.environ.setdefault(name, "1")


def require_harness() -> None:
    """ConfigError when lm-evaluation-harness is not installed: it is an extra, not a dependency."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        raise ConfigError("seer-deploy eval needs lm-evaluation-harness, an optional extra: "
                          "pip install 'seer-deploy[eval]' (from a clone: pip install -e '.[eval]')") from exc


def task_manager(include_paths: Sequence[Path] = ()) -> Any:
    """lm-eval's TaskManager over its own tasks, the bundled ones and the user's directories."""
    from lm_eval.tasks import TaskManager

    for path in include_paths:
        if not Path(path).is_dir():
            raise ConfigError(f"--include-path {path} is not a directory; give the directory of your task YAMLs")
    return TaskManager(include_path=[str(BUNDLED), *(str(p) for p in include_paths)])


def generation_tasks(manager: Any, names: Sequence[str]) -> list[str]:
    """The leaf tasks of `names` (a group expands to its tasks), each checked to be a generation task."""
    from seer_deploy.evaluation.lm import LOGLIKELIHOOD_REFUSAL

    leaves: list[str] = []
    for name in names:
        try:
            loaded = manager.load([name])
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"--tasks: '{name}' is neither a task lm-evaluation-harness knows nor a task YAML "
                              f"({exc}); check the name, or add --include-path DIR for your own tasks") from exc
        for task_name, task in loaded["tasks"].items():
            output = task.get_config("output_type")
            if output != "generate_until":
                raise ConfigError(f"task '{task_name}' ({output}) {LOGLIKELIHOOD_REFUSAL}")
            leaves.append(task_name)
    return list(dict.fromkeys(leaves))
