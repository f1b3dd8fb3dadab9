"""torch module -> in-memory ONNX model (onnx_ir), with the dynamic axes its contracts.graphs declaration names,
reproducible byte for byte.

The dynamo exporter records stack traces, FX node text and module paths as metadata on every node; they say where the
exporter ran rather than what the graph computes, so they are dropped: the same checkpoint then gives the same graph.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
import torch
from torch import nn

from seer_deploy.contracts.graphs import Axis, GraphIO
from seer_deploy.contracts.manifest_sections import TensorSpec
from seer_deploy.export.options import check_opset
from seer_deploy.export.streamed_weights import bind_weights, keeps_weights_lazy
from seer_deploy.models.checkpoints.weight_sources import WeightSource

_DTYPE_NAMES = {
    ir.DataType.INT64: "int64",
    ir.DataType.FLOAT: "float32",
    ir.DataType.FLOAT16: "float16",
    ir.DataType.BFLOAT16: "bfloat16",
    ir.DataType.BOOL: "bool",
}


@contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporter's progress prints and warnings are noise for users of `seer-deploy export`."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)  # torch.export logs unsupported-feature notes at ERROR
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@dataclass(frozen=True)
class StreamedWeights:
    """A module built under `fake_mode` (no weights in memory) and where its parameters' data is: what
    `trace_graph` binds the traced initializers to (export.streamed_weights)."""

    fake_mode: Any  # torch._subclasses.fake_tensor.FakeTensorMode
    sources: Mapping[str, WeightSource]
    dtype: torch.dtype

    def nbytes(self) -> int:
        """What the weights take in the export's dtype (the weights file, less alignment and small constants)."""
        size = torch.empty((), dtype=self.dtype).element_size()
        return sum(math.prod(source.shape) * size for source in self.sources.values())


def trace_graph(
    module: nn.Module,
    example_args: tuple[torch.Tensor, ...],
    graph: GraphIO,
    opset: int,
    bounds: Mapping[Axis, int],
    weights: StreamedWeights | None = None,
) -> ir.Model:
    """Export `module` under `graph`'s input and output names, its declared axes dynamic up to `bounds`. With
    `weights`, the module is a fake one: traced without its data, then bound to the checkpoint's tensors (read when
    the weights file is written) before the optimizer runs."""
    check_opset(opset)
    dims: dict[Axis, torch.export.Dim] = {}
    for axes in graph.dynamic_axes().values():
        for axis in axes.values():
            dims.setdefault(axis, torch.export.Dim(axis.value, min=1, max=bounds[axis]))
    dynamic_shapes: dict[str, Any] = {
        name: {index: dims[axis] for index, axis in axes.items()} for name, axes in graph.dynamic_axes().items()
    }
    with quiet_exporter(), torch.no_grad(), weights.fake_mode if weights is not None else nullcontext():
        program = torch.onnx.export(
            module,
            example_args,
            dynamo=True,
            input_names=graph.input_names,
            output_names=graph.output_names,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            optimize=weights is None,
            verbose=False,
            report=False,
        )
    if program is None:  # only the legacy exporter returns None
        raise RuntimeError("torch.onnx.export returned no program")
    model = program.model
    if weights is not None:
        import onnxscript
        from onnxscript.rewriter import onnx_fusions

        bind_weights(model, weights.sources, weights.dtype)
        with quiet_exporter():
            onnxscript.optimizer.optimize_ir(model, should_fold=keeps_weights_lazy)
            onnx_fusions.fuse(model)
    strip_metadata(model)
    return model


def strip_metadata(model: ir.Model) -> None:
    """Drop exporter provenance (stack traces, FX text) from nodes and values; keep names and computation."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        node.metadata_props.clear()
        node.doc_string = None
        for value in node.outputs:
            value.metadata_props.clear()
    for value in (*model.graph.inputs, *model.graph.outputs, *model.graph.initializers.values()):
        value.metadata_props.clear()
    model.graph.metadata_props.clear()
    model.metadata_props.clear()


def io_specs(values: Sequence[ir.Value]) -> dict[str, TensorSpec]:
    """Manifest entries for graph inputs or outputs: element type name and shape (ints or dim names)."""
    specs: dict[str, TensorSpec] = {}
    for value in values:
        if value.name is None or value.dtype is None or value.shape is None:
            raise RuntimeError(f"exported graph value {value.name!r} has no dtype or shape")
        dtype = _DTYPE_NAMES.get(value.dtype, str(value.dtype).lower())
        shape: list[int | str] = [d if isinstance(d, int) else str(d) for d in value.shape]
        specs[value.name] = TensorSpec(dtype, shape)
    return specs
