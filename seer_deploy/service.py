"""The one generation service: requests in, answers out, for every kind of target.

`generate(requests, target, options)` (or a `Service` kept open for many calls) is what the CLI, the demo, the
bench and a server call. It decides how a request runs, the same way for a checkpoint, an export or an engine
directory, text or multimodal: options checked before anything loads, the target opened (`runtime.openers`), the
Seer config found and fitted to the engine, then batches of `batch_size` requests through the one runtime loop
(`runtime.loop.run_generation`: step zero, Seer's plan, the batch scheduler, the executor). Pictures are a
capability of the target: a batch's images are encoded by the target's backend and its prompts point at them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from PIL import Image

from seer_deploy.core.backend import Backend
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.families.families import authors_rule
from seer_deploy.models.prompts.image_placeholders import expand_placeholders
from seer_deploy.models.prompts.prompt import Prompt, check_prompt_images, load_pictures
from seer_deploy.runtime.loop import LoopOptions, check_prompts, check_supported, guidance_refusal, run_generation
from seer_deploy.runtime.openers import open_target
from seer_deploy.runtime.targets import (
    Description,
    TargetOptions,
    TemplateChoice,
    describe,
    find_seer_config,
)
from seer_deploy.seer.config import SeerConfig, TailContext
from seer_deploy.seer.options import SeerOptions
from seer_deploy.seer.plan import SeerReport

__all__ = ["Answer", "Prepared", "Prompt", "Run", "SeerOptions", "Service", "ServiceOptions", "TargetOptions",
           "TemplateChoice", "generate", "resolve_seer"]


@dataclass(frozen=True)
class ServiceOptions:
    """How requests run: the generation settings, how the target opens, Seer, the chat template, the batch and the
    seed. None keeps what the target says (its engine settings, its calibrated Seer config, its chat template)."""

    generation: GenerationConfig = field(default_factory=GenerationConfig)
    target: TargetOptions = field(default_factory=TargetOptions)
    seer: SeerOptions = field(default_factory=SeerOptions)
    template: TemplateChoice | None = None  # a chat template instead of the target's own (text None: raw prompts)
    batch_size: int = 8  # requests per step zero (TensorRT: at most the engine's max batch)
    seed: int = 0

    def check(self) -> None:
        """ConfigError for settings no target can run, before anything loads (the generation settings checked
        themselves when they were made)."""
        self.target.check()
        self.seer.check(self.generation.gen_length)
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")


@dataclass
class Answer:
    request: Prompt
    text: str
    tokens: list[int]  # response ids (a cut tail holds EOS)
    seer: SeerReport | None = None  # what Seer did for this request
    passes: int = 0  # forward passes this request made, step zero included (parallel decoding: the model's choice)


@dataclass
class Run:
    """Answers of a request set, and what they cost."""

    answers: list[Answer]
    backend: str
    seer: SeerConfig | None  # the Seer config that ran, None at full length
    passes: int  # forward passes, over all batches
    tokens_processed: int  # real tokens through the model, over all batches
    seconds: float
    generation: GenerationConfig | None = None  # the settings the answers were made with
    step_zero_seconds: float = 0.0  # of `seconds`, spent in step zero (over all batches)
    # Time to first step: what a user waits before the model has worked once. load_seconds is the service's opening
    # of the target (Seer config, backend, tokenizer); first_step_seconds adds this call's time up to the end of its
    # first batch's step zero (prompts encoded, anything the backend opens on first use, the first forward pass).
    load_seconds: float = 0.0
    first_step_seconds: float = 0.0

    @property
    def reports(self) -> list[SeerReport | None]:
        return [a.seer for a in self.answers]


@dataclass(frozen=True)
class Prepared:
    """Requests checked and tokenized once (`Service.prepare`): what `Service.generate` runs and what a server
    reports. `ids` keep each `<image>` as one placeholder; `prompt_tokens` count each prompt as the model sees it,
    every picture at its own token count (anyres: its base view and crops)."""

    requests: tuple[Prompt, ...]
    ids: list[list[int]]
    pictures: list[list[Image.Image]]
    prompt_tokens: list[int]
    generation: GenerationConfig

    @classmethod
    def join(cls, parts: Sequence[Prepared]) -> Prepared:
        """Preparations of one generation config as one batch (a server's rows of one kind)."""
        if not parts or any(p.generation != parts[0].generation for p in parts):
            raise ConfigError("requests run together must share one generation config; run them apart")
        return cls(tuple(r for p in parts for r in p.requests), [i for p in parts for i in p.ids],
                   [x for p in parts for x in p.pictures], [n for p in parts for n in p.prompt_tokens],
                   parts[0].generation)


def resolve_seer(target: str | os.PathLike[str], options: SeerOptions, warn: Callable[[str], None],
                 described: Description | None = None) -> SeerConfig | None:
    """The Seer config a run uses: --seer-config, else the target's calibrated one (built-in defaults with a
    warning when --seer asks for Seer and none is found), with --tail-context and --first-canvas on top; None = full
    length."""
    if options.on is False:
        return None
    if isinstance(options.config, SeerConfig):
        seer: SeerConfig | None = options.config
    elif options.config is not None:
        seer = SeerConfig.load(options.config)
    else:
        seer = find_seer_config(target, described)
    if seer is None and options.on:
        warn("warning: no calibrated Seer config for this target; using the built-in defaults "
             "(run `seer-deploy calibrate` for a safe margin)")
        seer = SeerConfig()
    if seer is None:
        if options.tail_context is not None or options.first_canvas is not None:
            raise ConfigError("--tail-context and --first-canvas apply to Seer runs, and this target has no "
                              "calibrated Seer config; add --seer (built-in defaults) or --seer-config FILE")
        return None
    return options.applied(seer)


class Service:
    """A target opened once, answering requests in batches through the one runtime loop."""

    def __init__(self, target: str | os.PathLike[str], options: ServiceOptions | None = None,
                 warn: Callable[[str], None] = lambda message: None) -> None:
        opening = time.perf_counter()
        self.options = options or ServiceOptions()
        self.options.check()
        guidance = self.options.generation.cfg_scale
        described = describe(target)  # the target's kind and manifests, read once for the Seer config and the opener
        backend = self.options.target.backend
        if guidance > 0 and (backend not in (None, "torch") or described.kind != "checkpoint"):
            raise guidance_refusal(guidance, backend or described.kind)  # before anything loads
        seer = resolve_seer(target, self.options.seer, warn, described)
        self.backend: Backend
        self.backend, self.info = open_target(target, self.options.target, described, seer=seer)
        if self.options.generation.family_rule:
            self.options = with_authors_rule(self.options, self.info.config.family, self.info.config.prefix_dlm)
        check_supported(self.options.generation, self.backend)
        self.seer = self.info.seer_for(seer)
        self.tokenizer = self.info.tokenizer(self.options.template)
        self.load_seconds = time.perf_counter() - opening  # the start of time to first step (`Run`)

    def seer_for(self, on: bool | None, tail_context: TailContext | None = None) -> SeerConfig | None:
        """The Seer config one request runs with, settled here only (None: full length): on or off (None: the
        service's default), the built-in defaults where Seer is asked for and no calibrated config was found, the
        request's tail context instead of the config's; fitted to the engine. ConfigError for a tail context
        without Seer."""
        if tail_context is not None and on is False:
            raise ConfigError("tail_context applies to Seer runs; drop \"seer\": false (--no-seer) or tail_context")
        if on is False or (on is None and self.seer is None):
            if tail_context is not None:
                raise ConfigError("tail_context applies to Seer runs, and this target runs at full length by default; "
                                  "add \"seer\": true (--seer: built-in defaults) or drop tail_context")
            return None
        seer = self.seer if self.seer is not None else self.info.seer_for(SeerConfig())
        assert seer is not None
        return seer if tail_context is None else seer.with_(tail_context=tail_context)

    @property
    def batch_size(self) -> int:
        return min(self.options.batch_size, self.info.max_batch or self.options.batch_size)

    def generate(self, requests: Sequence[Prompt] | Prepared, progress: Callable[[int], None] = lambda done: None, *,
                 full_length: bool = False, seer: SeerConfig | None = None,
                 generation: GenerationConfig | None = None, seed: int | None = None,
                 on_settled: Callable[[int, list[int]], None] | None = None) -> Run:
        """Answer `requests` (or what `prepare` made of them) in batches, with the service's Seer config (`seer`
        instead, fitted to the engine; none with `full_length`), generation settings (`generation` instead) and
        seed (`seed` instead: batch n samples with seed + n); progress(n) after each batch of n; on_settled(i, ids)
        whenever request i's settled answer prefix grows (the response ids no later step changes: what a server
        streams).

        Only this method (and `prompt_ids`) runs the engine; `prepare` reads nothing that a run changes, so a
        server prepares requests with it from other threads while one thread generates."""
        called = time.perf_counter()
        if seed is not None and seed < 0:
            raise ConfigError(f"seed must be >= 0, got {seed}")
        if isinstance(requests, Prepared):
            if generation is not None and generation != requests.generation:
                raise ConfigError("these requests were prepared for another generation config; prepare them again")
            prepared = requests
        else:
            prepared = self.prepare(requests, generation)  # every input error before any model runs
        requests, ids, pictures, generation = prepared.requests, prepared.ids, prepared.pictures, prepared.generation
        seer = None if full_length else self.info.seer_for(seer) if seer is not None else self.seer
        answers: list[Answer] = []
        passes = tokens_processed = 0
        step_zero_seconds = first_step_seconds = 0.0
        start = time.perf_counter()
        for n, lo in enumerate(range(0, len(requests), self.batch_size)):
            batch = slice(lo, lo + self.batch_size)
            prompts = self._with_images(ids[batch], requests[batch], pictures[batch])
            hook = None if on_settled is None else partial(_report_settled, on_settled, lo)
            out = run_generation(self.backend, prompts, generation, ids=SpecialIds(mask=self.info.mask_id, pad=self.info.pad_id, eos=self.info.eos_id),
                                 seed=(self.options.seed if seed is None else seed) + n,
                                 seer=seer, options=LoopOptions(on_settled=hook))
            reports: list[SeerReport | None] = list(out.seer) if out.seer else [None] * len(prompts)
            for request, row, report, passes_made in zip(requests[batch], out.tokens.tolist(), reports, out.row_passes,
                                                   strict=True):
                answers.append(Answer(request, self.tokenizer.decode_answer(row), row, report, passes_made))
            passes += out.passes
            tokens_processed += out.tokens_processed
            step_zero_seconds += out.step_zero_seconds
            if n == 0:
                first_step_seconds = self.load_seconds + (out.step_zero_done_at - called)
            progress(len(prompts))
        return Run(answers, self.backend.name, seer, passes, tokens_processed, time.perf_counter() - start,
                   generation, step_zero_seconds, self.load_seconds, first_step_seconds)

    def prompt_ids(self, requests: Sequence[Prompt], generation: GenerationConfig | None = None) -> list[list[int]]:
        """The requests as one batch of prompt ids (checked to leave room for `generation`'s gen_length, the
        service's by default); for a multimodal target their pictures are encoded and set as the backend's image
        table, which the ids point at until the next batch."""
        prepared = self.prepare(requests, generation)
        return self._with_images(prepared.ids, prepared.requests, prepared.pictures)

    def prepare(self, requests: Sequence[Prompt], generation: GenerationConfig | None = None) -> Prepared:
        """Check and tokenize `requests` once, for `generation` (the service's by default): ConfigError for no
        request, settings this backend cannot run, pictures it cannot take or read, or a prompt that, its pictures'
        tokens included, leaves no room for gen_length. Reads nothing a run changes."""
        if not requests:
            raise ConfigError("no prompt given; pass --prompt TEXT or --prompts FILE.jsonl")
        if generation is None:
            generation = self.options.generation  # checked against the backend when the service opened
        elif generation != self.options.generation:
            check_supported(generation, self.backend)  # its own settings were checked when it was made
        check_prompt_images(requests, self.info.target, self.info.images is not None)
        pictures = load_pictures(requests)
        ids = [self.tokenizer.encode_request(r.prompt, r.messages) for r in requests]
        counts = [len(t) + self._picture_tokens(p) for t, p in zip(ids, pictures, strict=True)]
        generation.check_fits(self.backend.max_seq_len, max(counts), image_tokens=self.info.images is not None)
        images = self.info.images
        check_prompts(ids, generation, self.backend, self.info.mask_id,
                      None if images is None else images.image_token_index)
        return Prepared(tuple(requests), ids, pictures, counts, generation)

    def _picture_tokens(self, pictures: list[Image.Image]) -> int:
        """What a request's pictures add to its prompt: each one's tokens (anyres: its own count) less the one
        placeholder it replaces."""
        images = self.info.images
        if images is None:
            return 0
        return sum(images.picture_tokens(p, f"picture {i + 1}") - 1 for i, p in enumerate(pictures))

    def _with_images(self, ids: list[list[int]], requests: Sequence[Prompt], pictures: Sequence[list[Image.Image]]
                     ) -> list[list[int]]:
        """A batch's prompt ids; in a multimodal batch its pictures encoded into the image table, its placeholders
        into image ids."""
        images = self.info.images
        if images is None:
            return ids
        flat = [p for per_request in pictures for p in per_request]  # none for a batch of text-only requests
        tokens = images.set_pictures(self.backend, flat)
        counts = [len(r.images) for r in requests]
        return expand_placeholders(ids, counts, tokens, images.image_token_index, images.id_base)


def with_authors_rule(options: ServiceOptions, family: str, prefix_dlm: bool) -> ServiceOptions:
    """`options` with the family's own decoding rule (checked: ConfigError names what does not fit it)."""
    generation = dataclasses.replace(options.generation, **authors_rule(family, prefix_dlm))  # type: ignore[arg-type]
    return dataclasses.replace(options, generation=dataclasses.replace(generation, family_rule=False))


def _report_settled(on_settled: Callable[[int, list[int]], None], first: int, row: int, ids: np.ndarray) -> None:
    on_settled(first + row, ids.tolist())


def generate(requests: Sequence[Prompt], target: str | os.PathLike[str], options: ServiceOptions | None = None,
             progress: Callable[[int], None] = lambda done: None,
             warn: Callable[[str], None] = lambda message: None) -> Run:
    """Answer `requests` with TARGET: open it, run, return the answers (see `Service`)."""
    return Service(target, options, warn).generate(requests, progress)
