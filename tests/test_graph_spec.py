"""spec.graphs / spec.graph_calls: the declarations, the feeds made from them and the outputs read back by them.

The checks against real exports (every traced graph equals its declaration) are in test_export.py and
test_vision_export.py; these need no export.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from seer_deploy.core.backend import Step0Output, StepInput, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.export.graphs import MultimodalStep0Graph, MultimodalStepGraph, Step0Graph, StepGraph, VisionGraph
from seer_deploy.spec.graph_calls import graph_feed, step0_output, step_output
from seer_deploy.spec.graphs import (
    MULTIMODAL_STEP,
    MULTIMODAL_STEP0,
    SPARSITY,
    STEP,
    STEP0,
    VISION,
    Axis,
    GraphIO,
    Size,
    step_graphs,
)
from seer_deploy.spec.sampling import draw_uniform

ALL_GRAPHS = (STEP0, STEP, VISION, MULTIMODAL_STEP0, MULTIMODAL_STEP)


@pytest.mark.parametrize(("graph", "module"), [
    (STEP0, Step0Graph), (STEP, StepGraph), (VISION, VisionGraph),
    (MULTIMODAL_STEP0, MultimodalStep0Graph), (MULTIMODAL_STEP, MultimodalStepGraph),
])
def test_the_torch_modules_take_the_declared_inputs_in_order(graph: GraphIO, module: type) -> None:
    """Tracing passes the dynamic shapes by input name: the forward parameters must be the declared inputs."""
    assert list(inspect.signature(module.forward).parameters)[1:] == graph.input_names


def test_the_declarations() -> None:
    assert [g.name for g in step_graphs()] == [g.name for g in step_graphs(multimodal=True)] == ["step0", "step"]
    assert STEP0.file == "step0.onnx" and VISION.file == "vision.onnx"
    assert MULTIMODAL_STEP.input_names == [*STEP.input_names, "image_table"]
    assert MULTIMODAL_STEP0.outputs == STEP0.outputs
    # The step graphs' outputs are the backends' output records, field for field.
    assert STEP0.output_names == list(Step0Output._fields) and STEP.output_names == list(StepOutput._fields)
    for graph in ALL_GRAPHS:
        assert len(set(graph.input_names)) == len(graph.inputs) and graph.host_outputs == graph.output_names
        for tensor in (*graph.inputs, *graph.outputs):
            assert tensor.dtype in ("int64", "float32")
    assert STEP.dynamic_axes() == {
        "input_ids": {0: Axis.BATCH, 1: Axis.SEQ},
        "attention_mask": {0: Axis.BATCH, 1: Axis.SEQ},
        "temperature": {0: Axis.BATCH},
        "sample_uniform": {0: Axis.BATCH, 1: Axis.SEQ},
    }
    assert MULTIMODAL_STEP0.dynamic_axes()["image_table"] == {0: Axis.IMAGE_TOKENS}


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
    assert list(graph_feed(STEP0, checked)) == STEP0.input_names  # no sampling inputs at step zero
    table = np.zeros((4, 8), np.float32)
    feed = graph_feed(MULTIMODAL_STEP0, checked, table)
    assert list(feed) == MULTIMODAL_STEP0.input_names and feed["image_table"] is table
    with pytest.raises(ConfigError, match="step0 graph needs image_table"):
        graph_feed(MULTIMODAL_STEP0, checked)


def test_outputs_come_back_as_declared_dtypes() -> None:
    values = {"token_ids": np.array([[1, 2]], np.int32), "confidence": np.zeros((1, 2), np.float16),
              "eos_prob": np.zeros((1, 2), np.float32), "sparsity": np.zeros((1, 4, 2), np.float32), "extra": None}
    out = step0_output(values)
    assert out.token_ids.dtype == np.int64 and out.confidence.dtype == np.float32
    assert out.sparsity is values["sparsity"]  # already the declared type: not copied
    step = step_output(values)
    assert step.token_ids.tolist() == [[1, 2]] and step.confidence.dtype == np.float32
