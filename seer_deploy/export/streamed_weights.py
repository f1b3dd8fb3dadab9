"""Graphs traced without weights, whose initializers are then bound to the checkpoint's tensors, read only when the
weights file is written (seer_deploy.export.weights), one at a time.

The step module is traced on fake tensors (torch's FakeTensorMode: shapes and dtypes, no storage), with the exporter's
optimizer off, so each weight is an initializer named after its parameter. `bind_weights` gives each one a
`CheckpointTensor`: a lazy tensor that knows its source, the export dtype and any transpose. A `Transpose` of a weight
used nowhere else is folded into its initializer here (the exporter's optimizer does the same with loaded weights),
so the file holds each projection in the layout its MatMul reads and no runtime transposes or copies it. Then the
exporter's own optimizer runs, told never to fold a node that would read a large weight (`keeps_weights_lazy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import torch

from seer_deploy.models.checkpoints.weight_sources import WeightSource

PARAMETER_PREFIX = "model."  # the step modules hold the MaskPredictor as `model` (export.graphs)
FOLD_INPUT_LIMIT = 8192  # onnxscript's default: the optimizer folds nodes whose constant inputs are at most this big
_IR_DTYPES = {torch.float32: ir.DataType.FLOAT, torch.float16: ir.DataType.FLOAT16, torch.bfloat16: ir.DataType.BFLOAT16}


@dataclass(frozen=True)
class ExportedWeight:
    """A checkpoint tensor as the export writes it: converted to `dtype`, then permuted by `perm` (if any)."""

    source: WeightSource
    dtype: torch.dtype
    perm: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        shape = self.source.shape
        return shape if self.perm is None else tuple(shape[p] for p in self.perm)

    def tensor(self) -> torch.Tensor:
        """The tensor to write, contiguous (the conversion first: the permuted copy is then in the smaller dtype)."""
        tensor = self.source.read(self.dtype)
        return tensor if self.perm is None else tensor.permute(self.perm).contiguous()

    def array(self) -> np.ndarray:
        tensor = self.tensor()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits as uint16
            return tensor.view(torch.int16).numpy().view(np.uint16)
        return tensor.numpy()


class CheckpointTensor(ir.LazyTensor):
    """An initializer read from the checkpoint when its bytes are asked for (not cached: written once, then gone)."""

    __slots__ = ("weight",)

    def __init__(self, weight: ExportedWeight, name: str | None = None) -> None:
        super().__init__(lambda: ir.tensor(weight.array()), dtype=_IR_DTYPES[weight.dtype],
                         shape=ir.Shape(weight.shape), name=name)
        self.weight = weight


def bind_weights(model: ir.Model, sources: Mapping[str, WeightSource], dtype: torch.dtype) -> None:
    """Give every parameter initializer of a graph traced on fake tensors its checkpoint source, then fold the
    transposes of weights into them. RuntimeError if a floating-point initializer is left without data."""
    for name, value in model.graph.initializers.items():
        internal = name.removeprefix(PARAMETER_PREFIX)
        if name.startswith(PARAMETER_PREFIX) and internal in sources:
            value.const_value = CheckpointTensor(ExportedWeight(sources[internal], dtype), name)
        elif _is_fake(value.const_value):
            raise RuntimeError(f"traced initializer {name} has no checkpoint source (not a parameter of the model)")
    fold_weight_transposes(model)


def _is_fake(tensor: ir.TensorProtocol | None) -> bool:
    raw = getattr(tensor, "raw", None)
    return isinstance(raw, torch.Tensor) and type(raw) is not torch.Tensor


def fold_weight_transposes(model: ir.Model) -> int:
    """Replace each Transpose of a bound weight that nothing else reads by a transposed initializer; how many."""
    folded = 0
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 1:
            continue
        value = node.inputs[0]
        tensor = value.const_value if value is not None else None
        if value is None or not isinstance(tensor, CheckpointTensor) or len(value.uses()) != 1:
            continue
        weight = tensor.weight
        if weight.perm is not None:
            continue
        perm_attr = node.attributes.get("perm")
        rank = len(weight.shape)
        perm = tuple(perm_attr.as_ints()) if perm_attr is not None else tuple(reversed(range(rank)))
        name = f"{value.name}.T" if perm == (1, 0) else f"{value.name}.perm{''.join(map(str, perm))}"
        folded_weight = ExportedWeight(weight.source, weight.dtype, perm)
        new_value = ir.Value(name=name, shape=ir.Shape(folded_weight.shape), type=ir.TensorType(tensor.dtype),
                             const_value=CheckpointTensor(folded_weight, name))
        ir.convenience.replace_all_uses_with(node.outputs[0], new_value)
        assert node.graph is not None
        node.graph.remove(node, safe=True)
        assert value.name is not None
        model.graph.initializers.pop(value.name)
        model.graph.register_initializer(new_value)
        folded += 1
    return folded


def keeps_weights_lazy(node: ir.Node) -> bool | None:
    """The optimizer's should_fold: never fold a node that reads a weight bigger than it would fold anyway (that
    would load it into memory); default rules otherwise."""
    for value in node.inputs:
        tensor = value.const_value if value is not None else None
        if isinstance(tensor, CheckpointTensor) and tensor.size > FOLD_INPUT_LIMIT:
            return False
    return None
