"""The server's side of the generation service: rows of one kind in, one `Service.generate` call, a result per row.

Only the batcher's worker thread calls `Engine.run` (the Service is not thread-safe); `Engine.prepare` is read-only
(tokenizer and checks), so handlers call it to refuse a bad row before it is queued.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.seer.config import SeerConfig, TailContext
from seer_deploy.service import Answer, Prepared, Service


@dataclass(frozen=True)
class SeerChoice:
    """A request's Seer extras: on/off (None: the server's default) and a tail context instead of the config's."""

    on: bool | None = None
    tail_context: TailContext | None = None


@dataclass(frozen=True)
class Row:
    """One prompt to answer, with everything its batch must share (`key`) and what its answer needs."""

    prepared: Prepared = field(compare=False, repr=False)  # the request checked and tokenized once (Service.prepare)
    seer: SeerChoice
    max_tokens: int | None = None  # cut the answer to this many tokens (gen_length is max_tokens rounded up)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    solo: int | None = None  # set for sampled rows: they run alone so that their seed alone decides them
    # Streaming: told the answer's settled text as it grows (from the engine's thread); not part of the row's kind
    on_text: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @property
    def request(self) -> Prompt:
        return self.prepared.requests[0]

    @property
    def generation(self) -> GenerationConfig:
        return self.prepared.generation

    @property
    def prompt_tokens(self) -> int:
        """The prompt as the model sees it, each picture at its own token count: what `usage` reports."""
        return self.prepared.prompt_tokens[0]

    @property
    def key(self) -> Hashable:
        """Rows with equal keys run in one Service.generate call (a sampled row's key is its own)."""
        return self.generation, self.seer, self.seed, self.solo


@dataclass(frozen=True)
class Result:
    """One answer, as the HTTP layer reports it."""

    text: str
    finish_reason: str  # "stop" (the answer ended, or hit a stop string) or "length" (cut by max_tokens / canvas)
    prompt_tokens: int
    completion_tokens: int
    passes: int  # forward passes the row made, step zero included
    gen_length: int
    seer: dict[str, Any] | None  # the SeerReport, None at full length

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage, with what Seer did (kept length, passes, tokens processed vs full length)."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens, "passes": self.passes,
                "gen_length": self.gen_length, "seer": self.seer}


class Engine:
    """A Service behind the batcher."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._solo = itertools.count()  # keys that make a sampled row run alone (its seed alone decides it)

    @property
    def multimodal(self) -> bool:
        return self.service.info.images is not None

    def prepare(self, request: Prompt, generation: GenerationConfig, seer: SeerChoice, *, max_tokens: int | None,
                stop: tuple[str, ...], seed: int | None) -> Row:
        """A checked row, prepared by the service as the CLI's requests are (its pictures match its placeholders,
        its prompt leaves room for gen_length; the CLI's one-line messages, as ConfigError)."""
        if seer.tail_context is not None and seer.on is False:
            raise ConfigError("tail_context applies to Seer runs; drop \"seer\": false or tail_context")
        if seer.on is None and seer.tail_context is not None and self.service.seer is None:
            raise ConfigError("tail_context applies to Seer runs, and this server runs at full length by default; "
                              "add \"seer\": true (built-in defaults) or drop tail_context")
        prepared = self.service.prepare([request], generation)
        sampled = generation.temperature > 0
        return Row(prepared, seer, max_tokens, stop, seed if sampled else None, next(self._solo) if sampled else None)

    def seer_for(self, choice: SeerChoice) -> tuple[bool, SeerConfig | None]:
        """(full_length, the Seer config to run instead of the service's) for a request's choice."""
        if choice.on is False or (choice.on is None and self.service.seer is None):
            return True, None
        base = self.service.seer or SeerConfig()  # "seer": true with no calibrated config: the built-in defaults
        if choice.tail_context is not None:
            return False, base.with_(tail_context=choice.tail_context)
        return False, None if self.service.seer is not None else base

    def run(self, rows: list[Row]) -> list[Result | Exception]:
        """Answer rows of one kind in one call; if the call fails, each row alone, so one bad row fails alone."""
        try:
            return list(self._generate(rows))
        except Exception as exc:  # noqa: BLE001  # handed to the row's handler, which answers with it
            if len(rows) == 1:
                return [exc]
        results: list[Result | Exception] = []
        for row in rows:
            try:
                results.extend(self._generate([row]))
            except Exception as exc:  # noqa: BLE001  # as above, for this row alone
                results.append(exc)
        return results

    def _generate(self, rows: Sequence[Row]) -> list[Result]:
        first = rows[0]
        full_length, seer = self.seer_for(first.seer)
        # A sampled row runs alone, with its own seed (batch 0: seed + 0, as `generate --seed`).
        listening = any(r.on_text is not None for r in rows)
        run = self.service.generate(Prepared.join([r.prepared for r in rows]), full_length=full_length,
                                    seer=seer, seed=first.seed,
                                    on_settled=partial(self._settled, rows) if listening else None)
        return [self._result(row, answer) for row, answer in zip(rows, run.answers, strict=True)]

    def _settled(self, rows: Sequence[Row], index: int, ids: list[int]) -> None:
        """Tell a streaming row its settled text: the answer so far, cut as its result will be (its first stop id,
        max_tokens, its stop strings), less what the final text could still change (the last token, whose text a
        subword decoder may merge with the next; the start of a stop string), so every text told is a prefix of the
        final one."""
        row = rows[index]
        if row.on_text is None:
            return
        text = self.service.tokenizer.decode_answer(ids[: -1 if row.max_tokens is None else min(len(ids) - 1,
                                                                                                row.max_tokens)])
        for stop in row.stop:
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        hold = max((len(stop) for stop in row.stop), default=1) - 1
        row.on_text(text[: len(text) - hold])

    def _result(self, row: Row, answer: Answer) -> Result:
        tokenizer = self.service.tokenizer
        stops = {self.service.info.eos_id} | ({tokenizer.eot_id} if tokenizer.eot_id is not None else set())
        end = next((i for i, t in enumerate(answer.tokens) if t in stops), None)
        tokens = answer.tokens[: len(answer.tokens) if end is None else end]
        text, reason = answer.text, "stop" if end is not None else "length"
        if row.max_tokens is not None and len(tokens) > row.max_tokens:
            tokens = tokens[: row.max_tokens]
            text, reason = tokenizer.decode_answer(tokens), "length"
        for stop in row.stop:
            at = text.find(stop)
            if at >= 0:
                text, reason = text[:at], "stop"
        report = dataclasses.asdict(answer.seer) if answer.seer is not None else None
        return Result(text, reason, row.prompt_tokens, len(tokens), answer.passes, row.generation.gen_length, report)
