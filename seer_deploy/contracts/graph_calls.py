"""One call of an exported graph, by its declaration (contracts.graphs): the feed made from a `StepInput`, and the outputs
turned back into the `Step0Output` / `StepOutput` every backend returns. ONNX Runtime and TensorRT share both, so
the two engines cannot disagree on what a call sends or what it gets back."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from seer_deploy.contracts.graphs import (
    ATTENTION_MASK,
    CANDIDATES,
    CONFIDENCE,
    EOS_PROB,
    INPUT_IDS,
    KV,
    POSITION_SHIFT,
    PROMPT_KV,
    PROMPT_WIDTH,
    RUN_IDS,
    SCORE,
    SCORE_RULE,
    SCORE_TEMPERATURE,
    SPARSITY,
    TEMPERATURE,
    TOKEN_IDS,
    WINDOW_CONFIDENCE,
    WINDOW_IDS,
    WINDOW_START,
    WINDOW_TOKEN_IDS,
    WITH_STATS,
    GraphIO,
    TensorIO,
)
from seer_deploy.contracts.sampling import step_feed
from seer_deploy.core.backend import PromptInput, RefreshOutput, Step0Output, StepInput, StepOutput, WindowInput
from seer_deploy.core.decoding import Scoring
from seer_deploy.core.errors import ConfigError


def every_column(batch: int, seq: int) -> np.ndarray:
    """The candidates of a pass that computes every column: [batch, seq] int64."""
    return np.ascontiguousarray(np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)))


def graph_feed(graph: GraphIO, checked: StepInput, image_inputs: Mapping[str, np.ndarray] | None = None, *,
               with_stats: bool = False) -> dict[str, np.ndarray]:
    """`graph`'s inputs for one call, named and ordered as declared: the ids and mask of a checked StepInput, the
    step graph's sampling inputs (drawn from its temperature and seed), its candidates (every column unless the input
    names them) and whether to compute step zero's statistics, for the multimodal graphs `image_inputs` by name (the
    image table; an M-RoPE model's positions, models.pictures.mrope) and for the prefix-DLM graphs the prompt width
    (StepInput.prompt_width, the same for every row)."""
    assert checked.attention_mask is not None, "pass StepInput.checked(), which always has a mask"
    values = {INPUT_IDS.name: checked.input_ids, ATTENTION_MASK.name: checked.attention_mask}
    batch, seq = checked.input_ids.shape
    if graph.takes(TEMPERATURE):
        values.update(step_feed(batch, seq, checked.temperature, checked.seed, checked.uniform))
    if graph.takes(CANDIDATES):
        values[CANDIDATES.name] = every_column(batch, seq) if checked.candidates is None else checked.candidates
    if graph.takes(WITH_STATS):
        values[WITH_STATS.name] = np.full(batch, int(with_stats), dtype=np.int64)
    if graph.takes(SCORE_RULE):
        values.update(scoring_feed(batch, checked.scoring))
    values.update(image_inputs or {})
    if graph.takes(PROMPT_WIDTH):
        values[PROMPT_WIDTH.name] = np.full(checked.input_ids.shape[0], checked.prompt_width, dtype=np.int64)
    missing = [name for name in graph.input_names if name not in values]
    if missing:
        raise ConfigError(f"the {graph.name} graph needs {', '.join(missing)}, which this call does not give")
    return {name: values[name] for name in graph.input_names}


def window_feed(graph: GraphIO, checked: WindowInput) -> dict[str, np.ndarray]:
    """The window step's inputs for one call (sampling inputs drawn over the window's columns)."""
    batch, width = checked.window_ids.shape
    assert checked.position_shift is not None, "pass WindowInput.checked(), which always has a position shift"
    values = {WINDOW_IDS.name: checked.window_ids, ATTENTION_MASK.name: checked.attention_mask,
              WINDOW_START.name: checked.window_start, KV.name: checked.kv,
              PROMPT_WIDTH.name: np.full(batch, checked.prompt_width, dtype=np.int64),
              POSITION_SHIFT.name: checked.position_shift,
              **step_feed(batch, width, checked.temperature, checked.seed, checked.uniform)}
    return {name: values[name] for name in graph.input_names}


def prompt_feed(graph: GraphIO, checked: PromptInput) -> dict[str, np.ndarray]:
    """The prompt-cache graph's inputs for one call (sampling inputs drawn over the run's columns)."""
    batch, width = checked.run_ids.shape
    assert checked.candidates is not None and checked.position_shift is not None, \
        "pass PromptInput.checked(), which always has candidates and a position shift"
    values = {RUN_IDS.name: checked.run_ids, ATTENTION_MASK.name: checked.attention_mask,
              PROMPT_KV.name: checked.prompt_kv, CANDIDATES.name: checked.candidates,
              **scoring_feed(batch, checked.scoring),
              PROMPT_WIDTH.name: np.full(batch, checked.prompt_width, dtype=np.int64),
              POSITION_SHIFT.name: checked.position_shift,
              **step_feed(batch, width, checked.temperature, checked.seed)}
    return {name: values[name] for name in graph.input_names}


def scoring_feed(batch: int, scoring: Scoring | None) -> dict[str, np.ndarray]:
    """The decoding rule's graph inputs (None: rule 0 at temperature 1, whose score is the confidence)."""
    return {SCORE_RULE.name: np.full(batch, 0 if scoring is None else int(scoring.rule), dtype=np.int64),
            SCORE_TEMPERATURE.name: np.full(batch, 1.0 if scoring is None else scoring.temperature, np.float32)}


def _output(tensor: TensorIO, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """An output as a host array of its declared dtype (a no-op where the engine returned that type already)."""
    return np.asarray(values[tensor.name]).astype(tensor.dtype, copy=False)


def _score(values: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The score output where the graph returned it (the step graph's, prompt_step's; not window_step's)."""
    return _output(SCORE, values) if SCORE.name in values else None


def step0_output(values: Mapping[str, np.ndarray]) -> Step0Output:
    return Step0Output(
        token_ids=_output(TOKEN_IDS, values),
        confidence=_output(CONFIDENCE, values),
        eos_prob=_output(EOS_PROB, values),
        sparsity=_output(SPARSITY, values),
        score=_score(values),
    )


def step_output(values: Mapping[str, np.ndarray]) -> StepOutput:
    return StepOutput(token_ids=_output(TOKEN_IDS, values), confidence=_output(CONFIDENCE, values),
                      score=_score(values))


def prefill_output(values: Mapping[str, np.ndarray]) -> Step0Output:
    return step0_output(values)._replace(kv=_output(KV, values))


def refresh_output(values: Mapping[str, np.ndarray]) -> RefreshOutput:
    return RefreshOutput(_output(TOKEN_IDS, values), _output(CONFIDENCE, values), _output(KV, values), _score(values))


def window_output(values: Mapping[str, np.ndarray]) -> StepOutput:
    return StepOutput(token_ids=_output(WINDOW_TOKEN_IDS, values), confidence=_output(WINDOW_CONFIDENCE, values))
