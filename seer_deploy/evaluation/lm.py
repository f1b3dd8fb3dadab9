"""Our lm-evaluation-harness model: generation tasks answered through the service, in its batches.

One `ServiceLM` stands for one mode: the same opened `Service` with that mode's generation settings and Seer
config. It keeps every `Run` it made, so the eval can report what the answers cost (tokens processed, passes,
seconds, Seer's kept length) next to the harness's scores. Requests keep the harness's order (documents in order),
so a mode's batches hold the same documents as every other mode's and as the bench's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lm_eval.api.model import LM

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.seer.config import SeerConfig
from seer_deploy.service import Request, Run, Service

# Why multiple-choice tasks are refused (see README "Evaluating on lm-evaluation-harness").
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


def _stops(gen_kwargs: dict[str, Any]) -> list[str]:
    until = gen_kwargs.get("until") or []
    return [until] if isinstance(until, str) else list(until)


def _request(args: tuple[Any, ...]) -> Request:
    """An Instance's (context, gen_kwargs[, {"visual": pictures}]) as a service request; the pictures (PIL images)
    go to the context's `<image>` placeholders in order."""
    context = args[0]
    visual = args[2].get("visual") if len(args) > 2 and isinstance(args[2], dict) else None
    if visual is None:
        return Request(context)
    pictures = tuple(visual) if isinstance(visual, list | tuple) else (visual,)
    return Request(context, pictures)


class ServiceLM(LM):  # type: ignore[misc]  # lm_eval ships no type information
    """lm-eval's `LM` over an opened `Service`, for one mode (generation settings and Seer config)."""

    MULTIMODAL = True  # tasks with doc_to_image hand pictures in; a text-only target refuses them in one line

    def __init__(self, service: Service, generation: GenerationConfig, seer: SeerConfig | None) -> None:
        super().__init__()
        self.service = service
        self.generation = generation
        self.seer = seer
        self.runs: list[Run] = []

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Every request through the service in its batches; each answer cut at its request's stop sequences.
        The task's max_gen_toks is not used: a diffusion model fills a canvas of --gen-length (as LLaDA's own
        evaluation sets it)."""
        if not requests:
            return []
        asks = [_request(tuple(r.args)) for r in requests]
        run = self.service.generate(asks, full_length=self.seer is None, seer=self.seer, generation=self.generation)
        self.runs.append(run)
        return [cut_at_stops(a.text, _stops(r.args[1] if len(r.args) > 1 else {}))
                for a, r in zip(run.answers, requests, strict=True)]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        raise ConfigError(f"this task {LOGLIKELIHOOD_REFUSAL}")

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise ConfigError(f"this task {LOGLIKELIHOOD_REFUSAL}")
