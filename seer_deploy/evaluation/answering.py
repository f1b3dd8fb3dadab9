"""One mode's answers through the service, for either harness's model class (lm.py: lm-evaluation-harness; lmms.py:
lmms-eval): the requests in the harness's order (documents in order, so every mode's batches hold the same
documents, as the bench's do), each answer cut at its request's stop sequences, every `Run` kept for the table's
cost columns. Imports no harness.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.multimodal_files import IMAGE_TOKEN
from seer_deploy.models.pictures.image import to_rgb
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import Prompt, Run, Service

# Why multiple-choice tasks are refused (see docs/evaluation.md, "Multiple-choice (log-likelihood) tasks").
LOGLIKELIHOOD_REFUSAL = (
    "is a log-likelihood (multiple-choice) task, which needs log-probabilities of given continuations: the exported "
    "graphs return each position's chosen token and its confidence, not log-probabilities, and a masked diffusion "
    "model's likelihood is itself an estimate (LLaDA's evaluation averages Monte Carlo samples over masking ratios); "
    "choose generation tasks (output_type generate_until), e.g. gsm8k"
)


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """The text up to the first of the harness's stop sequences (`until`), as its own models cut it."""
    ends = [text.find(s) for s in stops if s]
    ends = [e for e in ends if e >= 0]
    return text[: min(ends)] if ends else text


def stops(gen_kwargs: Any) -> list[str]:
    """A request's stop sequences from its generation kwargs (`until`: a string, a list, or absent)."""
    until = gen_kwargs.get("until") if isinstance(gen_kwargs, dict) else None
    return [until] if isinstance(until, str) else list(until or [])


def picture_request(context: str, pictures: Sequence[Image.Image] = ()) -> Prompt:
    """A prompt and its pictures (in RGB, as a picture file is read) as a service request. A prompt with no `<image>`
    gets one per picture in front, as lmms-eval's own models place them (DocVQA's and ChartQA's prompts carry none);
    one that has them keeps its own."""
    if pictures and IMAGE_TOKEN not in context:
        context = " ".join([IMAGE_TOKEN] * len(pictures)) + "\n" + context
    return Prompt(context, tuple(to_rgb(p, "a task's picture") for p in pictures))


class ServiceAnswers:
    """An opened `Service` under one mode (generation settings and Seer config), keeping what each call cost."""

    def __init__(self, service: Service, generation: GenerationConfig, seer: SeerConfig | None) -> None:
        self.service = service
        self.generation = generation
        self.seer = seer
        self.runs: list[Run] = []

    def answer(self, requests: Sequence[Prompt], stop_lists: Sequence[Sequence[str]]) -> list[str]:
        """Every request through the service in its batches; each answer cut at its own stop sequences. The task's
        max_gen_toks / max_new_tokens is not used: a diffusion model fills a canvas of --gen-length (as LLaDA's own
        evaluation sets it)."""
        if not requests:
            return []
        run = self.service.generate(requests, full_length=self.seer is None, seer=self.seer,
                                    generation=self.generation)
        self.runs.append(run)
        return [cut_at_stops(a.text, s) for a, s in zip(run.answers, stop_lists, strict=True)]
