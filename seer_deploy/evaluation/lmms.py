"""Our lmms-eval model: its generation tasks answered through the service (answering.ServiceAnswers), pictures
included.

One `ServiceLMMS` stands for one mode. lmms-eval hands each request as (context, gen_kwargs, doc_to_visual, doc_id,
task, split) and keeps each task's documents in `task_dict`: the pictures are the task's doc_to_visual of the
document.
"""

from __future__ import annotations

from typing import Any

from lmms_eval.api.model import lmms
from PIL import Image

from seer_deploy.core.errors import ConfigError
from seer_deploy.evaluation.answering import LOGLIKELIHOOD_REFUSAL, ServiceAnswers, picture_request, stops
from seer_deploy.service import Prompt


class ServiceLMMS(lmms):  # type: ignore[misc]  # lmms_eval ships no type information
    """lmms-eval's `lmms` over one mode's `ServiceAnswers`."""

    def __init__(self, answers: ServiceAnswers) -> None:
        super().__init__()
        self.answers = answers

    def _request(self, args: tuple[Any, ...]) -> Prompt:
        context, _, doc_to_visual, doc_id, task, split = args
        visuals = doc_to_visual(self.task_dict[task][split][doc_id]) if doc_to_visual is not None else []
        visuals = visuals if isinstance(visuals, list | tuple) else [visuals]
        if not all(isinstance(v, Image.Image) for v in visuals):
            raise ConfigError(f"task '{task}' hands in video or audio, not pictures; the service answers about "
                              "pictures only: choose an image task (DocVQA, ChartQA, ...)")
        return picture_request(context, visuals)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        args = [tuple(r.args) for r in requests]
        return self.answers.answer([self._request(a) for a in args], [stops(a[1]) for a in args])

    def generate_until_multi_round(self, requests: list[Any]) -> list[str]:
        raise ConfigError("multi-round tasks (generate_until_multi_round) are not supported: each mode answers "
                          "one turn per document; choose a generate_until task")

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        raise ConfigError(f"this task {LOGLIKELIHOOD_REFUSAL}")
