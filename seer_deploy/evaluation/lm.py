"""Our lm-evaluation-harness model: generation tasks answered through the service (answering.ServiceAnswers).

One `ServiceLM` stands for one mode. lm-eval hands each request as (context, gen_kwargs[, {"visual": pictures}]):
a task with doc_to_image hands its pictures in, for the context's `<image>` placeholders.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import LM

from seer_deploy.core.errors import ConfigError
from seer_deploy.evaluation.answering import LOGLIKELIHOOD_REFUSAL, ServiceAnswers, picture_request, stops
from seer_deploy.service import Prompt


def _request(args: tuple[Any, ...]) -> Prompt:
    visual = args[2].get("visual") if len(args) > 2 and isinstance(args[2], dict) else None
    pictures = () if visual is None else tuple(visual) if isinstance(visual, list | tuple) else (visual,)
    return picture_request(args[0], pictures)


class ServiceLM(LM):  # type: ignore[misc]  # lm_eval ships no type information
    """lm-eval's `LM` over one mode's `ServiceAnswers`."""

    MULTIMODAL = True  # tasks with doc_to_image hand pictures in; a text-only target refuses them in one line

    def __init__(self, answers: ServiceAnswers) -> None:
        super().__init__()
        self.answers = answers

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        args = [tuple(r.args) for r in requests]
        return self.answers.answer([_request(a) for a in args], [stops(a[1] if len(a) > 1 else {}) for a in args])

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        raise ConfigError(f"this task {LOGLIKELIHOOD_REFUSAL}")

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise ConfigError(f"this task {LOGLIKELIHOOD_REFUSAL}")
