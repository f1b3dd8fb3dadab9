"""The server's side of the generation service: requests in as checked rows, answers out as results.

A `Responder` prepares a row once (the Service checks and tokenizes it, and settles its Seer config: `Service.seer_for`),
then runs rows either per call (`run`: rows of one kind, one `Service.generate`) or live (`admit`, `round`, `drop`:
`runtime.live.LiveRows`, rows joining and leaving between passes). Both cut an answer the same way, once
(`answer_cut`): streamed text and the final result. Only the batcher's worker thread runs rows (the Service is not
thread-safe); `prepare` is read-only, so handlers call it to refuse a bad row before it is queued.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from seer_deploy.core.backend import window_lead
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.runtime.live import LiveRows, Round
from seer_deploy.runtime.live_row import FinishedRow, RowRequest, takes
from seer_deploy.seer.config import SeerConfig, TailContext
from seer_deploy.service import Prepared, Service


@dataclass(frozen=True)
class Row:
    """One prompt to answer, with everything its batch must share (`key`) and what its answer needs."""

    prepared: Prepared = field(compare=False, repr=False)  # the request checked and tokenized once (Service.prepare)
    seer: SeerConfig | None  # settled once (Service.seer_for); None: full length
    max_tokens: int | None = None  # cut the answer to this many tokens (gen_length is max_tokens rounded up)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    solo: int | None = None  # per call, set for sampled rows: they run alone so that their seed alone decides them
    # Streaming: told the answer's settled text as it grows (from the worker's thread); not part of the row's kind
    on_text: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @property
    def generation(self) -> GenerationConfig:
        return self.prepared.generation

    @property
    def prompt_tokens(self) -> int:
        """The prompt as the model sees it, each picture at its own token count: what `usage` reports."""
        return self.prepared.prompt_tokens[0]

    @property
    def key(self) -> Hashable:
        """Per call, rows with equal keys run in one Service.generate call (a sampled row's key is its own)."""
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


@dataclass(frozen=True)
class Cut:
    """An answer as a client gets it: its text, its tokens, why it ended."""

    text: str
    tokens: int
    finish_reason: str


class Responder:
    """A Service as the server runs it: checked rows in, per call or live, results out."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._solo = itertools.count()  # per call, keys that make a sampled row run alone
        info = service.info
        self.live = LiveRows(service.backend, SpecialIds(info.mask_id, info.pad_id, info.eos_id),
                             max_call_rows=info.max_batch)
        self._live_rows: dict[int, Row] = {}

    @property
    def multimodal(self) -> bool:
        return self.service.info.images is not None

    def prepare(self, prompt: Prompt, generation: GenerationConfig, *, seer: bool | None,
                tail_context: TailContext | None, max_tokens: int | None, stop: tuple[str, ...],
                seed: int | None) -> Row:
        """A checked row, prepared by the service as the CLI's requests are (its pictures match its placeholders,
        its prompt leaves room for gen_length, its Seer settled; the CLI's one-line messages, as ConfigError)."""
        settled = self.service.seer_for(seer, tail_context)
        prepared = self.service.prepare([prompt], generation)
        sampled = generation.temperature > 0
        return Row(prepared, settled, max_tokens, stop, seed if sampled else None,
                   next(self._solo) if sampled else None)

    def answer_cut(self, row: Row, ids: Sequence[int], *, settled: bool = False) -> Cut:
        """The one cut of an answer: at its first stop id, to max_tokens, before its first stop string. A settled
        prefix (streaming) also holds back what the final text could still change (its last token, which a subword
        decoder may merge with the next, and the start of a stop string), so every text told is a prefix of the
        final one."""
        tokenizer = self.service.tokenizer
        end = tokenizer.answer_end(ids)
        tokens, reason = list(ids[: len(ids) if end is None else end]), "length" if end is None else "stop"
        if row.max_tokens is not None and len(tokens) > row.max_tokens:
            tokens, reason = tokens[: row.max_tokens], "length"
        elif settled and end is None:
            tokens = tokens[:-1]
        text = tokenizer.decode_answer(tokens)
        for stop in row.stop:
            at = text.find(stop)
            if at >= 0:
                text, reason = text[:at], "stop"
        if settled:
            text = text[: len(text) - (max((len(stop) for stop in row.stop), default=1) - 1)]
        return Cut(text, len(tokens), reason)

    def result(self, row: Row, tokens: Sequence[int], passes: int, seer: object | None) -> Result:
        cut = self.answer_cut(row, tokens)
        report = dataclasses.asdict(seer) if seer is not None else None  # type: ignore[call-overload]
        return Result(cut.text, cut.finish_reason, row.prompt_tokens, cut.tokens, passes, row.generation.gen_length,
                      report)

    def _tell(self, row: Row, ids: Sequence[int]) -> None:
        if row.on_text is not None:
            row.on_text(self.answer_cut(row, ids, settled=True).text)

    # ---------------------------------------------------------------- per call (serve --batching call)

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
        # A sampled row runs alone, with its own seed (batch 0: seed + 0, as `generate --seed`).
        listening = any(r.on_text is not None for r in rows)
        run = self.service.generate(Prepared.join([r.prepared for r in rows]), full_length=first.seer is None,
                                    seer=first.seer, seed=first.seed,
                                    on_settled=partial(self._settled, rows) if listening else None)
        return [self.result(row, answer.tokens, answer.passes, answer.seer)
                for row, answer in zip(rows, run.answers, strict=True)]

    def _settled(self, rows: Sequence[Row], index: int, ids: list[int]) -> None:
        self._tell(rows[index], ids)

    # ---------------------------------------------------------------- live (serve --batching step)

    def takes_live(self, row: Row) -> bool:
        """Whether a row joins the live rows: all but rows with pictures (their embeddings are a call's image
        table) and the rows `runtime.live_row.takes` leaves to a call of their own."""
        return not row.prepared.pictures[0] and takes(row.generation, row.seer, window_lead(self.service.backend))

    def admit(self, row: Row) -> int:
        """Take a row into the live rows (its step zero runs in the next round); its handle."""
        seed = row.seed if row.seed is not None else self.service.options.seed
        listen = None if row.on_text is None else partial(_told, self._tell, row)
        handle = self.live.admit(RowRequest(row.prepared.ids[0], row.generation, row.seer, seed, listen))
        self._live_rows[handle] = row
        return handle

    def drop(self, handle: int) -> None:
        self.live.drop(handle)
        self._live_rows.pop(handle, None)

    def round(self) -> tuple[Round, dict[int, Result]]:
        """Every live row's next pass; the results of the rows that finished, by handle."""
        done = self.live.round()
        return done, {f.handle: self._finished(f) for f in done.finished}

    def _finished(self, row: FinishedRow) -> Result:
        served = self._live_rows.pop(row.handle)
        return self.result(served, row.tokens.tolist(), row.passes, row.report)


def _told(tell: Callable[[Row, Sequence[int]], None], row: Row, ids: np.ndarray) -> None:
    tell(row, ids.tolist())
