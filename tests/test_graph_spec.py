"""contracts.graphs / contracts.graph_calls: the declarations, the feeds made from them and the outputs read back by them.

The checks against real exports (every traced graph equals its declaration) are in test_export.py and
test_vision_export.py; these need no export.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from seer_deploy.contracts.graph_calls import graph_feed, step0_output, step_output
from seer_deploy.contracts.graphs import (
    SPARSITY,
    STEP,
    VISION,
    WINDOW_STEP,
    Axis,
    GraphIO,
    Size,
    export_graphs,
    step_graph,
)
from seer_deploy.contracts.sampling import draw_uniform
from seer_deploy.core.backend import Step0Output, StepInput, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.export.graphs import (
    MultimodalPrefixStepGraph,
    MultimodalStepGraph,
    PrefixStepGraph,
    StepGraph,
    VisionGraph,
    WindowStepGraph,
)

MULTIMODAL_STEP = step_graph(multimodal=True)
ALL_GRAPHS = (STEP, VISION, MULTIMODAL_STEP, WINDOW_STEP, step_graph(kv_cache=True), step_graph(True, True, True))


@pytest.mark.parametrize(("graph", "module"), [
    (STEP, StepGraph), (step_graph(prefix_dlm=True), PrefixStepGraph), (VISION, VisionGraph),
    (MULTIMODAL_STEP, MultimodalStepGraph), (step_graph(multimodal=True, prefix_dlm=True), MultimodalPrefixStepGraph),
    (WINDOW_STEP, WindowStepGraph),
])
def test_the_torch_modules_take_the_declared_inputs_in_order(graph: GraphIO, module: type) -> None:
    """Tracing passes the dynamic shapes by input name: the forward parameters must be the declared inputs."""
    assert list(inspect.signature(module.forward).parameters)[1:] == graph.input_names


def test_the_declarations() -> None:
    # One graph for every full pass (step zero, the steps, the refresh); the window graph only with the cache.
    assert [g.name for g in export_graphs()] == [g.name for g in export_graphs(multimodal=True)] == ["step"]
    assert [g.name for g in export_graphs(kv_cache=True)] == ["step", "window_step", "prompt_step"]
    assert STEP.file == "step.onnx" and VISION.file == "vision.onnx"
    assert MULTIMODAL_STEP.input_names == [*STEP.input_names, "image_table"]
    assert step_graph(True, True).input_names == [*STEP.input_names, "image_table", "prompt_width"]
    assert step_graph(kv_cache=True).output_names == [*STEP.output_names, "kv"]
    # The step graph's outputs are step zero's output record, field for field (Step0Output's kv: what a prefill, step
    # zero of the prompt cache, also returns: the step graph's kv output); a later step reads the first two and the score.
    assert [*STEP.output_names, "kv"] == list(Step0Output._fields)
    assert [*STEP.output_names[:2], STEP.output_names[-1]] == list(StepOutput._fields)
    for graph in ALL_GRAPHS:
        assert len(set(graph.input_names)) == len(graph.inputs) and graph.host_outputs == graph.output_names
        for tensor in (*graph.inputs, *graph.outputs):
            assert tensor.dtype in ("int64", "float32")
    assert STEP.dynamic_axes() == {
        "input_ids": {0: Axis.BATCH, 1: Axis.SEQ},
        "attention_mask": {0: Axis.BATCH, 1: Axis.SEQ},
        "temperature": {0: Axis.BATCH},
        "sample_uniform": {0: Axis.BATCH, 1: Axis.SEQ},
        "candidates": {0: Axis.BATCH, 1: Axis.CANDIDATES},
        "with_stats": {0: Axis.BATCH},
        "score_rule": {0: Axis.BATCH},
        "score_temperature": {0: Axis.BATCH},
    }
    assert MULTIMODAL_STEP.dynamic_axes()["image_table"] == {0: Axis.IMAGE_TOKENS}


def test_shapes_resolve_from_sizes() -> None:
    assert SPARSITY.recorded_shape({Size.STAT_ROWS: 8}) == ["batch", 8, "seq"]
    assert SPARSITY.concrete_shape({Axis.BATCH: 2, Axis.SEQ: 5}, {Size.STAT_ROWS: 8}) == (2, 8, 5)
    assert VISION.interface({Size.IMAGE_SIZE: 16, Size.TOKENS_PER_IMAGE: 17, Size.D_MODEL: 32}) == [
        ("input", "pixel_values", "float32", ["images", 3, 16, 16]),
        ("output", "image_embeds", "float32", ["images", 17, 32]),
    ]
    with pytest.raises(KeyError, match="stat_rows"):
        SPARSITY.recorded_shape({})


def test_feeds_follow_the_declaration() -> None:
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    checked = StepInput(ids, None, temperature=0.5, seed=3).checked(16)
    feed = graph_feed(STEP, checked)
    assert list(feed) == STEP.input_names
    assert feed["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]
    assert feed["temperature"].tolist() == [0.5, 0.5] and feed["temperature"].dtype == np.float32
    np.testing.assert_array_equal(feed["sample_uniform"], draw_uniform(3, (2, 3)))
    # No candidates named: every column; no statistics unless asked for (step zero).
    assert feed["candidates"].tolist() == [[0, 1, 2], [0, 1, 2]] and feed["with_stats"].tolist() == [0, 0]
    assert graph_feed(STEP, checked, with_stats=True)["with_stats"].tolist() == [1, 1]
    named = StepInput(ids, None, candidates=np.array([[2], [1]])).checked(16)
    assert graph_feed(STEP, named)["candidates"].tolist() == [[2], [1]]
    with pytest.raises(ConfigError, match="candidates must be columns in"):
        StepInput(ids, None, candidates=np.array([[3], [1]])).checked(16)
    with pytest.raises(ConfigError, match="candidates must be integer columns"):
        StepInput(ids, None, candidates=np.array([[0, 1]])).checked(16)
    table = np.zeros((4, 8), np.float32)
    feed = graph_feed(MULTIMODAL_STEP, checked, {"image_table": table})
    assert list(feed) == MULTIMODAL_STEP.input_names and feed["image_table"] is table
    with pytest.raises(ConfigError, match="step graph needs image_table"):
        graph_feed(MULTIMODAL_STEP, checked)


def test_outputs_come_back_as_declared_dtypes() -> None:
    values = {"token_ids": np.array([[1, 2]], np.int32), "confidence": np.zeros((1, 2), np.float16),
              "eos_prob": np.zeros((1, 2), np.float32), "sparsity": np.zeros((1, 4, 2), np.float32), "extra": None}
    out = step0_output(values)
    assert out.token_ids.dtype == np.int64 and out.confidence.dtype == np.float32
    assert out.sparsity is values["sparsity"]  # already the declared type: not copied
    step = step_output(values)
    assert step.token_ids.tolist() == [[1, 2]] and step.confidence.dtype == np.float32
